"""RF-DETR (Roboflow's LWDETR), re-authored for fixed-shape export to Core AI and LiteRT.

State-dict keys match upstream `rfdetr` 1.11.2 (`LWDETR.state_dict()`), so its checkpoints load strictly.
Architecture (eval path only): windowed DINOv2 ViT backbone → multi-scale projector (C2f + LayerNorm, P4) →
two-stage query selection (top-k encoder proposals) → deformable-attention decoder with lite reference
refinement → bbox reparameterisation. What changed against upstream, and why:
- input is an image in [0, 1]; ImageNet normalisation is the first op of the graph (two constants);
- window partition/merge written at rank ≤ 4 (upstream reshapes through rank 5; the LiteRT GPU rejects
  rank > 4), batch folded into the window axis;
- position embeddings used as stored (resolution = positional_encoding_size × patch_size, as every variant
  is configured), so no in-graph bicubic resize; the two-stage proposals and their validity mask are
  build-time constants (they depend only on the feature-map shape), applied as float multiplies;
- the sine query embedding's frequency table is a constant buffer; sin/cos are interleaved by a rank-4 stack;
- attention (ViT, decoder self-attention) is explicit matmul → softmax → matmul at rank 4;
- the deformable sampler never calls `F.grid_sample` (no Core AI lowering; GATHER_ND on the LiteRT GPU):
  `sampler="gather"` is a 4-corner bilinear gather with a GPU-safe floor and float-arithmetic validity
  masks; `sampler="tent"` builds per-query bilinear weights as tent functions and samples with two batched
  matmuls (no gather at all; see zoo/rewrites/resampling.py). Both equal grid_sample(align_corners=False,
  padding zeros) to float rounding;
- query selection (top-k + row gather) stays in the graph; the row gather is an index_select on a
  flattened [B·HW, C] memory (no expand → BROADCAST_TO).
Unsupported here (raise): projector scales other than P4 (every released detection variant uses P4),
segmentation/keypoint heads, decoder registers, dual projector.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields

import torch
import torch.nn.functional as F
from torch import nn

from zoo.errors import ZooError
from zoo.rewrites.deformable import gather_bilinear

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
SAMPLERS = ("gather", "tent", "grid_sample")  # grid_sample: torch's op, for the reference only
SELECTIONS = ("index", "onehot")  # how the top-k encoder rows are picked (Transformer.pick_rows)


@dataclass(frozen=True)
class RFDETRConfig:
    resolution: int
    patch_size: int
    num_windows: int
    out_feature_indexes: list[int]
    vit_hidden_size: int
    vit_heads: int
    vit_layers: int
    hidden_dim: int
    sa_nheads: int
    ca_nheads: int
    dec_n_points: int
    dec_layers: int
    num_queries: int
    num_classes: int          # upstream's class head width (its num_classes + 1)
    vit_registers: int = 0
    dim_feedforward: int = 2048
    group_detr: int = 13
    projector_scale: list[str] = field(default_factory=lambda: ["P4"])
    vit_mlp_ratio: int = 4
    vit_layer_norm_eps: float = 1e-6

    @classmethod
    def from_dict(cls, config: dict) -> "RFDETRConfig":
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(config) - known)
        if unknown:
            raise ZooError(f"RF-DETR config has unknown keys {unknown}.", f"use only {sorted(known)}.")
        return cls(**{k: (list(v) if isinstance(v, (list, tuple)) else v) for k, v in config.items()})

    @property
    def patches_per_side(self) -> int:
        return self.resolution // self.patch_size

    @property
    def window_block_indexes(self) -> list[int]:
        """Upstream's rule: every block up to the last output index that is not itself an output index."""
        return sorted(set(range(self.out_feature_indexes[-1] + 1)) - set(self.out_feature_indexes))

    def check(self) -> None:
        if self.projector_scale != ["P4"]:
            raise ZooError(f"RF-DETR projector_scale {self.projector_scale} is not supported by this port.",
                           "use a detection variant (nano/small/medium/large all use ['P4']).")
        if self.resolution % (self.patch_size * self.num_windows):
            raise ZooError(f"RF-DETR resolution {self.resolution} is not a multiple of patch_size × num_windows "
                           f"({self.patch_size} × {self.num_windows}).", "pick a resolution that is.")


