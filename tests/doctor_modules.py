"""Third-party-style modules for the doctor's tests: plain F.* calls and their own classes, no zoo code.
Each factory returns (module, example_inputs), the `pkg.mod:factory` contract of `zoo doctor`."""

import torch
import torch.nn.functional as F
from torch import nn


def _x(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


class Warp(nn.Module):
    """Deformable-attention style sampling, a bicubic upsample and a hard sigmoid gate."""

    def __init__(self):
        super().__init__()
        self.proj = nn.Conv2d(3, 4, 1)

    def forward(self, x, grid):
        y = self.proj(x)
        sampled = F.grid_sample(y, grid, mode="bilinear", padding_mode="zeros", align_corners=False)
        up = F.interpolate(sampled, size=(8, 8), mode="bicubic", align_corners=False)
        return up * F.hardtanh(up, 0.0, 1.0)


class TinyGQA(nn.Module):
    """Hugging Face-style grouped-query attention with transformers' repeat_kv idiom."""

    def __init__(self, dim=32, heads=4, kv_heads=2):
        super().__init__()
        self.heads, self.kv_heads, self.hd = heads, kv_heads, dim // heads
        self.q = nn.Linear(dim, dim)
        self.kv = nn.Linear(dim, 2 * kv_heads * self.hd)

    @staticmethod
    def repeat_kv(x, n_rep):
        b, n, s, d = x.shape
        return x[:, :, None, :, :].expand(b, n, n_rep, s, d).reshape(b, n * n_rep, s, d)

    def forward(self, x):
        b, s, _ = x.shape
        q = self.q(x).view(b, s, self.heads, self.hd).transpose(1, 2)
        k, v = self.kv(x).view(b, s, 2 * self.kv_heads, self.hd).transpose(1, 2).chunk(2, dim=1)
        n_rep = self.heads // self.kv_heads
        k, v = self.repeat_kv(k, n_rep), self.repeat_kv(v, n_rep)
        att = (q @ k.transpose(-1, -2) / self.hd ** 0.5).softmax(-1)
        return (att @ v).transpose(1, 2).reshape(b, s, -1)


def warp():
    torch.manual_seed(0)
    grid = torch.rand(1, 6, 6, 2, generator=torch.Generator().manual_seed(1)) * 2 - 1
    return Warp().eval(), (_x(1, 3, 8, 8), grid)


def gqa():
    torch.manual_seed(0)
    return TinyGQA().eval(), (_x(1, 5, 32),)


def clean():
    return nn.Sequential(nn.Linear(8, 8), nn.ReLU()).eval(), (_x(2, 8),)


def not_a_pair():
    return nn.Linear(2, 2)


class WindowMixer(nn.Module):
    """Swin-style window partition (a rank-6 view/permute) around a per-window channel mix."""

    def __init__(self, dim=8, window=2):
        super().__init__()
        self.window = window
        self.mix = nn.Linear(dim, dim)

    def forward(self, x):  # x: [B, H, W, C]
        b, h, w, c = x.shape
        s = self.window
        windows = x.view(b, h // s, s, w // s, s, c).permute(0, 1, 3, 2, 4, 5).reshape(-1, s * s, c)
        mixed = self.mix(windows)
        return mixed.view(b, h // s, w // s, s, s, c).permute(0, 1, 3, 2, 4, 5).reshape(b, h, w, c)


class WideMLP(nn.Module):
    """A wide hidden layer with its own RMSNorm and a hand-written long-K down projection (x @ W), fed
    activations of the scale large LLM residual streams reach (|h| ~ 300, so h² passes fp16's 65504)."""

    def __init__(self, dim=64, hidden=4096):
        super().__init__()
        self.up = nn.Linear(dim, hidden)
        self.gain = nn.Parameter(torch.ones(hidden))
        self.down = nn.Parameter(torch.randn(hidden, dim) / hidden ** 0.5)

    def rms_norm(self, h):
        return h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6) * self.gain

    def forward(self, x):
        h = self.up(x) * 512.0
        return torch.matmul(self.rms_norm(h), self.down)


class SpanGate(nn.Module):
    """Keeps the positions inside [start, start + width): an int64 comparison chain from arange."""

    def __init__(self, width=4):
        super().__init__()
        self.width = width

    def forward(self, x, start):  # x: [B, L, C], start: [B, 1] int32
        pos = torch.arange(x.shape[1])[None, :]
        keep = (pos >= start) & (pos < start + self.width)
        return x * keep[:, :, None].to(x.dtype)


class LatentPool(nn.Module):
    """Perceiver-style pooling onto learned latents from a single summary token: the softmax runs over a
    length-1 key axis (LiteRT#9192: a DIV with identical inputs)."""

    def __init__(self, dim=16, latents=4):
        super().__init__()
        self.latents = nn.Parameter(torch.randn(1, latents, dim))
        self.key = nn.Linear(dim, dim)
        self.value = nn.Linear(dim, dim)

    def forward(self, x):  # x: [B, L, C]
        summary = x.mean(1, keepdim=True)
        scores = self.latents @ self.key(summary).transpose(1, 2) / 4.0  # [B, latents, 1]
        return F.softmax(scores, dim=-1) @ self.value(summary) + self.latents


def window():
    torch.manual_seed(0)
    return WindowMixer().eval(), (_x(1, 4, 4, 8),)


def wide():
    torch.manual_seed(0)
    return WideMLP().eval(), (_x(1, 4, 64),)


def span():
    return SpanGate().eval(), (_x(1, 8, 4), torch.tensor([[2]], dtype=torch.int32))


def pool():
    torch.manual_seed(0)
    return LatentPool().eval(), (_x(1, 6, 16),)


class ComplexRotary(nn.Module):
    """Meta's reference RoPE: a complex freqs_cis buffer and view_as_complex on q's channel pairs."""

    def __init__(self, seq=6, heads=2, dim=8):
        super().__init__()
        self.q = nn.Linear(heads * dim, heads * dim)
        self.heads = heads
        freqs = 1.0 / (10000 ** (torch.arange(0, dim, 2).float() / dim))
        angles = torch.outer(torch.arange(float(seq)), freqs)
        self.register_buffer("freqs_cis", torch.polar(torch.ones_like(angles), angles))

    def forward(self, x):  # x: [B, S, heads*dim]
        b, s, _ = x.shape
        q = self.q(x).view(b, s, self.heads, -1)
        qc = torch.view_as_complex(q.float().reshape(b, s, self.heads, -1, 2))
        rotated = torch.view_as_real(qc * self.freqs_cis.view(1, s, 1, -1)).flatten(3)
        return rotated.reshape(b, s, -1)


class TimestepEmbedding(nn.Module):
    """Diffusion-style sinusoidal embedding of a fixed schedule of timesteps (a buffer reaching 999)."""

    def __init__(self, steps=16, dim=32):
        super().__init__()
        freqs = torch.exp(-torch.arange(dim // 2).float() * (9.21 / (dim // 2)))
        self.register_buffer("angles", torch.linspace(0, 999, steps)[:, None] * freqs[None])
        self.proj = nn.Linear(dim, dim)

    def forward(self, x):  # x: [steps, dim]
        emb = torch.cat([torch.sin(self.angles), torch.cos(self.angles)], dim=-1)
        return self.proj(x + emb)


def rope():
    torch.manual_seed(0)
    return ComplexRotary().eval(), (_x(1, 6, 16),)


def timesteps():
    torch.manual_seed(0)
    return TimestepEmbedding().eval(), (_x(16, 32),)


class DataDependent(nn.Module):
    def forward(self, x):
        if x.sum() > 0:  # data-dependent control flow: torch.export cannot trace it
            return x
        return -x


def data_dependent():
    return DataDependent(), (_x(4),)
