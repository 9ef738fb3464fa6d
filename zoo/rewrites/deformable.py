"""Modulated deformable convolution (torchvision.ops.deform_conv2d, "DCNv2") without torchvision.

Neither converter has a lowering for `torchvision::deform_conv2d` (and torchvision cannot share the main venv's
torch). The op is: for every output pixel and kernel tap, sample the input bilinearly at the tap's position plus a
learned offset, multiply by a learned mask, then apply the kernel as one matrix product over (tap, channel). Only the
sampling is data-dependent, so the rewrite is that sampling in one of two forms, then a FULLY_CONNECTED:
- `sampler="gather"`: four corner rows picked by index (index_select) with float-arithmetic validity masks —
  O(C·P) memory; GATHER on LiteRT (CPU), gather on Core AI.
- `sampler="tent"`: the bilinear weights as tent functions relu(1 - |coord - j|) per axis (exactly the bilinear
  weights, zero outside the map), applied with two batched matmuls — no gather at all, so the LiteRT GPU delegate
  takes it; but O(C·H·P) memory for P = taps × output pixels (see `tent_intermediate_bytes`).
scripts/deform_conv_lowering.py measures which forms each converter lowers and what the LiteRT GPU delegate accepts.

torchvision's sampling is zero-padded bilinear: a sample's corners outside the map read 0, so a sample fades out
linearly between the last row and one row beyond (measured against torchvision 0.29.1's CPU kernel in the reference
venv: y = 3.5 on a 4-row map reads half of row 3). tests/test_deform_conv.py holds both forms to closed-form cases
(zero offsets = a plain convolution; a half-pixel offset = the mean of two rows; the fade past the edge) and to
upstream BiRefNet's golden output, with clamping at the border as the negative control.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from zoo.rewrites import inspect as tfl
from zoo.rewrites.activations import clamp01
from zoo.rewrites.arith import floor_gpu_safe
from zoo.rewrites.base import LITERT_GPU, NEEDED, Demo, ModuleSwap, Rewrite, apply_swap, const_like, seeded
from zoo.rewrites.resampling import tent_weights

SAMPLERS = ("gather", "tent")


def inside_integer(index: torch.Tensor, size: int) -> torch.Tensor:
    """1.0 where an integer-valued float index lies in [0, size-1], else 0.0 — arithmetic, no bool ops (clamp01 is
    bit-exact with clamp(0, 1), without the RELU_0_TO_1 the LiteRT GPU rejects)."""
    return clamp01(index + 1.0) * clamp01(float(size) - index)


def tent_axis(coord: torch.Tensor, size: int) -> torch.Tensor:
    """[B, P] pixel coordinates -> [B, P, size] bilinear weights relu(1 - |coord - j|) (zero outside the map)."""
    return tent_weights(coord.unsqueeze(-1), size)


def sample_tent(x: torch.Tensor, iy: torch.Tensor, ix: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """Zero-padded bilinear samples of x [B, C, H, W] at (iy, ix) [B, P], times weight [B, P] -> [B, P, C]."""
    b, c, h, w = x.shape
    p = iy.shape[1]
    wx = tent_axis(ix, w).to(x.dtype)                            # [B, P, W]
    wy = (tent_axis(iy, h) * weight.unsqueeze(-1)).to(x.dtype)   # [B, P, H]
    rows = x.reshape(b, c * h, w) @ wx.transpose(1, 2)           # [B, C·H, P]: every row sampled at every ix
    rows = rows.reshape(b, c, h, p).permute(0, 3, 1, 2)          # [B, P, C, H]
    return (rows @ wy.unsqueeze(-1)).reshape(b, p, c)            # weighted over H


def gather_bilinear(value: torch.Tensor, ix: torch.Tensor, iy: torch.Tensor, h: int, w: int,
                    weight: torch.Tensor | None = None) -> torch.Tensor:
    """grid_sample(align_corners=False, padding zeros) at pixel coordinates, as four corner-row gathers: value
    [N, H·W, D]; ix, iy [N, P] -> [N, P, D], each sample times `weight` [N, P] when given. Out-of-map corners get
    weight 0 through float masks; their clamped indices still read a valid row. Shared by RF-DETR's
    multi-scale deformable attention and the deformable convolution below.

    Coordinates in fp32 whatever the model dtype: bf16 keeps 8 mantissa bits (1/8 px at x = 24), and
    coreai-torch 0.4.3 fails to convert a bf16 floor-divide by a scalar ("dtype f32 vs bf16")."""
    n, hw, d = value.shape
    ix, iy = ix.float(), iy.float()
    x0, y0 = floor_gpu_safe(ix), floor_gpu_safe(iy)
    fx, fy = ix - x0, iy - y0
    rows = value.reshape(n * hw, d)
    base = const_like(np.arange(n).reshape(n, 1) * hw, ix)
    out = None
    for dy, wy in ((0.0, 1.0 - fy), (1.0, fy)):
        for dx, wx in ((0.0, 1.0 - fx), (1.0, fx)):
            xc, yc = x0 + dx, y0 + dy
            corner = wx * wy * inside_integer(xc, w) * inside_integer(yc, h)
            if weight is not None:
                corner = corner * weight
            index = base + yc.clamp(0, h - 1) * w + xc.clamp(0, w - 1)
            picked = rows.index_select(0, index.reshape(-1).to(torch.int32)).view(n, -1, d)
            term = picked * corner.unsqueeze(-1).to(value.dtype)
            out = term if out is None else out + term
    return out


def sample_gather(x: torch.Tensor, iy: torch.Tensor, ix: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """The deformable convolution's samples (sample_tent's contract) through gather_bilinear."""
    b, c, h, w = x.shape
    return gather_bilinear(x.permute(0, 2, 3, 1).reshape(b, h * w, c), ix, iy, h, w, weight)


def tap_grid(kernel: tuple[int, int], out_size: tuple[int, int], stride: tuple[int, int],
             padding: tuple[int, int], dilation: tuple[int, int]) -> tuple[np.ndarray, np.ndarray]:
    """Undeformed sampling positions [K, Ho·Wo] (y, x) of every tap at every output pixel, torchvision's:
    out_y·stride - pad + i·dilation."""
    kh, kw = kernel
    ho, wo = out_size
    oy = np.arange(ho) * stride[0] - padding[0]
    ox = np.arange(wo) * stride[1] - padding[1]
    ty = np.arange(kh) * dilation[0]
    tx = np.arange(kw) * dilation[1]
    y = (ty[:, None, None, None] + oy[None, None, :, None]) + np.zeros((1, kw, 1, wo))
    x = (tx[None, :, None, None] + ox[None, None, None, :]) + np.zeros((kh, 1, ho, 1))
    return y.reshape(kh * kw, ho * wo), x.reshape(kh * kw, ho * wo)


def _pair(v) -> tuple[int, int]:
    return (int(v), int(v)) if isinstance(v, int) else (int(v[0]), int(v[1]))


def deform_conv2d(x: torch.Tensor, offset: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
                  stride=1, padding=0, dilation=1, mask: torch.Tensor | None = None,
                  sampler: str = "gather") -> torch.Tensor:
    """torchvision.ops.deform_conv2d (one offset group, groups=1) in ops both converters lower.

    x [B, Cin, H, W]; offset [B, 2·K, Ho, Wo] (per tap k = i·kw + j: channel 2k the y offset, 2k+1 the x offset);
    mask [B, K, Ho, Wo] or None; weight [Cout, Cin, kh, kw] -> [B, Cout, Ho, Wo]."""
    if sampler not in SAMPLERS:
        raise ValueError(f"sampler {sampler!r}: one of {SAMPLERS}")
    b, c, h, w = x.shape
    cout, cin, kh, kw = weight.shape
    k = kh * kw
    ho, wo = offset.shape[-2:]
    if cin != c or offset.shape[1] != 2 * k or (mask is not None and mask.shape[1] != k):
        raise ValueError(f"deform_conv2d: one offset group and groups=1 only (x {tuple(x.shape)}, offset "
                         f"{tuple(offset.shape)}, weight {tuple(weight.shape)})")
    p = k * ho * wo
    grid_y, grid_x = tap_grid((kh, kw), (ho, wo), _pair(stride), _pair(padding), _pair(dilation))
    # Coordinates and weights in fp32 whatever the graph's dtype: bf16 keeps 8 mantissa bits (half a pixel at 256),
    # and coreai-torch 0.4.3 refuses a bf16 floor-divide ("div: dtype f32 vs bf16", `target=coreai precision=bf16`).
    pairs = offset.float().reshape(b, k, 2, ho * wo)
    iy = (pairs[:, :, 0] + const_like(grid_y, pairs)).reshape(b, p)
    ix = (pairs[:, :, 1] + const_like(grid_x, pairs)).reshape(b, p)
    scale = mask.float().reshape(b, p) if mask is not None else const_like(np.ones((b, p)), pairs)
    sample = sample_tent if sampler == "tent" else sample_gather
    taps = sample(x, iy, ix, scale)                                             # [B, K·Ho·Wo, C]
    cols = taps.reshape(b, k, ho * wo, c).permute(0, 2, 1, 3).reshape(b, ho * wo, k * c)
    out = F.linear(cols, weight.permute(0, 2, 3, 1).reshape(cout, k * c), bias)  # [B, Ho·Wo, Cout]
    return out.transpose(1, 2).reshape(b, cout, ho, wo)


def tent_intermediate_bytes(channels: int, height: int, taps: int, out_pixels: int, itemsize: int = 4) -> int:
    """The tent form's largest buffer ([B, C·H, P], P = taps × output pixels), in bytes."""
    return channels * height * taps * out_pixels * itemsize


