"""RF-DETR checkpoints: upstream `.pth` files, seeded weights for golden parity, and key normalisation.

`seeded_tensor` / `seeded_state_dict` are pure functions of (seed, key, shape): the real-size Nano golden
fixture stores only a key → shape manifest, and both sides draw identical weights from it.
scripts/make_rfdetr_goldens.py (reference environment, no zoo) loads this file by path, so this module must
keep importing nothing but torch and zlib.
"""

from __future__ import annotations

import zlib

import torch

# Buffers upstream's state_dict() carries that hold no weights (keypoint bookkeeping, empty for detectors).
BOOKKEEPING_KEYS = ("_kp_active_mask",)


def seeded_tensor(key: str, shape: tuple[int, ...], seed: int) -> torch.Tensor:
    """One tensor as a pure function of (seed, key, shape) (also used by scripts/make_rfdetr_goldens.py)."""
    generator = torch.Generator().manual_seed(seed * 1_000_003 + zlib.crc32(key.encode()))
    noise = torch.randn(shape, generator=generator, dtype=torch.float32)
    leaf = key.rsplit(".", 1)[-1]
    if len(shape) >= 2 and leaf == "weight":       # Linear / Conv: fan-in scaling keeps activations O(1)
        fan_in = 1
        for size in shape[1:]:
            fan_in *= size
        return noise / fan_in ** 0.5
    if leaf == "weight" or leaf == "lambda1":       # norms and layer scales: around 1
        return 1.0 + 0.1 * noise
    if "class_embed" in key and leaf == "bias":     # scores spread over (0, 1)
        return noise
    if leaf == "bias":
        return 0.02 * noise
    return 0.1 * noise                              # tokens, position embeddings, query embeddings


def seeded_state_dict(shapes: dict[str, tuple[int, ...]], seed: int) -> dict[str, torch.Tensor]:
    return {key: seeded_tensor(key, tuple(shape), seed) for key, shape in sorted(shapes.items())}


def without_bookkeeping(state_dict: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Drop upstream's weightless buffers (present in checkpoints saved by rfdetr ≥ 1.10, absent before)."""
    return {k: v for k, v in state_dict.items() if k not in BOOKKEEPING_KEYS or v.numel() > 0}
