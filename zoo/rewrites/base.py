"""What a rewrite is, and how one is applied to a model.

A rewrite replaces a pattern that a target rejects or miscomputes with an equivalent that it accepts.
Each one carries its own paperwork (what it fixes, for which targets, how exact it is, whether today's
converter still needs it) and a `demo()` — a tiny before/after pair that the tests and
`scripts/gpu_table.py` convert, so the claim and its evidence live in one place.

Two shapes of rewrite:
- a **module swap**: instances of a module class (nn.Hardtanh, nn.LayerNorm, ...) are replaced by an
  equivalent module built from them, weights copied (`ModuleSwap`);
- a **drop-in function**: for patterns that have no module of their own in torch (repeat_kv, a strided
  slice, a windowed reshape), the re-authored model calls the function instead of the idiom.
Many have both.
"""

from __future__ import annotations

import copy
import dataclasses
from pathlib import Path
from typing import Callable, Iterable, Literal, Sequence

import numpy as np
import torch
from torch import nn

Exactness = Literal["bit-exact", "<=1e-6", "approximate"]

NEEDED = "needed"
NOT_NEEDED = "not needed on litert-torch 0.10 / jax 0.10.2"

LITERT_GPU = "litert-gpu"
LITERT = "litert"  # the converter itself (e.g. no lowering for complex numbers)
COREAI = "coreai"


@dataclasses.dataclass(frozen=True)
class ModuleSwap:
    """Replace every instance of `source` for which `build(instance)` returns a module."""

    source: tuple[type[nn.Module], ...]
    # Returns the replacement (weights copied) or None to leave this instance alone, e.g. an
    # nn.Hardtanh whose bounds are not (0, 1).
    build: Callable[[nn.Module], nn.Module | None]
    root_only: bool = False  # wrap the model as a whole (e.g. to add an input), never its children


@dataclasses.dataclass
class Demo:
    """A tiny instance of the pattern: `before` shows the failure, `after` is the rewrite applied."""

    before: nn.Module
    after: nn.Module
    args: tuple[torch.Tensor, ...]
    # When the rewrite changes the inputs (add_output_alias adds `one`), the arguments for `after`.
    after_args: tuple[torch.Tensor, ...] | None = None
    # Same shapes as `args`, chosen to break the original in fp16 (|x| ~ 1e3, constant and zero rows):
    # the GPU check feeds these, so its fp16 run shows the failure and the fix.
    stress_args: tuple[torch.Tensor, ...] | None = None

    def args_after(self) -> tuple[torch.Tensor, ...]:
        return self.args if self.after_args is None else self.after_args


@dataclasses.dataclass(frozen=True)
class Rewrite:
    id: str
    family: str  # the module under zoo/rewrites/ that holds it
    fixes: str  # the op name, error string or silent miscompute it addresses
    targets: tuple[str, ...]
    exactness: Exactness
    status: str  # NEEDED or NOT_NEEDED (today's converter already emits the clean form)
    # Structural finding on a .tflite: a list of human-readable problems, empty when clean. The tests
    # assert it fires on demo().before (for NEEDED rewrites) and is silent on demo().after.
    detect: Callable[[Path], list[str]]
    demo: Callable[[], Demo]
    swap: ModuleSwap | None = None
    function: Callable | None = None
    # Ops today's converter emits for demo().before, asserted by the tests: for a NOT_NEEDED rewrite the
    # GPU-clean ops that defuse the seed row (a converter upgrade that regresses is caught), for a
    # NEEDED one the offending op.
    emits_before: tuple[str, ...] = ()
    # A tighter bound than the exactness class promises, where the rewrite is held to one (STFT: 1e-5).
    max_rel_error: float | None = None
    # Where the failure shows: "structural" (an op/rank the delegate rejects, visible in the file),
    # "numeric-gpu" (accepted but wrong on the GPU), "numeric-fp16" (overflow in fp16 kernels),
    # "device-only" (not reproducible on the WebGPU/lavapipe checker), "conversion" (converter raises).
    failure: str = "structural"
    opt_in: bool = False  # applied only when asked for by id (e.g. it changes the model's inputs)
    # False where the WebGPU/lavapipe checker cannot show the failure (fixed in its runtime, phone-only,
    # device-only); `notes` says which. The GPU tests then assert the original *passes* there, so a
    # change in the checker is noticed rather than hidden.
    reproduces_on_checker: bool = True
    upstream: str = ""  # tracking issue
    notes: str = ""

    def __post_init__(self):
        assert self.exactness in ("bit-exact", "<=1e-6", "approximate"), self.exactness
        assert self.status in (NEEDED, NOT_NEEDED), self.status
        assert self.swap is not None or self.function is not None, f"{self.id}: no swap and no function"

    @property
    def needed(self) -> bool:
        return self.status == NEEDED

    def tolerance(self, reference_scale: float = 1.0) -> float:
        """Max-abs after-vs-before tolerance in fp32 torch for this exactness class.

        "<=1e-6" and "approximate" are relative to max(1, max|reference|): a mean of values near 100
        is held to 1e-4 absolute, a unit-scale output to 1e-6.
        """
        rel = {"bit-exact": 0.0, "<=1e-6": 1e-6, "approximate": 1e-4}[self.exactness]
        if self.max_rel_error is not None:
            rel = min(rel, self.max_rel_error)
        return rel * max(1.0, reference_scale)


