"""Activations whose lowering the GPU delegate rejects: clamp-to-[0,1], PReLU, ELU.

- `nn.Hardtanh(0, 1)`, `x.clamp(0, 1)`, `(x/6 + 0.5).clamp(0, 1)` (functional hard-sigmoid) all become
  RELU_0_TO_1, accepted up to LiteRT 2.1.3 and rejected since 2.1.5 (LiteRT#8598, still open): a model at
  full residency hard-fails CompiledModel creation after a runtime upgrade. The converter fuses every
  min/max spelling of the clamp back into RELU_0_TO_1, so the rewrite goes through negation:
  `min(relu(x), 1) = -max(-relu(x), -1)` — RELU, MUL, MAXIMUM, MUL, and exact for every x.
  The seed's `relu(x) - relu(x - 1)` is NOT exact at large |x|: once x - 1 rounds to x it returns 0
  instead of 1 (x > 2048 in fp16 — what the GPU computes in — and x > 2**24 in fp32). Kept only as
  `clamp01_relu_diff` so a test can show it.
- `nn.Hardsigmoid` itself lowers to ADD(fused RELU6) + MUL today: not affected.
- PReLU: the seed saw SELECT; litert-torch 0.10 already emits RELU/MUL/SUB. Rewrite kept, not needed.
- ELU still lowers to GREATER_EQUAL + SELECT (accepted by the WebGPU checker, reported rejected on
  phones): `relu(x) + alpha * (exp(-relu(-x)) - 1)`, no select.
"""

from __future__ import annotations

import torch
from torch import nn

from zoo.rewrites import inspect as tfl
from zoo.rewrites.base import LITERT_GPU, NEEDED, NOT_NEEDED, Demo, ModuleSwap, Rewrite, apply_swap, copy_params, seeded


def clamp01(x: torch.Tensor) -> torch.Tensor:
    """clamp(x, 0, 1) without RELU_0_TO_1: negation and max are exact, so this is bit-exact."""
    return -torch.clamp_min(-torch.relu(x), -1.0)


def clamp01_relu_diff(x: torch.Tensor) -> torch.Tensor:
    """The seed's form. Exact only while x - 1 is representable: x <= 2048 in fp16."""
    return torch.relu(x) - torch.relu(x - 1.0)


class Clamp01(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return clamp01(x)


def _swap_hardtanh(m: nn.Hardtanh) -> nn.Module | None:
    return Clamp01() if (m.min_val, m.max_val) == (0.0, 1.0) else None


class PReLUArith(nn.Module):
    """prelu(x) = relu(x) - w * relu(-x): bit-exact (negation commutes with rounding)."""

    def __init__(self, src: nn.PReLU):
        super().__init__()
        copy_params(self, src, ["weight"])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        w = self.weight
        if w.numel() > 1:  # per-channel slope on axis 1
            w = w.reshape((1, -1) + (1,) * (x.dim() - 2))
        return torch.relu(x) - w * torch.relu(-x)


class ELUArith(nn.Module):
    """elu(x) = relu(x) + alpha * (exp(min(x, 0)) - 1), min(x, 0) = -relu(-x).

    torch uses expm1, so this is within ~1e-7 (absolute) of nn.ELU, not bit-exact.
    """

    def __init__(self, alpha: float = 1.0):
        super().__init__()
        self.alpha = float(alpha)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(x) + self.alpha * (torch.exp(-torch.relu(-x)) - 1.0)


def _x(*shape: int, scale: float = 2.0) -> torch.Tensor:
    return torch.randn(*shape, generator=seeded(4)) * scale


def _demo_clamp01() -> Demo:
    before = nn.Sequential(nn.Hardtanh(0.0, 1.0))
    return Demo(before, apply_swap(before, _SWAP_HARDTANH)[0], (_x(1, 8, 6, 6),))


def _demo_prelu() -> Demo:
    torch.manual_seed(0)
    before = nn.Sequential(nn.PReLU(8))
    with torch.no_grad():
        before[0].weight.uniform_(-0.5, 0.5)
    return Demo(before, apply_swap(before, _SWAP_PRELU)[0], (_x(1, 8, 6, 6),))


def _demo_elu() -> Demo:
    before = nn.Sequential(nn.ELU(0.7))
    return Demo(before, apply_swap(before, _SWAP_ELU)[0], (_x(1, 8, 6, 6),))


_SWAP_HARDTANH = ModuleSwap((nn.Hardtanh,), _swap_hardtanh)
_SWAP_PRELU = ModuleSwap((nn.PReLU,), PReLUArith)
_SWAP_ELU = ModuleSwap((nn.ELU,), lambda m: None if m.inplace else ELUArith(m.alpha))

REWRITES = [
    Rewrite(
        id="relu_0_to_1",
        family="activations",
        fixes="RELU_0_TO_1 rejected by the GPU delegate since LiteRT 2.1.5 (hardtanh(0,1), clamp(0,1), "
        "functional hard-sigmoid)",
        targets=(LITERT_GPU,),
        exactness="bit-exact",
        status=NEEDED,
        detect=lambda p: tfl.find_ops(p, "RELU_0_TO_1"),
        demo=_demo_clamp01,
        swap=_SWAP_HARDTANH,
        function=clamp01,
        emits_before=("RELU_0_TO_1",),
        upstream="google-ai-edge/LiteRT#8598",
        notes="The seed's relu(x)-relu(x-1) returns 0 for x > 2048 in fp16; -max(-relu(x), -1) is exact.",
    ),
    Rewrite(
        id="prelu_arith",
        family="activations",
        fixes="SELECT from PReLU (seed); today's converter emits RELU/MUL/SUB",
        targets=(LITERT_GPU,),
        exactness="bit-exact",
        status=NOT_NEEDED,
        detect=lambda p: tfl.find_ops(p, "SELECT", "SELECT_V2"),
        demo=_demo_prelu,
        swap=_SWAP_PRELU,
        emits_before=("RELU", "MUL", "SUB"),
    ),
    Rewrite(
        id="elu_arith",
        family="activations",
        fixes="SELECT from ELU (GREATER_EQUAL + SELECT); accepted by the WebGPU checker, reported "
        "rejected by phone delegates",
        targets=(LITERT_GPU,),
        exactness="<=1e-6",
        status=NEEDED,
        detect=lambda p: tfl.find_ops(p, "SELECT", "SELECT_V2"),
        demo=_demo_elu,
        swap=_SWAP_ELU,
        emits_before=("SELECT",),
        reproduces_on_checker=False,
        notes="SELECT is accepted by the WebGPU checker; the seed reports phone delegates rejecting it.",
    ),
]
