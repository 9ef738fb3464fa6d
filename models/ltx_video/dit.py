"""LTX-Video DiT (diffusers `LTXVideoTransformer3DModel`), re-authored for fixed-shape export.

State-dict keys match diffusers exactly, so the real checkpoints load strictly. What changed against
upstream, and why (numbers: models.md "LTX-Video lowering, measured", diffusers 0.42.1):
- RoPE cos/sin tables are computed at build time for one (latent frames, height, width, frame rate) and
  kept as buffers: upstream builds them in-graph (meshgrid, slice-assignment into a [B,3,F,H,W] grid,
  repeat_interleave), which is every op the LiteRT GPU delegate rejected (179 GPU / 163 CPU ops). The sign
  of the pair rotation is folded into the sin table, so applying RoPE is mul/add plus a rank-4 pair swap.
- the timestep sinusoid is computed on the host (`timestep_projection`): the graph takes the 256-wide
  projection. In-graph, t≈1000 in fp16 measured GPU fp16 cos 0.99992; on the host 0.999999.
- attention is explicit matmul/softmax on rank-4 tensors, optionally query-chunked (`attention_chunk`):
  the WebGPU adapter here caps one buffer at 128 MiB, and the real 3168-token score tensor is 642 MB fp16.
- every tensor stays at rank <= 4 (upstream's ada-LN table is rank 4 already; nothing here goes higher).
Numerics follow upstream: RMSNorm without affine (eps 1e-6) on the residual stream, RMSNorm across heads
(eps 1e-5, affine) on q/k, tanh-GELU feed-forward, text-mask bias -10000, LayerNorm out without affine.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from zoo.rewrites.attention import query_chunked_attention

TIMESTEP_CHANNELS = 256      # diffusers Timesteps(256, flip_sin_to_cos=True, downscale_freq_shift=0)
MASKED_BIAS = -10000.0       # upstream's text-mask bias; fits fp16
ROPE_BASE = (20, 2048, 2048)  # upstream's base_num_frames, base_height, base_width
ROPE_THETA = 10000.0


@dataclass(frozen=True)
class DiTConfig:
    in_channels: int = 128
    out_channels: int = 128
    num_attention_heads: int = 32
    attention_head_dim: int = 64
    cross_attention_dim: int = 2048
    num_layers: int = 28
    caption_channels: int = 4096
    norm_eps: float = 1e-6
    patch_size: int = 1
    patch_size_t: int = 1

    @classmethod
    def from_diffusers(cls, config: dict) -> "DiTConfig":
        for key, expected in (("qk_norm", "rms_norm_across_heads"), ("activation_fn", "gelu-approximate"),
                              ("norm_elementwise_affine", False), ("attention_bias", True),
                              ("attention_out_bias", True)):
            if config.get(key, expected) != expected:
                raise ValueError(f"LTX DiT port supports {key}={expected!r}, the checkpoint has {config[key]!r}")
        return cls(**{k: config[k] for k in cls.__dataclass_fields__ if k in config})

    @property
    def inner_dim(self) -> int:
        return self.num_attention_heads * self.attention_head_dim


@dataclass(frozen=True)
class VideoGrid:
    """What the RoPE tables are baked for: the latent video's token grid and the pipeline's frame rate."""

    frames: int
    height: int
    width: int
    frame_rate: float
    temporal_compression: int   # the VAE's, for rope_interpolation_scale = (tc / frame_rate, sc, sc)
    spatial_compression: int

    @property
    def tokens(self) -> int:
        return self.frames * self.height * self.width


def timestep_projection(timestep: torch.Tensor) -> torch.Tensor:
    """The host half of the timestep embedding: [B] -> [B, 256] (cos first), computed in fp32 exactly as
    diffusers' get_timestep_embedding(flip_sin_to_cos=True, downscale_freq_shift=0)."""
    half = TIMESTEP_CHANNELS // 2
    exponent = -math.log(10000) * torch.arange(half, dtype=torch.float32) / half
    angles = timestep.float().reshape(-1)[:, None] * torch.exp(exponent)[None, :]
    return torch.cat([torch.cos(angles), torch.sin(angles)], dim=-1)


