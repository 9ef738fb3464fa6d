"""fp16 numerics: the mean the norm rewrites use, and a CPU emulation of an fp16 GPU accumulator.

GPU delegates compute in fp16 by default. Two things overflow there (65504 is the fp16 maximum):
- an elementwise intermediate, e.g. x*x for |x| > 256 — reproduced on CPU simply by running the
  *decomposed* module in torch.float16 (not F.layer_norm, which accumulates in fp32 internally);
- the reduction accumulator of a plain mean/sum over many elements. torch's fp16 reductions on CPU
  accumulate in fp32, so they hide it; `emulate_fp16_accumulator()` makes `mean` below sum pairwise in
  fp16, rounding at every level, which is what a tree reduction in fp16 does.
The WebGPU/lavapipe checker did *not* overflow the accumulator (a mean of 4096 values of 200 stayed
exact, toolchain.md §4); the seed reports it on phones. Both are modelled, neither is assumed away.
"""

from __future__ import annotations

import contextlib
import contextvars
from typing import Iterator, Sequence

import torch
import torch.nn.functional as F

FP16_MAX = 65504.0
FP16_TINY = 2.0**-24  # smallest positive fp16 subnormal: the floor for a denominator

_EMULATE = contextvars.ContextVar("zoo_emulate_fp16_accumulator", default=False)


@contextlib.contextmanager
def emulate_fp16_accumulator() -> Iterator[None]:
    """Inside this block, `mean` sums pairwise in fp16 (for tests in torch.float16 on CPU)."""
    token = _EMULATE.set(True)
    try:
        yield
    finally:
        _EMULATE.reset(token)


def tree_sum_fp16(x: torch.Tensor, dim: int) -> torch.Tensor:
    """Pairwise sum along `dim`, rounding to fp16 at every level (keepdim=True)."""
    x = x.to(torch.float16).movedim(dim, -1)
    while x.shape[-1] > 1:
        if x.shape[-1] % 2:
            x = F.pad(x, (0, 1))
        x = x[..., 0::2] + x[..., 1::2]  # fp16 + fp16 rounds (and overflows) like the device
    return x.movedim(-1, dim)


def mean(x: torch.Tensor, dims: Sequence[int]) -> torch.Tensor:
    """Mean over `dims`, keepdim. The one reduction the fp16-family modules use."""
    dims = tuple(d % x.dim() for d in dims)
    if not _EMULATE.get():
        return x.mean(dim=dims, keepdim=True)
    n = 1
    for d in dims:
        n *= x.shape[d]
    flat = _flatten_trailing(x, dims)
    return (tree_sum_fp16(flat, -1) / n).reshape(_keepdim_shape(x, dims)).to(x.dtype)


def _flatten_trailing(x: torch.Tensor, dims: tuple[int, ...]) -> torch.Tensor:
    keep = [d for d in range(x.dim()) if d not in dims]
    return x.permute(keep + list(dims)).reshape([x.shape[d] for d in keep] + [-1])


def _keepdim_shape(x: torch.Tensor, dims: tuple[int, ...]) -> list[int]:
    return [1 if d in dims else s for d, s in enumerate(x.shape)]


SPLIT_K_CHUNK = 1024


def split_k_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
                   chunk: int = SPLIT_K_CHUNK) -> torch.Tensor:
    """F.linear with the contraction split into `chunk`-long pieces whose partial results are summed
    pairwise. On a GPU computing in fp16 each dot product then accumulates at most `chunk` terms, and the
    partials meet in a balanced tree: the error of a 4096-long fp16 dot product drops to that of a
    1024-long one plus log2(4) roundings. Exact in fp32 up to summation order (<= 1e-6 relative)."""
    k = x.shape[-1]
    if k <= chunk:
        return F.linear(x, weight, bias)
    parts = [F.linear(x[..., i:i + chunk], weight[:, i:i + chunk]) for i in range(0, k, chunk)]
    out = pairwise_sum(parts)
    return out if bias is None else out + bias


def split_k_matmul(a: torch.Tensor, b: torch.Tensor, chunk: int = SPLIT_K_CHUNK) -> torch.Tensor:
    """torch.matmul (mm, bmm, batched, matrix-vector) with the contraction split like split_k_linear:
    `a`'s last axis against `b`'s second-to-last (its only axis for a vector)."""
    k = a.shape[-1]
    if k <= chunk:
        return torch.matmul(a, b)
    b_axis = 0 if b.dim() == 1 else b.dim() - 2
    parts = [torch.matmul(a.narrow(-1, i, min(chunk, k - i)), b.narrow(b_axis, i, min(chunk, k - i)))
             for i in range(0, k, chunk)]
    return pairwise_sum(parts)


def pairwise_sum(parts: list[torch.Tensor]) -> torch.Tensor:
    """A balanced tree of additions, not a running sum: log2(n) roundings deep instead of n."""
    while len(parts) > 1:
        parts = [parts[i] + parts[i + 1] if i + 1 < len(parts) else parts[i] for i in range(0, len(parts), 2)]
    return parts[0]
