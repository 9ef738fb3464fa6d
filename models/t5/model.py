"""T5 v1.1 encoder, re-authored for fixed-length export.

State-dict keys match transformers' `T5EncoderModel` exactly, so the real checkpoints load strictly.
What changed against upstream, and why:
- the relative-position bias is precomputed for the export length into a `[1, H, L, L]` buffer, so the
  bucketing (abs/log/min/where/int casts) never enters the graph; the buffer is refreshed whenever
  weights are loaded;
- token ids and the attention mask arrive as int32 (Core AI narrows int64 anyway; LiteRT prefers it);
- no dropout, no head-mask, no cache, no output-attentions plumbing: one code path.
Numerics follow upstream: RMS norm variance in fp32, softmax in fp32, no 1/sqrt(d) score scaling
(T5 folds it into the initialisation), gated tanh-GELU feed-forward.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn
import torch.nn.functional as F


from zoo.rewrites.attention import MASK_VALUE as MASKED_SCORE  # the zoo's one additive mask value


@dataclass(frozen=True)
class T5EncoderConfig:
    vocab_size: int
    d_model: int
    d_kv: int
    d_ff: int
    num_layers: int
    num_heads: int
    relative_attention_num_buckets: int = 32
    relative_attention_max_distance: int = 128
    layer_norm_epsilon: float = 1e-6

    @classmethod
    def from_hf(cls, config: dict) -> "T5EncoderConfig":
        if config.get("feed_forward_proj", "gated-gelu") != "gated-gelu":
            raise ValueError(f"only the gated-GELU (v1.1) T5 family is supported, got {config.get('feed_forward_proj')}")
        return cls(**{k: config[k] for k in cls.__dataclass_fields__ if k in config})


def relative_position_buckets(length: int, num_buckets: int, max_distance: int) -> torch.Tensor:
    """Bidirectional T5 bucket of (key position - query position), as a `[L, L]` int64 table."""
    positions = torch.arange(length)
    relative = positions[None, :] - positions[:, None]
    half = num_buckets // 2
    bucket = (relative > 0).long() * half
    distance = relative.abs()
    exact = half // 2
    # Distances past `exact` share log-spaced buckets up to max_distance.
    log_scaled = exact + (
        torch.log(distance.float().clamp(min=1) / exact) / math.log(max_distance / exact) * (half - exact)
    ).long()
    log_scaled = log_scaled.clamp(max=half - 1)
    return bucket + torch.where(distance < exact, distance, log_scaled)


class T5RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x):
        variance = x.float().pow(2).mean(-1, keepdim=True)
        x = x * torch.rsqrt(variance + self.eps)
        return self.weight * x.to(self.weight.dtype)


class T5SelfAttention(nn.Module):
    def __init__(self, cfg: T5EncoderConfig, has_relative_bias: bool):
        super().__init__()
        inner = cfg.num_heads * cfg.d_kv
        self.num_heads, self.d_kv = cfg.num_heads, cfg.d_kv
        self.q = nn.Linear(cfg.d_model, inner, bias=False)
        self.k = nn.Linear(cfg.d_model, inner, bias=False)
        self.v = nn.Linear(cfg.d_model, inner, bias=False)
        self.o = nn.Linear(inner, cfg.d_model, bias=False)
        if has_relative_bias:
            self.relative_attention_bias = nn.Embedding(cfg.relative_attention_num_buckets, cfg.num_heads)

    def _heads(self, x):
        b, length, _ = x.shape
        return x.view(b, length, self.num_heads, self.d_kv).transpose(1, 2)

    def forward(self, x, bias):
        q, k, v = self._heads(self.q(x)), self._heads(self.k(x)), self._heads(self.v(x))
        scores = q @ k.transpose(-1, -2) + bias
        weights = F.softmax(scores.float(), dim=-1).type_as(scores)
        out = (weights @ v).transpose(1, 2).reshape(x.shape[0], x.shape[1], -1)
        return self.o(out)


class T5LayerSelfAttention(nn.Module):
    def __init__(self, cfg: T5EncoderConfig, has_relative_bias: bool):
        super().__init__()
        self.SelfAttention = T5SelfAttention(cfg, has_relative_bias)
        self.layer_norm = T5RMSNorm(cfg.d_model, cfg.layer_norm_epsilon)

    def forward(self, x, bias):
        return x + self.SelfAttention(self.layer_norm(x), bias)


class T5GatedGelu(nn.Module):
    def __init__(self, cfg: T5EncoderConfig):
        super().__init__()
        self.wi_0 = nn.Linear(cfg.d_model, cfg.d_ff, bias=False)
        self.wi_1 = nn.Linear(cfg.d_model, cfg.d_ff, bias=False)
        self.wo = nn.Linear(cfg.d_ff, cfg.d_model, bias=False)

    def forward(self, x):
        h = F.gelu(self.wi_0(x), approximate="tanh") * self.wi_1(x)
        return self.wo(h.to(self.wo.weight.dtype))


class T5LayerFF(nn.Module):
    def __init__(self, cfg: T5EncoderConfig):
        super().__init__()
        self.DenseReluDense = T5GatedGelu(cfg)
        self.layer_norm = T5RMSNorm(cfg.d_model, cfg.layer_norm_epsilon)

    def forward(self, x):
        return x + self.DenseReluDense(self.layer_norm(x))


class T5Block(nn.Module):
    def __init__(self, cfg: T5EncoderConfig, has_relative_bias: bool):
        super().__init__()
        self.layer = nn.ModuleList([T5LayerSelfAttention(cfg, has_relative_bias), T5LayerFF(cfg)])

    def forward(self, x, bias):
        return self.layer[1](self.layer[0](x, bias))


class T5Stack(nn.Module):
    def __init__(self, cfg: T5EncoderConfig, embed_tokens: nn.Embedding):
        super().__init__()
        self.embed_tokens = embed_tokens
        self.block = nn.ModuleList([T5Block(cfg, has_relative_bias=(i == 0)) for i in range(cfg.num_layers)])
        self.final_layer_norm = T5RMSNorm(cfg.d_model, cfg.layer_norm_epsilon)


class T5Encoder(nn.Module):
    """`last_hidden_state = T5Encoder(seq_len)(input_ids int32 [B, L], attention_mask int32 [B, L])`."""

    def __init__(self, cfg: T5EncoderConfig, seq_len: int):
        super().__init__()
        self.cfg, self.seq_len = cfg, seq_len
        self.shared = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.encoder = T5Stack(cfg, self.shared)  # tied: both keys exist, as upstream
        buckets = relative_position_buckets(seq_len, cfg.relative_attention_num_buckets, cfg.relative_attention_max_distance)
        self.register_buffer("position_buckets", buckets, persistent=False)
        self.register_buffer("position_bias", torch.zeros(1, cfg.num_heads, seq_len, seq_len), persistent=False)
        self.refresh_position_bias()
        self.register_load_state_dict_post_hook(lambda module, _keys: module.refresh_position_bias())

    @torch.no_grad()
    def refresh_position_bias(self):
        """Bake the bias of the loaded weights into a `[1, H, L, L]` constant (kept in the module's dtype)."""
        table = self.encoder.block[0].layer[0].SelfAttention.relative_attention_bias.weight
        bias = table[self.position_buckets].permute(2, 0, 1).unsqueeze(0)
        self.position_bias = bias.to(self.position_bias.dtype)

    def forward(self, input_ids, attention_mask):
        x = self.encoder.embed_tokens(input_ids)
        # Masked keys get a large negative score. Upstream uses finfo(dtype).min, which is -inf once the
        # LiteRT GPU delegate computes an fp32 graph in fp16, and 0 * -inf = NaN for every unmasked key
        # (measured: NaN output on the GPU's fp16 run). -30000 fits fp16 and still gives exp() = 0.
        blocked = (1.0 - attention_mask[:, None, None, :].to(x.dtype)) * MASKED_SCORE
        bias = self.position_bias + blocked
        for block in self.encoder.block:
            x = block(x, bias)
        return self.encoder.final_layer_norm(x)