# ------------------------------------------------------------------ shared small pieces


def layer_norm_channels(x: torch.Tensor, norm: nn.Module) -> torch.Tensor:
    """LayerNorm over the channel axis of [B, C, H, W] (upstream's channels-first LayerNorm)."""
    x = x.permute(0, 2, 3, 1)
    x = F.layer_norm(x, norm.normalized_shape, norm.weight, norm.bias, norm.eps)
    return x.permute(0, 3, 1, 2)


class ChannelsLayerNorm(nn.Module):
    """Keys `weight`, `bias` like upstream's projector LayerNorm (eps 1e-6)."""

    def __init__(self, channels: int, eps: float = 1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(channels))
        self.bias = nn.Parameter(torch.zeros(channels))
        self.eps = eps
        self.normalized_shape = (channels,)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return layer_norm_channels(x, self)


class MLP(nn.Module):
    """ReLU between layers, none after the last (upstream `rfdetr.models.math.MLP`)."""

    def __init__(self, in_dim: int, hidden: int, out_dim: int, num_layers: int):
        super().__init__()
        dims = [in_dim] + [hidden] * (num_layers - 1)
        self.layers = nn.ModuleList(nn.Linear(a, b) for a, b in zip(dims, dims[1:] + [out_dim]))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for i, layer in enumerate(self.layers):
            x = layer(x)
            if i < len(self.layers) - 1:
                x = F.relu(x)
        return x


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """[B, H, L, D] softmax attention as matmuls (rank 4; SDPA's own lowering varies by converter)."""
    scores = (q @ k.transpose(-1, -2)) / math.sqrt(q.shape[-1])
    return scores.softmax(-1) @ v


