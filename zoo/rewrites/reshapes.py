"""Rank-5/6 reshapes and transposes (window attention, einops rearrange, packed-QKV head splits).

The GPU delegate handles tensors up to rank 4 ("bad input dims size: 6"). A rearrange only moves data,
so any permutation of a rank-6 view can be done with rank-4 steps:
1. drop size-1 axes and merge input axes that stay adjacent (and in order) in the output — Swin's
   window partition (B, nH, w, nW, w, C) -> (B, nH, nW, w, w, C) becomes a single rank-4 transpose
   (B*nH, w, nW, w*C) -> (B*nH, nW, w, w*C);
2. if more than 4 merged axes remain, move one axis at a time to its place: moving an axis in front of
   the block before it is a transpose of a rank-4 view (prefix, block, axis, suffix).
Every step is bit-exact (no arithmetic).
"""

from __future__ import annotations

import math
from typing import Sequence

import torch
from torch import nn

from zoo.rewrites import inspect as tfl
from zoo.rewrites.base import LITERT_GPU, NEEDED, Demo, Lambda, ModuleSwap, Rewrite, apply_swap, seeded


def _merge_runs(shape: Sequence[int], perm: Sequence[int]) -> tuple[list[int], list[int]]:
    """Drop size-1 axes, then merge input axes that are consecutive in both input and output order.

    Returns (merged input shape, permutation over merged axes).
    """
    kept = [a for a in perm if shape[a] != 1]
    order = sorted(kept)
    runs: list[list[int]] = []  # runs of input axes, in output order
    for a in kept:
        if runs and order.index(a) == order.index(runs[-1][-1]) + 1:
            runs[-1].append(a)
        else:
            runs.append([a])
    by_input = sorted(range(len(runs)), key=lambda r: runs[r][0])  # merged axes in input order
    merged_shape = [math.prod(shape[a] for a in runs[r]) for r in by_input]
    merged_perm = [by_input.index(r) for r in range(len(runs))]
    return merged_shape, merged_perm


def permute_rank4(x: torch.Tensor, shape: Sequence[int], perm: Sequence[int], out_shape: Sequence[int]) -> torch.Tensor:
    """x.reshape(shape).permute(perm).reshape(out_shape) without any tensor of rank > 4.

    `out_shape` must itself have rank <= 4 (merge output axes as the consumer needs them).
    """
    assert len(out_shape) <= 4, "the result itself must be rank <= 4"
    sizes, order = _merge_runs(shape, perm)
    if len(sizes) <= 4:
        return x.reshape(sizes).permute(order).reshape(out_shape)
    # Insertion sort on the merged axes: bring order[i] to position i, one rank-4 transpose each.
    cur = list(range(len(sizes)))  # merged axis ids in current memory order
    y = x.reshape(-1)
    for i, want in enumerate(order):
        j = cur.index(want)
        if j == i:
            continue
        pre = math.prod(sizes[a] for a in cur[:i])
        block = math.prod(sizes[a] for a in cur[i:j])
        post = math.prod(sizes[a] for a in cur[j + 1 :])
        y = y.reshape(pre, block, sizes[want], post).transpose(1, 2)
        cur = cur[:i] + [want] + cur[i:j] + cur[j + 1 :]
    return y.reshape(out_shape)


# --- window attention (Swin) ----------------------------------------------------------------------


