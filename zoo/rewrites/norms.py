"""The fp16 reduction family: LayerNorm / RMSNorm / InstanceNorm / mean that survive fp16 kernels.

Symptom on the device: a model compiles, runs, and returns all-zero, NaN or inf output (or "head
outputs exactly zero"). Cause: an fp16 value passes 65504 — x*x for |x| > 256 (variance, mean square),
or the accumulator of a long sum. The robust form (toolchain.md §4, measured on real fp16 kernels):
- scale each row by S = max|x| over the normalised axes, clamped to >= 1 (small rows stay untouched);
- normalise in the down-scaled domain xs = x / S, where every intermediate is <= 4 per element;
- never multiply the variance back by S² (that reconstruction overflows at |x| in the thousands);
  the eps term moves into the scaled domain as eps / S / S (two divisions: S² itself may overflow);
- clamp the denominator at >= 2**-24: eps / S² underflows to 0 in fp16, and a constant or zero row
  would otherwise give 0 / 0 = NaN (this is why a *fixed*-scale "safe" norm fails on such rows).
For long rows the mean itself is taken hierarchically (every stage averages <= 32 elements), so the
accumulator stays small whatever the row length; zero-padding to a whole number of chunks and
rescaling by padded/true length keeps it exact for any length, not only powers of two.

x.amax(...) — the seed's "NHWC node rewriter not found: amax" — lowers to REDUCE_MAX today and is
accepted; `channel_max` (the max_pool2d form) is kept for older converters, marked not needed.
"""

from __future__ import annotations

import math
from typing import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from zoo.rewrites import fp16
from zoo.rewrites import inspect as tfl
from zoo.rewrites.base import (
    LITERT_GPU,
    NEEDED,
    NOT_NEEDED,
    Demo,
    Lambda,
    ModuleSwap,
    Rewrite,
    apply_swap,
    copy_params,
    seeded,
)

CHUNK = 32  # elements averaged per stage of a hierarchical mean
HIERARCHICAL_ABOVE = 4096  # rows longer than this are reduced hierarchically inside the norms


# --- means -----------------------------------------------------------------------------------------


