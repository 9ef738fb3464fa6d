"""TripoSplat's rectified-flow DiT (`LatentSeqMMFlowModel`), re-authored for export with upstream's state-dict keys.

Upstream (VAST-AI-Research/TripoSplat model.py, commit a78fa12, MIT) is read, not imported: it imports
torchvision at top level, which cannot live in the main venv. The real `triposplat_fp16.safetensors`
(559 keys, 370.5 M params) and the tiny golden checkpoint load strictly into `LatentSeqMMFlowModel` here.

What differs from upstream, and why (measurements: ../shared/notes/models.md "TripoSplat lowering, measured"):
- RePo RoPE returns real cos/sin `[B, L, H, D/2]` instead of `torch.polar` complex numbers: LiteRT has no
  lowering for `aten.polar` ("Lowering not found: aten.polar.default").
- Rotation in a de-interleaved layout: upstream rotates the (even, odd) pairs of each head; here the qkv
  Linear's q and k rows and the q/k norm gammas are permuted at load time (even dims first, then odd), so
  the rotation is the rank-4 `x*cos + rotate_half(x)*sin` and q·k is unchanged (the same permutation on
  both sides of the dot product). `state_dict()` un-permutes, so the keys and tensors stay upstream's.
  Upstream's pair view is rank 5, which the LiteRT GPU delegate rejects.
- Every norm (the q/k RMS norm, the LayerNorms) in the fp16-safe row-prescaled form of zoo.rewrites.norms
  (`adaptive_normalize`): exact to fp32 rounding, and no fp16 intermediate passes 65504 (a plain LayerNorm's
  variance overflows once |x| > ~256; the q/k Σx² of a 64-wide head once |x| > ~32).
- The Sobol positional embedding (`SobolEngine(3, scramble=True, seed=123)`, then 2^k-frequency sinusoids)
  is computed at construction into a non-persistent buffer (bitwise upstream's values), and the input
  layer's bias is folded into it: on the LiteRT GPU delegate a FULLY_CONNECTED followed by an ADD of a
  full-shape rank-3 constant was accepted but wrong (max-abs 5.0 on |y| 4.5, fp32 too; toolchain.md §3.2).
- Blocks are called positionally (upstream's `mod=` keyword breaks torch.export: "got multiple values for
  argument 'mod'"); qkv is split by slicing (no rank-5 reshape + unbind).
- Attention is explicit matmul/softmax, optionally query-chunked (`attention_chunk`): at the real 12,294
  tokens one 16-head fp16 score tensor is 4.8 GB; chunk 256 was GPU-accepted, 2048 not (512 MiB > 128 MiB).
- The timestep sinusoid is computed on the host (`timestep_frequencies`, upstream's formula and op order)
  and enters as the graph input `t_freq`: in-graph sinusoids of t≈1000 were the largest fp16 error.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Optional

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from zoo.rewrites.attention import query_chunked_attention
from zoo.rewrites.norms import SafeLayerNorm, adaptive_normalize, safe_layer_norm

SOBOL_SEED = 123              # upstream: SobolEngine(dimension=3, scramble=True, seed=123)
TIMESTEP_FREQUENCIES = 256    # upstream TimestepEmbedder.frequency_embedding_size
TIMESTEP_MAX_PERIOD = 10000
RMS_EPS_SQUARED = 1e-24       # F.normalize clamps ‖x‖ at 1e-12: the same floor on Σx², divided by D for mean(x²)
INPUT_NAMES = ("latent", "camera", "t_freq", "feature1", "feature2")
OUTPUT_NAMES = ("latent_velocity", "camera_velocity")


@dataclass
class DiTConfig:
    """Upstream's constructor arguments (LatentSeqMMFlowModel.__init__), the checkpoint's config.json."""

    q_token_length: int
    in_channels: int
    model_channels: int
    cond_channels: int
    out_channels: int
    num_blocks: int
    num_refiner_blocks: int = 2
    num_heads: Optional[int] = None
    num_head_channels: int = 64
    cam_channels: Optional[int] = None
    cond2_channels: Optional[int] = None
    mlp_ratio: float = 4
    share_mod: bool = True
    qk_rms_norm: bool = False
    use_shift_table: bool = False

    @classmethod
    def from_dict(cls, config: dict) -> "DiTConfig":
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(config) - known)
        if unknown:
            raise ValueError(f"unknown LatentSeqMMFlowModel arguments: {unknown}")
        return cls(**config)

    def to_dict(self) -> dict:
        return asdict(self)

    @property
    def heads(self) -> int:
        return self.num_heads or self.model_channels // self.num_head_channels


# ---------------------------------------------------------------- host-side pieces (bitwise upstream)


def timestep_frequencies(t: torch.Tensor, dim: int = TIMESTEP_FREQUENCIES, max_period: int = TIMESTEP_MAX_PERIOD):
    """Upstream TimestepEmbedder.timestep_embedding, same ops in the same order (so bitwise equal): `t` is the
    sampler's 1000·t, shape [B]. Runs on the host; the graph takes its [B, 256] result."""
    half = dim // 2
    freqs = torch.exp(-np.log(max_period) * torch.arange(start=0, end=half, dtype=torch.float32) / half)
    args = t[:, None].float() * freqs[None]
    embedding = torch.cat([torch.cos(args), torch.sin(args)], dim=-1)
    if dim % 2:
        embedding = torch.cat([embedding, torch.zeros_like(embedding[:, :1])], dim=-1)
    return embedding


