"""Precisions, what each target can honour, and the one I/O-cast wrapper for reduced precision.

A precision says two things: the dtype the graph *computes* in, and how the weights are *stored*.
They differ on LiteRT, whose CPU kernels compute in fp32 whatever the weight storage, and whose
`fp16` therefore means "fp16 weights" (the GPU delegate computes in fp16 regardless).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from zoo.errors import ZooError


@dataclass(frozen=True)
class Precision:
    name: str
    dtype: torch.dtype  # the reduced dtype, where a target computes in it (Core AI fp16/bf16)


PRECISIONS = {
    "fp32": Precision("fp32", torch.float32),
    "fp16": Precision("fp16", torch.float16),
    "bf16": Precision("bf16", torch.bfloat16),
    # int8 computes in fp32 on both targets; the weights are compressed after conversion
    # (Core AI: 8-bit palettization; LiteRT: dynamic-range int8). See each target's `compress`.
    "int8": Precision("int8", torch.float32),
}


def default_precision(model_cfg, target: str, component: str | None = None) -> str:
    """The model's per-target default, or the component's own where the config names one."""
    own = ((model_cfg.get("component_precision") or {}).get(component) or {}).get(target) if component else None
    return str(own or model_cfg.default_precision[target])


def resolve_precision(requested: str, target: str, model_cfg, force: bool = False, component: str | None = None) -> Precision:
    """Pick the precision for one target, refusing what the target or the model cannot honour.

    `requested == "default"` takes the component's default for the target (component_precision), else the
    model's. Nothing is ever substituted: an impossible request is an error that says what would work instead.
    """
    from zoo.targets import get_target  # late import: targets import this module

    name = default_precision(model_cfg, target, component) if requested == "default" else requested
    if name not in PRECISIONS:
        raise ZooError(
            f"Unknown precision '{name}'.",
            f"choose one of {', '.join(PRECISIONS)} (or 'default' for the model's per-target default).",
        )
    supported = get_target(target).precisions
    if name not in supported:
        raise ZooError(
            f"Target '{target}' cannot honour precision '{name}': {get_target(target).precision_notes.get(name, '')}".strip(),
            f"choose one of {', '.join(supported)} for {target}, e.g. PRECISION={model_cfg.default_precision[target]}.",
        )
    refusal = (model_cfg.get("refused_precisions") or {}).get(target, {}).get(name)
    if refusal and not force:
        raise ZooError(
            f"Model '{model_cfg.name}' refuses {name} on {target}: {refusal}",
            f"use PRECISION={model_cfg.default_precision[target]}, or add precision.force=true if you really want it.",
        )
    return PRECISIONS[name]


def in_fp32(op, x: torch.Tensor, *operands):
    """op(x, *operands) computed in fp32 and returned in x's dtype: the one fp32-accumulation rule that
    every reduced-precision matmul in the zoo uses (Fp32AccumulateLinear, and models' own layouts such as
    gqa-llm's pre-transposed Linear). Weights stay stored in the reduced dtype."""
    return op(x.float(), *(None if o is None else o.float() for o in operands)).to(x.dtype)


class Fp32AccumulateLinear(nn.Module):
    """A Linear whose weight stays stored in the reduced dtype but is multiplied in fp32.

    Measured on the Core AI Linux CPU runtime (coreai-core 1.0.0b3): a bf16 Linear against a constant
    weight accumulates in bf16, so its error grows with the input width (1 - cos 5e-4 at K=768,
    1.4e-3 at K=2048, vs 4e-6 for eager bf16), and a 12-layer T5-base drifts to cos 0.992. Casting the
    operands up restores eager-bf16 accuracy; the bundle keeps bf16 storage (half the size).
    """

    def __init__(self, linear: nn.Linear):
        super().__init__()
        self.weight = linear.weight
        self.bias = linear.bias

    def forward(self, x):
        return in_fp32(F.linear, x, self.weight, self.bias)


def accumulate_linears_in_fp32(module: nn.Module) -> nn.Module:
    for name, child in module.named_children():
        if isinstance(child, nn.Linear):
            setattr(module, name, Fp32AccumulateLinear(child))
        else:
            accumulate_linears_in_fp32(child)
    return module


class IOCast(nn.Module):
    """Run a module in a reduced dtype while its graph I/O stays fp32.

    The one wrapper every model uses: floating inputs are cast down on entry, floating outputs cast
    back to fp32 on exit; integer inputs (token ids, masks) pass through untouched.
    """

    def __init__(self, module: nn.Module, dtype: torch.dtype, fp32_linear_accumulation: bool = False):
        super().__init__()
        self.module = copy.deepcopy(module).to(dtype)  # never cast the caller's fp32 module in place
        if fp32_linear_accumulation:
            accumulate_linears_in_fp32(self.module)
        self.dtype = dtype

    def forward(self, *args, **kwargs):
        def cast(a):
            return a.to(self.dtype) if torch.is_floating_point(a) else a

        out = self.module(*map(cast, args), **{k: cast(v) for k, v in kwargs.items()})
        if isinstance(out, tuple):
            return tuple(o.float() for o in out)
        return out.float()


def cast_for_export(module: nn.Module, dtype: torch.dtype, fp32_linear_accumulation: bool = False) -> nn.Module:
    return module if dtype == torch.float32 else IOCast(module, dtype, fp32_linear_accumulation)
