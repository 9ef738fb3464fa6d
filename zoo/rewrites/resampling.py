"""Resampling: transposed convolutions, PixelShuffle, max-pool padding, bicubic resize, grid_sample.

Today (litert-torch 0.10): nn.ConvTranspose1d/2d -> TRANSPOSE_CONV v3, nn.PixelShuffle -> rank-4
RESHAPE/TRANSPOSE, max_pool2d(padding=1) -> PADV2 + MAX_POOL_2D; all accepted by the GPU checker, so the
rewrites for them are kept (older runtimes rejected TRANSPOSE_CONV: the seed's "version skew") but
marked not needed. Bicubic interpolate and F.grid_sample still lower to GATHER_ND (+ BROADCAST_TO,
rank 5 for grid_sample) and are rejected:
- bicubic resize at a fixed size is a constant linear map per axis: y = A_h · x · A_wᵀ, two matmuls
  with baked [out, in] matrices (the clamped 4-tap kernel folded in). Within 1e-6 of torch.
- bilinear grid_sample with a *runtime* grid: the bilinear weight of input pixel j for sample point p
  is the tent relu(1 - |ix_p - j|), separable in x and y, so the sample is two batched matmuls against
  tent-weight matrices built from the grid with elementwise ops. No gather at all. Honest limits:
  only mode="bilinear" with padding_mode "zeros"/"border" (nearest needs rounding, bicubic 16 taps,
  reflection a fold — none done here), and it costs O(C·H·P) memory instead of O(C·P): a [N, P, C, H]
  intermediate. At RF-DETR's deformable-attention scale it exceeds the 128 MiB single-buffer cap of the
  WebGPU adapter (see `grid_sample_intermediate_bytes`), so there it stays off the GPU.
"""

from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from zoo.rewrites import inspect as tfl
from zoo.rewrites.base import (
    COREAI,
    LITERT_GPU,
    NEEDED,
    NOT_NEEDED,
    Demo,
    ModuleSwap,
    Rewrite,
    apply_swap,
    const_like,
    seeded,
)

# --- transposed convolution as zero-stuffing + a plain convolution --------------------------------------


