"""Measure one rewrite on its demo: torch exactness, and what the converter emits before and after.

Shared by tests/test_rewrites.py (which asserts on it) and scripts/gpu_table.py (which tabulates it, with
the GPU verdicts added), so the two can never measure different things.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import torch

from zoo.rewrites import inspect as tfl
from zoo.rewrites.base import Demo, Rewrite


@dataclasses.dataclass
class Side:
    """One converted module (before or after the rewrite)."""

    path: Path | None
    convert_error: str | None = None
    ops: list[str] = dataclasses.field(default_factory=list)
    max_rank: int = 0
    findings: list[str] = dataclasses.field(default_factory=list)  # the rewrite's own detector
    lint: list[str] = dataclasses.field(default_factory=list)  # every known GPU trap
    cpu_error: float | None = None  # max |tflite CPU - torch original| over all outputs

    @property
    def converted(self) -> bool:
        return self.convert_error is None


@dataclasses.dataclass
class Evidence:
    rewrite: Rewrite
    demo: Demo
    reference: list[np.ndarray]  # torch outputs of demo.before (fp32)
    torch_error: float  # max |after - before| in torch fp32
    before: Side
    after: Side

    @property
    def reference_scale(self) -> float:
        return max(float(np.abs(r).max()) for r in self.reference)


def outputs(module: torch.nn.Module, args: tuple) -> list[np.ndarray]:
    """Run in torch, flatten tuple outputs to a list of numpy arrays."""
    with torch.no_grad():
        out = module(*args)
    out = out if isinstance(out, (tuple, list)) else [out]
    return [o.detach().float().numpy() for o in out]


def max_error(got: list[np.ndarray], ref: list[np.ndarray]) -> float:
    assert len(got) == len(ref), f"{len(got)} outputs vs {len(ref)}"
    return max(float(np.abs(g.astype(np.float64) - r).max()) for g, r in zip(got, ref))


def convert_side(module: torch.nn.Module, args: tuple, path: Path, rw: Rewrite, reference: list[np.ndarray]) -> Side:
    try:
        tfl.convert_to_tflite(module, args, path)
    except Exception as e:  # the converter's own failure is evidence (torch.stft: complex<f32>)
        return Side(path=None, convert_error=f"{type(e).__name__}: {str(e).splitlines()[0][:200]}")
    side = Side(path=path, ops=tfl.ops_in_tflite(path), max_rank=tfl.max_tensor_rank(path))
    side.findings = rw.detect(path)
    side.lint = tfl.gpu_lint(path)
    side.cpu_error = max_error(tfl.run_tflite_cpu(path, args), reference)
    return side


def collect(rw: Rewrite, workdir: Path) -> Evidence:
    """Build the demo, compare in torch, convert both sides into `workdir`, inspect and run on CPU."""
    demo = rw.demo()
    demo.before.eval()
    demo.after.eval()
    reference = outputs(demo.before, demo.args)
    torch_error = max_error(outputs(demo.after, demo.args_after()), reference)
    workdir.mkdir(parents=True, exist_ok=True)
    before = convert_side(demo.before, demo.args, workdir / f"{rw.id}.before.tflite", rw, reference)
    after = convert_side(demo.after, demo.args_after(), workdir / f"{rw.id}.after.tflite", rw, reference)
    return Evidence(rw, demo, reference, torch_error, before, after)


# --- the GPU side (zoo.targets.litert_gpu: WebGPU accelerator on software Vulkan) --------------------


@dataclasses.dataclass
class GpuEvidence:
    before: object | None  # litert_gpu.GpuCheck; None where that side did not convert
    after: object | None
    stressed: bool  # fed Demo.stress_args (fp16 family) rather than the ordinary demo inputs


def gpu_inputs(args: tuple) -> dict[str, dict[str, np.ndarray]]:
    """litert-torch names the inputs of the default signature args_0, args_1, ..."""
    return {
        "serving_default": {
            f"args_{i}": np.ascontiguousarray(a.detach().numpy() if isinstance(a, torch.Tensor) else a)
            for i, a in enumerate(args)
        }
    }


def collect_gpu(ev: Evidence) -> GpuEvidence:
    """Run the GPU-delegate check (fp32 and fp16 compute, each compared with the CPU interpreter) on
    both sides of a collected rewrite."""
    from zoo.targets.litert_gpu import gpu_check

    stress = ev.demo.stress_args
    before_args = stress if stress is not None else ev.demo.args
    after_args = stress if stress is not None else ev.demo.args_after()

    def check(side: Side, args: tuple):
        return gpu_check(side.path, gpu_inputs(args)) if side.converted else None

    return GpuEvidence(check(ev.before, before_args), check(ev.after, after_args), stress is not None)


def worst(check, field: str) -> float | None:
    """Largest `field` (e.g. "fp32_rel_err") over all outputs of a GpuCheck; None if nothing ran."""
    if check is None:
        return None
    values = [getattr(o, field) for outs in check.outputs.values() for o in outs.values()]
    values = [v for v in values if v is not None]
    if not values:
        return None
    return float("nan") if any(v != v for v in values) else max(values)
