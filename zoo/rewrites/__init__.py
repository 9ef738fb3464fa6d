"""The rewrite library: one registry of target-specific rewrites, one module per family.

    from zoo import rewrites
    rewrites.REWRITES["gqa_query_fold"]          # a self-describing Rewrite
    model = rewrites.apply(model, ["relu_0_to_1", "safe_layernorm"])   # module swaps, on a copy
    ids = [rw.id for rw in rewrites.for_target("litert-gpu")]          # the default set for a target

Families: attention, activations, arith, norms (the fp16 reduction family), slicing, resampling,
reshapes, spectral, deformable (torchvision's deform_conv2d). Each Rewrite says what it fixes, for which targets, how exact it is, whether
today's converter still needs it, and carries a tiny before/after demo that the tests and
scripts/gpu_table.py convert. Helpers to read a converted .tflite live in `zoo.rewrites.inspect`.
"""

from __future__ import annotations

from typing import Iterable

from torch import nn

from zoo.rewrites import activations, arith, attention, deformable, norms, reshapes, resampling, slicing, spectral
from zoo.rewrites.base import COREAI, LITERT, LITERT_GPU, NEEDED, NOT_NEEDED, Demo, ModuleSwap, Rewrite, apply_swaps

FAMILIES = (attention, activations, arith, norms, slicing, resampling, reshapes, spectral, deformable)


def _build_registry() -> dict[str, Rewrite]:
    registry: dict[str, Rewrite] = {}
    for family in FAMILIES:
        for rw in family.REWRITES:
            assert rw.id not in registry, f"duplicate rewrite id {rw.id}"
            registry[rw.id] = rw
    return registry


REWRITES: dict[str, Rewrite] = _build_registry()


def get(rewrite_id: str) -> Rewrite:
    try:
        return REWRITES[rewrite_id]
    except KeyError:
        raise KeyError(f"unknown rewrite {rewrite_id!r}; known: {', '.join(sorted(REWRITES))}") from None


def for_target(target: str, *, include_not_needed: bool = False, include_opt_in: bool = False) -> list[Rewrite]:
    """Rewrites a model bound for `target` should get by default (needed, not opt-in)."""
    return [
        rw
        for rw in REWRITES.values()
        if target in rw.targets and (rw.needed or include_not_needed) and (not rw.opt_in or include_opt_in)
    ]


def apply(module: nn.Module, ids: Iterable[str], *, inplace: bool = False) -> nn.Module:
    """Apply the module swaps of the rewrites `ids`, in order, to a copy of `module` (or in place).

    Function-only rewrites (no module class to swap, e.g. repeat_kv) are the re-authored model's job;
    asking for one here is allowed and does nothing. Use `apply_logged` to see what was replaced.
    """
    return apply_logged(module, ids, inplace=inplace)[0]


def apply_logged(
    module: nn.Module, ids: Iterable[str], *, inplace: bool = False
) -> tuple[nn.Module, list[tuple[str, str]]]:
    """Like `apply`, also returning [(module path, rewrite id)] for every replaced submodule."""
    return apply_swaps(module, [get(i) for i in ids], inplace=inplace)


__all__ = [
    "COREAI",
    "LITERT",
    "LITERT_GPU",
    "NEEDED",
    "NOT_NEEDED",
    "Demo",
    "ModuleSwap",
    "REWRITES",
    "Rewrite",
    "apply",
    "apply_logged",
    "for_target",
    "get",
]
