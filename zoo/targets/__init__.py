"""The two deployment targets behind one small interface.

A target turns a list of `Entry`s (one per graph function: `main`, or `prefill` + `decode`) into an
artifact, optionally compresses it, saves it, and opens it again on its runtime as a `Runner`.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field

import torch
from torch import nn

from zoo.errors import ZooError


@dataclass
class Entry:
    """One function of the exported graph: its module, example inputs (by graph input name, in
    positional order), and the names its outputs get in the artifact."""

    name: str
    module: nn.Module
    inputs: dict[str, torch.Tensor]
    output_names: list[str]
    state_names: list[str] = field(default_factory=list)  # Core AI states (mutated buffers)
    dynamic_shapes: dict | None = None  # torch.export dynamic dims by input name (Core AI)


def binds_as_keywords(module: nn.Module, names: list[str]) -> bool:
    """Whether module(**{name: ...}) binds: true for `forward(tokens, input_pos, **caches)`; false for
    `forward(latents, *rest)` (the LTX 0.9.1 decoder's timestep and noise planes have no keyword), which is then
    called positionally in the entry's input order, as Core AI's export calls every module."""
    try:
        inspect.signature(module.forward).bind(**dict.fromkeys(names))
    except (TypeError, ValueError):
        return False
    return True


class NamedIO(nn.Module):
    """Call a positional module with keyword inputs and return a dict of named outputs.

    LiteRT takes signature input/output names from keyword arguments and dict keys; Core AI takes
    them from explicit name lists. This adapter lets one module serve both.
    """

    def __init__(self, module: nn.Module, input_names: list[str], output_names: list[str]):
        super().__init__()
        self.module = module
        self.input_names = list(input_names)
        self.output_names = list(output_names)
        self._takes_keywords = binds_as_keywords(module, self.input_names)

    def forward(self, **inputs):
        ordered = {n: inputs[n] for n in self.input_names}
        outputs = (self.module(**ordered) if self._takes_keywords else self.module(*ordered.values()))
        if isinstance(outputs, dict):  # already named (e.g. an LLM returning logits + caches)
            return {n: outputs[n] for n in self.output_names}
        if not isinstance(outputs, (tuple, list)):
            outputs = (outputs,)
        return dict(zip(self.output_names, outputs))


# What each target can build; the target classes use the same tuples (checked by a test).
TARGET_PRECISIONS = {"coreai": ("fp32", "fp16", "bf16", "int8"), "litert": ("fp32", "fp16", "int8")}
TARGET_NAMES = tuple(TARGET_PRECISIONS)


def get_target(name: str):
    if name == "coreai":
        from zoo.targets.coreai import CoreAITarget

        return CoreAITarget()
    if name == "litert":
        from zoo.targets.litert import LiteRTTarget

        return LiteRTTarget()
    raise ZooError(f"Unknown target '{name}'.", f"choose one of {', '.join(TARGET_NAMES)} or 'all'.")
