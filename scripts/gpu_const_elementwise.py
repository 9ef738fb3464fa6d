"""Measure the LiteRT GPU delegate on `runtime (op) constant` of the same full shape (software Vulkan).

    python scripts/gpu_const_elementwise.py

Each variant is `(x + C) * 2` for a runtime x and a constant buffer C, converted with litert-torch and run
by zoo.targets.litert_gpu.gpu_check; prints the GPU-vs-CPU relative error computing in enforced fp32.
Found while converting a diffusion-style timestep embedding (tests/doctor_modules.py `timesteps`):
[16, 32] and [16, 1, 32] are wrong even in fp32, [1, 16, 32] and [1, 16, 1, 32] exact — the layout
zoo.rewrites.arith.elementwise_rank4 uses.
"""

import tempfile
from pathlib import Path

import torch
from torch import nn

from zoo.rewrites import inspect as tfl
from zoo.rewrites.arith import elementwise_rank4
from zoo.rewrites.evidence import gpu_inputs, worst
from zoo.targets.litert_gpu import gpu_check

VARIANTS = {
    "[16, 32] + const [16, 32]": ((16, 32), lambda x, c: x + c),
    "[16, 1, 32] + const [16, 1, 32]": ((16, 32), lambda x, c: (x.reshape(16, 1, 32) + c.reshape(16, 1, 32)).reshape(16, 32)),
    "[1, 16, 32] + const [1, 16, 32]": ((1, 16, 32), lambda x, c: x + c.reshape(1, 16, 32)),
    "[16, 32] + const row [1, 32]": ((16, 32), lambda x, c: x + c[:1]),
    "elementwise_rank4 ([1, 16, 1, 32])": ((16, 32), lambda x, c: elementwise_rank4("add", x, c)),
}


class Variant(nn.Module):
    def __init__(self, fn):
        super().__init__()
        self.fn = fn
        self.register_buffer("c", torch.randn(16, 32, generator=torch.Generator().manual_seed(2)))

    def forward(self, x):
        return self.fn(x, self.c) * 2.0


if __name__ == "__main__":
    with tempfile.TemporaryDirectory() as tmp:
        for i, (name, (shape, fn)) in enumerate(VARIANTS.items()):
            x = torch.randn(*shape, generator=torch.Generator().manual_seed(1))
            path = tfl.convert_to_tflite(Variant(fn).eval(), (x,), Path(tmp) / f"{i}.tflite")
            check = gpu_check(path, gpu_inputs((x,)))
            print(f"{name:<36} GPU {check.status}: fp32 rel err {worst(check, 'fp32_rel_err'):.2g}", flush=True)