def sobol_points(count: int, seed: int = SOBOL_SEED) -> torch.Tensor:
    """The scrambled 3D Sobol point set upstream places the latent tokens at, [1, count, 3]."""
    return torch.quasirandom.SobolEngine(dimension=3, scramble=True, seed=seed).draw(count).unsqueeze(0)


def point_frequencies(channels: int, in_channels: int = 3, max_res: int = 16) -> torch.Tensor:
    """PcdAbsolutePositionEmbedder._freqs: 2^0..2^(max_res-1), then a linear ramp of exponents."""
    freq_dim = channels // in_channels // 2
    exponents = torch.arange(max_res, dtype=torch.float32)
    res_dim = max(0, freq_dim - max_res)
    ramp = (torch.arange(res_dim, dtype=torch.float32) / max(res_dim, 1) * max_res) if res_dim > 0 else torch.empty(0)
    return torch.pow(2.0, torch.cat([exponents, ramp], dim=0)[:freq_dim])


def point_embedding(points: torch.Tensor, channels: int) -> torch.Tensor:
    """PcdAbsolutePositionEmbedder.forward on [B, L, 3] points, zero-padded to `channels` (fp32)."""
    *dims, _ = points.shape
    angles = torch.outer(points.float().reshape(-1), point_frequencies(channels)) * 2 * torch.pi
    out = torch.cat([angles.sin(), angles.cos()], dim=-1).reshape(*dims, -1)
    if out.shape[-1] < channels:
        out = torch.cat([out, torch.zeros(*dims, channels - out.shape[-1])], dim=-1)
    return out


def deinterleave_order(head_dim: int) -> torch.Tensor:
    """Even dims first, then odd: upstream's rotation pairs (2i, 2i+1) become (i, i + D/2)."""
    return torch.cat([torch.arange(0, head_dim, 2), torch.arange(1, head_dim, 2)])


# ---------------------------------------------------------------- building blocks


class HeadRMSNorm(nn.Module):
    """MultiHeadRMSNorm: per head, F.normalize(x)·γ·√D = x / rms(x) · γ. `gamma` [H, D] is held in the
    de-interleaved order. Taken in the fp16-safe form (row max-|x| prescaling, adaptive_normalize): Σx² of a
    64-wide head passes fp16's range once |x| > ~32. F.normalize's clamp ‖x‖ >= 1e-12 becomes eps on mean(x²)."""

    def __init__(self, head_dim: int, heads: int):
        super().__init__()
        self.eps = RMS_EPS_SQUARED / head_dim
        self.gamma = nn.Parameter(torch.ones(heads, head_dim))

    def forward(self, x):  # [B, L, H, D]
        return adaptive_normalize(x, (-1,), self.eps, center=False) * self.gamma


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Upstream's complex rotation of pairs (x[2i], x[2i+1]) by angle i, in the de-interleaved layout."""
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos + rotated * sin


