"""How a saved artifact is driven: the default one-shot session, and the interface stateful ones share.

A session wraps an open runner (zoo/targets: `CoreAIRunner`, `LiteRTRunner`). The one-shot session calls
the graph's `main` function once per input set; a component with a host-side loop (an LLM's prefill +
decode with a KV cache, a sampler's steps) declares its own session through `Component.session`, and a
generative one adds `step(token_ids, start) -> logits` (zoo/generation.py).
"""

from __future__ import annotations

import numpy as np

from zoo.errors import ZooError


def check_inputs(runner, function: str, inputs: dict[str, np.ndarray]) -> None:
    """Refuse inputs the saved graph cannot take — a missing or unknown name, a wrong shape or dtype — with the
    bundle's own contract in the message, instead of a runtime error (or silent garbage) from deep inside it.
    Runners without `input_specs` are not checked."""
    specs = runner.input_specs(function) if hasattr(runner, "input_specs") else None
    if not specs:
        return
    contract = ", ".join(f"{n} {list(shape)} {dtype}" for n, (shape, dtype) in specs.items())
    fix = f"feed exactly the bundle's inputs ({contract}); its manifest.json lists them under io.inputs."
    if set(inputs) != set(specs):
        raise ZooError(f"Inputs {sorted(inputs)} do not match the bundle's inputs {sorted(specs)}.", fix)
    for name, (shape, dtype) in specs.items():
        got = np.asarray(inputs[name])
        same_rank = got.ndim == len(shape)
        if not same_rank or any(e not in (None, -1) and e != g for e, g in zip(shape, got.shape)):
            raise ZooError(f"Input '{name}' has shape {list(got.shape)}; the bundle expects {list(shape)}.", fix)
        if got.dtype != dtype:
            raise ZooError(f"Input '{name}' is {got.dtype}; the bundle expects {dtype}.", fix)


class OneShotSession:
    """One call of one graph function per input set."""

    kind = "one_shot"

    def __init__(self, runner, function: str = "main"):
        self.runner = runner
        self.function = function

    def run(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        check_inputs(self.runner, self.function, inputs)
        return self.runner.run(self.function, inputs)

    def __enter__(self) -> "OneShotSession":
        return self

    def __exit__(self, *exc) -> None:
        pass
