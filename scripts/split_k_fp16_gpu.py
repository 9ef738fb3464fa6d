"""Measure what split-K does to a long matmul on the LiteRT GPU's fp16 path (software Vulkan checker).

    python scripts/split_k_fp16_gpu.py 4096 16384

For each K: a `torch.matmul(x, W)` module (x: [1, 8, K] with mean 0.5, so the dot products grow with K),
converted as written and after `zoo.doctor.fix` (zoo.rewrites.fp16.split_k_matmul, 1024-long pieces summed
pairwise); prints the GPU-vs-CPU relative error (max-abs / max|CPU|) computing in fp32 and in fp16.
"""

import sys
import tempfile
from pathlib import Path

import torch
from torch import nn

from zoo import doctor
from zoo.rewrites import inspect as tfl
from zoo.rewrites.evidence import gpu_inputs, worst
from zoo.targets.litert_gpu import gpu_check


class LongK(nn.Module):
    def __init__(self, k: int, n: int = 64):
        super().__init__()
        self.w = nn.Parameter(torch.randn(k, n, generator=torch.Generator().manual_seed(0)) / k**0.5)

    def forward(self, x):
        return torch.matmul(x, self.w)


def measure(k: int, workdir: Path) -> None:
    x = torch.randn(1, 8, k, generator=torch.Generator().manual_seed(1)) + 0.5
    module = LongK(k).eval()
    fixed = doctor.fix(module, (x,), ("litert-gpu",), precision="fp16")
    for name, candidate in (("as written", module), ("split-K", fixed.module)):
        path = tfl.convert_to_tflite(candidate, (x,), workdir / f"{k}-{name.replace(' ', '_')}.tflite")
        check = gpu_check(path, gpu_inputs((x,)))
        print(f"K={k:6d} {name:<10} GPU {check.status}: fp32 rel err {worst(check, 'fp32_rel_err'):.2g}, "
              f"fp16 rel err {worst(check, 'fp16_rel_err'):.2g}", flush=True)


if __name__ == "__main__":
    with tempfile.TemporaryDirectory() as tmp:
        for k in map(int, sys.argv[1:] or ["4096", "16384"]):
            measure(k, Path(tmp))