class RePoRotary(nn.Module):
    """RePo3DRotaryEmbedding: content-dependent 3D RoPE angles per token and head, as real cos/sin.

    Upstream's `clamp_mul(x, f) = x·tanh f + x·(f − tanh f)` is x·f in the forward pass (its split only
    shapes the gradient), so the angle is x·f·π here."""

    def __init__(self, model_channels: int, heads: int, head_dim: int, hidden_ratio: float = 0.125,
                 max_freq: float = 16.0):
        super().__init__()
        self.heads = heads
        hidden = int(model_channels * hidden_ratio)
        self.norm = SafeLayerNorm(model_channels, eps=1e-5)
        self.gate_map = nn.Linear(model_channels, hidden, bias=False)
        self.content_map = nn.Linear(model_channels, hidden, bias=False)
        self.final_map = nn.Linear(hidden, 3 * heads, bias=False)
        d01 = 2 * (head_dim // 6)
        for i, d in enumerate((d01, d01, head_dim - 2 * d01)):
            setattr(self, f"freqs_{i}", nn.Parameter(torch.linspace(1.0, float(max_freq), steps=d // 2)))

    def forward(self, x):
        h = self.norm(x)
        delta = self.final_map(F.silu(self.gate_map(h)) * self.content_map(h))   # [B, L, 3H]
        B, L, _ = delta.shape
        delta = delta.reshape(B, L, self.heads, 3)
        angles = torch.cat([delta[..., i:i + 1] * getattr(self, f"freqs_{i}") for i in range(3)], dim=-1) * torch.pi
        cos, sin = torch.cos(angles), torch.sin(angles)                           # [B, L, H, D/2]
        return torch.cat([cos, cos], dim=-1), torch.cat([sin, sin], dim=-1)       # [B, L, H, D]


class RopeSelfAttention(nn.Module):
    """RopeMultiHeadAttention (type "self"): rotate q, k, then their RMS norm, then attention."""

    def __init__(self, channels: int, heads: int, qk_rms_norm: bool):
        super().__init__()
        self.channels, self.heads, self.head_dim = channels, heads, channels // heads
        self.qk_rms_norm = qk_rms_norm
        self.chunk = 0
        self.qkv = nn.Linear(channels, 3 * channels)
        if qk_rms_norm:
            self.q_norm = HeadRMSNorm(self.head_dim, heads)
            self.k_norm = HeadRMSNorm(self.head_dim, heads)
        self.out = nn.Linear(channels, channels)
        self._register_load_state_dict_pre_hook(self._deinterleave_on_load)
        self._register_state_dict_hook(self._interleave_on_save)

    # q and k rows of the qkv Linear, and the norm gammas, live in the de-interleaved order inside the module
    def _qk_permutation(self, inverse: bool) -> torch.Tensor:
        order = deinterleave_order(self.head_dim)
        if inverse:
            order = torch.argsort(order)
        per_head = torch.cat([h * self.head_dim + order for h in range(self.heads)])
        identity = torch.arange(self.channels)
        return torch.cat([per_head, self.channels + per_head, 2 * self.channels + identity])

    def _permute(self, state, prefix, inverse: bool):
        rows = self._qk_permutation(inverse)
        order = deinterleave_order(self.head_dim)
        order = torch.argsort(order) if inverse else order
        for name in ("qkv.weight", "qkv.bias"):
            if prefix + name in state:
                state[prefix + name] = state[prefix + name][rows].contiguous()
        for name in ("q_norm.gamma", "k_norm.gamma"):
            if prefix + name in state:
                state[prefix + name] = state[prefix + name][:, order].contiguous()

    def _deinterleave_on_load(self, state, prefix, *_args):
        self._permute(state, prefix, inverse=False)

    def _interleave_on_save(self, _module, state, prefix, _local_metadata):
        self._permute(state, prefix, inverse=True)
        return state

    def forward(self, x, cos, sin):
        B, L, C = x.shape
        qkv = self.qkv(x)
        q = qkv[..., :C].reshape(B, L, self.heads, self.head_dim)
        k = qkv[..., C:2 * C].reshape(B, L, self.heads, self.head_dim)
        v = qkv[..., 2 * C:].reshape(B, L, self.heads, self.head_dim)
        q, k = rotate(q, cos, sin), rotate(k, cos, sin)
        if self.qk_rms_norm:
            q, k = self.q_norm(q), self.k_norm(k)
        h = query_chunked_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), self.chunk)
        return self.out(h.transpose(1, 2).reshape(B, L, C))


class FeedForward(nn.Module):
    """FeedForwardNet / MLP: Linear, tanh-GELU, Linear (keys `mlp.0`, `mlp.2`)."""

    def __init__(self, channels: int, inner: int, out: int):
        super().__init__()
        self.mlp = nn.Sequential(nn.Linear(channels, inner), nn.GELU(approximate="tanh"), nn.Linear(inner, out))

    def forward(self, x):
        return self.mlp(x)


class UnifiedBlock(nn.Module):
    """UnifiedTransformerBlock. Modulated (noise refiner, main blocks): adaLN from the shared table plus a
    per-block shift table; unmodulated (context refiner): affine LayerNorms."""

    def __init__(self, channels: int, heads: int, mlp_ratio: float, qk_rms_norm: bool, modulation: bool,
                 use_shift_table: bool):
        super().__init__()
        self.modulation = modulation
        if not modulation:
            self.norm1 = SafeLayerNorm(channels, eps=1e-6)
            self.norm2 = SafeLayerNorm(channels, eps=1e-6)
        self.attn = RopeSelfAttention(channels, heads, qk_rms_norm)
        self.mlp = FeedForward(channels, int(channels * mlp_ratio), channels)
        if modulation and use_shift_table:
            self.shift_table = nn.Parameter(torch.randn(1, 6 * channels) / channels ** 0.5)
        else:
            self.shift_table = None

    def forward(self, x, mod, cos, sin):
        if not self.modulation:
            x = x + self.attn(self.norm1(x), cos, sin)
            return x + self.mlp(self.norm2(x))
        if self.shift_table is not None:
            mod = mod + self.shift_table
        C = x.shape[-1]
        shift_msa, scale_msa, gate_msa, shift_mlp, scale_mlp, gate_mlp = (
            mod[:, i * C:(i + 1) * C].unsqueeze(1) for i in range(6))
        h = safe_layer_norm(x, 1e-6) * (1 + scale_msa) + shift_msa
        x = x + self.attn(h, cos, sin) * gate_msa
        h = safe_layer_norm(x, 1e-6) * (1 + scale_mlp) + shift_mlp
        return x + self.mlp(h) * gate_mlp


class TimestepMLP(nn.Module):
    """TimestepEmbedder's MLP (keys `mlp.0`, `mlp.2`); its sinusoid is `timestep_frequencies` on the host."""

    def __init__(self, hidden: int):
        super().__init__()
        self.mlp = nn.Sequential(nn.Linear(TIMESTEP_FREQUENCIES, hidden), nn.SiLU(), nn.Linear(hidden, hidden))

    def forward(self, t_freq):
        return self.mlp(t_freq)


# ---------------------------------------------------------------- the DiT


class LatentSeqMMFlowModel(nn.Module):
    """(latent [B,N,16], camera [B,1,5], t_freq [B,256], feature1 [B,M,cond], feature2 [B,M,cond2])
    -> (latent velocity [B,N,16], camera velocity [B,1,5]). Upstream's x_t/cond dicts become positional inputs."""

    def __init__(self, cfg: DiTConfig, attention_chunk: int = 0, sobol_seed: int = SOBOL_SEED):
        super().__init__()
        if cfg.cam_channels is None or cfg.cond2_channels is None:
            raise ValueError("the port covers TripoSplat's configuration: camera and second condition present")
        if cfg.num_refiner_blocks < 2:
            raise ValueError("num_refiner_blocks must be >= 2 (upstream's camera MLP breaks with 1)")
        self.cfg = cfg
        C, H, D = cfg.model_channels, cfg.heads, cfg.num_head_channels
        if H * D != C:
            raise ValueError(f"heads x head channels ({H} x {D}) must equal model_channels ({C})")
        self.t_embedder = TimestepMLP(C)
        if cfg.share_mod:
            self.adaLN_modulation = nn.Sequential(nn.SiLU(), nn.Linear(C, 6 * C))
        self.input_layer = nn.Linear(cfg.in_channels, C)
        self.cond_embedder = nn.Linear(cfg.cond_channels, C)
        self.cond_embedder2 = nn.Linear(cfg.cond2_channels, C)
        self.noise_repo_layers = nn.ModuleList([RePoRotary(C, H, D) for _ in range(cfg.num_refiner_blocks)])
        self.context_repo_layers = nn.ModuleList([RePoRotary(C, H, D) for _ in range(cfg.num_refiner_blocks)])
        self.repo_layers = nn.ModuleList([RePoRotary(C, H, D) for _ in range(cfg.num_blocks)])

        def block(modulation):
            return UnifiedBlock(C, H, cfg.mlp_ratio, cfg.qk_rms_norm, modulation, cfg.use_shift_table)

        if not cfg.share_mod:
            raise ValueError("the port covers share_mod=True (TripoSplat's configuration)")
        self.noise_refiner = nn.ModuleList([block(True) for _ in range(cfg.num_refiner_blocks)])
        self.context_refiner = nn.ModuleList([block(False) for _ in range(cfg.num_refiner_blocks)])
        # upstream MLP(cam, C, C, mlp_layer_num=num_refiner_blocks): keys mlp.0 / mlp.2 for the 2 layers it has
        if cfg.num_refiner_blocks != 2:
            raise ValueError("the camera MLP is ported for num_refiner_blocks=2 (TripoSplat's configuration)")
        self.cam_refiner = FeedForward(cfg.cam_channels, C, C)
        self.blocks = nn.ModuleList([block(True) for _ in range(cfg.num_blocks)])
        self.shift_table = (nn.Parameter(torch.randn(1, 2, C) / C ** 0.5) if cfg.use_shift_table else None)
        self.out_layer = nn.Linear(C, cfg.out_channels)
        self.cam_out_layer = nn.Linear(C, cfg.cam_channels)
        # Sobol token positions -> sinusoids, precomputed (a constant-folded sin of angles up to 2^15·2π
        # loses precision); the input layer's bias is folded in after every load (_fold_input_bias).
        self.register_buffer("sobol_embedding", point_embedding(sobol_points(cfg.q_token_length, sobol_seed), C),
                             persistent=False)
        self.register_buffer("sobol_plus_input_bias", self.sobol_embedding + self.input_layer.bias.detach(),
                             persistent=False)
        self.register_load_state_dict_post_hook(lambda module, _keys: module.fold_input_bias())
        self.set_attention_chunk(attention_chunk)

    @torch.no_grad()
    def fold_input_bias(self) -> None:
        """LiteRT GPU: FULLY_CONNECTED then ADD of a full-shape rank-3 constant miscomputes (toolchain.md §3.2);
        one constant (Sobol sinusoids + the input layer's bias) after a bias-free matmul does not."""
        self.sobol_plus_input_bias.copy_(self.sobol_embedding + self.input_layer.bias)

    def set_attention_chunk(self, chunk: int) -> "LatentSeqMMFlowModel":
        for module in self.modules():
            if isinstance(module, RopeSelfAttention):
                module.chunk = int(chunk)
        return self

    def forward(self, latent, camera, t_freq, feature1, feature2):
        h_x = F.linear(latent, self.input_layer.weight) + self.sobol_plus_input_bias
        h_cond = self.cond_embedder(feature1) + self.cond_embedder2(feature2)
        t_emb = self.t_embedder(t_freq)
        t_mod = self.adaLN_modulation(t_emb)
        for block, repo in zip(self.noise_refiner, self.noise_repo_layers):
            h_x = block(h_x, t_mod, *repo(h_x))
        for block, repo in zip(self.context_refiner, self.context_repo_layers):
            h_cond = block(h_cond, None, *repo(h_cond))
        h = torch.cat([h_x, h_cond, self.cam_refiner(camera)], dim=1)
        for block, repo in zip(self.blocks, self.repo_layers):
            h = block(h, t_mod, *repo(h))
        n = latent.shape[1]
        h_x = safe_layer_norm(h[:, :n], 1e-5)
        h_cam = safe_layer_norm(h[:, h.shape[1] - 1:], 1e-5)
        if self.shift_table is not None:
            table = self.shift_table + t_emb.unsqueeze(1)       # [B, 2, C]
            shift, scale = table[:, 0:1], table[:, 1:2]
            h_x = h_x * (1 + scale) + shift
            h_cam = h_cam * (1 + scale) + shift
        return self.out_layer(h_x), self.cam_out_layer(h_cam)