def split_heads(x: torch.Tensor, heads: int) -> torch.Tensor:
    b, length, width = x.shape
    return x.view(b, length, heads, width // heads).permute(0, 2, 1, 3)


def merge_heads(x: torch.Tensor) -> torch.Tensor:
    b, heads, length, d = x.shape
    return x.permute(0, 2, 1, 3).reshape(b, length, heads * d)


# ------------------------------------------------------------------ backbone: windowed DINOv2


class PatchEmbeddings(nn.Module):
    def __init__(self, c: RFDETRConfig):
        super().__init__()
        self.projection = nn.Conv2d(3, c.vit_hidden_size, c.patch_size, stride=c.patch_size)


class Embeddings(nn.Module):
    def __init__(self, c: RFDETRConfig):
        super().__init__()
        width = c.vit_hidden_size
        self.cls_token = nn.Parameter(torch.zeros(1, 1, width))
        self.mask_token = nn.Parameter(torch.zeros(1, width))  # training only; kept for strict loading
        if c.vit_registers:
            self.register_tokens = nn.Parameter(torch.zeros(1, c.vit_registers, width))
        self.patch_embeddings = PatchEmbeddings(c)
        self.position_embeddings = nn.Parameter(torch.zeros(1, c.patches_per_side ** 2 + 1, width))


class SelfAttentionProjections(nn.Module):
    def __init__(self, width: int):
        super().__init__()
        self.query, self.key, self.value = nn.Linear(width, width), nn.Linear(width, width), nn.Linear(width, width)


class AttentionOutput(nn.Module):
    def __init__(self, width: int):
        super().__init__()
        self.dense = nn.Linear(width, width)


class ViTAttention(nn.Module):
    def __init__(self, width: int, heads: int):
        super().__init__()
        self.attention = SelfAttentionProjections(width)
        self.output = AttentionOutput(width)
        self.heads = heads

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        p = self.attention
        q, k, v = (split_heads(proj(x), self.heads) for proj in (p.query, p.key, p.value))
        return self.output.dense(merge_heads(attention(q, k, v)))


class LayerScale(nn.Module):
    def __init__(self, width: int):
        super().__init__()
        self.lambda1 = nn.Parameter(torch.ones(width))


class ViTMLP(nn.Module):
    def __init__(self, width: int, ratio: int):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(width, width * ratio), nn.Linear(width * ratio, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(F.gelu(self.fc1(x)))  # erf GELU, as transformers' "gelu"


class ViTLayer(nn.Module):
    def __init__(self, c: RFDETRConfig, windowed: bool):
        super().__init__()
        width = c.vit_hidden_size
        self.norm1 = nn.LayerNorm(width, eps=c.vit_layer_norm_eps)
        self.attention = ViTAttention(width, c.vit_heads)
        self.layer_scale1 = LayerScale(width)
        self.norm2 = nn.LayerNorm(width, eps=c.vit_layer_norm_eps)
        self.mlp = ViTMLP(width, c.vit_mlp_ratio)
        self.layer_scale2 = LayerScale(width)
        self.windowed = windowed
        self.windows = c.num_windows ** 2

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x: [B·windows, T, C]. A global layer attends across all windows of an image (upstream folds the
        windows back into one sequence of windows × T tokens, each window keeping its own cls token)."""
        normed = self.norm1(x)
        if not self.windowed:
            batch_windows, tokens, width = normed.shape
            merged = normed.reshape(batch_windows // self.windows, self.windows * tokens, width)
            attended = self.attention(merged).reshape(batch_windows, tokens, width)
        else:
            attended = self.attention(normed)
        x = x + attended * self.layer_scale1.lambda1
        return x + self.mlp(self.norm2(x)) * self.layer_scale2.lambda1


class ViTEncoderLayers(nn.Module):
    def __init__(self, c: RFDETRConfig):
        super().__init__()
        windowed = set(c.window_block_indexes)
        self.layer = nn.ModuleList(ViTLayer(c, i in windowed) for i in range(c.vit_layers))


def partition_windows(tokens: torch.Tensor, batch: int, side: int, windows: int) -> torch.Tensor:
    """[B, side², C] → [B·windows², (side/windows)², C], window order (b, row, col), at rank ≤ 4."""
    width = tokens.shape[-1]
    per = side // windows
    x = tokens.reshape(batch * windows, per, windows, per * width)   # (b·row, y, col, x·C)
    x = x.permute(0, 2, 1, 3)                                         # (b·row, col, y, x·C)
    return x.reshape(batch * windows * windows, per * per, width)


def merge_windows(tokens: torch.Tensor, batch: int, side: int, windows: int) -> torch.Tensor:
    """Inverse of partition_windows, to a feature map [B, C, side, side]."""
    width = tokens.shape[-1]
    per = side // windows
    x = tokens.reshape(batch * windows, windows, per, per * width)   # (b·row, col, y, x·C)
    x = x.permute(0, 2, 1, 3)                                         # (b·row, y, col, x·C)
    return x.reshape(batch, side, side, width).permute(0, 3, 1, 2)


class WindowedDinoV2(nn.Module):
    """Upstream `WindowedDinov2WithRegistersBackbone` (keys: embeddings, encoder.layer.N, layernorm)."""

    def __init__(self, c: RFDETRConfig):
        super().__init__()
        self.embeddings = Embeddings(c)
        self.encoder = ViTEncoderLayers(c)
        self.layernorm = nn.LayerNorm(c.vit_hidden_size, eps=c.vit_layer_norm_eps)
        self.config = c

    def tokens(self, pixels: torch.Tensor) -> torch.Tensor:
        """Patch tokens + position embeddings, windowed, each window with its cls (+ register) tokens."""
        c, e = self.config, self.embeddings
        batch, windows, side = pixels.shape[0], c.num_windows, c.patches_per_side
        patches = e.patch_embeddings.projection(pixels).flatten(2).transpose(1, 2)       # [B, side², C]
        patches = patches + e.position_embeddings[:, 1:]
        cls = e.cls_token + e.position_embeddings[:, :1]                                  # [1, 1, C]
        patches = partition_windows(patches, batch, side, windows)
        count = patches.shape[0]
        # Every window carries the same cls token: a concatenation of copies (not expand → BROADCAST_TO).
        leading = [cls] * count if count > 1 else [cls]
        leading = torch.cat(leading, 0)
        if c.vit_registers:
            leading = torch.cat([leading, torch.cat([e.register_tokens] * count, 0)], 1)
        return torch.cat([leading, patches], 1)

    def forward(self, pixels: torch.Tensor) -> list[torch.Tensor]:
        c = self.config
        batch, leading = pixels.shape[0], 1 + c.vit_registers
        x = self.tokens(pixels)
        wanted = set(c.out_feature_indexes)
        features = []
        # hidden state 0 is the embedding output, hidden state i the output of block i-1 (upstream's stages).
        if 0 in wanted:
            features.append(x)
        for i, layer in enumerate(self.encoder.layer):
            if i >= c.out_feature_indexes[-1]:
                break  # nothing after the last requested stage reaches the output
            x = layer(x)
            if i + 1 in wanted:
                features.append(x)
        maps = []
        for hidden in features:
            hidden = self.layernorm(hidden)[:, leading:]
            maps.append(merge_windows(hidden, batch, c.patches_per_side, c.num_windows))
        return maps


class DinoV2Wrapper(nn.Module):
    """Upstream `DinoV2`: only holds `encoder` (key prefix `backbone.0.encoder.encoder.`)."""

    def __init__(self, c: RFDETRConfig):
        super().__init__()
        self.encoder = WindowedDinoV2(c)

    def forward(self, pixels: torch.Tensor) -> list[torch.Tensor]:
        return self.encoder(pixels)


# ------------------------------------------------------------------ projector (P4: C2f + LayerNorm)


class ConvNormAct(nn.Module):
    """Upstream `ConvX` with layer_norm=True: conv (no bias) → channels LayerNorm → SiLU."""

    def __init__(self, cin: int, cout: int, kernel: int):
        super().__init__()
        self.conv = nn.Conv2d(cin, cout, kernel, padding=kernel // 2, bias=False)
        self.bn = ChannelsLayerNorm(cout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.silu(self.bn(self.conv(x)))


class Bottleneck(nn.Module):
    def __init__(self, width: int):
        super().__init__()
        self.cv1, self.cv2 = ConvNormAct(width, width, 3), ConvNormAct(width, width, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.cv2(self.cv1(x))  # C2f's bottlenecks have no shortcut


class C2f(nn.Module):
    def __init__(self, cin: int, cout: int, blocks: int = 3):
        super().__init__()
        self.hidden = cout // 2
        self.cv1 = ConvNormAct(cin, 2 * self.hidden, 1)
        self.cv2 = ConvNormAct((2 + blocks) * self.hidden, cout, 1)
        self.m = nn.ModuleList(Bottleneck(self.hidden) for _ in range(blocks))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.cv1(x)
        parts = [y[:, : self.hidden], y[:, self.hidden:]]
        for block in self.m:
            parts.append(block(parts[-1]))
        return self.cv2(torch.cat(parts, 1))


class Projector(nn.Module):
    def __init__(self, c: RFDETRConfig):
        super().__init__()
        cin = c.vit_hidden_size * len(c.out_feature_indexes)
        self.stages = nn.ModuleList([nn.Sequential(C2f(cin, c.hidden_dim), ChannelsLayerNorm(c.hidden_dim))])

    def forward(self, features: list[torch.Tensor]) -> torch.Tensor:
        return self.stages[0](torch.cat(features, 1))


class Backbone(nn.Module):
    def __init__(self, c: RFDETRConfig):
        super().__init__()
        self.encoder = DinoV2Wrapper(c)
        self.projector = Projector(c)

    def forward(self, pixels: torch.Tensor) -> torch.Tensor:
        return self.projector(self.encoder(pixels))


# ------------------------------------------------------------------ deformable attention


def sample_bilinear_tent(value: torch.Tensor, ix: torch.Tensor, iy: torch.Tensor, attn: torch.Tensor,
                         h: int, w: int, points: int) -> torch.Tensor:
    """The same samples, attention-weighted and summed over points, with no gather: for each query the
    sampling kernel over the H×W map is Σ_p a_p · wy_p ⊗ wx_p, with tent weights wx_p[j] = relu(1-|ix_p - j|)
    (exactly the bilinear weights, zero outside the image); one batched matmul builds it, one applies it.

    value [N, H·W, D]; ix, iy, attn [N, Q·P] → [N, Q, D].
    """
    from zoo.rewrites.resampling import tent_weights

    n, hw, d = value.shape
    queries = ix.shape[1] // points
    wx = tent_weights(ix.reshape(n * queries, points, 1), w)                      # [NQ, P, W]
    wy = tent_weights(iy.reshape(n * queries, points, 1), h)                      # [NQ, P, H]
    wy = wy * attn.reshape(n * queries, points, 1)
    kernel = wy.transpose(1, 2) @ wx                                              # [NQ, H, W]
    return kernel.reshape(n, queries, hw) @ value                                 # [N, Q, D]


class MSDeformAttn(nn.Module):
    """Upstream `MSDeformAttn` for one feature level and box reference points ([B, Q, 4], cxcywh)."""

    def __init__(self, d_model: int, heads: int, points: int, levels: int = 1):
        super().__init__()
        self.heads, self.points, self.levels = heads, points, levels
        self.sampling_offsets = nn.Linear(d_model, heads * levels * points * 2)
        self.attention_weights = nn.Linear(d_model, heads * levels * points)
        self.value_proj = nn.Linear(d_model, d_model)
        self.output_proj = nn.Linear(d_model, d_model)
        self.sampler = "gather"

    def sample_locations(self, query: torch.Tensor, reference: torch.Tensor):
        """Normalised sampling locations [B·heads, Q·P] (x and y) of every point, upstream's formula."""
        b, q, _ = query.shape
        offsets = self.sampling_offsets(query).view(b, q, self.heads, self.points * 2)
        off_x, off_y = offsets[..., 0::2], offsets[..., 1::2]                      # [B, Q, heads, P]
        ref = reference.view(b, q, 1, 4)
        loc_x = ref[..., 0:1] + off_x / self.points * ref[..., 2:3] * 0.5
        loc_y = ref[..., 1:2] + off_y / self.points * ref[..., 3:4] * 0.5
        per_head = lambda t: t.permute(0, 2, 1, 3).reshape(b * self.heads, q * self.points)  # noqa: E731
        return per_head(loc_x), per_head(loc_y)

    @staticmethod
    def to_pixels(loc: torch.Tensor, size: int) -> torch.Tensor:
        """grid = 2·loc - 1, then grid_sample's unnormalisation ((g + 1)·size - 1) / 2, in its op order."""
        return ((2.0 * loc - 1.0 + 1.0) * size - 1.0) / 2.0

    def sample_with_grid_sample(self, value, loc_x, loc_y, h: int, w: int) -> torch.Tensor:
        """torch's F.grid_sample, as upstream calls it: [N, H·W, D] → [N, Q·P, D]. Reference only."""
        n, hw, d = value.shape
        grid = torch.stack([2.0 * loc_x - 1.0, 2.0 * loc_y - 1.0], -1).view(n, 1, -1, 2)
        sampled = F.grid_sample(value.transpose(1, 2).reshape(n, d, h, w), grid, mode="bilinear",
                                padding_mode="zeros", align_corners=False)       # [N, D, 1, Q·P]
        return sampled[:, :, 0].transpose(1, 2)

    def forward(self, query: torch.Tensor, reference: torch.Tensor, memory: torch.Tensor, h: int, w: int):
        b, q, d = query.shape
        head_dim = d // self.heads
        value = self.value_proj(memory).view(b, h * w, self.heads, head_dim)
        value = value.permute(0, 2, 1, 3).reshape(b * self.heads, h * w, head_dim)
        attn = self.attention_weights(query).view(b, q, self.heads, self.points).softmax(-1)
        attn = attn.permute(0, 2, 1, 3).reshape(b * self.heads, q * self.points)
        loc_x, loc_y = self.sample_locations(query, reference)
        ix, iy = self.to_pixels(loc_x, w), self.to_pixels(loc_y, h)
        if self.sampler == "tent":
            sampled = sample_bilinear_tent(value, ix, iy, attn, h, w, self.points)      # [B·heads, Q, D]
        else:
            if self.sampler == "grid_sample":
                picked = self.sample_with_grid_sample(value, loc_x, loc_y, h, w)
            else:
                picked = gather_bilinear(value, ix, iy, h, w)                             # [B·heads, Q·P, D]
            picked = picked * attn.unsqueeze(-1)
            sampled = picked.view(b * self.heads, q, self.points, head_dim).sum(2)
        out = sampled.view(b, self.heads, q, head_dim).permute(0, 2, 1, 3).reshape(b, q, d)
        return self.output_proj(out)


# ------------------------------------------------------------------ decoder


def linear_plus(x: torch.Tensor, linear: nn.Linear, addend: torch.Tensor) -> torch.Tensor:
    """linear(x) + addend, with the bias folded into the addend: x·Wᵀ + (b + addend).

    Why: in decoder layer 0 the addend is the learned query table, a graph constant [1, Q, C]. LiteRT's GPU
    delegate accepts FULLY_CONNECTED (rank-2 output, bias inside) → ADD with a full-shape rank-3 constant but
    computes it wrongly even in fp32 (toolchain.md §3.2: err 1.87, only row 0 right); with the bias folded into
    the constant it is exact. For a runtime addend the fold is one extra ADD and 1-ulp reassociation."""
    return F.linear(x, linear.weight) + (linear.bias + addend)


class MultiheadSelfAttention(nn.Module):
    """nn.MultiheadAttention's keys (in_proj_weight/bias, out_proj), written as explicit matmuls."""

    def __init__(self, d_model: int, heads: int):
        super().__init__()
        self.in_proj_weight = nn.Parameter(torch.zeros(3 * d_model, d_model))
        self.in_proj_bias = nn.Parameter(torch.zeros(3 * d_model))
        self.out_proj = nn.Linear(d_model, d_model)
        self.heads = heads

    def forward(self, qk: torch.Tensor, v: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        """residual + attention(qk, qk, v)."""
        d = qk.shape[-1]
        w, bias = self.in_proj_weight, self.in_proj_bias
        q = F.linear(qk, w[:d], bias[:d])
        k = F.linear(qk, w[d: 2 * d], bias[d: 2 * d])
        v = F.linear(v, w[2 * d:], bias[2 * d:])
        out = attention(*(split_heads(t, self.heads) for t in (q, k, v)))
        return linear_plus(merge_heads(out), self.out_proj, residual)


class DecoderLayer(nn.Module):
    def __init__(self, c: RFDETRConfig):
        super().__init__()
        d = c.hidden_dim
        self.self_attn = MultiheadSelfAttention(d, c.sa_nheads)
        self.norm1 = nn.LayerNorm(d)
        self.cross_attn = MSDeformAttn(d, c.ca_nheads, c.dec_n_points)
        self.linear1, self.linear2 = nn.Linear(d, c.dim_feedforward), nn.Linear(c.dim_feedforward, d)
        self.norm2, self.norm3 = nn.LayerNorm(d), nn.LayerNorm(d)

    def forward(self, tgt, with_query_pos, reference, memory, h: int, w: int):
        """with_query_pos(t) = t + query_pos (computed by the decoder with its bias folded, see linear_plus)."""
        tgt = self.norm1(self.self_attn(with_query_pos(tgt), tgt, tgt))
        tgt = self.norm2(tgt + self.cross_attn(with_query_pos(tgt), reference, memory, h, w))
        return self.norm3(tgt + self.linear2(F.relu(self.linear1(tgt))))


class Decoder(nn.Module):
    def __init__(self, c: RFDETRConfig):
        super().__init__()
        self.layers = nn.ModuleList(DecoderLayer(c) for _ in range(c.dec_layers))
        self.norm = nn.LayerNorm(c.hidden_dim)
        self.ref_point_head = MLP(2 * c.hidden_dim, c.hidden_dim, c.hidden_dim, 2)
        half = c.hidden_dim // 2
        steps = torch.arange(half, dtype=torch.float32)
        # 10000^(2⌊i/2⌋/half): constant, so no pow/arange in the graph.
        self.register_buffer("sine_frequencies", 10000 ** (2 * torch.div(steps, 2, rounding_mode="floor") / half),
                             persistent=False)

    def sine_embedding(self, boxes: torch.Tensor) -> torch.Tensor:
        """Upstream gen_sineembed_for_position for [B, Q, 4] boxes → [B, Q, 4·half], order (y, x, w, h)."""
        b, q, _ = boxes.shape
        angles = (boxes * (2 * math.pi)).unsqueeze(-1) / self.sine_frequencies      # [B, Q, 4, half]
        # Channel 2i is sin, 2i+1 cos, of angles that are equal in pairs (the table repeats each frequency).
        even = angles[..., 0::2].sin()
        odd = angles[..., 1::2].cos()
        interleaved = torch.stack([even.reshape(b * q, 4, -1), odd.reshape(b * q, 4, -1)], -1)  # rank 4
        per_coord = interleaved.reshape(b, q, 4, -1)
        x, y, w, h = (per_coord[:, :, i] for i in range(4))
        return torch.cat([y, x, w, h], -1)

    def forward(self, tgt, reference, memory, h: int, w: int):
        head = self.ref_point_head
        hidden = F.relu(head.layers[0](self.sine_embedding(reference)))   # the query-position MLP, but its last
        with_query_pos = lambda t: linear_plus(hidden, head.layers[1], t)  # noqa: E731  layer fused with the add
        for layer in self.layers:
            tgt = layer(tgt, with_query_pos, reference, memory, h, w)
        return self.norm(tgt)


def proposal_constants(h: int, w: int, level: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Two-stage proposals for an unpadded h×w map: ((x+0.5)/w, (y+0.5)/h, 0.05·2^level, same) per cell,
    and upstream's validity mask (all four in (0.01, 0.99)) as 1.0/0.0. Shapes [1, h·w, 4], [1, h·w, 1]."""
    ys, xs = torch.meshgrid(torch.arange(h, dtype=torch.float32), torch.arange(w, dtype=torch.float32), indexing="ij")
    centers = (torch.stack([xs, ys], -1) + 0.5) / torch.tensor([float(w), float(h)])
    wh = torch.ones_like(centers) * 0.05 * (2.0 ** level)
    proposals = torch.cat([centers, wh], -1).reshape(1, h * w, 4)
    valid = ((proposals > 0.01) & (proposals < 0.99)).all(-1, keepdim=True).float()
    return proposals * valid, valid


def apply_box_delta(delta: torch.Tensor, boxes: torch.Tensor) -> torch.Tensor:
    """bbox_reparam: centre moves by delta·size, size scales by exp(delta)."""
    centre = delta[..., :2] * boxes[..., 2:] + boxes[..., :2]
    size = delta[..., 2:].exp() * boxes[..., 2:]
    return torch.cat([centre, size], -1)


class Transformer(nn.Module):
    """Two-stage query selection (group 0: the only group used at inference) + the decoder."""

    def __init__(self, c: RFDETRConfig):
        super().__init__()
        d, groups = c.hidden_dim, c.group_detr
        self.decoder = Decoder(c)
        self.enc_output = nn.ModuleList(nn.Linear(d, d) for _ in range(groups))
        self.enc_output_norm = nn.ModuleList(nn.LayerNorm(d) for _ in range(groups))
        self.enc_out_class_embed = nn.ModuleList(nn.Linear(d, c.num_classes) for _ in range(groups))
        self.enc_out_bbox_embed = nn.ModuleList(MLP(d, d, 4, 3) for _ in range(groups))
        side = c.patches_per_side
        proposals, valid = proposal_constants(side, side)
        self.register_buffer("proposals", proposals, persistent=False)
        self.register_buffer("proposal_valid", valid, persistent=False)
        self.num_queries = c.num_queries
        self.selection = "index"

    def select_queries(self, memory: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Top-k encoder tokens by best class logit → their proposal boxes refined by the encoder box head."""
        b, hw, d = memory.shape
        memory = memory * self.proposal_valid
        prenorm = self.enc_output[0](memory)
        normed = self.enc_output_norm[0](prenorm)
        scores = self.enc_out_class_embed[0](normed).amax(-1)                        # [B, HW]
        k = min(self.num_queries, hw)
        top = torch.topk(scores, k, dim=1).indices                                    # [B, k]
        # LayerNorm is per row, so picking rows of the normed memory equals upstream's norm-after-gather.
        selected = self.pick_rows(normed, top)
        boxes = self.pick_rows(torch.cat([self.proposals] * b) if b > 1 else self.proposals, top)
        return apply_box_delta(self.enc_out_bbox_embed[0](selected), boxes), selected

    def pick_rows(self, rows: torch.Tensor, top: torch.Tensor) -> torch.Tensor:
        """rows [B, N, C], top [B, k] → [B, k, C].

        "index": an index_select on the flattened [B·N, C] rows (no expand, so no BROADCAST_TO); a GATHER the
        LiteRT GPU delegate rejects. "onehot": a [B, k, N] one-hot matrix built with float arithmetic from the
        indices (tent weights at integer positions are exactly 0/1) times the rows — a batched matmul, GPU-clean,
        and exact in fp32 (each output is one row times 1 plus zeros)."""
        b, n, c = rows.shape
        if self.selection == "onehot":
            from zoo.rewrites.resampling import tent_weights

            onehot = tent_weights(top.to(rows.dtype).unsqueeze(-1), n)              # [B, k, N]
            return onehot @ rows
        flat = (top + torch.arange(b).view(b, 1) * n).reshape(-1)
        return rows.reshape(b * n, c).index_select(0, flat).view(b, -1, c)

    def forward(self, features: torch.Tensor, query_feat: torch.Tensor, refpoint_embed: torch.Tensor):
        b, d, h, w = features.shape
        memory = features.flatten(2).transpose(1, 2)                                  # [B, HW, d]
        encoder_boxes, _ = self.select_queries(memory)
        k = encoder_boxes.shape[1]
        learned = refpoint_embed.unsqueeze(0)
        reference = apply_box_delta(learned[:, :k], encoder_boxes)
        if refpoint_embed.shape[0] > k:
            reference = torch.cat([reference, torch.cat([learned[:, k:]] * b)], 1)
        tgt = torch.cat([query_feat.unsqueeze(0)] * b) if b > 1 else query_feat.unsqueeze(0)
        return self.decoder(tgt, reference, memory, h, w), reference


# ------------------------------------------------------------------ the detector


class RFDETR(nn.Module):
    """image [B, 3, R, R] in [0, 1] → boxes [B, Q, 4] (cxcywh, normalised), logits [B, Q, classes]."""

    def __init__(self, c: RFDETRConfig):
        super().__init__()
        c.check()
        self.config = c
        self.backbone = nn.ModuleList([Backbone(c)])
        self.transformer = Transformer(c)
        self.class_embed = nn.Linear(c.hidden_dim, c.num_classes)
        self.bbox_embed = MLP(c.hidden_dim, c.hidden_dim, 4, 3)
        self.refpoint_embed = nn.Embedding(c.num_queries * c.group_detr, 4)
        self.query_feat = nn.Embedding(c.num_queries * c.group_detr, c.hidden_dim)
        self.register_buffer("pixel_mean", torch.tensor(IMAGENET_MEAN).view(1, 3, 1, 1), persistent=False)
        self.register_buffer("pixel_std", torch.tensor(IMAGENET_STD).view(1, 3, 1, 1), persistent=False)

    def set_sampler(self, sampler: str) -> "RFDETR":
        if sampler not in SAMPLERS:
            raise ZooError(f"Unknown deformable sampler '{sampler}'.", f"use one of {', '.join(SAMPLERS)}.")
        for module in self.modules():
            if isinstance(module, MSDeformAttn):
                module.sampler = sampler
        return self

    def set_selection(self, selection: str) -> "RFDETR":
        if selection not in SELECTIONS:
            raise ZooError(f"Unknown query selection '{selection}'.", f"use one of {', '.join(SELECTIONS)}.")
        self.transformer.selection = selection
        return self

    def forward(self, image: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        pixels = (image - self.pixel_mean) / self.pixel_std   # ImageNet normalisation, in the graph
        features = self.backbone[0](pixels)
        n = self.config.num_queries
        hs, reference = self.transformer(features, self.query_feat.weight[:n], self.refpoint_embed.weight[:n])
        boxes = apply_box_delta(self.bbox_embed(hs), reference)
        return boxes, self.class_embed(hs)
