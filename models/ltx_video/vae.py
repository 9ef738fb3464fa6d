"""LTX-Video VAE decoder (diffusers `AutoencoderKLLTXVideo.decoder`), re-authored at rank 4.

Keys match diffusers' `decoder.*` exactly (the encoder's keys are not part of this component). Upstream
is rank 5 ([B, C, F, H, W]) with a rank-8 depth-to-space and in-graph `torch.randn`; LiteRT conversion
fails on it (`tfl.pow` illegal at rank 5, `broadcast_to` at rank 8), and Core AI has no `aten.randn`.
Here (models.md "A rank-4 decoder works on both": exact to ~2e-6, GPU-accepted, 0.9.0 and 0.9.1 configs):
- frames live in the batch axis: activations are [F, C, H, W] (batch 1, as the pipeline decodes);
- a (kt, 3, 3) conv3d with replicate frame padding is the sum of kt conv2d over time-shifted frame slices
  (edge frames concatenated for the padding); the sum form has about half the fp16 error of one conv2d over
  concatenated slices and needs less memory;
- the (2, 2, 2) depth-to-space is a build-time reorder of the conv's output channels to (t, c, h, w), a
  view that interleaves the two time phases into frames, and `pixel_shuffle(2)`; the patch unshuffle at the
  output is a build-time reorder + `pixel_shuffle(p)` the same way;
- noise injection (0.9.1+) takes its [1, 1, H, W] planes as graph inputs, in upstream's draw order;
- RMSNorm over channels (eps 1e-8) is computed per pixel over axis 1, as upstream's movedim + RMSNorm.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from models.ltx_video.dit import TIMESTEP_CHANNELS, TwoLinear


@dataclass(frozen=True)
class DecoderConfig:
    latent_channels: int = 128
    out_channels: int = 3
    block_out_channels: tuple = (128, 256, 512, 512)
    spatio_temporal_scaling: tuple = (True, True, True, False)
    layers_per_block: tuple = (4, 3, 3, 3, 4)
    patch_size: int = 4
    patch_size_t: int = 1
    resnet_norm_eps: float = 1e-6
    inject_noise: tuple = (False, False, False, False, False)
    timestep_conditioning: bool = False
    upsample_residual: tuple = (False, False, False, False)
    upsample_factor: tuple = (1, 1, 1, 1)

    @classmethod
    def from_diffusers(cls, config: dict) -> "DecoderConfig":
        """The decoder half of an AutoencoderKLLTXVideo config.json (decoder_* keys)."""
        if config.get("decoder_causal", False):
            raise ValueError("the LTX-Video decoders are non-causal; decoder_causal=true is not supported")
        if int(config.get("patch_size_t", 1)) != 1:
            raise ValueError("patch_size_t != 1 is not supported (LTX-Video 0.9.x uses 1)")
        n = len(config["decoder_block_out_channels"])
        return cls(latent_channels=config["latent_channels"], out_channels=config["out_channels"],
                   block_out_channels=tuple(config["decoder_block_out_channels"]),
                   spatio_temporal_scaling=tuple(config["decoder_spatio_temporal_scaling"]),
                   layers_per_block=tuple(config["decoder_layers_per_block"]),
                   patch_size=config["patch_size"], patch_size_t=config.get("patch_size_t", 1),
                   resnet_norm_eps=config.get("resnet_norm_eps", 1e-6),
                   inject_noise=tuple(config.get("decoder_inject_noise", (False,) * (n + 1))),
                   timestep_conditioning=bool(config.get("timestep_conditioning", False)),
                   upsample_residual=tuple(config.get("upsample_residual", (False,) * n)),
                   upsample_factor=tuple(config.get("upsample_factor", (1,) * n)))


def channel_rms_norm(x: torch.Tensor, eps: float = 1e-8) -> torch.Tensor:
    """RMSNorm over channels at every pixel of [F, C, H, W] (upstream: movedim(1, -1) + RMSNorm(eps=1e-8))."""
    return x * torch.rsqrt(x.pow(2).mean(1, keepdim=True) + eps)


def channel_layer_norm(x: torch.Tensor, weight, bias, eps: float) -> torch.Tensor:
    mean = x.mean(1, keepdim=True)
    centred = x - mean
    variance = centred.pow(2).mean(1, keepdim=True)
    return centred * torch.rsqrt(variance + eps) * weight[None, :, None, None] + bias[None, :, None, None]


def pad_frames(x: torch.Tensor, before: int, after: int) -> torch.Tensor:
    """Replicate padding along frames (axis 0): edge frames concatenated."""
    return torch.cat([x[:1]] * before + [x] + [x[-1:]] * after, dim=0)


class CausalConv3d(nn.Module):
    """diffusers LTXVideoCausalConv3d (key `conv.weight` [O, I, kt, kh, kw]) applied to [F, C, H, W] as the sum
    of kt conv2d over time-shifted slices; non-causal (replicate pad (kt-1)/2 frames each side)."""

    def __init__(self, in_channels: int, out_channels: int, kernel_size: int = 3):
        super().__init__()
        self.conv = nn.Conv3d(in_channels, out_channels, kernel_size, padding=(0, kernel_size // 2, kernel_size // 2))
        self.order: torch.Tensor | None = None   # build-time output channel reorder (depth-to-space)

    def weights(self):
        w, b = self.conv.weight, self.conv.bias
        if self.order is not None:
            w, b = w[self.order], b[self.order]
        return w, b

    def forward(self, x):
        w, b = self.weights()
        kt, pad = w.shape[2], w.shape[3] // 2
        frames = x.shape[0]
        x = pad_frames(x, (kt - 1) // 2, (kt - 1) // 2)
        out = None
        for k in range(kt):
            term = F.conv2d(x[k:k + frames], w[:, :, k], None, padding=pad)
            out = term if out is None else out + term
        return out + b[None, :, None, None]


def space_time_order(channels_out: int) -> torch.Tensor:
    """Output-channel permutation that turns upstream's (c, t, h, w) packing into (t, c, h, w)."""
    c = channels_out // 8
    return torch.arange(channels_out).reshape(c, 2, 4).permute(1, 0, 2).reshape(-1)