# --- module form and the registry entry ------------------------------------------------------------------


class DeformConv2d(nn.Module):
    """torchvision.ops.DeformConv2d's parameters (`weight`, `bias`) and call (x, offset, mask), one offset group,
    with the sampling form chosen (`sampler`): a module that models can hold and the registry can swap."""

    def __init__(self, cin: int, cout: int, kernel: int, stride: int = 1, padding: int = 0, dilation: int = 1,
                 bias: bool = True, sampler: str = "gather"):
        super().__init__()
        self.stride, self.padding, self.dilation, self.sampler = stride, padding, dilation, sampler
        self.weight = nn.Parameter(torch.empty(cout, cin, kernel, kernel))
        self.bias = nn.Parameter(torch.empty(cout)) if bias else None
        nn.init.kaiming_uniform_(self.weight, a=5 ** 0.5)
        if self.bias is not None:
            nn.init.uniform_(self.bias, -0.1, 0.1)

    def forward(self, x, offset, mask=None):
        return deform_conv2d(x, offset, self.weight, self.bias, self.stride, self.padding, self.dilation, mask,
                             self.sampler)


def _tent_copy(m: DeformConv2d) -> DeformConv2d | None:
    if m.sampler == "tent":
        return None
    new = DeformConv2d(m.weight.shape[1], m.weight.shape[0], m.weight.shape[-1], m.stride, m.padding, m.dilation,
                       m.bias is not None, sampler="tent")
    new.load_state_dict(m.state_dict())
    return new


