"""TripoSplat's image encoders, re-authored for both targets: DINOv3 ViT (`feature1`) and the FLUX.2 VAE encoder
(`feature2`), with upstream's pre/post-processing in the graph so each bundle's output is what the DiT consumes.

Upstream (triposplat.py `encode_image`, commit a78fa12) on the 1024² RGB composite `img` in [0, 1]:
- feature1 = layer_norm(DINOv3(normalize(img, ImageNet mean/std)))      -> [1, 5 + 64², 1280]
  (DINOv3's last hidden state after its final LayerNorm, then a second, affine-free layer norm)
- feature2 = cat(zeros(5), tokens(bn_normalize(patchify2x2(mean + exp(logvar/2)·noise))))  -> [1, 5 + 64², 128]
  (the VAE posterior sampled with the pipeline's seeded generator, drawn before the sampler's noise; the 2x2
  patchify puts channel c, offset (dy, dx) at c·4 + dy·2 + dx; batch-norm running statistics with eps 1e-5)

The references are the library classes on the same weights: transformers `DINOv3ViTModel` and diffusers
`AutoencoderKLFlux2` (`reference_*` below), with upstream's host-side steps around them stated in plain torch.
State-dict keys are the files' (upstream's `dino_v3_vit_h.safetensors` is transformers-keyed: `embeddings.*`,
`layer.N.*`, `norm.*`; `flux2-vae.safetensors` diffusers-keyed: `encoder.*`, `quant_conv.*`, `bn.*`, plus the
decoder half, which the encoder component drops), so the real files load strictly.

What was re-authored, and why (README "Image encoders"):
- every LayerNorm / GroupNorm in the fp16-safe prescaled form (zoo.rewrites.norms.adaptive_normalize): a plain
  norm's variance overflows fp16 once |x| > ~256 (`zoo doctor` flags half-layer-norm inside both library modules
  on the fp16 Core AI graph: scripts/triposplat_encoder_library_lowering.py);
- the cls / register tokens concatenated as they are: transformers' `cls_token.expand(B, ...)` lowers to
  BROADCAST_TO, which the LiteRT GPU delegate rejects (same script);
- DINOv3's 2-D RoPE cos/sin computed once at construction for the fixed image size (a buffer, as the DiT's Sobol
  embedding): no trig in the graph;
- attention as explicit softmax(q kᵀ/√d) v, query-chunked (`model.encoders.attention_chunk`): the VAE's mid
  attention at 1024² is one head over 16,384 tokens (a 1 GiB fp32 score matrix unchunked);
- the GroupNorm as reshape to [B, G, C/G·H·W] (rank 3): rank ≤ 4 throughout for the LiteRT GPU delegate;
- the 2x2 patchify as a strided convolution with one-hot weights (exact: each output is one input times 1) instead
  of upstream's rank-6 view/permute, which the LiteRT GPU delegate rejects ("bad input dims size: 6").
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from zoo.errors import ZooError
from zoo.rewrites.attention import query_chunked_attention
from zoo.rewrites.norms import SafeLayerNorm, adaptive_normalize, safe_layer_norm

IMAGENET_MEAN = (0.485, 0.456, 0.406)   # upstream's _DINOV3_NORMALIZE
IMAGENET_STD = (0.229, 0.224, 0.225)
PREFIX_TOKENS = 5                        # DINOv3's cls + 4 registers; feature2 is zero-padded by as many
VAE_BN_EPS = 1e-5                        # upstream's BatchNorm1d eps (diffusers' config default is 1e-4)
VAE_DOWNSAMPLE = 8                       # three stride-2 stages
VAE_PATCH = 2
# Keys the files carry that inference never reads: DINOv3's masked-image-modelling token, the VAE's decoder half
# and BN's update counter. Dropped by name before the strict load; everything else must match.
UNUSED_KEYS = ("embeddings.mask_token", "bn.num_batches_tracked")
UNUSED_PREFIXES = ("decoder.", "post_quant_conv.")


# ---------------------------------------------------------------- configs


@dataclass
class DinoConfig:
    """transformers DINOv3ViTConfig fields TripoSplat's DINOv3 uses (real: ViT-H+/16, upstream's DinoV3ViT)."""

    hidden_size: int = 1280
    intermediate_size: int = 5120
    num_hidden_layers: int = 32
    num_attention_heads: int = 20
    num_register_tokens: int = 4
    patch_size: int = 16
    layer_norm_eps: float = 1e-5
    rope_theta: float = 100.0
    query_bias: bool = True
    key_bias: bool = False
    value_bias: bool = True
    proj_bias: bool = True
    mlp_bias: bool = True
    use_gated_mlp: bool = True
    hidden_act: str = "silu"

    @classmethod
    def from_dict(cls, d: dict) -> "DinoConfig":
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in names})

    def library(self, image_size: int):
        from transformers import DINOv3ViTConfig

        return DINOv3ViTConfig(**asdict(self), image_size=image_size)


@dataclass
class VaeConfig:
    """diffusers AutoencoderKLFlux2 fields the encoder half uses (real: its defaults = FLUX.2's VAE)."""

    block_out_channels: tuple = (128, 256, 512, 512)
    layers_per_block: int = 2
    latent_channels: int = 32
    norm_num_groups: int = 32

    @classmethod
    def from_dict(cls, d: dict) -> "VaeConfig":
        names = {f.name for f in fields(cls)}
        out = cls(**{k: v for k, v in d.items() if k in names})
        out.block_out_channels = tuple(int(c) for c in out.block_out_channels)
        return out

    def library(self):
        from diffusers import AutoencoderKLFlux2

        n = len(self.block_out_channels)
        return AutoencoderKLFlux2(block_out_channels=self.block_out_channels, layers_per_block=self.layers_per_block,
                                  latent_channels=self.latent_channels, norm_num_groups=self.norm_num_groups,
                                  down_block_types=("DownEncoderBlock2D",) * n, up_block_types=("UpDecoderBlock2D",) * n,
                                  batch_norm_eps=VAE_BN_EPS)


def image_size_for(cond_tokens: int, patch_size: int) -> int:
    """The square canvas whose DINOv3 patches plus the 5 prefix tokens are the DiT's conditioning tokens
    (real: 4101 -> 64² patches -> 1024²; tiny: 21 -> 4² -> 64²)."""
    side = math.isqrt(max(int(cond_tokens) - PREFIX_TOKENS, 0))
    if side < 1 or side * side != int(cond_tokens) - PREFIX_TOKENS:
        raise ZooError(f"cond_tokens = {cond_tokens} is not {PREFIX_TOKENS} + a square number of DINOv3 patches.",
                       "set model.cond_tokens to 5 + n² (real: 4101 = 5 + 64²).")
    return side * int(patch_size)


# ---------------------------------------------------------------- shared pieces


class GroupNorm(nn.Module):
    """nn.GroupNorm's keys, computed on a rank-3 [B, G, C/G·H·W] view in the fp16-safe form."""

    def __init__(self, groups: int, channels: int, eps: float = 1e-6):
        super().__init__()
        self.groups, self.eps = groups, eps
        self.weight = nn.Parameter(torch.ones(channels))
        self.bias = nn.Parameter(torch.zeros(channels))

    def forward(self, x):
        b, c, h, w = x.shape
        y = adaptive_normalize(x.reshape(b, self.groups, (c // self.groups) * h * w), (-1,), self.eps, center=True)
        return y.reshape(b, c, h, w) * self.weight.reshape(1, c, 1, 1) + self.bias.reshape(1, c, 1, 1)


def split_heads(x: torch.Tensor, heads: int) -> torch.Tensor:
    b, n, c = x.shape
    return x.reshape(b, n, heads, c // heads).transpose(1, 2)


# ---------------------------------------------------------------- DINOv3 ViT


def rope_tables(cfg: DinoConfig, image_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """transformers' DINOv3ViTRopePositionEmbedding at inference (no coordinate augmentation), for one image size,
    in float64 then rounded once: cos/sin [1, 1, P, head_dim]."""
    head_dim = cfg.hidden_size // cfg.num_attention_heads
    side = image_size // cfg.patch_size
    inv_freq = 1.0 / cfg.rope_theta ** torch.arange(0, 1, 4 / head_dim, dtype=torch.float32)
    centres = (torch.arange(0.5, side, dtype=torch.float32) / side) * 2.0 - 1.0
    coords = torch.stack(torch.meshgrid(centres, centres, indexing="ij"), dim=-1).flatten(0, 1)     # [P, 2] (y, x)
    angles = (2 * math.pi * coords[:, :, None] * inv_freq[None, None, :]).flatten(1, 2).tile(2)      # [P, head_dim]
    return angles.cos()[None, None], angles.sin()[None, None]


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat([-x[..., half:], x[..., :half]], dim=-1)


class DinoAttention(nn.Module):
    def __init__(self, cfg: DinoConfig, chunk: int):
        super().__init__()
        c = cfg.hidden_size
        self.heads, self.chunk = cfg.num_attention_heads, chunk
        self.q_proj = nn.Linear(c, c, bias=cfg.query_bias)
        self.k_proj = nn.Linear(c, c, bias=cfg.key_bias)
        self.v_proj = nn.Linear(c, c, bias=cfg.value_bias)
        self.o_proj = nn.Linear(c, c, bias=cfg.proj_bias)

    def forward(self, x, cos, sin, prefix: int):
        b, n, c = x.shape
        q, k, v = (split_heads(proj(x), self.heads) for proj in (self.q_proj, self.k_proj, self.v_proj))
        # RoPE on the patch tokens only (cls and registers pass through), as transformers' apply_rotary_pos_emb
        q = torch.cat([q[:, :, :prefix], q[:, :, prefix:] * cos + rotate_half(q[:, :, prefix:]) * sin], dim=2)
        k = torch.cat([k[:, :, :prefix], k[:, :, prefix:] * cos + rotate_half(k[:, :, prefix:]) * sin], dim=2)
        out = query_chunked_attention(q, k, v, self.chunk)
        return self.o_proj(out.transpose(1, 2).reshape(b, n, c))


class DinoMLP(nn.Module):
    def __init__(self, cfg: DinoConfig):
        super().__init__()
        c, h = cfg.hidden_size, cfg.intermediate_size
        self.gated = cfg.use_gated_mlp
        if self.gated:
            self.gate_proj = nn.Linear(c, h, bias=cfg.mlp_bias)
        self.up_proj = nn.Linear(c, h, bias=cfg.mlp_bias)
        self.down_proj = nn.Linear(h, c, bias=cfg.mlp_bias)
        self.act = {"silu": F.silu, "gelu": F.gelu}[cfg.hidden_act]

    def forward(self, x):
        if self.gated:
            return self.down_proj(self.act(self.gate_proj(x)) * self.up_proj(x))
        return self.down_proj(self.act(self.up_proj(x)))


class LayerScale(nn.Module):
    def __init__(self, channels: int):
        super().__init__()
        self.lambda1 = nn.Parameter(torch.ones(channels))

    def forward(self, x):
        return x * self.lambda1


class DinoLayer(nn.Module):
    def __init__(self, cfg: DinoConfig, chunk: int):
        super().__init__()
        self.norm1 = SafeLayerNorm(cfg.hidden_size, cfg.layer_norm_eps)
        self.attention = DinoAttention(cfg, chunk)
        self.layer_scale1 = LayerScale(cfg.hidden_size)
        self.norm2 = SafeLayerNorm(cfg.hidden_size, cfg.layer_norm_eps)
        self.mlp = DinoMLP(cfg)
        self.layer_scale2 = LayerScale(cfg.hidden_size)

    def forward(self, x, cos, sin, prefix: int):
        x = x + self.layer_scale1(self.attention(self.norm1(x), cos, sin, prefix))
        return x + self.layer_scale2(self.mlp(self.norm2(x)))


class DinoEmbeddings(nn.Module):
    def __init__(self, cfg: DinoConfig):
        super().__init__()
        self.cls_token = nn.Parameter(torch.zeros(1, 1, cfg.hidden_size))
        self.register_tokens = nn.Parameter(torch.zeros(1, cfg.num_register_tokens, cfg.hidden_size))
        self.patch_embeddings = nn.Conv2d(3, cfg.hidden_size, cfg.patch_size, cfg.patch_size)

    def forward(self, pixels):
        patches = self.patch_embeddings(pixels).flatten(2).transpose(1, 2)
        return torch.cat([self.cls_token, self.register_tokens, patches], dim=1)


class ImageEncoder(nn.Module):
    """image [1, 3, S, S] (RGB composite in [0, 1]) -> feature1 [1, 5 + (S/16)², hidden]: upstream's ImageNet
    normalisation, DINOv3, its final norm, then the affine-free layer norm. `mean`/`std` other than upstream's are
    the gate's negative control only (`model.encoders.pixel_mean`)."""

    def __init__(self, cfg: DinoConfig, image_size: int, chunk: int = 0,
                 mean=IMAGENET_MEAN, std=IMAGENET_STD):
        super().__init__()
        self.config, self.image_size = cfg, image_size
        self.prefix = 1 + cfg.num_register_tokens
        self.embeddings = DinoEmbeddings(cfg)
        self.layer = nn.ModuleList(DinoLayer(cfg, chunk) for _ in range(cfg.num_hidden_layers))
        self.norm = SafeLayerNorm(cfg.hidden_size, cfg.layer_norm_eps)
        cos, sin = rope_tables(cfg, image_size)
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)
        self.register_buffer("pixel_mean", torch.tensor(mean, dtype=torch.float32).reshape(1, 3, 1, 1), persistent=False)
        self.register_buffer("pixel_std", torch.tensor(std, dtype=torch.float32).reshape(1, 3, 1, 1), persistent=False)

    def forward(self, image):
        x = self.embeddings((image - self.pixel_mean) / self.pixel_std)
        for layer in self.layer:
            x = layer(x, self.rope_cos, self.rope_sin, self.prefix)
        x = self.norm(x)
        return safe_layer_norm(x, 1e-5)          # upstream: F.layer_norm(feature, feature.shape[-1:]) on top


# ---------------------------------------------------------------- FLUX.2 VAE encoder


class ResnetBlock(nn.Module):
    """diffusers ResnetBlock2D (encoder use: no time embedding, silu, eps 1e-6)."""

    def __init__(self, cin: int, cout: int, groups: int):
        super().__init__()
        self.norm1 = GroupNorm(groups, cin)
        self.conv1 = nn.Conv2d(cin, cout, 3, 1, 1)
        self.norm2 = GroupNorm(groups, cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1)
        self.conv_shortcut = nn.Conv2d(cin, cout, 1) if cin != cout else None

    def forward(self, x):
        h = self.conv1(F.silu(self.norm1(x)))
        h = self.conv2(F.silu(self.norm2(h)))
        return (self.conv_shortcut(x) if self.conv_shortcut is not None else x) + h


class Downsample(nn.Module):
    """diffusers Downsample2D(padding=0): pad right and bottom by one, 3x3 stride 2."""

    def __init__(self, channels: int):
        super().__init__()
        self.conv = nn.Conv2d(channels, channels, 3, 2, 0)

    def forward(self, x):
        return self.conv(F.pad(x, (0, 1, 0, 1)))


class DownBlock(nn.Module):
    def __init__(self, cin: int, cout: int, layers: int, groups: int, downsample: bool):
        super().__init__()
        self.resnets = nn.ModuleList(ResnetBlock(cin if i == 0 else cout, cout, groups) for i in range(layers))
        self.downsamplers = nn.ModuleList([Downsample(cout)]) if downsample else None

    def forward(self, x):
        for resnet in self.resnets:
            x = resnet(x)
        return self.downsamplers[0](x) if self.downsamplers is not None else x


class MidAttention(nn.Module):
    """diffusers Attention as the VAE's mid block uses it: one head over the H·W tokens, residual, no rescale."""

    def __init__(self, channels: int, groups: int, chunk: int):
        super().__init__()
        self.chunk = chunk
        self.group_norm = GroupNorm(groups, channels)
        self.to_q = nn.Linear(channels, channels)
        self.to_k = nn.Linear(channels, channels)
        self.to_v = nn.Linear(channels, channels)
        self.to_out = nn.ModuleList([nn.Linear(channels, channels)])

    def forward(self, x):
        b, c, h, w = x.shape
        tokens = self.group_norm(x).reshape(b, c, h * w).transpose(1, 2)
        q, k, v = (proj(tokens).unsqueeze(1) for proj in (self.to_q, self.to_k, self.to_v))
        out = self.to_out[0](query_chunked_attention(q, k, v, self.chunk).squeeze(1))
        return x + out.transpose(1, 2).reshape(b, c, h, w)


class MidBlock(nn.Module):
    def __init__(self, channels: int, groups: int, chunk: int):
        super().__init__()
        self.resnets = nn.ModuleList([ResnetBlock(channels, channels, groups), ResnetBlock(channels, channels, groups)])
        self.attentions = nn.ModuleList([MidAttention(channels, groups, chunk)])

    def forward(self, x):
        return self.resnets[1](self.attentions[0](self.resnets[0](x)))


class Encoder(nn.Module):
    """diffusers vae.Encoder with double_z (keys `encoder.*`)."""

    def __init__(self, cfg: VaeConfig, chunk: int):
        super().__init__()
        ch, g = cfg.block_out_channels, cfg.norm_num_groups
        self.conv_in = nn.Conv2d(3, ch[0], 3, 1, 1)
        self.down_blocks = nn.ModuleList(
            DownBlock(ch[max(i - 1, 0)], ch[i], cfg.layers_per_block, g, i < len(ch) - 1) for i in range(len(ch)))
        self.mid_block = MidBlock(ch[-1], g, chunk)
        self.conv_norm_out = GroupNorm(g, ch[-1])
        self.conv_out = nn.Conv2d(ch[-1], 2 * cfg.latent_channels, 3, 1, 1)

    def forward(self, x):
        x = self.conv_in(x)
        for block in self.down_blocks:
            x = block(x)
        return self.conv_out(F.silu(self.conv_norm_out(self.mid_block(x))))


class BatchStats(nn.Module):
    """The VAE's BatchNorm2d running statistics (keys `bn.running_mean`, `bn.running_var`), read, not applied as
    a BatchNorm: upstream normalises with them by hand, with its own eps."""

    def __init__(self, channels: int):
        super().__init__()
        self.register_buffer("running_mean", torch.zeros(channels))
        self.register_buffer("running_var", torch.ones(channels))


def patchify_weight(channels: int, order: str = "upstream") -> torch.Tensor:
    """One-hot [4C, C, 2, 2] kernel: output channel c·4 + dy·2 + dx reads input channel c at offset (dy, dx) —
    upstream's view(B, C, H/2, 2, W/2, 2).permute(0, 1, 3, 5, 2, 4). `transposed` swaps dy and dx (the gate's
    negative control: same values, wrong channel order)."""
    weight = torch.zeros(channels * 4, channels, 2, 2)
    for c in range(channels):
        for dy in range(2):
            for dx in range(2):
                slot = dy * 2 + dx if order == "upstream" else dx * 2 + dy
                weight[c * 4 + slot, c, dy, dx] = 1.0
    return weight


class VaeEncoder(nn.Module):
    """image [1, 3, S, S] in [0, 1], noise [1, latent, S/8, S/8] -> feature2 [1, 5 + (S/16)², 4·latent]:
    upstream's `image·2 − 1`, the encoder, quant_conv, the posterior sample mean + exp(logvar/2)·noise, the 2x2
    patchify, the batch-norm normalisation, the tokens behind 5 zero tokens."""

    def __init__(self, cfg: VaeConfig, chunk: int = 0, patch_order: str = "upstream"):
        super().__init__()
        if patch_order not in ("upstream", "transposed"):
            raise ZooError(f"model.encoders.patch_order = {patch_order!r}.", "use upstream (transposed is the negative control).")
        self.config, self.patch_order = cfg, patch_order
        latent = cfg.latent_channels
        self.encoder = Encoder(cfg, chunk)
        self.quant_conv = nn.Conv2d(2 * latent, 2 * latent, 1)
        self.bn = BatchStats(latent * VAE_PATCH * VAE_PATCH)
        self.register_buffer("patchify", patchify_weight(latent, patch_order), persistent=False)

    def forward(self, image, noise):
        moments = self.quant_conv(self.encoder(image * 2 - 1))
        latent = self.config.latent_channels
        sample = moments[:, :latent] + torch.exp(0.5 * moments[:, latent:]) * noise
        # the batch-norm scale and shift folded into the patchify convolution: one op, per-channel constants
        inv_std = torch.rsqrt(self.bn.running_var + VAE_BN_EPS)
        patches = F.conv2d(sample, self.patchify * inv_std.reshape(-1, 1, 1, 1), -self.bn.running_mean * inv_std,
                           stride=VAE_PATCH)
        tokens = patches.flatten(2).transpose(1, 2)
        # the 5 zero tokens as a constant pad, not cat(torch.zeros(...)): Core AI's converter typed that `full` f32
        # inside a bf16 graph ("full[0]: dtype f32 vs bf16", `target=coreai precision=bf16`)
        return F.pad(tokens, (0, 0, PREFIX_TOKENS, 0))


# ---------------------------------------------------------------- state dicts


def clean_state(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The file's tensors the encoder reads: drop UNUSED_KEYS / UNUSED_PREFIXES; transformers >= 5 saves DINOv3's
    blocks under `model.layer.N` where the released file has `layer.N`."""
    out = {}
    for key, value in state.items():
        if key in UNUSED_KEYS or key.startswith(UNUSED_PREFIXES):
            continue
        out[key[len("model."):] if key.startswith("model.layer.") else key] = value
    return out


def library_dino_state(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Our (released-file) keys -> this transformers' DINOv3ViTModel keys, mask token added as zeros if absent."""
    out = {("model." + k if k.startswith("layer.") else k): v for k, v in state.items()}
    out.setdefault("embeddings.mask_token", torch.zeros_like(state["embeddings.cls_token"]))
    return out


def seeded_dino_state(cfg: DinoConfig, seed: int) -> dict[str, torch.Tensor]:
    """transformers' own init under a seed, then every norm affine, layer scale and token perturbed so that no
    weight is the identity (a port that skipped one would still match)."""
    from transformers import DINOv3ViTModel

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(int(seed))
        state = clean_state(DINOv3ViTModel(cfg.library(224)).state_dict())
        generator = torch.Generator().manual_seed(int(seed) + 11)
        for key, value in state.items():
            if value.ndim == 1 and ("norm" in key or "lambda1" in key):
                state[key] = value + 0.1 * torch.randn(value.shape, generator=generator)
            elif key.endswith(("cls_token", "register_tokens")):
                state[key] = torch.randn(value.shape, generator=generator)
    return {k: v.contiguous() for k, v in state.items()}


def seeded_vae_state(cfg: VaeConfig, seed: int) -> dict[str, torch.Tensor]:
    """diffusers' own init under a seed (encoder half), norm affines perturbed, and batch-norm statistics that are
    not the identity (mean ~ N(0, 0.5²), var in [0.25, 4]) so the normalisation is visible to the gates."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(int(seed))
        state = clean_state(cfg.library().state_dict())
        generator = torch.Generator().manual_seed(int(seed) + 13)
        for key, value in state.items():
            if value.ndim == 1 and "norm" in key:
                state[key] = value + 0.1 * torch.randn(value.shape, generator=generator)
        channels = state["bn.running_mean"].shape[0]
        state["bn.running_mean"] = 0.5 * torch.randn(channels, generator=generator)
        state["bn.running_var"] = torch.exp(torch.empty(channels).uniform_(-1.386, 1.386, generator=generator))
    return {k: v.contiguous() for k, v in state.items()}


# ---------------------------------------------------------------- references (the library classes)


class ReferenceImageEncoder(nn.Module):
    """transformers DINOv3ViTModel (eager attention) + upstream's normalisation and final layer norm, in torch."""

    def __init__(self, cfg: DinoConfig, image_size: int, state: dict[str, torch.Tensor]):
        super().__init__()
        from transformers import DINOv3ViTModel

        library_cfg = cfg.library(image_size)
        library_cfg._attn_implementation = "eager"
        self.model = DINOv3ViTModel(library_cfg).eval()
        self.model.load_state_dict(library_dino_state(state), strict=True)
        self.register_buffer("mean", torch.tensor(IMAGENET_MEAN).reshape(1, 3, 1, 1))
        self.register_buffer("std", torch.tensor(IMAGENET_STD).reshape(1, 3, 1, 1))

    @torch.no_grad()
    def forward(self, image):
        hidden = self.model(pixel_values=(image - self.mean) / self.std).last_hidden_state
        return F.layer_norm(hidden.float(), hidden.shape[-1:])


class ReferenceVaeEncoder(nn.Module):
    """diffusers AutoencoderKLFlux2 (encoder + quant_conv) + upstream's Flux2VAEEncoder.encode sampling, patchify,
    normalisation and the 5-token pad, in torch as upstream writes them."""

    def __init__(self, cfg: VaeConfig, state: dict[str, torch.Tensor]):
        super().__init__()
        self.vae = cfg.library().eval()
        full = self.vae.state_dict()
        loaded = {**{k: v for k, v in full.items() if k.startswith(UNUSED_PREFIXES)}, **state,
                  "bn.num_batches_tracked": full["bn.num_batches_tracked"]}
        self.vae.load_state_dict(loaded, strict=True)

    @torch.no_grad()
    def forward(self, image, noise):
        moments = self.vae._encode(image * 2 - 1)
        mean, logvar = moments.chunk(2, dim=1)
        latents = mean + torch.exp(0.5 * logvar) * noise
        b, c, h, w = latents.shape
        latents = latents.view(b, c, h // 2, 2, w // 2, 2).permute(0, 1, 3, 5, 2, 4).reshape(b, c * 4, h // 2, w // 2)
        bn_mean = self.vae.bn.running_mean.view(1, -1, 1, 1)
        bn_std = torch.sqrt(self.vae.bn.running_var.view(1, -1, 1, 1) + VAE_BN_EPS)
        tokens = ((latents - bn_mean) / bn_std).flatten(2).transpose(1, 2)
        return torch.cat([torch.zeros(b, PREFIX_TOKENS, tokens.shape[2]), tokens], dim=1)


def vae_noise_shape(cfg: VaeConfig, image_size: int) -> tuple[int, int, int, int]:
    side = image_size // VAE_DOWNSAMPLE
    return (1, cfg.latent_channels, side, side)


def pipeline_noise(seed: int, vae_shape: tuple[int, ...], tokens: int, channels: int,
                   camera_channels: int) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Upstream's draws from one generator seeded with `seed`, in its order: the VAE posterior noise
    (`encode_image`), then the sampler's latent and camera noise (`sample_latent`)."""
    generator = torch.Generator().manual_seed(int(seed))
    vae = torch.randn(vae_shape, generator=generator)
    latent = torch.randn(1, tokens, channels, generator=generator)
    camera = torch.randn(1, 1, camera_channels, generator=generator)
    return vae, {"latent": latent, "camera": camera}


def test_card(size: int) -> np.ndarray:
    """A fixed RGBA cut-out (uint8 [size, size, 4]) for the gates: a shaded, two-coloured disc with a soft edge on a
    transparent background, off-centre so the crop has something to do."""
    yy, xx = np.mgrid[0:size, 0:size].astype(np.float64) / size
    r = np.hypot(xx - 0.45, yy - 0.55)
    alpha = np.clip((0.33 - r) / 0.02, 0, 1)
    rgb = np.stack([0.2 + 0.7 * xx, 0.3 + 0.5 * (yy > 0.55), 0.8 - 0.6 * r * 2], axis=-1)
    return (np.concatenate([np.clip(rgb, 0, 1), alpha[..., None]], axis=-1) * 255).round().astype(np.uint8)
