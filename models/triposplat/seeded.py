"""Seeded TripoSplat weights as a pure function of (seed, key, shape), for the goldens whose weights are too big to
commit: both sides (scripts/make_triposplat_goldens.py in the reference environment, and tests/test_triposplat.py)
draw identical tensors from a key -> shape manifest. scripts/make_triposplat_goldens.py loads this file by path (no
zoo there), so it must keep importing nothing but torch and zlib.
"""

from __future__ import annotations

import zlib

import torch


def seeded_tensor(key: str, shape: tuple[int, ...], seed: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed * 1_000_003 + zlib.crc32(key.encode()))
    noise = torch.randn(shape, generator=generator, dtype=torch.float32)
    leaf = key.rsplit(".", 1)[-1]
    if leaf.startswith("freqs_"):                 # RePo frequencies: upstream's ramp 1..16, perturbed
        return torch.linspace(1.0, 16.0, steps=shape[0]) * (1.0 + 0.1 * noise)
    if len(shape) >= 2 and leaf == "weight":      # Linear: fan-in scaling keeps activations O(1)
        return noise / shape[-1] ** 0.5
    if leaf in ("weight", "gamma"):               # norms: around 1
        return 1.0 + 0.1 * noise
    if leaf == "bias":
        return 0.02 * noise
    return noise / shape[-1] ** 0.5               # shift tables, as upstream draws them


def seeded_state_dict(shapes: dict[str, tuple[int, ...]], seed: int) -> dict[str, torch.Tensor]:
    return {key: seeded_tensor(key, tuple(shape), seed) for key, shape in sorted(shapes.items())}