def window_partition(x: torch.Tensor, w: int) -> torch.Tensor:
    """[B, H, W, C] -> [B*nH*nW, w*w, C] windows (Swin order), at rank <= 4."""
    b, h, wd, c = x.shape
    return permute_rank4(x, (b, h // w, w, wd // w, w, c), (0, 1, 3, 2, 4, 5), (b * (h // w) * (wd // w), w * w, c))


def window_reverse(win: torch.Tensor, w: int, h: int, wd: int) -> torch.Tensor:
    """Inverse of window_partition: [B*nH*nW, w*w, C] -> [B, H, W, C]."""
    c = win.shape[-1]
    b = win.shape[0] // ((h // w) * (wd // w))
    return permute_rank4(win, (b, h // w, wd // w, w, w, c), (0, 1, 3, 2, 4, 5), (b, h, wd, c))


def split_qkv_heads(qkv: torch.Tensor, n_heads: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """[B, S, 3*C] -> q, k, v each [B, H, S, D], for `qkv.reshape(B,S,3,H,D).permute(2,0,3,1,4)`."""
    b, s, c3 = qkv.shape
    d = c3 // (3 * n_heads)
    t = permute_rank4(qkv, (b, s, 3, n_heads, d), (2, 0, 3, 1, 4), (3, b * n_heads, s, d))
    return tuple(t[i].reshape(b, n_heads, s, d) for i in range(3))


def _window_partition_naive(x: torch.Tensor, w: int) -> torch.Tensor:
    b, h, wd, c = x.shape
    return x.view(b, h // w, w, wd // w, w, c).permute(0, 1, 3, 2, 4, 5).reshape(-1, w * w, c)


def _window_reverse_naive(win: torch.Tensor, w: int, h: int, wd: int) -> torch.Tensor:
    b = win.shape[0] // ((h // w) * (wd // w))
    return win.view(b, h // w, wd // w, w, w, -1).permute(0, 1, 3, 2, 4, 5).reshape(b, h, wd, -1)


def _split_qkv_naive(qkv: torch.Tensor, n_heads: int):
    b, s, c3 = qkv.shape
    t = qkv.reshape(b, s, 3, n_heads, c3 // (3 * n_heads)).permute(2, 0, 3, 1, 4)
    return t[0], t[1], t[2]


class WindowAttention(nn.Module):
    """Swin-style windowed self-attention over an NHWC map; `rank4` picks the rank-<=4 reshapes."""

    def __init__(self, dim: int = 8, n_heads: int = 2, window: int = 4, rank4: bool = False):
        super().__init__()
        self.n_heads, self.window, self.rank4 = n_heads, window, rank4
        self.qkv = nn.Linear(dim, 3 * dim, bias=False)
        self.proj = nn.Linear(dim, dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [B, H, W, C]
        _, h, wd, c = x.shape
        partition, reverse, split = (
            (window_partition, window_reverse, split_qkv_heads)
            if self.rank4
            else (_window_partition_naive, _window_reverse_naive, _split_qkv_naive)
        )
        win = partition(x, self.window)  # [nW*B, N, C]
        q, k, v = split(self.qkv(win), self.n_heads)
        att = ((q * (q.shape[-1] ** -0.5)) @ k.transpose(-1, -2)).softmax(-1) @ v  # [nW*B, H, N, D]
        out = att.transpose(1, 2).reshape(win.shape[0], win.shape[1], c)
        return reverse(self.proj(out), self.window, h, wd)


def patchify_naive(x: torch.Tensor, p: int) -> torch.Tensor:
    """einops `b c (h p1) (w p2) -> b (h w) (p1 p2 c)`, as einops lowers it: a rank-6 permute."""
    b, c, hh, ww = x.shape
    return (
        x.reshape(b, c, hh // p, p, ww // p, p).permute(0, 2, 4, 3, 5, 1).reshape(b, (hh // p) * (ww // p), p * p * c)
    )


def patchify(x: torch.Tensor, p: int) -> torch.Tensor:
    b, c, hh, ww = x.shape
    return permute_rank4(x, (b, c, hh // p, p, ww // p, p), (0, 2, 4, 3, 5, 1), (b, (hh // p) * (ww // p), p * p * c))


def _demo_window() -> Demo:
    torch.manual_seed(0)
    before = WindowAttention().eval()
    after = apply_swap(before, _SWAP_WINDOW)[0]
    return Demo(before, after, (torch.randn(2, 8, 8, 8, generator=seeded(21)),))


def _demo_patchify() -> Demo:
    return Demo(
        Lambda(lambda x: patchify_naive(x, 2), "rearrange b c (h p1) (w p2) -> b (h w) (p1 p2 c)"),
        Lambda(lambda x: patchify(x, 2), "patchify"),
        (torch.randn(2, 3, 4, 6, generator=seeded(22)),),
    )


_SWAP_WINDOW = ModuleSwap((WindowAttention,), lambda m: None if m.rank4 else _rank4_copy(m))


def _rank4_copy(m: WindowAttention) -> WindowAttention:
    new = WindowAttention(m.qkv.in_features, m.n_heads, m.window, rank4=True)
    new.load_state_dict(m.state_dict())
    return new


REWRITES = [
    Rewrite(
        id="window_attention_rank4",
        family="reshapes",
        fixes="rank-6 RESHAPE/TRANSPOSE from Swin window partition/reverse and rank-5 packed-QKV head "
        "split: 'bad input dims size: 6'",
        targets=(LITERT_GPU,),
        exactness="bit-exact",
        status=NEEDED,
        detect=tfl.find_rank_over,
        demo=_demo_window,
        swap=_SWAP_WINDOW,
        function=window_partition,
        emits_before=("TRANSPOSE",),
        notes="Also window_reverse() and split_qkv_heads().",
    ),
    Rewrite(
        id="einops_rank4",
        family="reshapes",
        fixes="rank-5/6 RESHAPE/TRANSPOSE from einops.rearrange patterns (patchify, head splits)",
        targets=(LITERT_GPU,),
        exactness="bit-exact",
        status=NEEDED,
        detect=tfl.find_rank_over,
        demo=_demo_patchify,
        function=permute_rank4,
        emits_before=("TRANSPOSE",),
    ),
]