def depth_to_space(x: torch.Tensor) -> torch.Tensor:
    """[F, 2*4c, H, W] in (t, c, h, w) channel order -> [2F - 1, c, 2H, 2W] (upstream drops the first frame)."""
    frames, channels, h, w = x.shape
    x = x.reshape(frames * 2, channels // 2, h, w)   # (f, t) -> frame 2f + t
    return F.pixel_shuffle(x, 2)[1:]


def residual_depth_to_space(x: torch.Tensor) -> torch.Tensor:
    """The same depth-to-space of an activation (runtime channels, so the reorder is strided slices)."""
    frames, channels, h, w = x.shape
    grouped = x.reshape(frames, channels // 8, 8, h * w)
    phases = [grouped[:, :, 4 * t:4 * t + 4].reshape(frames, channels // 2, h, w) for t in (0, 1)]
    return depth_to_space(torch.cat(phases, dim=1))


class Upsampler(nn.Module):
    def __init__(self, in_channels: int, residual: bool, upscale_factor: int):
        super().__init__()
        self.residual, self.repeats = residual, 8 // upscale_factor
        out_channels = in_channels * 8 // upscale_factor
        self.conv = CausalConv3d(in_channels, out_channels)
        self.conv.order = space_time_order(out_channels)

    def forward(self, x):
        out = depth_to_space(self.conv(x))
        if self.residual:
            out = out + torch.cat([residual_depth_to_space(x)] * self.repeats, dim=1)
        return out


class ResnetBlock(nn.Module):
    """diffusers LTXVideoResnetBlock3d (keys conv1/conv2/norm3/conv_shortcut/per_channel_scale*/scale_shift_table)."""

    def __init__(self, in_channels: int, out_channels: int, eps: float, inject_noise: bool, timestep_conditioning: bool):
        super().__init__()
        self.conv1 = CausalConv3d(in_channels, out_channels)
        self.conv2 = CausalConv3d(out_channels, out_channels)
        self.inject_noise = inject_noise
        if in_channels != out_channels:
            self.norm3 = nn.LayerNorm(in_channels, eps=eps)
            self.conv_shortcut = CausalConv3d(in_channels, out_channels, kernel_size=1)
        if inject_noise:
            self.per_channel_scale1 = nn.Parameter(torch.zeros(in_channels, 1, 1))
            self.per_channel_scale2 = nn.Parameter(torch.zeros(in_channels, 1, 1))
        if timestep_conditioning:
            self.scale_shift_table = nn.Parameter(torch.zeros(4, in_channels))

    def modulation(self, temb, i: int):
        """shift/scale i of [1, 4C] temb + table, as [1, C, 1, 1]."""
        c = self.scale_shift_table.shape[1]
        return (temb[:, i * c:(i + 1) * c] + self.scale_shift_table[i][None])[:, :, None, None]

    def forward(self, x, temb=None, noise=None):
        h = channel_rms_norm(x)
        if temb is not None:
            h = h * (1 + self.modulation(temb, 1)) + self.modulation(temb, 0)
        h = self.conv1(F.silu(h))
        if self.inject_noise:
            h = h + noise[0] * self.per_channel_scale1[None]
        h = channel_rms_norm(h)
        if temb is not None:
            h = h * (1 + self.modulation(temb, 3)) + self.modulation(temb, 2)
        h = self.conv2(F.silu(h))
        if self.inject_noise:
            h = h + noise[1] * self.per_channel_scale2[None]
        if hasattr(self, "conv_shortcut"):
            x = self.conv_shortcut(channel_layer_norm(x, self.norm3.weight, self.norm3.bias, self.norm3.eps))
        return h + x


class TimeEmbedder(nn.Module):
    """diffusers PixArtAlphaCombinedTimestepSizeEmbeddings(dim, 0) keys: timestep_embedder.linear_1/2."""

    def __init__(self, dim: int):
        super().__init__()
        self.timestep_embedder = TwoLinear(TIMESTEP_CHANNELS, dim, F.silu)

    def forward(self, t):
        half = TIMESTEP_CHANNELS // 2
        exponent = -math.log(10000) * torch.arange(half, dtype=torch.float32, device=t.device) / half
        angles = t.float().reshape(-1, 1) * torch.exp(exponent)[None, :]
        return self.timestep_embedder(torch.cat([torch.cos(angles), torch.sin(angles)], dim=-1).to(t.dtype))


class MidBlock(nn.Module):
    def __init__(self, channels: int, layers: int, eps: float, noise: bool, tc: bool):
        super().__init__()
        if tc:
            self.time_embedder = TimeEmbedder(channels * 4)
        self.resnets = nn.ModuleList([ResnetBlock(channels, channels, eps, noise, tc) for _ in range(layers)])


class UpBlock(nn.Module):
    def __init__(self, cin: int, cout: int, layers: int, eps: float, scale: bool, noise: bool, tc: bool,
                 residual: bool, factor: int):
        super().__init__()
        if tc:
            self.time_embedder = TimeEmbedder(cin * 4)
        if cin != cout:
            if tc:  # upstream would hand this resnet the raw timestep; no 0.9.x decoder has one
                raise ValueError("a channel-changing up block with timestep conditioning is not supported")
            self.conv_in = ResnetBlock(cin, cout, eps, noise, tc)
        if scale:
            self.upsamplers = nn.ModuleList([Upsampler(cout * factor, residual, factor)])
        self.resnets = nn.ModuleList([ResnetBlock(cout, cout, eps, noise, tc) for _ in range(layers)])


class Decoder(nn.Module):
    def __init__(self, cfg: DecoderConfig):
        super().__init__()
        channels = tuple(reversed(cfg.block_out_channels))
        scaling, layers = tuple(reversed(cfg.spatio_temporal_scaling)), tuple(reversed(cfg.layers_per_block))
        noise, residual = tuple(reversed(cfg.inject_noise)), tuple(reversed(cfg.upsample_residual))
        factor, tc, eps = tuple(reversed(cfg.upsample_factor)), cfg.timestep_conditioning, cfg.resnet_norm_eps
        out = channels[0]
        self.conv_in = CausalConv3d(cfg.latent_channels, out)
        self.mid_block = MidBlock(out, layers[0], eps, noise[0], tc)
        blocks = []
        for i in range(len(channels)):
            cin, out = out // factor[i], channels[i] // factor[i]
            blocks.append(UpBlock(cin, out, layers[i + 1], eps, scaling[i], noise[i + 1], tc, residual[i], factor[i]))
        self.up_blocks = nn.ModuleList(blocks)
        p = cfg.patch_size
        self.conv_out = CausalConv3d(out, cfg.out_channels * p * p)
        # upstream unpatchifies channel (c, a, b) to pixel (row b, column a): reorder to pixel_shuffle's (c, row, col)
        self.conv_out.order = torch.arange(cfg.out_channels * p * p).reshape(cfg.out_channels, p, p).transpose(1, 2).reshape(-1)
        self.patch_size = p
        if tc:
            self.timestep_scale_multiplier = nn.Parameter(torch.tensor(1000.0))
            self.time_embedder = TimeEmbedder(out * 2)
            self.scale_shift_table = nn.Parameter(torch.zeros(2, out))


def noise_sites(decoder: Decoder) -> list[tuple[ResnetBlock, int]]:
    """Every resnet that injects noise, in upstream's execution (and so torch.randn draw) order, with its
    output-resolution upscale relative to the latent grid."""
    sites, scale = [], 1
    for resnet in decoder.mid_block.resnets:
        sites.append((resnet, scale))
    for block in decoder.up_blocks:
        if hasattr(block, "conv_in"):
            sites.append((block.conv_in, scale))
        if hasattr(block, "upsamplers"):
            scale *= 2
        sites.extend((resnet, scale) for resnet in block.resnets)
    return [(r, s) for r, s in sites if r.inject_noise]


class RankFourDecoder(nn.Module):
    """`video [F', 3, H', W'] = RankFourDecoder(cfg)(latents [F, C, h, w], *[timestep [1]], *noise planes)`.

    The planes are [1, 1, h*s, w*s], two per noise-injecting resnet (`noise_shapes`)."""

    def __init__(self, cfg: DecoderConfig):
        super().__init__()
        self.cfg = cfg
        self.decoder = Decoder(cfg)

    def noise_shapes(self, height: int, width: int) -> list[tuple[int, int, int, int]]:
        return [(1, 1, height * s, width * s) for _, s in noise_sites(self.decoder) for _ in range(2)]

    def input_names(self) -> list[str]:
        names = ["latents"] + (["timestep"] if self.cfg.timestep_conditioning else [])
        return names + [f"noise_{i}" for i in range(2 * len(noise_sites(self.decoder)))]

    def forward(self, latents, *rest):
        d = self.decoder
        t = rest[0] * d.timestep_scale_multiplier if self.cfg.timestep_conditioning else None
        planes = list(rest[1:] if self.cfg.timestep_conditioning else rest)
        noise = {id(r): (planes[2 * i], planes[2 * i + 1]) for i, (r, _) in enumerate(noise_sites(d))}
        x = d.conv_in(latents)
        x = self._blocks(x, t, noise)
        x = channel_rms_norm(x)
        if t is not None:
            temb = d.time_embedder(t)
            c = d.scale_shift_table.shape[1]
            shift = (temb[:, :c] + d.scale_shift_table[0][None])[:, :, None, None]
            scale = (temb[:, c:] + d.scale_shift_table[1][None])[:, :, None, None]
            x = x * (1 + scale) + shift
        x = d.conv_out(F.silu(x))
        return F.pixel_shuffle(x, self.patch_size) if self.patch_size > 1 else x

    @property
    def patch_size(self) -> int:
        return self.decoder.patch_size

    def _blocks(self, x, t, noise):
        for block in [self.decoder.mid_block, *self.decoder.up_blocks]:
            x = self._run_block(block, x, t, noise)
        return x

    @staticmethod
    def _run_block(block, x, t, noise):
        temb = block.time_embedder(t) if hasattr(block, "time_embedder") else None
        if hasattr(block, "conv_in"):   # no 0.9.x config has one with timestep conditioning (checked at build)
            x = block.conv_in(x, None, noise.get(id(block.conv_in)))
        if hasattr(block, "upsamplers"):
            x = block.upsamplers[0](x)
        for resnet in block.resnets:
            x = resnet(x, temb, noise.get(id(resnet)))
        return x

