"""How a saved artifact is driven: the default one-shot session, and the interface stateful ones share.

A session wraps an open runner (zoo/targets: `CoreAIRunner`, `LiteRTRunner`). The one-shot session calls
the graph's `main` function once per input set; a component with a host-side loop (an LLM's prefill +
decode with a KV cache, a sampler's steps) declares its own session through `Component.session`, and a
generative one adds `step(token_ids, start) -> logits` (zoo/generation.py).
"""

from __future__ import annotations

import numpy as np


class OneShotSession:
    """One call of one graph function per input set."""

    kind = "one_shot"

    def __init__(self, runner, function: str = "main"):
        self.runner = runner
        self.function = function

    def run(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        return self.runner.run(self.function, inputs)

    def __enter__(self) -> "OneShotSession":
        return self

    def __exit__(self, *exc) -> None:
        pass
