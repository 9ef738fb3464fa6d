"""wide-norm: x * 300 → RMSNorm over 2048 channels. mean(x²) ≈ 9e4 > fp16's 65504, so an fp16 GPU run
overflows while fp32 (CPU, or GPU with enforce_f32) is exact: the GPU fp16 gate must fail it."""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from zoo.registry import Component, ModelSpec
from zoo.weights import load_strict

WIDTH = 2048


class WideNorm(nn.Module):
    def __init__(self):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(WIDTH))

    def forward(self, x):
        x = x * 300.0
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * self.weight


def build(checkpoint, cfg):
    return load_strict(WideNorm(), checkpoint.state_dict).eval()


def inputs(checkpoint, cfg):
    return {"x": torch.randn(1, 4, WIDTH, generator=torch.Generator().manual_seed(0))}


SPEC = ModelSpec(
    name="wide-norm",
    components=[Component("norm", build, build, inputs, ["y"])],
    tiny_dir=Path(__file__).parent / "tiny",
    random_checkpoint=lambda cfg: ({}, {"weight": torch.ones(WIDTH)}),
)
