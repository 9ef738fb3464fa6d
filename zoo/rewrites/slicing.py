"""Strided slices and edge padding: the seed's GATHER_ND sources that are data movement only.

Measured on litert-torch 0.10 / jax 0.10.2 (toolchain.md §1: the jax version decides this):
- `x[:, :, ::2]`, Focus `x[..., ::2, ::2]`: STRIDED_SLICE at any rank — the seed's GATHER_ND is gone.
- `F.pad(mode="reflect")` on a rank-4 tensor: MIRROR_PAD — also gone.
- but `F.pad(mode="reflect")` on a rank-3 tensor (1-D signals: audio, STFT centering) and
  `mode="replicate"` at rank 3 *and* 4 still lower to GATHER_ND. So the edge-pad rewrite is needed.

Edge padding here never gathers: the pad region is a constant selection of the first/last few samples,
taken as a matmul with a 0/1 matrix (one nonzero per column, so it is exact for finite inputs).
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

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
    const_like,
    seeded,
)

# --- strided slice ---------------------------------------------------------------------------------


def every_nth(x: torch.Tensor, dim: int, step: int, start: int = 0) -> torch.Tensor:
    """x.narrow(dim)[start::step] as reshape + slice at rank <= 4 (no STRIDED_SLICE, no GATHER_ND)."""
    dim %= x.dim()
    size = x.shape[dim]
    full = (size - start) // step
    lead = 1
    for d in x.shape[:dim]:
        lead *= d
    tail = 1
    for d in x.shape[dim + 1 :]:
        tail *= d
    grouped = x.narrow(dim, start, full * step).reshape(lead, full, step, tail)
    y = grouped[:, :, 0:1, :].reshape(tuple(x.shape[:dim]) + (full,) + tuple(x.shape[dim + 1 :]))
    last = start + full * step
    if last < size:  # one more element past the last whole group
        y = torch.cat([y, x.narrow(dim, last, 1)], dim=dim)
    return y


def focus_space_to_depth(x: torch.Tensor) -> torch.Tensor:
    """YOLOv5 Focus stem: the four 2x2 phases of an NCHW image stacked on channels."""
    rows = [every_nth(x, 2, 2, 0), every_nth(x, 2, 2, 1)]
    r0c0, r1c0 = (every_nth(r, 3, 2, 0) for r in rows)
    r0c1, r1c1 = (every_nth(r, 3, 2, 1) for r in rows)
    return torch.cat([r0c0, r1c0, r0c1, r1c1], dim=1)


def _focus_naive(x: torch.Tensor) -> torch.Tensor:
    return torch.cat([x[..., ::2, ::2], x[..., 1::2, ::2], x[..., ::2, 1::2], x[..., 1::2, 1::2]], dim=1)


# --- edge padding ----------------------------------------------------------------------------------


def take_last_axis(x: torch.Tensor, indices: list[int]) -> torch.Tensor:
    """x[..., indices] for constant indices, as a matmul with a one-hot matrix (no GATHER).

    Only the span [min, max] of the indices is multiplied. Exact for finite x (each output is 1*x_i plus
    zeros).
    """
    lo, hi = min(indices), max(indices)
    sel = np.zeros((hi - lo + 1, len(indices)))
    sel[np.asarray(indices) - lo, np.arange(len(indices))] = 1.0
    return x.narrow(-1, lo, hi - lo + 1) @ const_like(sel, x)


def _edge_indices(size: int, left: int, right: int, mode: str) -> tuple[list[int], list[int]]:
    if mode == "reflect":
        assert left < size and right < size, "reflect pad must be smaller than the axis"
        return list(range(left, 0, -1)), list(range(size - 2, size - 2 - right, -1))
    if mode == "replicate":
        return [0] * left, [size - 1] * right
    raise NotImplementedError(f"edge pad mode {mode!r}: only 'reflect' and 'replicate'")


def _pad_last_axis(x: torch.Tensor, left: int, right: int, mode: str) -> torch.Tensor:
    before, after = _edge_indices(x.shape[-1], left, right, mode)
    parts = ([take_last_axis(x, before)] if before else []) + [x] + ([take_last_axis(x, after)] if after else [])
    return torch.cat(parts, dim=-1) if len(parts) > 1 else x


def pad_edges(x: torch.Tensor, pad: tuple[int, ...], mode: str) -> torch.Tensor:
    """F.pad(x, pad, mode) for mode "reflect" / "replicate", any rank, without GATHER_ND.

    `pad` is F.pad's: (left, right) of the last axis first, then the axis before it, ...
    """
    for k in range(len(pad) // 2):
        left, right = pad[2 * k], pad[2 * k + 1]
        if left == right == 0:
            continue
        dim = x.dim() - 1 - k
        if dim == x.dim() - 1:
            x = _pad_last_axis(x, left, right, mode)
        else:
            x = _pad_last_axis(x.transpose(dim, -1), left, right, mode).transpose(dim, -1)
    return x


class EdgePad(nn.Module):
    def __init__(self, pad: tuple[int, ...], mode: str):
        super().__init__()
        self.pad, self.mode = tuple(pad), mode

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return pad_edges(x, self.pad, self.mode)


def _edge_pad_from(m: nn.Module) -> EdgePad:
    mode = "reflect" if isinstance(m, (nn.ReflectionPad1d, nn.ReflectionPad2d, nn.ReflectionPad3d)) else "replicate"
    return EdgePad(m.padding, mode)


_SWAP_EDGE = ModuleSwap(
    (nn.ReflectionPad1d, nn.ReplicationPad1d, nn.ReplicationPad2d, nn.ReplicationPad3d), _edge_pad_from
)
_SWAP_REFLECT_2D = ModuleSwap((nn.ReflectionPad2d,), _edge_pad_from)


def _demo_pad(module: nn.Module, swap: ModuleSwap, shape: tuple[int, ...]) -> Demo:
    before = nn.Sequential(module)
    return Demo(before, apply_swap(before, swap)[0], (torch.randn(*shape, generator=seeded(17)),))


def _demo_stride() -> Demo:
    return Demo(
        Lambda(_focus_naive, "focus x[..., ::2, ::2]"),
        Lambda(focus_space_to_depth),
        (torch.randn(1, 3, 8, 8, generator=seeded(18)),),
    )


REWRITES = [
    Rewrite(
        id="stride_slice_reshape",
        family="slicing",
        fixes="GATHER_ND from stride-2 slicing (x[:, ::2], Focus stems, patch merging) — seed; today STRIDED_SLICE",
        targets=(LITERT_GPU,),
        exactness="bit-exact",
        status=NOT_NEEDED,
        detect=lambda p: tfl.find_ops(p, "GATHER_ND") + tfl.find_rank_over(p),
        demo=_demo_stride,
        function=every_nth,
        emits_before=("STRIDED_SLICE",),
    ),
    Rewrite(
        id="reflect_pad_2d",
        family="slicing",
        fixes="GATHER_ND from reflect-mode F.pad (seed); today MIRROR_PAD at rank 4",
        targets=(LITERT_GPU,),
        exactness="bit-exact",
        status=NOT_NEEDED,
        detect=lambda p: tfl.find_ops(p, "GATHER_ND"),
        demo=lambda: _demo_pad(nn.ReflectionPad2d(2), _SWAP_REFLECT_2D, (1, 3, 8, 8)),
        swap=_SWAP_REFLECT_2D,
        function=pad_edges,
        emits_before=("MIRROR_PAD",),
    ),
    Rewrite(
        id="edge_pad",
        family="slicing",
        fixes="GATHER_ND from reflect pad on rank-3 tensors (1-D signals) and from replicate pad at "
        "rank 3 and 4 — not defused by litert-torch 0.10",
        targets=(LITERT_GPU,),
        exactness="bit-exact",
        status=NEEDED,
        detect=lambda p: tfl.find_ops(p, "GATHER_ND"),
        demo=lambda: _demo_pad(nn.ReflectionPad1d(3), _SWAP_EDGE, (1, 2, 16)),
        swap=_SWAP_EDGE,
        function=pad_edges,
        emits_before=("GATHER_ND",),
    ),
]
