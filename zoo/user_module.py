"""`zoo convert module=pkg.mod:factory [fix=true]`: any user module through the shared pipeline.

The factory returns `(module, example_inputs)` (the same contract as `zoo doctor pkg.mod:factory`). This
file only *declares* it the way a model folder declares a model — a `ModelSpec` with one component and
a typed config — and zoo.pipeline does the work: doctor stage, both targets, gates, GPU check, report,
bundle. What differs from a model folder:
- the weights live in the module (`weights=module`: a Checkpoint made from its state dict);
- `reference` is the user's original module, unchanged: with `fix=true`, `build` returns the graph fixed
  by zoo.doctor.fix, so every gate compares the fixed artifact with the *original* on the same inputs;
- the LiteRT GPU must take every op and match the CPU in fp32 *and* in fp16 compute (the phone default),
  gated by MODULE_GPU below.
"""

from __future__ import annotations

import functools
import inspect
import re
from dataclasses import dataclass, field
from pathlib import Path

import torch
from omegaconf import MISSING, OmegaConf
from torch import nn

from zoo.divergence import FP16_TOLERANCE
from zoo.errors import ZooError
from zoo.schema import ModelConfig

# Gates of the artifact against the original module, per precision. fp32 is the doctor's "approximate"
# class (every graph fix is exact to <= 1e-6 relative, zoo.doctor FIX_TOLERANCE in the tests).
MODULE_GATES = {
    "fp32": {"cosine": 0.99999, "rel_max_abs": 1e-4},
    "fp16": {"cosine": 0.999},
    "bf16": {"cosine": 0.99},
    "int8": {"cosine": 0.99},
}
# The LiteRT GPU check (software Vulkan): resident at fp32, enforced-fp32 GPU vs CPU <= 1e-3 of the
# output's peak, and the GPU's default fp16 compute within zoo.divergence.FP16_TOLERANCE (1e-2, the same
# tolerance the fp16 locator uses). Measured on tests/doctor_modules.py with fix=true: 2.5e-4 to 1.7e-3;
# the wide norm unfixed: 1 (all-zero output).
MODULE_GPU = {"check": True, "require_resident": ["fp32"], "fp32_rel_tol": {"fp32": 1e-3},
              "fp16_rel_tol": {"fp32": FP16_TOLERANCE}}


@dataclass
class ModuleConfig(ModelConfig):
    """A user module's config: the model keys, plus where the module comes from."""

    factory: str = MISSING           # pkg.mod:factory
    fix: bool = False                # apply zoo doctor's graph-level fixes before conversion
    ignore: list = field(default_factory=list)  # doctor rule ids not to fix


def module_config(factory: str, fix: bool = False, ignore=()) -> "DictConfig":  # noqa: F821
    """The typed model config for a factory: fp32 on both targets, gated against the original module."""
    from zoo import doctor

    doctor.check_rule_ids(ignore)
    raw = {"name": module_name(factory), "package": __name__, "weights": "module", "factory": factory,
           "fix": bool(fix), "ignore": list(ignore), "default_precision": {"coreai": "fp32", "litert": "fp32"},
           "gates": MODULE_GATES, "gpu": MODULE_GPU}
    return OmegaConf.merge(OmegaConf.structured(ModuleConfig), raw)


def module_name(factory: str) -> str:
    """`pkg.mod:build` -> `pkg.mod-build`: the bundle folder under out_dir."""
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", factory.replace(":", "-")).strip("-") or "module"


class CallByName(nn.Module):
    """Positional (Core AI export, the pipeline's reference run) or keyword (LiteRT's NamedIO) call of a
    module that takes positional inputs, returning a flat tuple of its output tensors. A graph fixed by
    zoo.doctor (an unlifted ExportedProgram) accepts positional inputs only."""

    def __init__(self, module: nn.Module, input_names: list[str]):
        super().__init__()
        self.module = module
        self.input_names = list(input_names)

    def forward(self, *args, **kwargs):
        args = (*args, *[kwargs[n] for n in self.input_names[len(args):]])
        return tuple(torch.utils._pytree.tree_leaves(self.module(*args)))