def rope_tables(grid: VideoGrid, dim: int, patch_size: int = 1, patch_size_t: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sign-folded sin tables [1, tokens, dim] for the grid, in fp32 (upstream's formula)."""
    scale = (grid.temporal_compression / grid.frame_rate, grid.spatial_compression, grid.spatial_compression)
    f, h, w = torch.meshgrid(torch.arange(grid.frames, dtype=torch.float32),
                             torch.arange(grid.height, dtype=torch.float32),
                             torch.arange(grid.width, dtype=torch.float32), indexing="ij")
    coords = torch.stack([f.reshape(-1) * scale[0] * patch_size_t / ROPE_BASE[0],
                          h.reshape(-1) * scale[1] * patch_size / ROPE_BASE[1],
                          w.reshape(-1) * scale[2] * patch_size / ROPE_BASE[2]], dim=-1)   # [S, 3]
    freqs = ROPE_THETA ** torch.linspace(0.0, 1.0, dim // 6, dtype=torch.float32) * math.pi / 2.0
    # [S, 3, dim//6] -> frequency-major, axis-minor order, as upstream's transpose(-1, -2).flatten(2)
    angles = (freqs[None, None, :] * (coords[:, :, None] * 2 - 1)).transpose(1, 2).reshape(coords.shape[0], -1)
    cos = angles.cos().repeat_interleave(2, dim=-1)
    sin = angles.sin().repeat_interleave(2, dim=-1)
    pad = dim % 6
    if pad:
        cos = torch.cat([torch.ones(cos.shape[0], pad), cos], dim=-1)
        sin = torch.cat([torch.zeros(sin.shape[0], pad), sin], dim=-1)
    # rotated[2i] = -x[2i+1], rotated[2i+1] = x[2i]: the minus goes into the table.
    sign = torch.tensor([-1.0, 1.0]).repeat(dim // 2)
    return cos[None], (sin * sign)[None]


def swap_pairs(x: torch.Tensor) -> torch.Tensor:
    """[B, S, D] -> each (even, odd) pair swapped; rank 4 at most."""
    b, s, d = x.shape
    pairs = x.reshape(b, s, d // 2, 2)
    return torch.cat([pairs[..., 1:2], pairs[..., 0:1]], dim=-1).reshape(b, s, d)


def rms_norm(x: torch.Tensor, eps: float) -> torch.Tensor:
    variance = x.float().pow(2).mean(-1, keepdim=True)
    return (x.float() * torch.rsqrt(variance + eps)).to(x.dtype)


class RMSNormAffine(nn.Module):
    """torch.nn.RMSNorm(dim, eps) with weight, written out (key: `weight`)."""

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x):
        return rms_norm(x, self.eps) * self.weight


class Attention(nn.Module):
    """diffusers LTXAttention (keys to_q/to_k/to_v/to_out.0/norm_q/norm_k)."""

    def __init__(self, dim: int, heads: int, head_dim: int, context_dim: int | None):
        super().__init__()
        inner = heads * head_dim
        self.heads, self.head_dim = heads, head_dim
        self.norm_q = RMSNormAffine(inner, 1e-5)
        self.norm_k = RMSNormAffine(inner, 1e-5)
        self.to_q = nn.Linear(dim, inner)
        self.to_k = nn.Linear(context_dim or dim, inner)
        self.to_v = nn.Linear(context_dim or dim, inner)
        self.to_out = nn.ModuleList([nn.Linear(inner, dim)])
        self.chunk = 0

    def _heads(self, x):
        return x.reshape(x.shape[0], x.shape[1], self.heads, self.head_dim).transpose(1, 2)

    def forward(self, x, context=None, bias=None, rope=None):
        context = x if context is None else context
        q, k = self.norm_q(self.to_q(x)), self.norm_k(self.to_k(context))
        if rope is not None:
            cos, sin = rope
            q = q * cos + swap_pairs(q) * sin
            k = k * cos + swap_pairs(k) * sin
        out = query_chunked_attention(self._heads(q), self._heads(k), self._heads(self.to_v(context)), self.chunk, bias)
        out = out.transpose(1, 2).reshape(x.shape[0], x.shape[1], -1)
        return self.to_out[0](out)


class GeluProj(nn.Module):
    def __init__(self, dim_in: int, dim_out: int):
        super().__init__()
        self.proj = nn.Linear(dim_in, dim_out)

    def forward(self, x):
        return F.gelu(self.proj(x), approximate="tanh")


class FeedForward(nn.Module):
    """diffusers FeedForward(dim, activation_fn="gelu-approximate"): keys net.0.proj, net.2."""

    def __init__(self, dim: int):
        super().__init__()
        self.net = nn.ModuleList([GeluProj(dim, 4 * dim), nn.Identity(), nn.Linear(4 * dim, dim)])

    def forward(self, x):
        return self.net[2](self.net[0](x))


class Block(nn.Module):
    def __init__(self, cfg: DiTConfig):
        super().__init__()
        d = cfg.inner_dim
        self.eps = cfg.norm_eps
        self.attn1 = Attention(d, cfg.num_attention_heads, cfg.attention_head_dim, None)
        self.attn2 = Attention(d, cfg.num_attention_heads, cfg.attention_head_dim, cfg.cross_attention_dim)
        self.ff = FeedForward(d)
        self.scale_shift_table = nn.Parameter(torch.zeros(6, d))

    def forward(self, x, context, temb, text_bias, rope):
        b, d = x.shape[0], x.shape[-1]
        ada = self.scale_shift_table[None, None] + temb.reshape(b, 1, 6, d)   # [B, 1, 6, D]
        shift_msa, scale_msa, gate_msa, shift_mlp, scale_mlp, gate_mlp = (ada[:, :, i] for i in range(6))
        h = rms_norm(x, self.eps) * (1 + scale_msa) + shift_msa
        x = x + self.attn1(h, rope=rope) * gate_msa
        x = x + self.attn2(x, context, bias=text_bias)
        h = rms_norm(x, self.eps) * (1 + scale_mlp) + shift_mlp
        return x + self.ff(h) * gate_mlp


class TwoLinear(nn.Module):
    """linear_1 → act → linear_2 (diffusers TimestepEmbedding / PixArtAlphaTextProjection keys)."""

    def __init__(self, dim_in: int, dim: int, act):
        super().__init__()
        self.linear_1 = nn.Linear(dim_in, dim)
        self.linear_2 = nn.Linear(dim, dim)
        self.act = act

    def forward(self, x):
        return self.linear_2(self.act(self.linear_1(x)))


class TimestepMLP(nn.Module):
    """Keys of diffusers PixArtAlphaCombinedTimestepSizeEmbeddings (without size conditions)."""

    def __init__(self, dim: int):
        super().__init__()
        self.timestep_embedder = TwoLinear(TIMESTEP_CHANNELS, dim, F.silu)


class AdaLayerNormSingle(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.emb = TimestepMLP(dim)
        self.linear = nn.Linear(dim, 6 * dim)

    def forward(self, projection):
        embedded = self.emb.timestep_embedder(projection)
        return self.linear(F.silu(embedded)), embedded


class LTXDiT(nn.Module):
    """`velocity = LTXDiT(cfg, grid)(hidden_states [B,S,Cin], encoder_hidden_states [B,L,Ccap],
    encoder_attention_mask [B,L], timestep_projection [B,256])` for one baked token grid."""

    def __init__(self, cfg: DiTConfig, grid: VideoGrid, attention_chunk: int = 0):
        super().__init__()
        if cfg.patch_size != 1 or cfg.patch_size_t != 1:
            raise ValueError("LTX-Video 0.9.x uses patch size 1; the port bakes RoPE for that")
        d = cfg.inner_dim
        self.cfg, self.grid = cfg, grid
        self.proj_in = nn.Linear(cfg.in_channels, d)
        self.scale_shift_table = nn.Parameter(torch.zeros(2, d))
        self.time_embed = AdaLayerNormSingle(d)
        self.caption_projection = TwoLinear(cfg.caption_channels, d, lambda x: F.gelu(x, approximate="tanh"))
        self.transformer_blocks = nn.ModuleList([Block(cfg) for _ in range(cfg.num_layers)])
        self.proj_out = nn.Linear(d, cfg.out_channels)
        cos, sin = rope_tables(grid, d)
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)
        self.set_attention_chunk(attention_chunk)

    def set_attention_chunk(self, chunk: int) -> "LTXDiT":
        for module in self.modules():
            if isinstance(module, Attention):
                module.chunk = int(chunk)
        return self

    def forward(self, hidden_states, encoder_hidden_states, encoder_attention_mask, timestep_projection):
        b = hidden_states.shape[0]
        text_bias = ((1.0 - encoder_attention_mask.to(hidden_states.dtype)) * MASKED_BIAS)[:, None, None, :]
        x = self.proj_in(hidden_states)
        temb, embedded = self.time_embed(timestep_projection.to(x.dtype))
        temb, embedded = temb[:, None, :], embedded[:, None, :]
        context = self.caption_projection(encoder_hidden_states)
        rope = (self.rope_cos.to(x.dtype), self.rope_sin.to(x.dtype))
        for block in self.transformer_blocks:
            x = block(x, context, temb, text_bias, rope)
        shift_scale = self.scale_shift_table[None, None] + embedded[:, :, None]   # [B, 1, 2, D]
        x = F.layer_norm(x, (x.shape[-1],), eps=1e-6) * (1 + shift_scale[:, :, 1]) + shift_scale[:, :, 0]
        return self.proj_out(x)