_SWAP_TENT = ModuleSwap((DeformConv2d,), _tent_copy)


def _demo_deform() -> Demo:
    torch.manual_seed(0)
    before = DeformConv2d(4, 5, 3, padding=1).eval()
    x = torch.randn(1, 4, 8, 8, generator=seeded(23))
    offset = 2.0 * torch.randn(1, 18, 8, 8, generator=seeded(24))       # some samples fall past the border
    mask = 2.0 * torch.rand(1, 9, 8, 8, generator=seeded(25))
    return Demo(before, apply_swap(before, _SWAP_TENT)[0], (x, offset, mask))


REWRITES = [
    Rewrite(
        id="deform_conv_tent",
        family="deformable",
        fixes="GATHER_ND from a deformable convolution's bilinear sampling (torchvision.ops.deform_conv2d has no "
        "lowering at all; its gather form or F.grid_sample emit GATHER_ND, which the GPU delegate rejects)",
        targets=(LITERT_GPU,),
        exactness="<=1e-6",
        status=NEEDED,
        detect=lambda p: tfl.find_ops(p, "GATHER_ND", "GATHER", "BROADCAST_TO") + tfl.find_rank_over(p),
        demo=_demo_deform,
        swap=_SWAP_TENT,
        function=deform_conv2d,
        emits_before=("GATHER_ND",),
        notes="The tent form's buffer is channels x map height x taps x pixels (tent_intermediate_bytes): fine for "
        "small maps, far too big for BiRefNet at 1024² (scripts/deform_conv_lowering.py); the gather form is the "
        "one for Core AI and for the LiteRT CPU at that size.",
    ),
]
