"""A re-authored Llama-family GQA decoder, written so that it lowers cleanly to Core AI and LiteRT.

The parameter tree is the one transformers' `LlamaForCausalLM` uses (`model.embed_tokens`,
`model.layers.{i}.self_attn.{q,k,v,o}_proj`, `model.layers.{i}.mlp.{gate,up,down}_proj`,
`model.layers.{i}.{input,post_attention}_layernorm`, `model.norm`, `lm_head`), so a real checkpoint
loads with `strict=True`. Qwen2 (q/k/v bias) and Qwen3 (per-head q/k RMSNorm) are two config flags.

What differs from the upstream implementation, and why:
- RoPE comes from cos/sin tables computed once in fp32 and indexed by position. No `inv_freq` buffer
  ever exists in half precision, and the exported graph carries no trigonometry.
- GQA is a *query fold*: the `n_rep` query heads that share one KV head are stacked along the
  sequence axis (`[B, n_kv, n_rep*T, D]`) and attend to the KV head directly. K/V are never copied
  or broadcast, so no BROADCAST_TO and no rank-5 tensor appear (transformers' `repeat_kv` is
  expand + reshape through rank 5).
- Masks and one-hot position matrices are built with float arithmetic only (sub, abs, relu):
  no comparisons, no integer chains, no `is_causal` (which is upper-left when q_len != k_len).

Three forward forms share the same modules and weights:
- `GQAForCausalLM.forward(input_ids)`: cache-free, all-position logits (the eager reference form);
- `CoreAIStatefulLM`: K/V caches are registered buffers written by slice assignment, which
  coreai-torch turns into Core AI *states* shared by the `prefill` and `decode` functions;
- `LiteRTCacheIOLM`: K/V caches are explicit rank-4 inputs/outputs and are written by a one-hot
  matmul; every broadcast the LiteRT GPU delegate mishandles is pre-expanded with `torch.cat`.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from zoo.targets.coreai_form import pretranspose_linears
from zoo.targets import Entry

# The additive mask value and the causal mask are the rewrite library's (one definition for the zoo).
from zoo.rewrites.attention import MASK_VALUE, causal_mask_at as causal_mask  # noqa: E402,F401
from zoo.rewrites.attention import fold_queries, repeat_along, unfold_queries  # noqa: E402


# --------------------------------------------------------------------------------------------
# Config
# --------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class GQAConfig:
    """Architecture as data. Field names are ours; `from_hf_config` maps a transformers config."""

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rope_theta: float = 10000.0
    rms_eps: float = 1e-5
    tie_embeddings: bool = True
    max_seq_len: int = 2048
    qkv_bias: bool = False  # Qwen2: q/k/v projections carry a bias (o_proj does not)
    qk_norm: bool = False  # Qwen3: RMSNorm over head_dim on q and k, before RoPE

    def __post_init__(self):
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"num_heads={self.num_heads} is not a multiple of num_kv_heads={self.num_kv_heads}")

    @property
    def n_rep(self) -> int:
        """Query heads per KV head."""
        return self.num_heads // self.num_kv_heads

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


# SmolLM2-135M(-Instruct): 30 layers, 9 query heads sharing 3 KV heads, tied embeddings.
SMOLLM2_135M = GQAConfig(
    vocab_size=49152,
    hidden_size=576,
    intermediate_size=1536,
    num_layers=30,
    num_heads=9,
    num_kv_heads=3,
    head_dim=64,
    rope_theta=100000.0,
    rms_eps=1e-5,
    tie_embeddings=True,
    max_seq_len=8192,
)

# Same classes, a few thousand parameters: CI converts and gates this in seconds. It keeps
# SmolLM2's 3:1 query/KV ratio and tied embeddings so the same code paths are exercised.
# The vocabulary is the byte-level tiny tokenizer's (weights.make_tiny_checkpoint).
TINY = GQAConfig(
    vocab_size=260,
    hidden_size=96,
    intermediate_size=192,
    num_layers=2,
    num_heads=6,
    num_kv_heads=2,
    head_dim=16,
    rope_theta=10000.0,
    rms_eps=1e-5,
    tie_embeddings=True,
    max_seq_len=256,
)


class UnsupportedConfig(ValueError):
    """The transformers config asks for something this re-authoring does not implement."""


def from_hf_config(cfg: dict) -> GQAConfig:
    """Build a GQAConfig from a transformers config.json dict (llama / qwen2 / qwen3).

    Refuses (rather than silently ignores) options that would change the numerics: RoPE scaling,
    sliding windows, MLP/o_proj biases, activations other than SiLU.
    """
    model_type = cfg.get("model_type", "llama")
    if model_type not in ("llama", "qwen2", "qwen3"):
        raise UnsupportedConfig(f"model_type={model_type!r}: only llama, qwen2 and qwen3 are supported")
    if cfg.get("hidden_act", "silu") != "silu":
        raise UnsupportedConfig(f"hidden_act={cfg['hidden_act']!r}: only silu is supported")
    if cfg.get("mlp_bias"):
        raise UnsupportedConfig("mlp_bias=True is not supported")
    if cfg.get("use_sliding_window"):
        raise UnsupportedConfig("sliding-window attention is not supported")

    # transformers 5 keeps RoPE settings in `rope_parameters`; 4.x used rope_theta + rope_scaling.
    rope = dict(cfg.get("rope_parameters") or {})
    rope_type = rope.get("rope_type", rope.get("type", "default"))
    scaling = cfg.get("rope_scaling")
    if rope_type != "default" or (scaling and scaling.get("rope_type", scaling.get("type")) != "default"):
        raise UnsupportedConfig(f"RoPE scaling ({rope_type!r} / {scaling!r}) is not supported")
    rope_theta = float(rope.get("rope_theta", cfg.get("rope_theta", 10000.0)))

    attention_bias = bool(cfg.get("attention_bias", False))
    if model_type == "llama" and attention_bias:
        raise UnsupportedConfig("llama attention_bias=True (bias on o_proj too) is not supported")
    if model_type == "qwen3" and attention_bias:
        raise UnsupportedConfig("qwen3 attention_bias=True is not supported")

    heads = int(cfg["num_attention_heads"])
    return GQAConfig(
        vocab_size=int(cfg["vocab_size"]),
        hidden_size=int(cfg["hidden_size"]),
        intermediate_size=int(cfg["intermediate_size"]),
        num_layers=int(cfg["num_hidden_layers"]),
        num_heads=heads,
        num_kv_heads=int(cfg.get("num_key_value_heads") or heads),
        head_dim=int(cfg.get("head_dim") or cfg["hidden_size"] // heads),
        rope_theta=rope_theta,
        rms_eps=float(cfg.get("rms_norm_eps", 1e-6)),
        # LlamaConfig and Qwen2Config both default to untied embeddings.
        tie_embeddings=bool(cfg.get("tie_word_embeddings", False)),
        max_seq_len=int(cfg.get("max_position_embeddings", 2048)),
        qkv_bias=model_type == "qwen2",
        qk_norm=model_type == "qwen3",
    )


# --------------------------------------------------------------------------------------------
# Building blocks
# --------------------------------------------------------------------------------------------
class RMSNorm(nn.Module):
    """x / sqrt(mean(x^2) + eps) * weight, computed in fp32 whatever the module dtype."""

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x = x.float()
        mean_square = (x * x).mean(-1, keepdim=True)
        return self.weight * (x * torch.rsqrt(mean_square + self.eps)).to(dtype)


def rope_tables(head_dim: int, theta: float, length: int) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin tables [length, head_dim] for the half-split RoPE layout, computed in fp32.

    Same arithmetic as transformers' default RoPE (fp32 inv_freq, fp32 outer product), so the
    tables match the reference bit for bit.
    """
    exponents = torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim
    inv_freq = 1.0 / (theta**exponents)
    angles = torch.arange(length, dtype=torch.float32)[:, None] * inv_freq[None, :]
    angles = torch.cat([angles, angles], dim=-1)
    return angles.cos(), angles.sin()


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat([-x[..., half:], x[..., :half]], dim=-1)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [B, H, T, D]; cos/sin [T, D] (broadcast over batch and heads)."""
    return x * cos + rotate_half(x) * sin


# Position arithmetic is done on rank-4 [1, 1, T, *] tensors. Measured on the LiteRT GPU delegate
# (WebGPU, fp32): a *runtime* tensor broadcast along axis 0 of a rank-1/2 tensor — `[1] + [T]`,
# `[1, 1] + [T, 1]`, `[1, T] - [S, 1]` — is accepted but computes garbage (start + 0 in every lane);
# the same arithmetic broadcasting along the inner axes of a rank-4 tensor is exact. Keeping every
# position-derived tensor rank 4 with batch 1 avoids that class of miscompute.


def position_column(start: torch.Tensor, t: int) -> torch.Tensor:
    """Absolute positions start .. start+t-1 as a float [1, 1, t, 1] tensor (start: [1] int)."""
    return start.reshape(1, 1, 1, 1).float() + torch.arange(t, dtype=torch.float32).reshape(1, 1, t, 1)


def one_hot_rows(positions: torch.Tensor, num_cols: int) -> torch.Tensor:
    """[1, 1, T, num_cols]: 1.0 at column positions[..., t, 0] of row t (no 1 if out of range).

    relu(1 - |p - j|) is 1 exactly at j == p and 0 at every other integer: a gather-free,
    comparison-free one-hot.
    """
    cols = torch.arange(num_cols, dtype=torch.float32).reshape(1, 1, 1, num_cols)
    return F.relu(1.0 - (positions - cols).abs())


class Attention(nn.Module):
    """GQA self-attention. `project` makes rotated q/k/v; `attend` runs the query-folded attention."""

    def __init__(self, cfg: GQAConfig):
        super().__init__()
        self.cfg = cfg
        d, hd = cfg.hidden_size, cfg.head_dim
        self.q_proj = nn.Linear(d, cfg.num_heads * hd, bias=cfg.qkv_bias)
        self.k_proj = nn.Linear(d, cfg.num_kv_heads * hd, bias=cfg.qkv_bias)
        self.v_proj = nn.Linear(d, cfg.num_kv_heads * hd, bias=cfg.qkv_bias)
        self.o_proj = nn.Linear(cfg.num_heads * hd, d, bias=False)
        if cfg.qk_norm:
            self.q_norm = RMSNorm(hd, cfg.rms_eps)
            self.k_norm = RMSNorm(hd, cfg.rms_eps)

    def project(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
        """x [B, T, hidden] -> q [B, H, T, D], k and v [B, n_kv, T, D]; RoPE applied to q and k."""
        b, t, _ = x.shape
        hd = self.cfg.head_dim
        q = self.q_proj(x).reshape(b, t, self.cfg.num_heads, hd)
        k = self.k_proj(x).reshape(b, t, self.cfg.num_kv_heads, hd)
        v = self.v_proj(x).reshape(b, t, self.cfg.num_kv_heads, hd)
        if self.cfg.qk_norm:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        cos, sin = cos.to(x.dtype), sin.to(x.dtype)
        return apply_rope(q, cos, sin), apply_rope(k, cos, sin), v

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """q [B, H, T, D] against k/v [B, n_kv, S, D], additive mask [1, 1, T, S] -> [B, T, hidden].

        Query fold: heads h = kv*n_rep + r (the grouping transformers' repeat_kv implies) become
        rows r*T + t of KV head kv, so both matmuls are plain batched matmuls with equal batch
        dims — no K/V copy, no broadcast operand (the LiteRT GPU BMM-broadcast bug).
        """
        cfg = self.cfg
        b, _, t, hd = q.shape
        s = k.shape[2]
        g = b * cfg.num_kv_heads
        # Rank-3 bmm over (batch x KV head). Unfolding goes through [g, n_rep, T, D] on purpose:
        # reshaping [g, n_rep*T, D] straight to [B, H, T, D] makes torch.export guard on
        # Min(D, n_rep*D*T) and refuse a dynamic T (prefill).
        q = fold_queries(q, cfg.num_kv_heads).reshape(g, cfg.n_rep * t, hd)
        scores = torch.bmm(q, k.reshape(g, s, hd).transpose(1, 2)) * (hd**-0.5)
        # The mask repeats once per folded query head (torch.cat: a concrete tensor, not a
        # broadcast) and is added at rank 4, where its broadcast over KV heads is an inner axis.
        mask = repeat_along(mask, 2, cfg.n_rep)
        scores = scores.reshape(b, cfg.num_kv_heads, cfg.n_rep * t, s) + mask
        probs = torch.softmax(scores.float(), dim=-1).to(q.dtype).reshape(g, cfg.n_rep * t, s)
        out = torch.bmm(probs, v.reshape(g, s, hd)).reshape(b, cfg.num_kv_heads, cfg.n_rep * t, hd)
        out = unfold_queries(out, cfg.num_heads)
        return self.o_proj(out.transpose(1, 2).reshape(b, t, cfg.num_heads * hd))


class MLP(nn.Module):
    def __init__(self, cfg: GQAConfig):
        super().__init__()
        self.gate_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.up_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    def __init__(self, cfg: GQAConfig):
        super().__init__()
        self.self_attn = Attention(cfg)
        self.mlp = MLP(cfg)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_eps)

    def forward(self, h, cos, sin, mask, kv_update=None):
        """One pre-norm block. `kv_update(k, v) -> (k_all, v_all)` lets a caller splice a cache in."""
        q, k, v = self.self_attn.project(self.input_layernorm(h), cos, sin)
        if kv_update is not None:
            k, v = kv_update(k, v)
        h = h + self.self_attn.attend(q, k, v, mask)
        return h + self.mlp(self.post_attention_layernorm(h))


class Backbone(nn.Module):
    """Everything but the LM head; holds the RoPE tables (non-persistent: not in the state dict)."""

    def __init__(self, cfg: GQAConfig):
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(cfg) for _ in range(cfg.num_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_eps)
        cos, sin = rope_tables(cfg.head_dim, cfg.rope_theta, cfg.max_seq_len)
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)


class GQAForCausalLM(nn.Module):
    """The decoder with the state-dict layout of transformers' LlamaForCausalLM."""

    def __init__(self, cfg: GQAConfig):
        super().__init__()
        self.cfg = cfg
        self.model = Backbone(cfg)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        if cfg.tie_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight

    def run_layers(self, h, cos, sin, mask, kv_updates=None) -> torch.Tensor:
        """All blocks + final norm. kv_updates[i] (optional) is layer i's cache hook."""
        for i, layer in enumerate(self.model.layers):
            h = layer(h, cos, sin, mask, None if kv_updates is None else kv_updates[i])
        return self.model.norm(h)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        """Cache-free forward: input_ids [B, T] -> logits [B, T, vocab] (positions 0..T-1)."""
        t = input_ids.shape[1]
        if t > self.cfg.max_seq_len:
            raise ValueError(f"sequence of {t} tokens exceeds max_seq_len={self.cfg.max_seq_len}")
        cos, sin = self.model.rope_cos[:t], self.model.rope_sin[:t]
        mask = causal_mask(torch.arange(t, dtype=torch.float32).reshape(1, 1, t, 1), t)
        h = self.run_layers(self.model.embed_tokens(input_ids), cos, sin, mask)
        return self.lm_head(h)

    # ---- weights -------------------------------------------------------------------------
    def load_hf_state_dict(self, state_dict: dict[str, torch.Tensor]) -> None:
        """Strict load of a transformers-layout state dict.

        Checkpoints with tied embeddings usually omit `lm_head.weight` (safetensors refuses shared
        tensors, so save_pretrained drops it); it is then taken from the embedding. Anything else
        missing or unexpected raises.
        """
        state_dict = dict(state_dict)
        if self.cfg.tie_embeddings and "lm_head.weight" not in state_dict:
            state_dict["lm_head.weight"] = state_dict["model.embed_tokens.weight"]
        self.load_state_dict(state_dict, strict=True)
        if self.cfg.tie_embeddings:  # load_state_dict copies; re-assert the tie for exports
            self.lm_head.weight = self.model.embed_tokens.weight

    @classmethod
    def from_pretrained(cls, folder: str | Path, dtype: torch.dtype = torch.float32) -> "GQAForCausalLM":
        """Build from an HF-format folder (config.json + *.safetensors), strictly."""
        from safetensors.torch import load_file

        folder = Path(folder)
        cfg = from_hf_config(json.loads((folder / "config.json").read_text()))
        files = sorted(folder.glob("*.safetensors"))
        if not files:
            raise FileNotFoundError(f"no *.safetensors in {folder}")
        state_dict: dict[str, torch.Tensor] = {}
        for f in files:
            state_dict.update(load_file(f))
        model = cls(cfg)
        model.load_hf_state_dict(state_dict)
        return model.to(dtype).eval()


# --------------------------------------------------------------------------------------------
# Weight layout for Core AI
# --------------------------------------------------------------------------------------------
class TransposedEmbedding(nn.Module):
    """Embedding lookup from a [hidden, vocab] table, so a tied LM head and the embedding share
    one pre-transposed constant instead of storing the 49152 x 576 table twice."""

    def __init__(self, weight_t: nn.Parameter):
        super().__init__()
        self.weight_t = weight_t

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        rows = torch.index_select(self.weight_t, 1, ids.reshape(-1))  # [hidden, B*T]
        return rows.t().reshape(*ids.shape, self.weight_t.shape[0])


def with_pretransposed_weights(lm: GQAForCausalLM) -> GQAForCausalLM:
    """A copy of `lm` whose Linear layers hold W^T (the Core AI target's shared pass,
    zoo/targets/coreai_form.py: 241 runtime transposes took 88% of a SmolLM2 decode step) and whose tied
    embedding reads the LM head's W^T, so the 49152 x 576 table is stored once. Numerics are identical;
    `lm` is untouched. Idempotent: a module the target already prepared keeps its layers."""
    out, _ = pretranspose_linears(lm)
    if lm.cfg.tie_embeddings:  # the same Parameter object: exported as one constant
        out.model.embed_tokens = TransposedEmbedding(out.lm_head.weight_t)
    return out


class ScaledRMSNorm(RMSNorm):
    """RMSNorm that cannot overflow in fp16: normalise x / max|x| instead of x (the idea of the rewrite
    library's adaptive_normalize, in this model's own op order: rsqrt and a product, not sqrt and a
    division — with the library's form the tiny LLM's GPU fp16 greedy run on prompt 2 fell to token
    agreement 1.0 -> 0.4375, `zoo convert model=gqa-llm target=litert weights=tiny`).

    x / sqrt(mean(x^2) + eps) == y / sqrt(mean(y^2) + eps / s^2) with y = x / s, s = max|x| >= 1,
    so the result is the same function, but no intermediate exceeds 1 in magnitude. SmolLM2's
    residual stream reaches |x| ~ 22,500 (mean(x^2) ~ 9e5, far past fp16's 65,504), so the plain
    form returns inf/NaN wherever a GPU delegate computes in fp16 (toolchain.md §4). The
    denominator is clamped at 2^-24 so eps / s^2 underflowing to 0 cannot divide by zero.
    """

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x = x.float()
        scale = x.abs().amax(-1, keepdim=True).clamp(min=1.0)
        y = x / scale
        mean_square = (y * y).mean(-1, keepdim=True)
        inv = torch.rsqrt(torch.clamp(mean_square + self.eps / (scale * scale), min=2.0**-24))
        return self.weight * (y * inv).to(dtype)


def with_scaled_norms(lm: GQAForCausalLM) -> GQAForCausalLM:
    """A copy of `lm` (weights shared, not copied) whose RMSNorms are ScaledRMSNorm."""
    import copy

    memo = {id(t): t for t in list(lm.parameters()) + list(lm.buffers())}
    out = copy.deepcopy(lm, memo)
    for parent in list(out.modules()):
        for name, child in list(parent.named_children()):
            if type(child) is RMSNorm:
                safe = ScaledRMSNorm(child.weight.shape[0], child.eps)
                safe.weight = child.weight
                setattr(parent, name, safe)
    return out


# --------------------------------------------------------------------------------------------
# Export form 1: Core AI, caches as module state
# --------------------------------------------------------------------------------------------
class CoreAIStatefulLM(nn.Module):
    """Decoder with per-layer K/V caches as registered buffers `k_cache_{i}`/`v_cache_{i}`
    [B, n_kv, context_len, D].

    forward(input_ids [1, T] int32, start [1] int32) -> logits [1, 1, vocab] of the LAST position.
    Exported twice — T dynamic ("prefill") and T=1 ("decode") — the two Core AI functions share
    the buffers as states. Only the last position's logits are returned: that is all greedy
    decoding needs, and it skips (T-1) x vocab x hidden multiply-adds in the LM head.
    Attention always spans the whole cache with a lower-right mask, so shapes stay static
    except for T.
    """

    def __init__(self, lm: GQAForCausalLM, context_len: int, batch: int = 1):
        super().__init__()
        cfg = lm.cfg
        if context_len > cfg.max_seq_len:
            raise ValueError(f"context_len={context_len} exceeds the model's max_seq_len={cfg.max_seq_len}")
        self.lm = lm
        self.context_len = context_len
        # Caches are fp32 states whatever the compute dtype: numpy (and so the runtime's NDArray
        # bridge) has no bfloat16, and the cast costs one [n_kv, context, D] pass per layer.
        for i in range(cfg.num_layers):
            shape = (batch, cfg.num_kv_heads, context_len, cfg.head_dim)
            self.register_buffer(f"k_cache_{i}", torch.zeros(shape, dtype=torch.float32))
            self.register_buffer(f"v_cache_{i}", torch.zeros(shape, dtype=torch.float32))

    def state_names(self) -> list[str]:
        """Cache buffer names, in the order torch.export lists them (registration order)."""
        return [n for i in range(self.lm.cfg.num_layers) for n in (f"k_cache_{i}", f"v_cache_{i}")]

    def reset(self) -> None:
        for name in self.state_names():
            getattr(self, name).zero_()

    def _cache_writer(self, layer: int, p: int, t: int):
        k_cache, v_cache = getattr(self, f"k_cache_{layer}"), getattr(self, f"v_cache_{layer}")

        def write(k, v):
            # Plain slice assignment into a buffer: coreai-torch records it as a state update.
            k_cache[:, :, p : p + t] = k.float()
            v_cache[:, :, p : p + t] = v.float()
            return k_cache.to(k.dtype), v_cache.to(v.dtype)

        return write

    def forward(self, input_ids: torch.Tensor, start: torch.Tensor) -> torch.Tensor:
        t = input_ids.shape[1]
        p = start.item()  # start is [1]: reshape(()) to a scalar breaks coreai-torch (0-d shape operand)
        torch._check(p >= 0)  # (torch._check_is_size is deprecated in 2.13 in favour of this)
        torch._check(p + t <= self.context_len)
        rope_cos, rope_sin = self.lm.model.rope_cos, self.lm.model.rope_sin
        cos, sin = rope_cos[p : p + t], rope_sin[p : p + t]
        mask = causal_mask(position_column(start, t), self.context_len)
        writers = [self._cache_writer(i, p, t) for i in range(self.lm.cfg.num_layers)]
        h = self.lm.model.embed_tokens(input_ids)
        h = self.lm.run_layers(h, cos, sin, mask, writers)
        return self.lm.lm_head(h[:, -1:]).float()


# --------------------------------------------------------------------------------------------
# Export form 2: LiteRT, caches as explicit inputs/outputs (GPU-clean)
# --------------------------------------------------------------------------------------------
class LiteRTCacheIOLM(nn.Module):
    """Decoder in the LiteRT-LM runtime's own contract: caches travel as explicit rank-4 inputs and
    outputs [1, n_kv, context_len, D].

    forward(tokens [1, T] int32, input_pos [T] int32, **caches) -> dict(logits [1, 1, vocab],
    k_cache_{i}/v_cache_{i}: updated caches). These are the names and shapes LiteRT-LM's engine binds
    (toolchain.md §5: `tokens`, `input_pos` one absolute position per token, `k_cache_i`/`v_cache_i`,
    `logits`), so the same .tflite runs under our interpreter session and inside a .litertlm.

    - T is static per signature: "prefill" uses a fixed chunk, "decode" T=1.
    - A short prefill is right-padded by the caller; LiteRT-LM pads with token 0 at *position 0*.
      A row is real iff input_pos[t] == input_pos[0] + t (padding at position 0 fails that for t >= 1),
      so padding is neither written to the cache (its one-hot write row is zeroed; it would otherwise
      overwrite the token at position 0) nor picked for the logits.
    - The cache write is `cache * keep + onehotT @ new` with the one-hot pre-expanded over KV heads
      (a BMM whose operand broadcasts on the head axis is accepted but wrong on the GPU delegate).
    - RoPE rows are picked with the same one-hot matrix (a matmul, not a GATHER).
    - Returned logits are the last *real* position's, selected by a one-hot row matmul.
    """

    def __init__(self, lm: GQAForCausalLM, context_len: int):
        super().__init__()
        cfg = lm.cfg
        if context_len > cfg.max_seq_len:
            raise ValueError(f"context_len={context_len} exceeds the model's max_seq_len={cfg.max_seq_len}")
        self.lm = lm
        self.context_len = context_len
        # Tables cut to the exported context, [1, 1, S, D]: one-hot rows [1, 1, T, S] select from
        # them by a rank-4 matmul with equal batch dims (a 4D @ 2D matmul fails to legalize).
        self.register_buffer("cos_table", lm.model.rope_cos[:context_len].clone()[None, None], persistent=False)
        self.register_buffer("sin_table", lm.model.rope_sin[:context_len].clone()[None, None], persistent=False)

    def cache_names(self) -> list[str]:
        return [n for i in range(self.lm.cfg.num_layers) for n in (f"k_cache_{i}", f"v_cache_{i}")]

    def empty_caches(self, dtype=torch.float32) -> dict[str, torch.Tensor]:
        cfg = self.lm.cfg
        shape = (1, cfg.num_kv_heads, self.context_len, cfg.head_dim)
        return {n: torch.zeros(shape, dtype=dtype) for n in self.cache_names()}

    def forward(self, tokens, input_pos, **caches):
        cfg = self.lm.cfg
        t = tokens.shape[1]
        positions = input_pos.reshape(1, 1, t, 1).float()  # rank 4 before any arithmetic (see above)
        rows = one_hot_rows(positions, self.context_len)  # [1, 1, T, S]
        real = None
        if t > 1:
            real = contiguous_rows(positions)  # [1, 1, T, 1]: 1 for real tokens, 0 for padding
            rows = rows * real
        cos, sin = rows @ self.cos_table, rows @ self.sin_table
        mask = causal_mask(positions, self.context_len)
        # [1, n_kv, S, T] write matrix and [1, n_kv, S, 1] keep mask, both rank 4.
        write_t = torch.cat([rows.transpose(2, 3)] * cfg.num_kv_heads, dim=1)
        keep = 1.0 - write_t.sum(-1, keepdim=True)

        new_caches: dict[str, torch.Tensor] = {}

        def writer(i):
            def write(k, v):
                kc = caches[f"k_cache_{i}"] * keep + write_t @ k
                vc = caches[f"v_cache_{i}"] * keep + write_t @ v
                new_caches[f"k_cache_{i}"], new_caches[f"v_cache_{i}"] = kc, vc
                return kc, vc

            return write

        h = self.lm.model.embed_tokens(tokens)
        h = self.lm.run_layers(h, cos, sin, mask, [writer(i) for i in range(cfg.num_layers)])
        if real is None:
            last = h[:, -1:]
        else:
            count = real.sum(2, keepdim=True)  # [1, 1, 1, 1]: real rows form a prefix
            pick = one_hot_rows(count - 1.0, t)  # [1, 1, 1, T]
            last = pick.reshape(1, 1, t) @ h
        return {"logits": self.lm.lm_head(last), **new_caches}


def contiguous_rows(positions: torch.Tensor) -> torch.Tensor:
    """[1, 1, T, 1]: 1.0 where positions[t] == positions[0] + t, else 0.0 (relu(1 - |d|) on integers)."""
    t = positions.shape[2]
    expected = positions[:, :, :1] + torch.arange(t, dtype=torch.float32).reshape(1, 1, t, 1)
    return F.relu(1.0 - (positions - expected).abs())


# --------------------------------------------------------------------------------------------
# Export contract: what each target exports, as data (the shared pipeline can consume this)
# --------------------------------------------------------------------------------------------


def _ids_and_start(t: int) -> dict[str, torch.Tensor]:
    return {"input_ids": torch.zeros(1, t, dtype=torch.int32), "start": torch.zeros(1, dtype=torch.int32)}


def coreai_entries(lm: GQAForCausalLM, context_len: int) -> list[Entry]:
    """`prefill` (dynamic T in 1..context_len-1) and `decode` (T=1) over ONE stateful module, so the
    two functions mutate the same buffers and share them as states. Weights are pre-transposed.

    T stops at context_len - 1: at T == context_len the cache slice write is the whole cache,
    torch.export guards on that contiguity case and refuses the dynamic dim. A full-context prompt
    is run as prefill(context_len - 1) + decode(1) by the session.
    """
    stateful = CoreAIStatefulLM(with_pretransposed_weights(lm), context_len).eval()
    seq = torch.export.Dim("T", min=1, max=context_len - 1)
    common = {"module": stateful, "output_names": ["logits"], "state_names": stateful.state_names()}
    return [
        Entry("prefill", inputs=_ids_and_start(min(8, context_len - 1)),
                    dynamic_shapes={"input_ids": {1: seq}, "start": None}, **common),
        Entry("decode", inputs=_ids_and_start(1), **common),
    ]


def litert_lm_inputs(t: int) -> dict[str, torch.Tensor]:
    """LiteRT-LM's input names: `tokens` [1, T] and `input_pos` [T] (one absolute position per token).

    The values are what the pipeline's GPU check feeds: one real token at position 0 and, for T > 1, the rest
    padded the way LiteRT-LM pads (token 0 at position 0) — so the check also runs the padding path."""
    return {"tokens": torch.zeros(1, t, dtype=torch.int32), "input_pos": torch.zeros(t, dtype=torch.int32)}


def litert_entries(lm: GQAForCausalLM, context_len: int, prefill_len: int,
                   scaled_norms: bool = True) -> list[Entry]:
    """`prefill` (static T = prefill_len, right-padded) and `decode` (T=1) in LiteRT-LM's contract
    (`tokens`, `input_pos`, `k_cache_i`/`v_cache_i` in and out, `logits`). Both signatures share the
    weights in one .tflite, which LiteRT-LM runs as is inside a .litertlm (models/gqa_llm/litertlm.py).

    scaled_norms: use ScaledRMSNorm. The .tflite is fp32, but the GPU delegate computes in fp16 by
    default, where SmolLM2's plain RMSNorm overflows from layer 3 on (logits cosine 0 on the
    delegate); scaled, fp16 logits cosine is 0.9999 and the CPU fp32 path stays token-exact.
    """
    if not 1 < prefill_len <= context_len:
        raise ValueError(f"prefill_len={prefill_len} must be in 2..context_len={context_len}")
    module = LiteRTCacheIOLM(with_scaled_norms(lm) if scaled_norms else lm, context_len).eval()
    caches = module.empty_caches()
    names = ["logits", *module.cache_names()]
    return [
        Entry("prefill", module, {**litert_lm_inputs(prefill_len), **caches}, names),
        Entry("decode", module, {**litert_lm_inputs(1), **caches}, names),
    ]