def hierarchical_mean(x: torch.Tensor, dims: Sequence[int], chunk: int = CHUNK) -> torch.Tensor:
    """Mean over the trailing `dims` (keepdim) in stages that each average at most `chunk` values.

    A row of n values is zero-padded to a multiple of `chunk`, averaged per chunk, and the chunk means
    are reduced the same way; the zero padding is undone by one factor padded_n / n per stage. Every
    intermediate stays within max|x|, so no fp16 accumulator can overflow. Rank stays <= 4 for inputs of
    rank <= 3 plus one reduced axis (lead dims, chunks, chunk).
    """
    dims = sorted(d % x.dim() for d in dims)
    lead = list(x.shape[: dims[0]])
    assert dims == list(range(dims[0], x.dim())), "hierarchical_mean reduces trailing axes only"
    n = math.prod(x.shape[d] for d in dims)
    y = x.reshape(lead + [n])
    factor = 1.0
    while n > chunk:
        m = -(-n // chunk)
        if m * chunk != n:
            y = F.pad(y, (0, m * chunk - n))
            factor *= m * chunk / n
        y = fp16.mean(y.reshape(lead + [m, chunk]), [-1]).reshape(lead + [m])
        n = m
    y = fp16.mean(y, [-1])
    if factor != 1.0:
        y = y * factor
    return y.reshape(lead + [1] * len(dims))


def _row_mean(x: torch.Tensor, dims: Sequence[int]) -> torch.Tensor:
    n = math.prod(x.shape[d] for d in dims)
    return hierarchical_mean(x, dims) if n > HIERARCHICAL_ABOVE else fp16.mean(x, dims)


def hierarchical_reduce(x: torch.Tensor, dims: Sequence[int] | None = None, keepdim: bool = False,
                        kind: str = "mean") -> torch.Tensor:
    """x.mean(dims) / x.sum(dims) for any axes, through hierarchical_mean: no stage averages more than
    CHUNK values, so no fp16 accumulator sees a long run. The reduced axes move last and the kept ones
    merge into one, so every intermediate is rank <= 3 whatever x's rank (the GPU delegate stops at 4)."""
    dims = tuple(range(x.dim())) if dims is None or len(dims) == 0 else tuple(d % x.dim() for d in dims)
    kept = [d for d in range(x.dim()) if d not in dims]
    n = math.prod(x.shape[d] for d in dims)
    rows = x.permute(kept + list(dims)).reshape(math.prod(x.shape[d] for d in kept), n)
    out = hierarchical_mean(rows, [-1])  # [rows, 1]
    if kind == "sum":
        out = out * float(n)
    shape = [1 if d in dims else s for d, s in enumerate(x.shape)] if keepdim else [x.shape[d] for d in kept]
    return out.reshape(shape)


# --- the adaptive normalisation ----------------------------------------------------------------------


def adaptive_normalize(x: torch.Tensor, dims: Sequence[int], eps: float, *, center: bool) -> torch.Tensor:
    """(x - mean) / sqrt(var + eps) (center=True) or x / sqrt(mean(x²) + eps), overflow-free in fp16."""
    s = torch.clamp_min(x.abs().amax(dim=tuple(dims), keepdim=True), 1.0)
    xs = x / s
    if center:
        xs = xs - _row_mean(xs, dims)
    var = _row_mean(xs * xs, dims)
    denom = torch.clamp_min(torch.sqrt(var + eps / s / s), fp16.FP16_TINY)
    return xs / denom


def _affine(y: torch.Tensor, weight: torch.Tensor | None, bias: torch.Tensor | None) -> torch.Tensor:
    if weight is not None:
        y = y * weight
    if bias is not None:
        y = y + bias
    return y


def safe_layer_norm(x: torch.Tensor, eps: float, weight: torch.Tensor | None = None,
                    bias: torch.Tensor | None = None) -> torch.Tensor:
    """LayerNorm over the last axis in the fp16-safe form, for re-authored modules: exact to fp32 rounding, and
    no intermediate passes fp16's 65504 (a plain LayerNorm's variance overflows once |x| > ~256, which `zoo
    doctor` flags on an fp16 Core AI graph as half-layer-norm)."""
    return _affine(adaptive_normalize(x, (-1,), eps, center=True), weight, bias)


class SafeLayerNorm(nn.Module):
    """nn.LayerNorm(channels)'s keys (`weight`, `bias`) over the last axis, computed by `safe_layer_norm`."""

    def __init__(self, channels: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(channels))
        self.bias = nn.Parameter(torch.zeros(channels))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return safe_layer_norm(x, self.eps, self.weight, self.bias)


class AdaptiveLayerNorm(nn.Module):
    def __init__(self, src: nn.LayerNorm):
        super().__init__()
        self.dims = tuple(range(-len(src.normalized_shape), 0))
        self.eps = src.eps
        copy_params(self, src, ["weight", "bias"])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _affine(adaptive_normalize(x, self.dims, self.eps, center=True), self.weight, self.bias)


class AdaptiveRMSNorm(nn.Module):
    def __init__(self, src: nn.RMSNorm):
        super().__init__()
        self.dims = tuple(range(-len(src.normalized_shape), 0))
        self.eps = src.eps  # None: torch uses finfo(x.dtype).eps, and so do we
        copy_params(self, src, ["weight"])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        eps = torch.finfo(x.dtype).eps if self.eps is None else self.eps
        return _affine(adaptive_normalize(x, self.dims, eps, center=False), self.weight, None)


class AdaptiveInstanceNorm(nn.Module):
    """InstanceNorm1d/2d/3d without running statistics: per (n, c) over the spatial axes."""

    def __init__(self, src: nn.modules.instancenorm._InstanceNorm):
        super().__init__()
        self.eps = src.eps
        copy_params(self, src, ["weight", "bias"])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = adaptive_normalize(x, tuple(range(2, x.dim())), self.eps, center=True)
        per_channel = (1, -1) + (1,) * (x.dim() - 2)
        w = None if self.weight is None else self.weight.reshape(per_channel)
        b = None if self.bias is None else self.bias.reshape(per_channel)
        return _affine(y, w, b)


def _swap_instance_norm(m: nn.modules.instancenorm._InstanceNorm) -> nn.Module | None:
    # With tracked running stats in eval mode there is no reduction to protect.
    return None if m.track_running_stats else AdaptiveInstanceNorm(m)


# --- the decomposed originals: what an fp16 kernel computes, for the fp16 tests -----------------------


def decomposed_layer_norm(x: torch.Tensor, dims: Sequence[int], eps: float) -> torch.Tensor:
    mu = fp16.mean(x, dims)
    d = x - mu
    return d / torch.sqrt(fp16.mean(d * d, dims) + eps)


def decomposed_rms_norm(x: torch.Tensor, dims: Sequence[int], eps: float) -> torch.Tensor:
    return x / torch.sqrt(fp16.mean(x * x, dims) + eps)


def fixed_scale_layer_norm(x: torch.Tensor, dims: Sequence[int], eps: float, scale: float = 256.0) -> torch.Tensor:
    """The non-adaptive "safe" norm (x / constant S): NaN on constant and zero rows in fp16."""
    xs = x / scale
    d = xs - fp16.mean(xs, dims)
    return d / torch.sqrt(fp16.mean(d * d, dims) + eps / (scale * scale))


# --- amax ------------------------------------------------------------------------------------------


def channel_max(x: torch.Tensor) -> torch.Tensor:
    """x.amax(1, keepdim=True) for NCHW as a max-pool over the channel axis (for converters without
    an NHWC amax rewriter)."""
    n, c, h, w = x.shape
    return F.max_pool2d(x.reshape(n, 1, c, h * w), kernel_size=(c, 1)).reshape(n, 1, h, w)


# --- demos -----------------------------------------------------------------------------------------

_SWAP_LN = ModuleSwap((nn.LayerNorm,), AdaptiveLayerNorm)
_SWAP_RMS = ModuleSwap((nn.RMSNorm,), AdaptiveRMSNorm)
_SWAP_IN = ModuleSwap((nn.InstanceNorm1d, nn.InstanceNorm2d, nn.InstanceNorm3d), _swap_instance_norm)


def _randomize_affine(m: nn.Module) -> nn.Module:
    g = seeded(13)
    with torch.no_grad():
        for p in m.parameters():
            p.copy_(1.0 + 0.5 * torch.randn(p.shape, generator=g))
    return m


def fp16_stress_rows(shape: tuple[int, ...], seed: int = 14) -> torch.Tensor:
    """Rows (along axis 1) that break a naive fp16 norm: ordinary, constant 500, zero, uniform ±1000.

    Axis 1 is the token axis of [B, S, C] and the channel axis of [N, C, H, W]: either way each kind
    of row is normalised on its own.
    """
    g = seeded(seed)
    x = 3.0 * torch.randn(*shape, generator=g)
    kinds = [
        lambda r: r,
        lambda r: torch.full_like(r, 500.0),
        lambda r: torch.zeros_like(r),
        lambda r: 1000.0 * (2.0 * torch.rand(r.shape, generator=g) - 1.0),
    ]
    for i in range(x.shape[1]):
        x[:, i] = kinds[i % len(kinds)](x[:, i])
    return x


def _demo_norm(module: nn.Module, swap: ModuleSwap, shape: tuple[int, ...]) -> Demo:
    before = nn.Sequential(_randomize_affine(module)).eval()
    args = (3.0 * torch.randn(*shape, generator=seeded(14)),)
    return Demo(before, apply_swap(before, swap)[0], args, stress_args=(fp16_stress_rows(shape),))


def _demo_mean() -> Demo:
    before = Lambda(lambda x: x.mean(-1, keepdim=True), "x.mean(-1)")
    after = Lambda(lambda x: hierarchical_mean(x, [-1]), "hierarchical_mean")
    x = 100.0 + torch.randn(1, 4, 2000, generator=seeded(15))
    return Demo(before, after, (x,), stress_args=(x,))


def _demo_amax() -> Demo:
    before = Lambda(lambda x: x.amax(1, keepdim=True), "x.amax(1)")
    return Demo(before, Lambda(channel_max), (torch.randn(1, 8, 6, 6, generator=seeded(16)),))


_FP16 = dict(
    family="norms",
    targets=(LITERT_GPU,),
    status=NEEDED,
    detect=tfl.no_structural_finding,
    failure="numeric-fp16",
)

REWRITES = [
    Rewrite(
        id="safe_layernorm",
        fixes="fp16 overflow in LayerNorm: all-zero or NaN output (variance of |x| > 256)",
        exactness="<=1e-6",
        demo=lambda: _demo_norm(nn.LayerNorm(64), _SWAP_LN, (1, 4, 64)),
        swap=_SWAP_LN,
        function=adaptive_normalize,
        **_FP16,
    ),
    Rewrite(
        id="safe_rmsnorm",
        fixes="fp16 overflow in RMSNorm: sum of x² becomes inf, head outputs exactly zero",
        exactness="<=1e-6",
        demo=lambda: _demo_norm(nn.RMSNorm(64, eps=1e-6), _SWAP_RMS, (1, 4, 64)),
        swap=_SWAP_RMS,
        function=adaptive_normalize,
        **_FP16,
    ),
    Rewrite(
        id="safe_instancenorm",
        fixes="fp16 overflow in InstanceNorm over large spatial maps: zeros / NaN",
        exactness="<=1e-6",
        demo=lambda: _demo_norm(nn.InstanceNorm2d(4, affine=True), _SWAP_IN, (1, 4, 8, 8)),
        swap=_SWAP_IN,
        function=adaptive_normalize,
        **_FP16,
    ),
    Rewrite(
        id="hierarchical_mean",
        fixes="fp16 accumulator overflow in a plain mean/sum over many elements (inf); seen on phones, "
        "not on the WebGPU/lavapipe checker",
        exactness="<=1e-6",
        demo=_demo_mean,
        reproduces_on_checker=False,
        notes="lavapipe kept a mean of 2000 values near 100 exact in fp16 (toolchain.md §4); the seed "
        "reports the overflow on phones.",
        function=hierarchical_mean,
        **_FP16,
    ),
    Rewrite(
        id="amax_maxpool",
        family="norms",
        fixes="NHWC node rewriter not found: amax (seed); today x.amax lowers to REDUCE_MAX, accepted",
        targets=(LITERT_GPU,),
        exactness="bit-exact",
        status=NOT_NEEDED,
        detect=lambda p: tfl.find_ops(p, "GATHER_ND", "BROADCAST_TO") + tfl.find_rank_over(p),
        demo=_demo_amax,
        function=channel_max,
        emits_before=("REDUCE_MAX",),
    ),
]
