"""TripoSplat's two decoders, re-authored for conversion with upstream's state-dict keys.

Upstream (model.py at a78fa12) holds both in `OctreeGaussianDecoder`, whose decoder file stores them under
the prefixes `octree.` and `gs.`; each class here loads its part strictly, un-prefixed:

- `OctreeDecoder` (upstream `OctreeProbabilityFixedlenDecoder`): per octree level, every parent cell
  (its centre in [0,1]³) attends to the DiT latent `[B, 8192, 16]` and gives 8 child logits. Its blocks are
  cross-attention only, so each query is independent of the others: the graph takes a fixed query count
  (8192 at real size, the most parents any level can have) and the host pads and slices (models/triposplat/
  octree.py). The level input is a float `[B]` (upstream passes int64 `res`, which Core AI narrows to int32
  and rejects feeding: models.md), or with `host_sinusoids` its sinusoid `[B, 256]` computed on the host.
- `GaussianDecoder` (upstream `ElasticGaussianFixedlenDecoder`): self- and cross-attention over the sampled
  points, out `[B, N, 480]` = 32 Gaussians × 15 floats, laid out by attribute (`GAUSSIAN_LAYOUT`).

What differs from upstream, all exact in fp32 (tests/test_triposplat_decoders.py against the goldens):
- every tensor stays at rank ≤ 4: qkv / kv split by slicing channels instead of `reshape(B,L,2|3,H,D)
  .unbind` and `stack` (rank 5: LiteRT's GPU delegate rejects the RESHAPE/SLICE, models.md);
- the q/k RMS norm is written out as `x·rsqrt(max(Σx², 1e-24))·γ·√D`, which is F.normalize's
  `x / max(‖x‖, 1e-12)` without its clamp op;
- attention is explicit matmul/softmax, optionally in query chunks (`attention_chunk`: real size on the GPU
  needs ≤ 128 MiB score buffers, models.md);
- `host_sinusoids`: the point and level sinusoids (angles up to 1e3 rad) become graph inputs computed on the
  host in fp32; in-graph they cost most of the fp16 error (octree GPU-fp16 cos 0.985 → 0.999998, Gaussian
  0.9906 → 0.999996, models.md).
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from zoo.rewrites.attention import query_chunked_attention

# The 480 output floats per token, in upstream's order (`ElasticGaussianFixedlenDecoder._calc_layout` with
# num_gaussians=32, learned per-offset scale): name -> floats per Gaussian. Named slices for the gates.
GAUSSIAN_ATTRIBUTES = (("xyz", 3), ("dc", 3), ("scale", 3), ("rot", 4), ("opacity", 1), ("offset_scale", 1))
LEVEL_FREQUENCY_CHANNELS = 256     # upstream LevelEmbedder's frequency_embedding_size
LEVEL_MAX_PERIOD = 1024
POINT_MAX_RES = 10                 # PcdAbsolutePositionEmbedderV2: frequencies 2^linspace(0, 10)


def gaussian_layout(num_gaussians: int) -> dict[str, tuple[int, int]]:
    """name -> (start, stop) channel range of the decoder output, as upstream lays it out."""
    layout, start = {}, 0
    for name, size in GAUSSIAN_ATTRIBUTES:
        layout[name] = (start, start + size * num_gaussians)
        start += size * num_gaussians
    return layout


# ---------------------------------------------------------------- configs (upstream's constructor arguments)


@dataclass
class OctreeDecoderConfig:
    model_channels: int = 1024
    cond_channels: int = 16
    num_blocks: int = 4
    num_heads: int = 16
    mlp_ratio: float = 4.0
    share_mod: bool = True

    @classmethod
    def from_dict(cls, d: dict) -> "OctreeDecoderConfig":
        known = {f.name for f in fields(cls)}
        unknown = set(d) - known
        if unknown:
            raise ValueError(f"unsupported octree decoder arguments: {sorted(unknown)}")
        return cls(**d)


@dataclass
class RepresentationConfig:
    num_gaussians: int = 32
    lr: dict = field(default_factory=lambda: {"_xyz": 1.0, "_features_dc": 1.0, "_opacity": 1.0,
                                              "_scaling": 1.0, "_rotation": 0.1})
    perturb_offset: bool = True
    perturbe_size: float = 1.5
    offset_scale: float = 0.05
    filter_kernel_size_3d: float = 0.0009
    scaling_bias: float = 0.004
    opacity_bias: float = 0.1
    scaling_activation: str = "softplus"


@dataclass
class GaussianDecoderConfig:
    in_channels: int = 3
    model_channels: int = 1024
    cond_channels: int = 16
    num_blocks: int = 16
    num_heads: int = 16
    mlp_ratio: float = 4.0
    representation_config: RepresentationConfig = field(default_factory=RepresentationConfig)

    @classmethod
    def from_dict(cls, d: dict) -> "GaussianDecoderConfig":
        d = dict(d)
        rep = RepresentationConfig(**dict(d.pop("representation_config", {})))
        # upstream's production arguments that name the only form it implements
        for key, only in (("attn_mode", "full"), ("use_learned_offset_scale", True), ("use_per_offset", True)):
            if d.pop(key, only) != only:
                raise ValueError(f"only {key}={only!r} is supported (upstream's production decoder)")
        known = {f.name for f in fields(cls)}
        unknown = set(d) - known
        if unknown:
            raise ValueError(f"unsupported Gaussian decoder arguments: {sorted(unknown)}")
        return cls(representation_config=rep, **d)


# ---------------------------------------------------------------- host-side sinusoids (fp32, bitwise upstream's)


def level_frequencies() -> torch.Tensor:
    half = LEVEL_FREQUENCY_CHANNELS // 2
    return torch.exp(-np.log(LEVEL_MAX_PERIOD) * torch.arange(start=0, end=half, dtype=torch.float32) / half)


def level_sinusoid(level: torch.Tensor) -> torch.Tensor:
    """[B] level (octree resolution 2^lv) -> [B, 256] cos|sin, upstream LevelEmbedder.level_embedding's op order."""
    args = level[:, None].float() * level_frequencies()[None] * 2 * torch.pi
    return torch.cat([torch.cos(args), torch.sin(args)], dim=-1)


