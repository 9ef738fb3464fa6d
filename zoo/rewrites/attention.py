"""Attention: grouped-query K/V sharing, the additive mask, and broadcast batch-matmuls.

Three GPU-delegate traps live in an ordinary GQA block (toolchain.md §3.2):
- repeat_kv as `x[:, :, None].expand(...).reshape(...)` emits BROADCAST_TO on a runtime tensor at rank 5,
  which the delegate rejects (LiteRT#9191). So does `repeat_interleave`, and so does the seed's own fix
  `cat([x[:, i:i+1].expand(...)])` — the expand is still a BROADCAST_TO. Two forms are clean:
  * slice-concat: `cat([x[:, i:i+1] for i ... for _ in range(n_rep)])` — SLICE + CONCATENATION, bit-exact;
  * query fold: reshape the queries to `[B, n_kv, n_rep*S, D]` so each K/V head meets its n_rep query
    heads in one matmul. K/V are never copied, which is why it is the recommended form.
- `scores + mask[1, 1, S, S]` is an ADD broadcast over the head axis right after a BATCH_MATMUL; older
  runtimes computed it wrong after token 0 (LiteRT#8593, fixed in ai-edge-litert 2.3.0). Pre-expanding
  the mask to the scores' shape costs nothing on a constant-shape graph and removes the question.
- a BATCH_MATMUL whose operands broadcast on a batch axis (`[1,1,M,S] @ [1,H,S,D]`, typical of einsum)
  is accepted by the delegate and **wrong even in fp32**. Expand the operand explicitly first.
"""

from __future__ import annotations

import math
from typing import Literal

import torch
from torch import nn

from zoo.rewrites import inspect as tfl
from zoo.rewrites.base import LITERT_GPU, NEEDED, Demo, Lambda, ModuleSwap, Rewrite, apply_swap, seeded

KvForm = Literal["expand", "cat_expand", "slice_concat", "query_fold"]

# The one additive mask value (the GQA LLM, T5, these rewrites). Finite and inside fp16 range on purpose:
# with -inf or finfo.min, a GPU kernel computing in fp16 gets 0 * mask = NaN for every visible key
# (measured: T5's NaN output on the LiteRT GPU's fp16 run); exp(-30000 - max) is exactly 0 in fp32 and fp16.
MASK_VALUE = -30000.0


# --- repeat_kv: the idiom, the seed's fix, and the clean form -------------------------------------------


def repeat_kv_expand(x: torch.Tensor, n_rep: int) -> torch.Tensor:
    """The Hugging Face idiom (the pattern to replace): rank-5 BROADCAST_TO."""
    b, n_kv, s, d = x.shape
    return x[:, :, None].expand(b, n_kv, n_rep, s, d).reshape(b, n_kv * n_rep, s, d)


def repeat_kv_cat_expand(x: torch.Tensor, n_rep: int) -> torch.Tensor:
    """The seed's proposed fix. Rank 4, but each `.expand` still lowers to BROADCAST_TO: rejected."""
    b, n_kv, s, d = x.shape
    return torch.cat([x[:, i : i + 1].expand(b, n_rep, s, d) for i in range(n_kv)], dim=1)


def repeat_kv_slice_concat(x: torch.Tensor, n_rep: int) -> torch.Tensor:
    """K/V head i repeated n_rep times, same head order as repeat_kv: SLICE + CONCATENATION only."""
    n_kv = x.shape[1]
    return torch.cat([x[:, i : i + 1] for i in range(n_kv) for _ in range(n_rep)], dim=1)


