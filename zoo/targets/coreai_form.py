"""The graph form the Core AI Linux CPU runtime runs fast, applied to every model by the Core AI target.

`nn.Linear` exports as `permute(W) + mm`, and coreai-torch 0.4.3 keeps that permute as a *runtime* transpose
of the constant. On SmolLM2 decode, 241 such transposes took 88% of a step (0.83 of 0.95 s); storing W^T
turns each into a plain matmul (models/gqa_llm/README.md). `pretranspose_linears` does that for any module,
at export time only: the caller's module and its state dict keep upstream's layout.

`op_histogram` counts the ops of a converted program, so the report can show what the pass changed
(`transpose`, `matmul` / `batch_matmul` counts) on every bundle.
"""

from __future__ import annotations

import copy
from collections import Counter

import torch
from torch import nn

from zoo.precision import Fp32AccumulateLinear, in_fp32


class PretransposedLinear(nn.Module):
    """y = x @ weight_t + bias with weight_t = W^T ([in, out]).

    `weight_t` may be a transposed *view* of the original weight: torch.export lifts it as a constant with
    the transposed values, so nothing is copied in torch (a real-size model is never held twice).
    accumulate_fp32: multiply a reduced-precision weight in fp32 (zoo.precision.in_fp32)."""

    def __init__(self, weight_t: torch.Tensor, bias: torch.Tensor | None, accumulate_fp32: bool = False):
        super().__init__()
        self.weight_t = nn.Parameter(weight_t, requires_grad=False)
        self.bias = None if bias is None else nn.Parameter(bias.detach(), requires_grad=False)
        self.accumulate_fp32 = accumulate_fp32

    @classmethod
    def of(cls, linear: nn.Module) -> "PretransposedLinear":
        accumulate = isinstance(linear, Fp32AccumulateLinear)
        return cls(linear.weight.detach().t(), linear.bias, accumulate_fp32=accumulate)

    @property
    def weight(self) -> torch.Tensor:
        """W in upstream's [out, in] layout (a view): code that reads `layer.weight.dtype` or `.shape`, as
        T5's feed-forward does before `wo`, keeps working on the swapped layer."""
        return self.weight_t.t()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = in_fp32(torch.matmul, x, self.weight_t) if self.accumulate_fp32 else x @ self.weight_t
        return y if self.bias is None else y + self.bias


def _structural_copy(module: nn.Module) -> nn.Module:
    """A copy of the module tree that shares every parameter and buffer with the original (no tensor is
    copied), so swapping children in the copy never touches the caller's module."""
    memo = {id(t): t for t in list(module.parameters()) + list(module.buffers())}
    return copy.deepcopy(module, memo)


def pretranspose_linears(module: nn.Module) -> tuple[nn.Module, int]:
    """(copy of `module` with every nn.Linear / Fp32AccumulateLinear stored as W^T, how many were swapped).
    Numerics are identical: the same products in the same order."""
    out = _structural_copy(module)
    swapped = 0

    def visit(parent: nn.Module) -> None:
        nonlocal swapped
        for name, child in parent.named_children():
            if isinstance(child, (nn.Linear, Fp32AccumulateLinear)):
                setattr(parent, name, PretransposedLinear.of(child))
                swapped += 1
            else:
                visit(child)

    visit(out)
    return out, swapped


def op_histogram(program) -> Counter:
    """How many of each op a converted Core AI program holds (dialect prefix dropped: `transpose`,
    `broadcasting_batch_matmul`, ...), read from its MLIR module."""
    from coreai._compiler.ir import WalkResult

    counts: Counter = Counter()

    def visit(op):
        counts[op.name.rsplit(".", 1)[-1]] += 1
        return WalkResult.ADVANCE

    program._module._mlir_module.operation.walk(visit)
    return counts
