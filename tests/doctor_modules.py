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