def fold_queries(q: torch.Tensor, n_kv: int) -> torch.Tensor:
    """[B, H, S, D] -> [B, n_kv, n_rep*S, D]: query heads of one K/V group become extra rows.

    Query head h uses K/V head h // n_rep, so the groups are contiguous on the head axis and a plain
    reshape does the grouping.
    """
    b, h, s, d = q.shape
    return q.reshape(b, n_kv, (h // n_kv) * s, d)


def unfold_queries(o: torch.Tensor, n_heads: int) -> torch.Tensor:
    """Inverse of `fold_queries`: [B, n_kv, n_rep*S, D] -> [B, H, S, D].

    Through [B*n_kv, n_rep, S, D] (rank 4) on purpose: reshaping [.., n_rep*S, D] straight to [B, H, S, D]
    makes torch.export guard on Min(D, n_rep*D*S) and refuse a dynamic S (an LLM's prefill)."""
    b, n_kv, rows, d = o.shape
    n_rep = n_heads // n_kv
    return o.reshape(b * n_kv, n_rep, rows // n_rep, d).reshape(b, n_heads, rows // n_rep, d)


# --- the mask --------------------------------------------------------------------------------------------


def repeat_along(x: torch.Tensor, dim: int, times: int) -> torch.Tensor:
    """Tile a size-1 axis by concatenation: CONCATENATION, never BROADCAST_TO."""
    return x if times == 1 else torch.cat([x] * times, dim=dim)


def expand_mask_heads(mask: torch.Tensor, n_heads: int) -> torch.Tensor:
    """[B, 1, S, T] -> [B, n_heads, S, T], so the scores + mask ADD has equal shapes."""
    return repeat_along(mask, 1, n_heads // mask.shape[1])


def fold_mask(mask: torch.Tensor, n_kv: int, n_rep: int) -> torch.Tensor:
    """[B, 1, S, T] -> [B, n_kv, n_rep*S, T]: the mask for query-folded scores, fully expanded."""
    return repeat_along(repeat_along(mask, 2, n_rep), 1, n_kv)


# --- BMM with a broadcast batch axis ------------------------------------------------------------------


def matmul_no_broadcast(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """`a @ b` with every batch axis materialised on both operands (no implicit broadcast).

    A BATCH_MATMUL whose operands differ on a batch axis is accepted by the GPU delegate and computes
    the wrong numbers; with equal batch dims it is exact.
    """
    rank = max(a.dim(), b.dim())
    a = a.reshape((1,) * (rank - a.dim()) + tuple(a.shape))
    b = b.reshape((1,) * (rank - b.dim()) + tuple(b.shape))
    for dim in range(rank - 2):
        n = max(a.shape[dim], b.shape[dim])
        if a.shape[dim] != n:
            a = repeat_along(a, dim, n)
        if b.shape[dim] != n:
            b = repeat_along(b, dim, n)
    return a @ b


# --- the attention block ------------------------------------------------------------------------------


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """softmax(q k^T / sqrt(d) + mask) v, with equal batch dims on every matmul."""
    scores = (q * (1.0 / math.sqrt(q.shape[-1]))) @ k.transpose(-1, -2)
    if mask is not None:
        scores = scores + mask
    return scores.softmax(-1) @ v


def query_chunked_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, chunk: int,
                            bias: torch.Tensor | None = None) -> torch.Tensor:
    """softmax(q k^T / sqrt(d) + bias) v on [B, H, L, D], the queries in chunks of `chunk` (0: all at once).

    Why: the score tensor of long sequences exceeds the GPU's buffer limit (the WebGPU adapter's 128 MiB: LTX-Video's
    3168-token scores are 642 MB in fp16, TripoSplat's 12,294 tokens at chunk 2048 needed 512 MiB and were refused,
    chunk 256 accepted) and, unchunked, converting TripoSplat's DiT exceeded 19 GB on Core AI (models.md). Each chunk
    is an exact slice of the same computation, so the result equals the unchunked one to fp32 rounding.
    """
    scale = 1.0 / math.sqrt(q.shape[-1])
    kt = k.transpose(-1, -2)
    starts = range(0, q.shape[2], chunk) if chunk and chunk < q.shape[2] else [0]
    outs = []
    for start in starts:
        scores = ((q[:, :, start:start + chunk] if len(starts) > 1 else q) @ kt) * scale
        if bias is not None:
            scores = scores + bias
        outs.append(torch.softmax(scores, dim=-1) @ v)
    return outs[0] if len(outs) == 1 else torch.cat(outs, dim=2)


class GQAAttention(nn.Module):
    """Llama-style grouped-query self-attention; `kv_form` and `expand_mask` pick the lowering.

    All forms have the same parameters (the state dict of one loads into any other). `mask` is an
    additive [B, 1, S, S] float mask (0 / large negative) given as a graph input.
    """

    def __init__(self, dim: int, n_heads: int, n_kv_heads: int, kv_form: KvForm = "expand", expand_mask: bool = False):
        super().__init__()
        assert n_heads % n_kv_heads == 0
        self.n_heads, self.n_kv, self.head_dim = n_heads, n_kv_heads, dim // n_heads
        self.kv_form, self.expand_mask = kv_form, expand_mask
        self.q_proj = nn.Linear(dim, n_heads * self.head_dim, bias=False)
        self.k_proj = nn.Linear(dim, n_kv_heads * self.head_dim, bias=False)
        self.v_proj = nn.Linear(dim, n_kv_heads * self.head_dim, bias=False)
        self.o_proj = nn.Linear(n_heads * self.head_dim, dim, bias=False)

    def variant(self, **changes) -> "GQAAttention":
        """The same weights under another lowering."""
        cfg = dict(kv_form=self.kv_form, expand_mask=self.expand_mask) | changes
        dim = self.q_proj.in_features
        new = GQAAttention(dim, self.n_heads, self.n_kv, **cfg)
        new.load_state_dict(self.state_dict())
        return new

    def _heads(self, t: torch.Tensor, n: int) -> torch.Tensor:
        b, s, _ = t.shape
        return t.reshape(b, s, n, self.head_dim).transpose(1, 2)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        b, s, _ = x.shape
        n_rep = self.n_heads // self.n_kv
        q = self._heads(self.q_proj(x), self.n_heads)
        k = self._heads(self.k_proj(x), self.n_kv)
        v = self._heads(self.v_proj(x), self.n_kv)
        if self.kv_form == "query_fold":
            if mask is not None:
                mask = fold_mask(mask, self.n_kv, n_rep) if self.expand_mask else repeat_along(mask, 2, n_rep)
            out = unfold_queries(attend(fold_queries(q, self.n_kv), k, v, mask), self.n_heads)
        else:
            repeat = {
                "expand": repeat_kv_expand,
                "cat_expand": repeat_kv_cat_expand,
                "slice_concat": repeat_kv_slice_concat,
            }[self.kv_form]
            k, v = repeat(k, n_rep), repeat(v, n_rep)
            if mask is not None and self.expand_mask:
                mask = expand_mask_heads(mask, self.n_heads)
            out = attend(q, k, v, mask)
        return self.o_proj(out.transpose(1, 2).reshape(b, s, self.n_heads * self.head_dim))


# --- demos: a tiny block, seeded weights ----------------------------------------------------------------


def causal_mask_at(positions: torch.Tensor, num_keys: int, neg: float = MASK_VALUE) -> torch.Tensor:
    """Additive causal mask [1, 1, T, num_keys] for float query positions [1, 1, T, 1], lower-right
    aligned: key j is visible to the query at position p iff j <= p. This is the mask SDPA's
    `is_causal=True` does *not* build when q_len != k_len (it aligns upper-left): decode with a cache
    needs this one.

    Built as clamp(p - j + 1, 0, 1) with two ReLUs (exact on integers), so the graph has no comparison
    or integer ops — forms the GPU delegates handle, unlike bool/int chains."""
    keys = torch.arange(num_keys, dtype=torch.float32).reshape(1, 1, 1, num_keys)
    diff = positions - keys + 1.0
    visible = torch.relu(diff) - torch.relu(diff - 1.0)  # 1.0 where j <= p, else 0.0
    return (1.0 - visible) * neg


def causal_mask(s: int, neg: float = MASK_VALUE) -> torch.Tensor:
    """Additive causal mask [1, 1, S, S] for queries at positions 0..S-1."""
    return causal_mask_at(torch.arange(s, dtype=torch.float32).reshape(1, 1, s, 1), s, neg)


def _tiny_gqa(**cfg) -> tuple[GQAAttention, tuple[torch.Tensor, torch.Tensor]]:
    torch.manual_seed(0)
    m = GQAAttention(dim=16, n_heads=4, n_kv_heads=2, **cfg).eval()
    x = torch.randn(1, 5, 16, generator=seeded(1))
    return m, (x, causal_mask(5))


def _swap_kv(form: KvForm) -> ModuleSwap:
    return ModuleSwap(
        (GQAAttention,),
        lambda m: m.variant(kv_form=form, expand_mask=True) if m.kv_form in ("expand", "cat_expand") else None,
    )


def _demo_kv(form: KvForm) -> Demo:
    before, args = _tiny_gqa(kv_form="expand", expand_mask=True)
    return Demo(before, apply_swap(before, _swap_kv(form))[0], args)


def _demo_mask() -> Demo:
    before, args = _tiny_gqa(kv_form="slice_concat", expand_mask=False)
    return Demo(before, apply_swap(before, _SWAP_MASK)[0], args)


_SWAP_MASK = ModuleSwap((GQAAttention,), lambda m: None if m.expand_mask else m.variant(expand_mask=True))


def _demo_bmm() -> Demo:
    # einsum("bms,bhsd->bhmd") with a head-shared operand: the converter emits one broadcast BMM.
    a = torch.randn(1, 3, 5, generator=seeded(2))
    b = torch.randn(1, 2, 5, 4, generator=seeded(3))
    before = Lambda(lambda a, b: torch.einsum("bms,bhsd->bhmd", a, b), "einsum bms,bhsd->bhmd")
    after = Lambda(lambda a, b: matmul_no_broadcast(a[:, None], b), "matmul_no_broadcast")
    return Demo(before, after, (a, b))


def _detect_repeat_kv(path) -> list[str]:
    return tfl.find_ops(path, "BROADCAST_TO") + tfl.find_rank_over(path)


REWRITES = [
    Rewrite(
        id="gqa_repeat_kv_slice_concat",
        family="attention",
        fixes="BROADCAST_TO (runtime tensor, rank 5) from repeat_kv expand/repeat_interleave: "
        "'BROADCAST_TO: Not supported' — the seed's cat(expand) fix still emits BROADCAST_TO",
        targets=(LITERT_GPU,),
        exactness="bit-exact",
        status=NEEDED,
        detect=_detect_repeat_kv,
        demo=lambda: _demo_kv("slice_concat"),
        swap=_swap_kv("slice_concat"),
        function=repeat_kv_slice_concat,
        emits_before=("BROADCAST_TO",),
        upstream="google-ai-edge/LiteRT#9191",
    ),
    Rewrite(
        id="gqa_query_fold",
        family="attention",
        fixes="BROADCAST_TO (runtime tensor, rank 5) from repeat_kv; never copies K/V",
        targets=(LITERT_GPU,),
        exactness="<=1e-6",
        status=NEEDED,
        detect=_detect_repeat_kv,
        demo=lambda: _demo_kv("query_fold"),
        swap=_swap_kv("query_fold"),
        function=fold_queries,
        emits_before=("BROADCAST_TO",),
        upstream="google-ai-edge/LiteRT#9191",
        notes="Fold the mask with fold_mask(); unfold the output with unfold_queries().",
    ),
    Rewrite(
        id="mask_pre_expand",
        family="attention",
        fixes="silent miscompute: ADD of a BATCH_MATMUL result and a head-broadcast mask [1,1,S,S] "
        "(token 0 right, later tokens wrong) on runtimes before ai-edge-litert 2.3.0",
        targets=(LITERT_GPU,),
        exactness="bit-exact",
        status=NEEDED,
        detect=tfl.find_broadcast_add_after_bmm,
        demo=_demo_mask,
        swap=_SWAP_MASK,
        function=expand_mask_heads,
        emits_before=("BATCH_MATMUL", "ADD"),
        failure="numeric-gpu",
        reproduces_on_checker=False,
        upstream="google-ai-edge/LiteRT#8593",
        notes="Fixed in the ai-edge-litert 2.3.0 runtime (exact on the WebGPU checker); kept for devices "
        "running older runtimes.",
    ),
    Rewrite(
        id="bmm_pre_expand",
        family="attention",
        fixes="silent miscompute: BATCH_MATMUL with an operand broadcast on a batch axis "
        "([1,1,M,S] @ [1,H,S,D]) is accepted by the GPU delegate and wrong even in fp32",
        targets=(LITERT_GPU,),
        exactness="bit-exact",
        status=NEEDED,
        detect=tfl.find_broadcast_bmm,
        demo=_demo_bmm,
        function=matmul_no_broadcast,
        emits_before=("BATCH_MATMUL",),
        failure="numeric-gpu",
    ),
]