def conv_weight_from_transposed(w: torch.Tensor, groups: int) -> torch.Tensor:
    """ConvTranspose weight [Cin, Cout/g, *k] -> the equivalent Conv weight [Cout, Cin/g, *k], flipped."""
    cin, cout_g, *k = w.shape
    w = w.reshape(groups, cin // groups, cout_g, *k).transpose(1, 2).reshape(groups * cout_g, cin // groups, *k)
    return w.flip(dims=tuple(range(2, w.dim())))


def zero_stuff_2d(x: torch.Tensor, sh: int, sw: int) -> torch.Tensor:
    """[N, C, H, W] -> [N, C, H*sh, W*sw]: each input at (i*sh, j*sw), zeros elsewhere. Rank <= 4.

    Trailing zero rows/cols (sh-1, sw-1) are included; the caller's padding accounts for them.
    """
    n, c, h, w = x.shape
    if sw > 1:
        x = F.pad(x.reshape(n * c, h, w, 1), (0, sw - 1)).reshape(n, c, h, w * sw)
    if sh > 1:
        x = F.pad(x.reshape(n * c, h, 1, w * sw), (0, 0, 0, sh - 1)).reshape(n, c, h * sh, w * sw)
    return x


def _pad_or_crop(x: torch.Tensor, dim: int, before: int, after: int) -> torch.Tensor:
    """Zero-pad (positive) or crop (negative) each end of `dim`."""
    if before < 0:
        x = x.narrow(dim, -before, x.shape[dim] + before)
        before = 0
    if after < 0:
        x = x.narrow(dim, 0, x.shape[dim] + after)
        after = 0
    if before or after:
        pad = [0, 0] * (x.dim() - 1 - dim % x.dim()) + [before, after]
        x = F.pad(x, pad)
    return x


def zero_stuff_conv_transpose2d(
    x: torch.Tensor,
    conv_weight: torch.Tensor,
    bias: torch.Tensor | None,
    stride: tuple[int, int],
    padding: tuple[int, int],
    output_padding: tuple[int, int] = (0, 0),
    dilation: tuple[int, int] = (1, 1),
    groups: int = 1,
) -> torch.Tensor:
    """conv_transpose2d(x, w, ...) computed as zero-stuff + pad + conv2d with the flipped kernel.

    `conv_weight` comes from `conv_weight_from_transposed` (done once, at build time).
    """
    y = zero_stuff_2d(x, *stride)
    for axis, (s, p, op, d, k) in enumerate(zip(stride, padding, output_padding, dilation, conv_weight.shape[2:])):
        edge = d * (k - 1) - p
        # The stuffed tensor already ends with s-1 zeros; the right edge needs edge + op in total.
        y = _pad_or_crop(y, 2 + axis, edge, edge + op - (s - 1))
    return F.conv2d(y, conv_weight, bias, stride=1, dilation=dilation, groups=groups)


class ZeroStuffConvTranspose2d(nn.Module):
    def __init__(self, src: nn.ConvTranspose2d):
        super().__init__()
        assert src.padding_mode == "zeros"
        self.stride, self.padding = src.stride, src.padding
        self.output_padding, self.dilation, self.groups = src.output_padding, src.dilation, src.groups
        with torch.no_grad():
            self.weight = nn.Parameter(conv_weight_from_transposed(src.weight.detach(), src.groups).clone())
            self.bias = None if src.bias is None else nn.Parameter(src.bias.detach().clone())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return zero_stuff_conv_transpose2d(
            x, self.weight, self.bias, self.stride, self.padding, self.output_padding, self.dilation, self.groups
        )


class ZeroStuffConvTranspose1d(nn.Module):
    """ConvTranspose1d through the 2-D form on [N, C, 1, L] (a 1-D conv is a 2-D conv to the converter)."""

    def __init__(self, src: nn.ConvTranspose1d):
        super().__init__()
        assert src.padding_mode == "zeros"
        self.stride, self.padding = (1, src.stride[0]), (0, src.padding[0])
        self.output_padding, self.dilation, self.groups = (0, src.output_padding[0]), (1, src.dilation[0]), src.groups
        with torch.no_grad():
            w2d = conv_weight_from_transposed(src.weight.detach().unsqueeze(2), src.groups)
            self.weight = nn.Parameter(w2d.clone())
            self.bias = None if src.bias is None else nn.Parameter(src.bias.detach().clone())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = zero_stuff_conv_transpose2d(
            x.unsqueeze(2),
            self.weight,
            self.bias,
            self.stride,
            self.padding,
            self.output_padding,
            self.dilation,
            self.groups,
        )
        return y.squeeze(2)


# --- PixelShuffle as a one-hot transposed convolution ---------------------------------------------------


def pixel_shuffle_weight(channels_out: int, r: int) -> np.ndarray:
    """ConvTranspose2d weight [C*r², C, r, r] with w[c*r² + i*r + j, c, i, j] = 1."""
    w = np.zeros((channels_out * r * r, channels_out, r, r))
    for c in range(channels_out):
        for i in range(r):
            for j in range(r):
                w[c * r * r + i * r + j, c, i, j] = 1.0
    return w


def pixel_shuffle_conv_transpose(x: torch.Tensor, r: int) -> torch.Tensor:
    """F.pixel_shuffle(x, r) as conv_transpose2d with stride r and a one-hot kernel (rank 4 throughout).

    Exact for finite inputs (each output is 1·x plus zeros).
    """
    c = x.shape[1] // (r * r)
    return F.conv_transpose2d(x, const_like(pixel_shuffle_weight(c, r), x), stride=r)


class PixelShuffleConvT(nn.Module):
    def __init__(self, upscale_factor: int):
        super().__init__()
        self.r = upscale_factor

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return pixel_shuffle_conv_transpose(x, self.r)


# --- max-pool padding --------------------------------------------------------------------------------


# Pad value for an explicit max-pool pad: the most negative finite fp16. Not -inf: an -inf written by
# PADV2 that reaches MAX_POOL_2D through a TRANSPOSE comes back wrong from the WebGPU delegate (rel err
# 1.0, measured; the converter's own PADV2(-inf) feeding MAX_POOL_2D directly is fine). Not
# finfo(float32).min either: it becomes -inf when the GPU computes in fp16.
POOL_PAD_VALUE = -65504.0


class ExplicitPadMaxPool2d(nn.Module):
    """MaxPool2d(padding=p) as an explicit pad + unpadded pool (what the seed's GATHER_ND hid).

    Equal to MaxPool2d for inputs above -65504 (everything fp16 can hold).
    """

    def __init__(self, src: nn.MaxPool2d):
        super().__init__()
        self.kernel_size, self.stride, self.padding = src.kernel_size, src.stride, src.padding
        self.dilation, self.ceil_mode = src.dilation, src.ceil_mode

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        ph, pw = (self.padding, self.padding) if isinstance(self.padding, int) else self.padding
        x = F.pad(x, (pw, pw, ph, ph), value=POOL_PAD_VALUE)
        return F.max_pool2d(x, self.kernel_size, self.stride, 0, self.dilation, ceil_mode=self.ceil_mode)


def _swap_maxpool(m: nn.MaxPool2d) -> nn.Module | None:
    # ceil_mode's "last window starts inside the input" rule sees the padding; keep those as they are.
    if m.padding in (0, (0, 0)) or m.return_indices or m.ceil_mode:
        return None
    return ExplicitPadMaxPool2d(m)


# --- bicubic resize as two constant matmuls -----------------------------------------------------------


def _cubic_coeffs(t: float, a: float = -0.75) -> list[float]:
    """torch's 4-tap cubic convolution weights for fractional offset t (upsample_bicubic2d, A=-0.75)."""

    def near(d: float) -> float:  # |d| <= 1
        return ((a + 2) * d - (a + 3)) * d * d + 1

    def far(d: float) -> float:  # 1 < |d| < 2
        return ((a * d - 5 * a) * d + 8 * a) * d - 4 * a

    return [far(t + 1), near(t), near(1 - t), far(2 - t)]


def bicubic_matrix(n_in: int, n_out: int, align_corners: bool, scale: float | None = None) -> np.ndarray:
    """[n_out, n_in] matrix M with interpolate(mode="bicubic") along one axis = M @ x.

    Source coordinates follow torch: align_corners maps ends to ends; otherwise
    src = scale * (dst + 0.5) - 0.5 with scale = 1/scale_factor if given, else n_in/n_out, and (for
    cubic) no clamping of negative coordinates. Taps outside [0, n_in) read the edge (clamped index).
    """
    m = np.zeros((n_out, n_in))
    for i in range(n_out):
        if align_corners:
            src = i * (n_in - 1) / (n_out - 1) if n_out > 1 else 0.0
        else:
            s = scale if scale is not None else n_in / n_out
            src = s * (i + 0.5) - 0.5
        base = math.floor(src)
        for tap, w in zip(range(base - 1, base + 3), _cubic_coeffs(src - base)):
            m[i, min(max(tap, 0), n_in - 1)] += w
    return m


def resize_bicubic(
    x: torch.Tensor, size: tuple[int, int], align_corners: bool = False, scale_factor: tuple[float, float] | None = None
) -> torch.Tensor:
    """F.interpolate(x, size, mode="bicubic") on NCHW as x @ A_wᵀ, then the same on the H axis."""
    h, w = x.shape[-2:]
    sh, sw = (None, None) if scale_factor is None else (1.0 / scale_factor[0], 1.0 / scale_factor[1])
    a_w = const_like(bicubic_matrix(w, size[1], align_corners, sw).T, x)
    a_h = const_like(bicubic_matrix(h, size[0], align_corners, sh).T, x)
    y = x @ a_w  # [N, C, H, W_out]
    return (y.transpose(-1, -2) @ a_h).transpose(-1, -2)  # [N, C, H_out, W_out]


class BicubicResize(nn.Module):
    """nn.Upsample(mode="bicubic") without GATHER_ND; sizes resolved at trace time (static shapes)."""

    def __init__(self, size=None, scale_factor=None, align_corners: bool = False):
        super().__init__()
        self.size, self.scale_factor, self.align_corners = size, scale_factor, bool(align_corners)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h, w = x.shape[-2:]
        if self.size is not None:
            size = (self.size, self.size) if isinstance(self.size, int) else tuple(self.size)
            return resize_bicubic(x, size, self.align_corners)
        sf = self.scale_factor if isinstance(self.scale_factor, (tuple, list)) else (self.scale_factor,) * 2
        size = (int(math.floor(h * sf[0])), int(math.floor(w * sf[1])))
        return resize_bicubic(x, size, self.align_corners, scale_factor=tuple(float(s) for s in sf))


def _swap_upsample(m: nn.Upsample) -> nn.Module | None:
    if m.mode != "bicubic":
        return None
    return BicubicResize(m.size, m.scale_factor, bool(m.align_corners))


# --- grid_sample as tent-weight matmuls -----------------------------------------------------------------


def _unnormalize(g: torch.Tensor, size: int, align_corners: bool) -> torch.Tensor:
    """Grid coordinate in [-1, 1] -> pixel coordinate, as torch.grid_sampler does."""
    if align_corners:
        return (g + 1.0) * ((size - 1) / 2.0)
    return ((g + 1.0) * size - 1.0) / 2.0


def _clamp_border(ix: torch.Tensor, size: int) -> torch.Tensor:
    # max/min through negation so that a (0, 1) clamp can never fuse into RELU_0_TO_1.
    return -torch.clamp_min(-torch.clamp_min(ix, 0.0), -(size - 1.0))


def tent_weights(coord: torch.Tensor, size: int) -> torch.Tensor:
    """[N, P, 1] pixel coordinates -> [N, P, size] bilinear weights relu(1 - |coord - j|).

    Exactly the bilinear interpolation weights of the two neighbouring pixels, and 0 for every pixel
    outside the map (zero padding). Public: RF-DETR's deformable sampler builds its kernels from it."""
    # A copy per pixel as a broadcasting MUL with a ones row (no BROADCAST_TO is emitted). The previous form,
    # an FC against a [size, 1] ones matrix, is accepted by LiteRT's GPU delegate but computed wrongly at rank 3
    # ([1, 30, 1] → [1, 30, size]: only row 0 right, even in fp32; measured on RF-DETR's one-hot query selection,
    # cosine 1/30 vs the CPU interpreter). The MUL form is exact on the GPU.
    spread = coord * const_like(np.ones(size), coord)
    return torch.relu(1.0 - torch.abs(spread - const_like(np.arange(size), coord)))


def grid_sample_bilinear(
    x: torch.Tensor,
    grid: torch.Tensor,
    align_corners: bool = False,
    padding_mode: str = "zeros",
    mode: str = "bilinear",
) -> torch.Tensor:
    """F.grid_sample for mode="bilinear", padding "zeros"/"border", as matmuls — no GATHER_ND, rank <= 4.

    x [N, C, H, W], grid [N, Ho, Wo, 2] -> [N, C, Ho, Wo]. Out-of-range taps get weight 0, which is
    exactly zero padding.
    """
    if mode != "bilinear" or padding_mode not in ("zeros", "border"):
        raise NotImplementedError(
            f"grid_sample(mode={mode!r}, padding_mode={padding_mode!r}) has no GPU-clean form here: only "
            "bilinear with zeros/border padding is expressible as tent-weight matmuls. Keep it on the CPU."
        )
    n, c, h, w = x.shape
    _, ho, wo, _ = grid.shape
    p = ho * wo
    g = grid.reshape(n, p, 2)
    ix = _unnormalize(g[..., 0:1], w, align_corners)
    iy = _unnormalize(g[..., 1:2], h, align_corners)
    if padding_mode == "border":
        ix, iy = _clamp_border(ix, w), _clamp_border(iy, h)
    wx, wy = tent_weights(ix, w), tent_weights(iy, h)  # [N, P, W], [N, P, H]
    rows = x.reshape(n, c * h, w) @ wx.transpose(1, 2)  # [N, C*H, P]: every row sampled at every ix
    rows = rows.reshape(n, c, h, p).permute(0, 3, 1, 2)  # [N, P, C, H]
    out = rows @ wy.unsqueeze(-1)  # [N, P, C, 1]: weighted over H, batch dims (N, P) on both sides
    return out.reshape(n, ho, wo, c).permute(0, 3, 1, 2)


def grid_sample_intermediate_bytes(x_shape: tuple[int, ...], grid_shape: tuple[int, ...], itemsize: int = 2) -> int:
    """Largest buffer `grid_sample_bilinear` allocates ([N, P, C, H]), in bytes (fp16 by default)."""
    n, c, h, w = x_shape
    p = grid_shape[1] * grid_shape[2]
    return n * p * c * max(h, w) * itemsize


class GridSample(nn.Module):
    """A module form of F.grid_sample, so models can be swapped instead of edited."""

    def __init__(
        self, align_corners: bool = False, padding_mode: str = "zeros", mode: str = "bilinear", gpu_clean: bool = False
    ):
        super().__init__()
        self.align_corners, self.padding_mode, self.mode, self.gpu_clean = align_corners, padding_mode, mode, gpu_clean

    def forward(self, x: torch.Tensor, grid: torch.Tensor) -> torch.Tensor:
        if self.gpu_clean:
            return grid_sample_bilinear(x, grid, self.align_corners, self.padding_mode, self.mode)
        return F.grid_sample(x, grid, mode=self.mode, padding_mode=self.padding_mode, align_corners=self.align_corners)


def _swap_grid_sample(m: GridSample) -> nn.Module | None:
    if m.gpu_clean or m.mode != "bilinear" or m.padding_mode not in ("zeros", "border"):
        return None
    return GridSample(m.align_corners, m.padding_mode, m.mode, gpu_clean=True)


# --- demos -----------------------------------------------------------------------------------------

_SWAP_CONVT = ModuleSwap(
    (nn.ConvTranspose1d, nn.ConvTranspose2d),
    lambda m: (ZeroStuffConvTranspose1d if isinstance(m, nn.ConvTranspose1d) else ZeroStuffConvTranspose2d)(m),
)
_SWAP_PIXEL_SHUFFLE = ModuleSwap((nn.PixelShuffle,), lambda m: PixelShuffleConvT(m.upscale_factor))
_SWAP_MAXPOOL = ModuleSwap((nn.MaxPool2d,), _swap_maxpool)
_SWAP_BICUBIC = ModuleSwap((nn.Upsample,), _swap_upsample)
_SWAP_GRID = ModuleSwap((GridSample,), _swap_grid_sample)


def _demo_swap(before: nn.Module, swap: ModuleSwap, *args: torch.Tensor) -> Demo:
    before = before.eval()
    return Demo(before, apply_swap(before, swap)[0], args)


def _x(*shape: int, seed: int = 19) -> torch.Tensor:
    return torch.randn(*shape, generator=seeded(seed))


def _demo_convt() -> Demo:
    torch.manual_seed(0)
    return _demo_swap(nn.Sequential(nn.ConvTranspose2d(4, 6, 4, stride=2, padding=1)), _SWAP_CONVT, _x(1, 4, 5, 5))


def _demo_grid() -> Demo:
    grid = torch.rand(1, 4, 5, 2, generator=seeded(20)) * 2.4 - 1.2  # some points fall outside
    return _demo_swap(GridSample(align_corners=False), _SWAP_GRID, _x(1, 3, 6, 7), grid)


REWRITES = [
    Rewrite(
        id="zero_stuff_conv_transpose",
        family="resampling",
        fixes="TRANSPOSE_CONV rejected (seed: version skew); today TRANSPOSE_CONV v3 is accepted",
        targets=(LITERT_GPU,),
        exactness="<=1e-6",
        status=NOT_NEEDED,
        detect=lambda p: tfl.find_ops(p, "GATHER_ND") + tfl.find_rank_over(p),
        demo=_demo_convt,
        swap=_SWAP_CONVT,
        function=zero_stuff_conv_transpose2d,
        emits_before=("TRANSPOSE_CONV",),
    ),
    Rewrite(
        id="pixel_shuffle_conv_transpose",
        family="resampling",
        fixes="rank-6 RESHAPE from PixelShuffle (seed); today rank-4 RESHAPE/TRANSPOSE",
        targets=(LITERT_GPU,),
        exactness="bit-exact",
        status=NOT_NEEDED,
        detect=tfl.find_rank_over,
        demo=lambda: _demo_swap(nn.Sequential(nn.PixelShuffle(2)), _SWAP_PIXEL_SHUFFLE, _x(1, 8, 4, 4)),
        swap=_SWAP_PIXEL_SHUFFLE,
        function=pixel_shuffle_conv_transpose,
        emits_before=("RESHAPE", "TRANSPOSE"),
    ),
    Rewrite(
        id="maxpool_explicit_pad",
        family="resampling",
        fixes="GATHER_ND from MaxPool padding (seed); today PADV2 + MAX_POOL_2D",
        targets=(LITERT_GPU,),
        exactness="bit-exact",
        status=NOT_NEEDED,
        detect=lambda p: tfl.find_ops(p, "GATHER_ND"),
        demo=lambda: _demo_swap(nn.Sequential(nn.MaxPool2d(3, 2, 1)), _SWAP_MAXPOOL, _x(1, 4, 8, 8)),
        swap=_SWAP_MAXPOOL,
        emits_before=("PADV2", "MAX_POOL_2D"),
    ),
    Rewrite(
        id="bicubic_matmul",
        family="resampling",
        fixes="GATHER_ND + BROADCAST_TO from F.interpolate(mode='bicubic')",
        targets=(LITERT_GPU,),
        exactness="<=1e-6",
        status=NEEDED,
        detect=lambda p: tfl.find_ops(p, "GATHER_ND", "BROADCAST_TO") + tfl.find_rank_over(p),
        demo=lambda: _demo_swap(
            nn.Sequential(nn.Upsample(scale_factor=2, mode="bicubic")), _SWAP_BICUBIC, _x(1, 3, 5, 6)
        ),
        swap=_SWAP_BICUBIC,
        function=resize_bicubic,
        emits_before=("GATHER_ND",),
    ),
    Rewrite(
        id="grid_sample_tent",
        family="resampling",
        fixes="GATHER_ND + BROADCAST_TO + rank 5 from F.grid_sample (bilinear, zeros/border padding)",
        targets=(LITERT_GPU, COREAI),
        exactness="<=1e-6",
        status=NEEDED,
        detect=lambda p: tfl.find_ops(p, "GATHER_ND", "BROADCAST_TO") + tfl.find_rank_over(p),
        demo=_demo_grid,
        swap=_SWAP_GRID,
        function=grid_sample_bilinear,
        emits_before=("GATHER_ND",),
        notes="Not for nearest/bicubic modes or reflection padding (raises). Memory O(C*H*P): at real "
        "deformable-attention sizes the [N,P,C,H] buffer exceeds the WebGPU 128 MiB cap.",
    ),
]
