"""Where does fp16 go wrong? The first intermediate tensor whose fp16 error exceeds its tolerance.

A model whose fp16 output is off (all zeros from an overflowing norm, a drifting long reduction) says
nothing about *where*. The locator makes every intermediate a graph output ("taps"), runs the tapped
graph in fp32 and in fp16, and walks the taps in graph (topological) order: the first one whose error,
relative to its own fp32 peak, exceeds the tolerance is the first divergence — named by its ATen op, the
module that emitted it (nn_module_stack) and the user's source line.

Two ways to compute the fp16 side:
- `emulate` (any machine): the tapped graph cast to fp16 in torch on the CPU. It reproduces elementwise
  overflow (x² past 65504 is inf) and rounding, not a device's accumulator order;
- `gpu`: the tapped graph converted to .tflite and run by the LiteRT GPU delegate computing in fp16
  (software Vulkan, zoo.targets.litert_gpu), compared with its CPU interpreter: the device's own numbers.
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import Sequence

import numpy as np
import torch
from torch import fx, nn

FP16_TOLERANCE = 1e-2  # relative to the tensor's fp32 peak: fp16 keeps ~3 significant digits per op
TAP_MAX_RANK = 4  # the GPU delegate refuses tensors above rank 4: a tap must not make the graph unrunnable


@dataclasses.dataclass(frozen=True)
class Divergence:
    node: str
    op: str
    module: str  # the nn.Module path that emitted it ("" at top level)
    source: str  # the user's "file:line: code"
    rel_error: float
    tolerance: float

    def format(self) -> str:
        where = self.source or "(no source line)"
        module = f" in {self.module}" if self.module else ""
        return (f"first fp16 divergence: {self.op} ({self.node}){module} at {where}: "
                f"rel err {self.rel_error:.3g} > {self.tolerance:g}")


def _taps(graph: fx.Graph) -> list[fx.Node]:
    """Float tensors computed by the graph (not inputs, not weights), rank <= 4, in topological order."""
    taps = []
    for node in graph.nodes:
        val = node.meta.get("val")
        if node.op == "call_function" and isinstance(val, torch.Tensor) and val.is_floating_point() \
                and 0 < val.dim() <= TAP_MAX_RANK and val.numel() > 0:
            taps.append(node)
    return taps


def tapped_module(module: nn.Module, inputs: Sequence) -> tuple[fx.GraphModule, list[fx.Node]]:
    """The exported graph of `module` returning every tap (a flat tuple) instead of its outputs."""
    from zoo.doctor import export_program

    gm = export_program(module, tuple(inputs)).module()
    del gm.train, gm.eval  # unlifted graphs refuse .eval(); the converters call it (see zoo.doctor.fix)
    taps = _taps(gm.graph)
    output = next(n for n in gm.graph.nodes if n.op == "output")
    with gm.graph.inserting_before(output):
        flat = gm.graph.call_function(_as_tuple, tuple(taps))
    output.args = (flat,)
    gm._out_spec = None  # the unlifted module re-packs outputs into the original pytree: return them flat
    gm.graph._codegen = fx.graph.CodeGen()
    gm.recompile()
    return gm, taps


def _as_tuple(*tensors):
    return tuple(t.float() for t in tensors)


def relative_errors(got: Sequence[np.ndarray], want: Sequence[np.ndarray]) -> list[float]:
    """max|got - want| / max|want| per tensor (inf where fp16 is not finite and fp32 is)."""
    errors = []
    for g, w in zip(got, want):
        g, w = np.asarray(g, dtype=np.float64), np.asarray(w, dtype=np.float64)
        if not np.all(np.isfinite(g)) and np.all(np.isfinite(w)):
            errors.append(math.inf)
            continue
        peak = float(np.max(np.abs(w))) if w.size else 0.0
        errors.append(float(np.max(np.abs(g - w))) / max(peak, 1e-6) if w.size else 0.0)
    return errors


def first_divergence(module: nn.Module, inputs: Sequence, tolerance: float = FP16_TOLERANCE, *,
                     mode: str = "emulate", workdir: Path | None = None) -> Divergence | None:
    """The first tap whose fp16 error exceeds `tolerance`, or None if every tap stays within it."""
    gm, taps = tapped_module(module, inputs)
    if not taps:
        return None
    if mode == "gpu":
        errors = _gpu_errors(gm, tuple(inputs), len(taps), workdir)
        if errors is None:
            return None
    else:
        errors = _emulated_errors(gm, tuple(inputs))
    for node, error in zip(taps, errors):
        if error > tolerance:
            return _describe(node, error, tolerance)
    return None


def _emulated_errors(gm: fx.GraphModule, inputs: tuple) -> list[float]:
    import copy

    from zoo.precision import cast_for_export

    with torch.no_grad():
        want = [t.numpy() for t in gm(*inputs)]
        half = cast_for_export(copy.deepcopy(gm), torch.float16)
        got = [t.float().numpy() for t in half(*inputs)]
    return relative_errors(got, want)


def _gpu_errors(gm: fx.GraphModule, inputs: tuple, count: int, workdir: Path | None) -> list[float] | None:
    """Per-tap fp16 GPU-vs-CPU relative error from the LiteRT GPU check; None if it could not run."""
    import tempfile

    from zoo.targets import Entry
    from zoo.targets.litert import convert_entries
    from zoo.targets.litert_gpu import gpu_check

    names = [f"tap_{i:05d}" for i in range(count)]  # zero-padded: signature names sort lexicographically
    arrays = {f"x{i}": t for i, t in enumerate(inputs)}
    with tempfile.TemporaryDirectory(prefix="zoo-divergence-") as tmp:
        folder = Path(workdir or tmp)
        folder.mkdir(parents=True, exist_ok=True)
        path = convert_entries([Entry("main", _Positional(gm), arrays, names)], folder / "tapped.tflite")
        check = gpu_check(path, {"main": {k: v.numpy() for k, v in arrays.items()}})
    if check.status != "accepted":
        return None
    per_output = check.to_dict()["outputs"].get("main", {})
    return [_trusted_fp16_error(per_output.get(n) or {}) for n in names]


# A tap whose enforced-fp32 GPU run is off by more than this says nothing about fp16: on the software
# Vulkan checker the first tap of a graph (a linear whose output also feeds the next op) came back NaN
# in fp32 while the same values one op later matched to 4.5e-7 — an output-aliasing artifact of tapping.
FP32_TRUST = 1e-3


def _trusted_fp16_error(errors: dict) -> float:
    fp32, fp16 = _as_error(errors.get("fp32_rel_err")), _as_error(errors.get("fp16_rel_err"))
    if errors.get("fp32_rel_err") is None or fp32 > FP32_TRUST:
        return 0.0  # not measurable through a tap: never blamed
    return fp16


def _as_error(value) -> float:
    if value is None:
        return 0.0
    try:
        value = float(value)
    except (TypeError, ValueError):
        return math.inf
    return math.inf if math.isnan(value) else value


class _Positional(nn.Module):
    """Keyword inputs x0, x1, ... (LiteRT's NamedIO) to a graph module that takes them by position."""

    def __init__(self, gm: nn.Module):
        super().__init__()
        self.gm = gm

    def forward(self, *args, **kwargs):
        return self.gm(*args, *[kwargs[f"x{i}"] for i in range(len(args), len(args) + len(kwargs))])


def _describe(node: fx.Node, error: float, tolerance: float) -> Divergence:
    from zoo.doctor import source_line

    stack = node.meta.get("nn_module_stack") or {}
    module = ""
    if stack:
        path, kind = list(stack.values())[-1]
        kind = getattr(kind, "__name__", str(kind).rsplit(".", 1)[-1])
        module = f"{path} ({kind})" if path else kind
    op = str(node.target).removeprefix("aten.")
    return Divergence(node.name, op, module, source_line(node), error, tolerance)