def point_frequencies(channels: int) -> torch.Tensor:
    return torch.pow(2.0, torch.linspace(0.0, float(POINT_MAX_RES), steps=channels // 3 // 2, dtype=torch.float32))


def point_sinusoid(points: torch.Tensor, channels: int) -> torch.Tensor:
    """[B, L, 3] points -> [B, L, channels]: per coordinate sin|cos of x·2^k·π, zero-padded (upstream V2 order)."""
    ang = points.float().unsqueeze(-1) * point_frequencies(channels).to(points.device) * torch.pi   # [B,L,3,F]
    emb = torch.cat([torch.sin(ang), torch.cos(ang)], dim=-1).flatten(2)                         # [B,L,6F]
    return F.pad(emb, (0, channels - emb.shape[-1]))


# ---------------------------------------------------------------- building blocks


class HeadRMSNorm(nn.Module):
    """Upstream MultiHeadRMSNorm (`gamma` [H, D]) on [B, L, H, D], F.normalize written out."""

    def __init__(self, dim: int, heads: int):
        super().__init__()
        self.scale = dim ** 0.5
        self.gamma = nn.Parameter(torch.ones(heads, dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        inv = torch.rsqrt(torch.clamp_min((x * x).sum(dim=-1, keepdim=True), 1e-24))
        return x * inv * (self.gamma * self.scale)


class Attention(nn.Module):
    """Upstream MultiHeadAttention (full, qkv bias, q/k RMS norm), keys to_qkv | to_q + to_kv, to_out."""

    def __init__(self, channels: int, num_heads: int, ctx_channels: int | None = None, cross: bool = False):
        super().__init__()
        self.channels, self.num_heads, self.cross = channels, num_heads, cross
        self.head_dim = channels // num_heads
        if cross:
            self.to_q = nn.Linear(channels, channels)
            self.to_kv = nn.Linear(ctx_channels or channels, channels * 2)
        else:
            self.to_qkv = nn.Linear(channels, channels * 3)
        self.q_rms_norm = HeadRMSNorm(self.head_dim, num_heads)
        self.k_rms_norm = HeadRMSNorm(self.head_dim, num_heads)
        self.to_out = nn.Linear(channels, channels)
        self.chunk = 0

    def _heads(self, x: torch.Tensor) -> torch.Tensor:   # [B, L, C] -> [B, L, H, D]
        return x.reshape(x.shape[0], x.shape[1], self.num_heads, self.head_dim)

    def forward(self, x: torch.Tensor, context: torch.Tensor | None = None) -> torch.Tensor:
        c = self.channels
        if self.cross:
            q, kv = self.to_q(x), self.to_kv(context)
            k, v = kv[..., :c], kv[..., c:]
        else:
            qkv = self.to_qkv(x)
            q, k, v = qkv[..., :c], qkv[..., c:2 * c], qkv[..., 2 * c:]
        q = self.q_rms_norm(self._heads(q)).transpose(1, 2)
        k = self.k_rms_norm(self._heads(k)).transpose(1, 2)
        v = self._heads(v).transpose(1, 2)
        h = query_chunked_attention(q, k, v, self.chunk).transpose(1, 2)
        return self.to_out(h.reshape(x.shape[0], x.shape[1], c))


class FeedForward(nn.Module):
    def __init__(self, channels: int, mlp_ratio: float):
        super().__init__()
        hidden = int(channels * mlp_ratio)
        self.mlp = nn.Sequential(nn.Linear(channels, hidden), nn.GELU(approximate="tanh"), nn.Linear(hidden, channels))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.mlp(x)


class LevelEmbedder(nn.Module):
    def __init__(self, hidden: int):
        super().__init__()
        self.mlp = nn.Sequential(nn.Linear(LEVEL_FREQUENCY_CHANNELS, hidden), nn.SiLU(), nn.Linear(hidden, hidden))
        self.register_buffer("frequencies", level_frequencies(), persistent=False)

    def sinusoid(self, level: torch.Tensor) -> torch.Tensor:
        args = level[:, None] * self.frequencies[None] * 2 * torch.pi
        return torch.cat([torch.cos(args), torch.sin(args)], dim=-1)

    def forward(self, sinusoid: torch.Tensor) -> torch.Tensor:
        return self.mlp(sinusoid)


class PointEmbedder(nn.Module):
    """PcdAbsolutePositionEmbedderV2 in-graph at rank 4: [B, L, 3] -> [B, L, channels]."""

    def __init__(self, channels: int):
        super().__init__()
        self.channels = channels
        self.register_buffer("frequencies", point_frequencies(channels), persistent=False)

    def forward(self, points: torch.Tensor) -> torch.Tensor:
        ang = points.unsqueeze(-1) * self.frequencies * torch.pi
        emb = torch.cat([torch.sin(ang), torch.cos(ang)], dim=-1)
        emb = emb.reshape(points.shape[0], points.shape[1], -1)
        pad = self.channels - emb.shape[-1]
        if pad:
            emb = torch.cat([emb, emb.new_zeros(emb.shape[0], emb.shape[1], pad)], dim=-1)
        return emb


def layer_norm(x: torch.Tensor, eps: float) -> torch.Tensor:
    return F.layer_norm(x, x.shape[-1:], eps=eps)


class ModulatedCrossBlock(nn.Module):
    """Upstream ModulatedTransformerCrossOnlyBlock: adaLN-modulated cross-attention + MLP."""

    def __init__(self, channels: int, ctx_channels: int, num_heads: int, mlp_ratio: float, share_mod: bool):
        super().__init__()
        self.share_mod = share_mod
        self.cross_attn = Attention(channels, num_heads, ctx_channels, cross=True)
        self.mlp = FeedForward(channels, mlp_ratio)
        if not share_mod:
            self.adaLN_modulation = nn.Sequential(nn.SiLU(), nn.Linear(channels, 6 * channels))

    def forward(self, x: torch.Tensor, mod: torch.Tensor, context: torch.Tensor) -> torch.Tensor:
        if not self.share_mod:
            mod = self.adaLN_modulation(mod)
        c = x.shape[-1]
        # [B, 6C] -> six [B, 1, C] (upstream's chunk(6) + unsqueeze(1)) by slicing
        shift_msa, scale_msa, gate_msa, shift_mlp, scale_mlp, gate_mlp = (
            mod[:, None, i * c:(i + 1) * c] for i in range(6))
        h = layer_norm(x, 1e-6) * (1 + scale_msa) + shift_msa
        x = x + self.cross_attn(h, context) * gate_msa
        h = layer_norm(x, 1e-6) * (1 + scale_mlp) + shift_mlp
        return x + self.mlp(h) * gate_mlp


class CrossBlock(nn.Module):
    """Upstream TransformerCrossBlock: self-attention, cross-attention (affine norm2), MLP."""

    def __init__(self, channels: int, ctx_channels: int, num_heads: int, mlp_ratio: float):
        super().__init__()
        self.norm2 = nn.LayerNorm(channels, eps=1e-6)
        self.self_attn = Attention(channels, num_heads)
        self.cross_attn = Attention(channels, num_heads, ctx_channels, cross=True)
        self.mlp = FeedForward(channels, mlp_ratio)

    def forward(self, x: torch.Tensor, context: torch.Tensor) -> torch.Tensor:
        x = x + self.self_attn(layer_norm(x, 1e-6))
        x = x + self.cross_attn(self.norm2(x), context)
        return x + self.mlp(layer_norm(x, 1e-6))


class _Decoder(nn.Module):
    def set_attention_chunk(self, chunk: int):
        for module in self.modules():
            if isinstance(module, Attention):
                module.chunk = int(chunk)
        return self


# ---------------------------------------------------------------- the two decoders


class OctreeDecoder(_Decoder):
    """(points [B,Q,3], level [B] float, latent [B,T,16]) -> logits [B,Q,8]: the sinusoids in the graph.
    `OctreeDecoderHostSinusoids` (same weights and keys) takes them as inputs instead. The pipeline calls a
    graph by keyword and the reference positionally, so each form is its own forward signature."""

    host_sinusoids = False

    def __init__(self, cfg: OctreeDecoderConfig, attention_chunk: int = 0):
        super().__init__()
        self.cfg = cfg
        c = cfg.model_channels
        self.input_layer = nn.Linear(c, c)
        self.l_embedder = LevelEmbedder(c)
        if cfg.share_mod:
            self.adaLN_modulation = nn.Sequential(nn.SiLU(), nn.Linear(c, 6 * c))
        self.blocks = nn.ModuleList([ModulatedCrossBlock(c, cfg.cond_channels, cfg.num_heads, cfg.mlp_ratio,
                                                         cfg.share_mod) for _ in range(cfg.num_blocks)])
        self.out_proj = nn.Linear(c, 8)
        self.in_proj = nn.Linear(3, c)
        self.pos_embedder = PointEmbedder(c)
        self.set_attention_chunk(attention_chunk)

    def input_names(self) -> list[str]:
        return ["points", "level", "latent"]

    def host_inputs(self, points: torch.Tensor, level: torch.Tensor, latent: torch.Tensor) -> tuple:
        """The graph's inputs, in order, for parent-cell centres, float levels (resolution 2^lv) and the latent."""
        return points.float(), level.float(), latent.float()

    def decode(self, points, point_emb, level_emb, latent) -> torch.Tensor:
        h = self.input_layer(self.in_proj(points) + point_emb)
        mod = self.l_embedder(level_emb)
        if self.cfg.share_mod:
            mod = self.adaLN_modulation(mod)
        for block in self.blocks:
            h = block(h, mod, latent)
        return self.out_proj(layer_norm(h, 1e-5))

    def forward(self, points: torch.Tensor, level: torch.Tensor, latent: torch.Tensor) -> torch.Tensor:
        return self.decode(points, self.pos_embedder(points), self.l_embedder.sinusoid(level), latent)


class OctreeDecoderHostSinusoids(OctreeDecoder):
    """(points [B,Q,3], point_sinusoid [B,Q,C], level_sinusoid [B,256], latent [B,T,16]) -> logits [B,Q,8]."""

    host_sinusoids = True

    def input_names(self) -> list[str]:
        return ["points", "point_sinusoid", "level_sinusoid", "latent"]

    def host_inputs(self, points: torch.Tensor, level: torch.Tensor, latent: torch.Tensor) -> tuple:
        points = points.float()
        return points, point_sinusoid(points, self.cfg.model_channels), level_sinusoid(level), latent.float()

    def forward(self, points: torch.Tensor, point_sinusoid: torch.Tensor, level_sinusoid: torch.Tensor,
                latent: torch.Tensor) -> torch.Tensor:
        return self.decode(points, point_sinusoid, level_sinusoid, latent)


class GaussianDecoder(_Decoder):
    """(points [B,N,3], latent [B,T,16]) -> features [B,N,480], the point sinusoid in the graph;
    `GaussianDecoderHostSinusoids` takes it as an input after points. The offset perturbation buffers are
    upstream's (persistent, so in the decoder file) and serve the host-side Gaussian assembly (octree.py)."""

    host_sinusoids = False

    def __init__(self, cfg: GaussianDecoderConfig, attention_chunk: int = 0):
        super().__init__()
        self.cfg = cfg
        c, rep = cfg.model_channels, cfg.representation_config
        self.layout = gaussian_layout(rep.num_gaussians)
        self.out_channels = max(stop for _, stop in self.layout.values())
        self.input_layer = nn.Linear(c, c)
        self.blocks = nn.ModuleList([CrossBlock(c, cfg.cond_channels, cfg.num_heads, cfg.mlp_ratio)
                                     for _ in range(cfg.num_blocks)])
        self.in_proj = nn.Linear(cfg.in_channels, c)
        self.pos_embedder = PointEmbedder(c)
        self.out_proj = nn.Linear(c, self.out_channels)
        self.register_buffer("points_offset_perturbation", offset_perturbation(rep))
        self.register_buffer("base_offset_scale", torch.log(torch.exp(torch.tensor(rep.offset_scale)) - 1.0))
        self.set_attention_chunk(attention_chunk)

    def input_names(self) -> list[str]:
        return ["points", "latent"]

    def host_inputs(self, points: torch.Tensor, latent: torch.Tensor) -> tuple:
        return points.float(), latent.float()

    def decode(self, points, point_emb, latent) -> torch.Tensor:
        h = self.input_layer(self.in_proj(points) + point_emb)
        for block in self.blocks:
            h = block(h, latent)
        return self.out_proj(layer_norm(h, 1e-5))

    def forward(self, points: torch.Tensor, latent: torch.Tensor) -> torch.Tensor:
        return self.decode(points, self.pos_embedder(points), latent)


class GaussianDecoderHostSinusoids(GaussianDecoder):
    host_sinusoids = True

    def input_names(self) -> list[str]:
        return ["points", "point_sinusoid", "latent"]

    def host_inputs(self, points: torch.Tensor, latent: torch.Tensor) -> tuple:
        points = points.float()
        return points, point_sinusoid(points, self.cfg.model_channels), latent.float()

    def forward(self, points: torch.Tensor, point_sinusoid: torch.Tensor, latent: torch.Tensor) -> torch.Tensor:
        return self.decode(points, point_sinusoid, latent)


def octree_decoder(cfg: OctreeDecoderConfig, host_sinusoids: bool = False, attention_chunk: int = 0) -> OctreeDecoder:
    return (OctreeDecoderHostSinusoids if host_sinusoids else OctreeDecoder)(cfg, attention_chunk)


def gaussian_decoder(cfg: GaussianDecoderConfig, host_sinusoids: bool = False, attention_chunk: int = 0) -> GaussianDecoder:
    return (GaussianDecoderHostSinusoids if host_sinusoids else GaussianDecoder)(cfg, attention_chunk)


# ---------------------------------------------------------------- the fixed per-Gaussian offset pattern


PRIMES = (2, 3, 5)


def radical_inverse(base: int, n: int) -> float:
    value, inv = 0.0, 1.0 / base
    scale = inv
    while n > 0:
        value += (n % base) * scale
        n //= base
        scale *= inv
    return value


def offset_perturbation(rep: RepresentationConfig) -> torch.Tensor:
    """[num_gaussians, 3]: the 3-D Hammersley point set mapped through atanh((2u-1)/perturbe_size), as
    upstream `_build_perturbation` (its float64 Python values, rounded to fp32 once)."""
    n = rep.num_gaussians
    points = torch.tensor([[i / n, radical_inverse(PRIMES[0], i), radical_inverse(PRIMES[1], i)]
                           for i in range(n)]).float()
    return torch.atanh((points * 2 - 1) / rep.perturbe_size)


# ---------------------------------------------------------------- upstream's decoder file (prefixes octree. / gs.)

OCTREE_PREFIX, GAUSSIAN_PREFIX = "octree.", "gs."


def split_decoder_file(state_dict: dict[str, torch.Tensor], prefix: str) -> dict[str, torch.Tensor]:
    """One decoder's un-prefixed part of upstream's decoder file (`OctreeGaussianDecoder` state dict)."""
    return {k[len(prefix):]: v for k, v in state_dict.items() if k.startswith(prefix)}