def input_names(module: nn.Module, inputs: tuple) -> list[str]:
    """The forward's own parameter names where it has enough plain ones, else x0, x1, ..."""
    try:
        params = [p for p in inspect.signature(module.forward).parameters.values()
                  if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    except (TypeError, ValueError):
        params = []
    if len(params) >= len(inputs):
        return [p.name for p in params[: len(inputs)]]
    return [f"x{i}" for i in range(len(inputs))]


@dataclass
class Loaded:
    """A factory's module and inputs, and the graph the pipeline converts (fixed or not)."""

    original: nn.Module
    inputs: dict[str, torch.Tensor]
    output_names: list[str]
    converted: nn.Module
    fixes: dict = field(default_factory=dict)  # doctor rule id -> places changed


@functools.cache
def load(factory: str, fix: bool, ignore: tuple = ()) -> Loaded:
    """Call the factory once per run (the pipeline asks for the spec more than once)."""
    from zoo import doctor

    module, args = doctor.load_factory(factory)
    module = module.eval()
    names = input_names(module, args)
    with torch.no_grad():
        outputs = torch.utils._pytree.tree_leaves(module(*args))
    if not outputs or not all(isinstance(o, torch.Tensor) for o in outputs):
        raise ZooError(f"The module from '{factory}' returns no tensors.",
                       "return a tensor, or a tuple/dict of tensors, from forward.")
    output_names = ["output"] if len(outputs) == 1 else [f"output_{i}" for i in range(len(outputs))]
    converted, fixes = module, {}
    if fix:
        try:
            result = fix_for_pipeline(module, args, ignore)
        except doctor.ExportFailure as failure:  # the user's module, not a zoo bug: one paragraph
            finding = failure.finding()
            raise ZooError(f"The module from '{factory}' does not export ({finding.cause}) at "
                           f"{finding.source or 'an unknown line'}.", finding.fix) from None
        converted, fixes = result.module, result.applied
    return Loaded(module, dict(zip(names, args)), output_names, converted, fixes)


def fix_for_pipeline(module: nn.Module, args: tuple, ignore=()):
    """zoo.doctor.fix for both targets, linted at fp16: the LiteRT GPU computes in fp16 by default whatever
    the bundle's precision, so the half-precision traps (wide norms, long-K matmuls) are fixed too. Every
    fix is exact to <= 1e-6 relative in fp32, so the fp32 bundles lose nothing."""
    from zoo import doctor

    only = [r for r in doctor.FIXABLE if r not in set(ignore)]
    return doctor.fix(module, args, doctor.DEFAULT_TARGETS, precision="fp16", only=only)


def spec_for(cfg):
    """The ModelSpec of one factory (zoo.registry.get_spec calls this for packages that synthesize it)."""
    from zoo import weights
    from zoo.registry import Component, ModelSpec

    loaded = load(str(cfg.factory), bool(cfg.fix), tuple(cfg.get("ignore") or ()))
    names = list(loaded.inputs)
    component = Component(
        name="main",
        build=lambda checkpoint, c: CallByName(loaded.converted, names).eval(),
        reference=lambda checkpoint, c: CallByName(loaded.original, names).eval(),
        example_inputs=lambda checkpoint, c: dict(loaded.inputs),
        output_names=loaded.output_names,
    )

    def own_weights(c) -> "weights.Checkpoint":
        state = {k: v.detach() for k, v in loaded.original.state_dict().items()}
        provenance = {"source": "module", "factory": str(c.factory), "fixes": dict(loaded.fixes),
                      "note": "the weights the factory's module holds"}
        return weights.Checkpoint("module", {}, state, provenance)

    return ModelSpec(name=str(cfg.name), components=[component], tiny_dir=Path("."),
                     random_checkpoint=_no_random, summary=f"user module {cfg.factory}",
                     config_schema=ModuleConfig, module_weights=own_weights)


def _no_random(cfg):
    raise ZooError("A user module has no random weights.", "drop weights=...: its own weights are used.")
