"""Elementwise arithmetic the GPU delegate declines or miscomputes.

- SELECT / SELECT_V2 (torch.where, masked fill, in-place index assignment): `x*(1-m) + v*m` with a float
  {0,1} mask. Bit-exact for finite x and v; a -inf fill becomes NaN (inf * 0), so fill with a finite
  large negative (-1e4 survives fp16).
- DIV whose two inputs are the same tensor ("No support of few identical inputs"): in practice a softmax
  over a length-1 axis (exp(x - max) / sum, where max and sum over one element fold to identity). That
  softmax is identically 1; special-casing it lets the converter fold it away (LiteRT#9192).
- FULLY_CONNECTED with a rank-2 output feeding ADD/MUL with a full-shape rank-3 constant
  (`nn.Linear(x[1,L,C]) + pos_emb[1,L,C]`): accepted, wrong even in fp32 on the GPU. litert-torch 0.10
  emits the rank-2 FC (v1, keep_num_dims=False) for a linear *with* bias on a rank-3 input, and a rank-3
  FC (v5) for `F.linear(x, W) + b`; with the bias outside, the converter folds it into the ADD constant
  itself (pos_emb + b), which is the seed's "fold the bias into the constant".
- ADD output aliasing (LiteRT#8599, device-only): an ADD of two runtime tensors that is both a graph
  output and consumed downstream comes back holding an operand. `AliasSafeOutputs` multiplies every
  output by a runtime input `one` (a constant would fold straight back). Opt-in: it adds an input.
  Not reproducible on the WebGPU/lavapipe checker, so only the graph shape can be tested here.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from zoo.rewrites import inspect as tfl
from zoo.rewrites.base import LITERT_GPU, NEEDED, Demo, Lambda, ModuleSwap, Rewrite, apply_swap, copy_params, seeded

# --- SELECT -> arithmetic -----------------------------------------------------------------------------


def select_arith(mask: torch.Tensor, value: torch.Tensor | float, x: torch.Tensor) -> torch.Tensor:
    """torch.where(mask, value, x) for a float mask of exact 0/1 values, without SELECT."""
    return x * (1.0 - mask) + value * mask


def _demo_select() -> Demo:
    x = torch.randn(1, 4, 6, 6, generator=seeded(5))
    m = (torch.rand(1, 4, 6, 6, generator=seeded(6)) > 0.5).float()
    before = Lambda(lambda x, m: torch.where(m > 0.5, -1e4, x), "where(m, -1e4, x)")
    after = Lambda(lambda x, m: select_arith(m, -1e4, x), "select_arith")
    return Demo(before, after, (x, m))


# --- softmax over a length-1 axis ---------------------------------------------------------------------


def floor_gpu_safe(x: torch.Tensor) -> torch.Tensor:
    """floor(x) in the form the seed records as safe on the Core AI GPU (a bare floor lowers to identity
    there): floor(2x / 2) == floor(x) exactly, doubling is exact, and div(rounding_mode="floor") lowers
    to a different op. Used by zoo.doctor's floor-on-gpu fix and by RF-DETR's deformable sampler."""
    return torch.div(x * 2.0, 2.0, rounding_mode="floor")


_ELEMENTWISE = {"add": torch.add, "sub": torch.sub, "mul": torch.mul, "div": torch.div}


def elementwise_rank4(op: str, a, b) -> torch.Tensor:
    """`a op b` for two same-shape tensors [N, C] or [N, M, C], computed as [1, N*M, 1, C].

    The LiteRT GPU delegate (software Vulkan, ai-edge-litert 2.3.0) accepts an ADD/MUL of a runtime
    [16, 32] tensor and a [16, 32] *constant* and computes it wrong even in fp32 (rel err 1.1; the same
    at [16, 1, 32]); with the leading axis 1 ([1, 16, 32]) or the operands as [1, 16, 1, 32] it is exact
    (scripts/gpu_const_elementwise.py). Pure reshapes around the op: bit-exact."""
    shape = a.shape if isinstance(a, torch.Tensor) else b.shape
    rows = math.prod(shape[:-1])
    lift = lambda t: t.reshape(1, rows, 1, shape[-1]) if isinstance(t, torch.Tensor) else t  # noqa: E731
    return _ELEMENTWISE[op](lift(a), lift(b)).reshape(shape)


def softmax_safe(x: torch.Tensor, dim: int) -> torch.Tensor:
    """softmax, except over a length-1 axis where it is identically 1 (no DIV of a tensor by itself)."""
    if x.shape[dim] == 1:
        return torch.ones_like(x)
    return x.softmax(dim)


class SafeSoftmax(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.dim = dim

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return softmax_safe(x, self.dim)


class LatentCrossAttention(nn.Module):
    """Perceiver-style read-out: a learned latent bank attends to a single input token.

    The softmax runs over the key axis, of length 1: the pattern that splits the GPU partition.
    """

    def __init__(self, n_latents: int = 4, dim: int = 8):
        super().__init__()
        self.latents = nn.Parameter(torch.randn(1, n_latents, dim, generator=seeded(7)))
        self.q = nn.Linear(dim, dim, bias=False)
        self.softmax = nn.Softmax(dim=-1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x: [1, 1, dim]
        scores = self.q(self.latents) @ x.transpose(-1, -2)  # [1, n_latents, 1]
        return self.softmax(scores) @ x


_SWAP_SOFTMAX = ModuleSwap((nn.Softmax,), lambda m: SafeSoftmax(m.dim if m.dim is not None else -1))


def _demo_softmax_len1() -> Demo:
    torch.manual_seed(0)
    before = LatentCrossAttention().eval()
    return Demo(before, apply_swap(before, _SWAP_SOFTMAX)[0], (torch.randn(1, 1, 8, generator=seeded(8)),))


# --- FULLY_CONNECTED -> ADD/MUL with a rank-3 constant --------------------------------------------------


class LinearKeepRank(nn.Linear):
    """nn.Linear written as `F.linear(x, W) + b`: litert-torch keeps the FC output at the input's rank.

    Same parameters (a drop-in for nn.Linear, state dict unchanged). Not bit-exact against addmm in
    torch (the bias is added after, not before, the dot product): within 1e-6.
    """

    @classmethod
    def from_linear(cls, src: nn.Linear) -> "LinearKeepRank":
        new = cls(src.in_features, src.out_features, bias=src.bias is not None)
        return copy_params(new, src, ["weight", "bias"])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.linear(x, self.weight)
        return y if self.bias is None else y + self.bias


class LinearPlusConstant(nn.Module):
    """`proj(x) + pos` / `proj(x) * gain` with a full-shape [1, L, C] parameter: the failing pattern."""

    def __init__(self, seq: int = 5, c_in: int = 6, c_out: int = 8, op: str = "add"):
        super().__init__()
        self.proj = nn.Linear(c_in, c_out)
        self.const = nn.Parameter(torch.randn(1, seq, c_out, generator=seeded(9)))
        self.op = op

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.proj(x)
        return y + self.const if self.op == "add" else y * self.const


def _swap_linear(m: nn.Linear) -> nn.Module | None:
    return None if isinstance(m, LinearKeepRank) or m.bias is None else LinearKeepRank.from_linear(m)


_SWAP_LINEAR = ModuleSwap((nn.Linear,), _swap_linear)


def _demo_fc(op: str) -> Demo:
    torch.manual_seed(0)
    before = LinearPlusConstant(op=op).eval()
    return Demo(before, apply_swap(before, _SWAP_LINEAR)[0], (torch.randn(1, 5, 6, generator=seeded(10)),))


# --- ADD output aliasing ------------------------------------------------------------------------------


class AliasSafeOutputs(nn.Module):
    """Wrap a model so every output is `output * one`, `one` a runtime input holding 1.0.

    x * 1.0 is exact, so outputs are bit-identical; the graph output becomes a MUL result distinct from
    the ADD result that downstream ops read. The caller feeds `one = torch.ones(1)` as the last input.
    """

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, *args):
        *inputs, one = args
        out = self.model(*inputs)
        if isinstance(out, (tuple, list)):
            return type(out)(o * one for o in out)
        return out * one


class StateUpdateCell(nn.Module):
    """A streaming state update: `state = state + f(x)` is returned *and* used to make the output."""

    def __init__(self, dim: int = 8):
        super().__init__()
        self.f = nn.Linear(dim, dim, bias=False)
        self.g = nn.Linear(dim, dim, bias=False)

    def forward(self, x: torch.Tensor, state: torch.Tensor):
        state = state + self.f(x)
        return self.g(state), state


def _demo_alias() -> Demo:
    torch.manual_seed(0)
    before = StateUpdateCell().eval()
    x, s = torch.randn(1, 3, 8, generator=seeded(11)), torch.randn(1, 3, 8, generator=seeded(12))
    after = apply_swap(before, _SWAP_ALIAS)[0]
    return Demo(before, after, (x, s), after_args=(x, s, torch.ones(1)))


# Wraps the model as a whole (root only): the extra input must be a graph input.
_SWAP_ALIAS = ModuleSwap(
    (nn.Module,), lambda m: None if isinstance(m, AliasSafeOutputs) else AliasSafeOutputs(m), root_only=True
)


REWRITES = [
    Rewrite(
        id="select_to_arith",
        family="arith",
        fixes="SELECT / SELECT_V2 from torch.where / masked fill (accepted by the WebGPU checker, "
        "reported rejected by phone delegates)",
        targets=(LITERT_GPU,),
        exactness="bit-exact",
        status=NEEDED,
        detect=lambda p: tfl.find_ops(p, "SELECT", "SELECT_V2"),
        demo=_demo_select,
        function=select_arith,
        emits_before=("SELECT_V2",),
        reproduces_on_checker=False,
        notes="Mask must be exactly 0/1 and the fill finite (inf * 0 = NaN). SELECT_V2 is accepted by the "
        "WebGPU checker; the seed reports phone delegates rejecting it.",
    ),
    Rewrite(
        id="softmax_len1",
        family="arith",
        fixes="DIV: No support of few identical inputs / Expected 1 const input tensor(s) — softmax over a "
        "length-1 axis",
        targets=(LITERT_GPU,),
        exactness="bit-exact",
        status=NEEDED,
        detect=lambda p: tfl.find_identical_inputs(p, ("DIV",)),
        demo=_demo_softmax_len1,
        swap=_SWAP_SOFTMAX,
        function=softmax_safe,
        emits_before=("DIV",),
        upstream="google-ai-edge/LiteRT#9192",
    ),
    Rewrite(
        id="fc_rank3_constant",
        family="arith",
        fixes="silent miscompute: rank-2 FULLY_CONNECTED output feeding ADD/MUL with a full-shape rank-3 "
        "constant (row 0 right, the rest wrong, even in fp32)",
        targets=(LITERT_GPU,),
        exactness="<=1e-6",
        status=NEEDED,
        detect=tfl.find_fc_rank_drop,
        demo=lambda: _demo_fc("add"),
        swap=_SWAP_LINEAR,
        emits_before=("FULLY_CONNECTED", "ADD"),
        failure="numeric-gpu",
        notes="Swaps nn.Linear (with bias) for F.linear(x, W) + b; for ADD the converter then folds the "
        "bias into the constant. Also fixes the MUL form, where no fold is possible.",
    ),
    Rewrite(
        id="add_output_alias",
        family="arith",
        fixes="device-only: an ADD result that is a graph output and consumed downstream comes back holding an operand",
        targets=(LITERT_GPU,),
        exactness="bit-exact",
        status=NEEDED,
        detect=tfl.find_aliased_add_outputs,
        demo=_demo_alias,
        swap=_SWAP_ALIAS,
        emits_before=("ADD",),
        failure="device-only",
        opt_in=True,
        reproduces_on_checker=False,
        upstream="google-ai-edge/LiteRT#8599",
        notes="Adds a runtime input `one` (feed 1.0). Not reproducible on the WebGPU/lavapipe checker.",
    ),
]