def swap_modules(model: nn.Module, swap: ModuleSwap) -> list[str]:
    """Replace matching submodules of `model` in place; return the dotted paths that were replaced.

    The root itself is not replaced here (a module cannot replace itself); `apply_swap` handles it.
    Replacements are not searched again, so a rewrite that wraps its source cannot recurse forever.
    """
    replaced: list[str] = []

    def visit(parent: nn.Module, prefix: str) -> None:
        for name, child in list(parent.named_children()):
            path = f"{prefix}{name}"
            new = swap.build(child) if isinstance(child, swap.source) else None
            if new is not None:
                setattr(parent, name, new)
                replaced.append(path)
            else:
                visit(child, path + ".")

    visit(model, "")
    return replaced


def apply_swap(model: nn.Module, swap: ModuleSwap, *, inplace: bool = False) -> tuple[nn.Module, list[str]]:
    """Apply one swap to a copy of `model` (root included). Returns (model, replaced paths; "" = root)."""
    model = model if inplace else copy.deepcopy(model)
    if isinstance(model, swap.source):
        new = swap.build(model)
        if new is not None:
            return new, [""]
    if swap.root_only:
        return model, []
    return model, swap_modules(model, swap)


def apply_swaps(
    model: nn.Module, rewrites: Sequence[Rewrite], *, inplace: bool = False
) -> tuple[nn.Module, list[tuple[str, str]]]:
    """Apply the module swaps of `rewrites` in order. Returns (model, [(path, rewrite id), ...]).

    Rewrites without a module swap (function-only) are skipped here: the model calls them itself.
    """
    model = model if inplace else copy.deepcopy(model)
    log: list[tuple[str, str]] = []
    for rw in rewrites:
        if rw.swap is not None:
            model, paths = apply_swap(model, rw.swap, inplace=True)
            log += [(path, rw.id) for path in paths]
    return model, log


def copy_params(dst: nn.Module, src: nn.Module, names: Iterable[str]) -> nn.Module:
    """Share nothing, copy values: the rewritten module owns tensors equal to the original's."""
    with torch.no_grad():
        for n in names:
            s = getattr(src, n)
            if s is None:
                setattr(dst, n, None)
            elif isinstance(s, nn.Parameter):
                setattr(dst, n, nn.Parameter(s.detach().clone(), requires_grad=s.requires_grad))
            else:
                dst.register_buffer(n, s.detach().clone())
    return dst


class Lambda(nn.Module):
    """Wrap a function as a module so a drop-in function can be converted on its own in a demo."""

    def __init__(self, fn: Callable, name: str | None = None):
        super().__init__()
        self.fn = fn
        self.label = name or getattr(fn, "__name__", "fn")

    def forward(self, *args):
        return self.fn(*args)

    def extra_repr(self) -> str:
        return self.label


def seeded(seed: int = 0) -> torch.Generator:
    """Demos build their tensors from a fixed seed so measured numbers are reproducible."""
    return torch.Generator().manual_seed(seed)


_NP_DTYPES = {torch.float32: np.float32, torch.float16: np.float16, torch.float64: np.float64}


def const_like(a: np.ndarray, like: torch.Tensor) -> torch.Tensor:
    """A constant for use inside forward(), built in numpy so export records a constant, not ops.

    `torch.zeros(...)` plus item assignment inside forward is traced as ops (BROADCAST_TO, SELECT, ...)
    that reach the .tflite; a tensor made from numpy is lifted as a constant and folded. The dtype
    follows `like`, so the same module runs in fp32 and in fp16 emulation.
    """
    np_dtype = _NP_DTYPES.get(like.dtype)
    if np_dtype is None:  # bf16 has no numpy dtype
        return torch.from_numpy(np.ascontiguousarray(a, dtype=np.float32)).to(like.dtype)
    return torch.from_numpy(np.ascontiguousarray(a, dtype=np_dtype))
