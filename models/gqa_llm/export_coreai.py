"""Core AI form of the GQA decoder: one .aimodel, functions `prefill` and `decode`, K/V caches as
states shared by both.

    make convert MODEL=gqa-llm TARGET=coreai      # the shared pipeline exports model.coreai_entries
    with CoreAISession(bundle / "model.aimodel") as session:  # keeps the AIModel alive while functions run
        stream = greedy(session.step, prompt_ids)

Function signatures inside the bundle:
    prefill(input_ids [1, T] int32, 1 <= T < context_len dynamic, start [1] int32) -> logits [1, 1, V]
    decode (input_ids [1, 1] int32,                                  start [1] int32) -> logits [1, 1, V]
    states: k_cache_{i}, v_cache_{i}  [1, n_kv, context_len, head_dim] fp32, i = 0 .. layers-1
Prefill takes the exact prompt length (dynamic T), so there is no padding to get wrong and no
wasted compute; logits are the last position's only.
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

import numpy as np

from zoo.generation import check_fits


def max_prefill(context_len: int) -> int:
    """Longest single prefill call (see model.coreai_entries for why it is one short)."""
    return context_len - 1


class CoreAISession:
    """A loaded bundle plus its cache states, driven synchronously (a `generation.StepFn`).

    Runs on the shared `zoo.targets.coreai.CoreAIRunner`, which keeps the AIModel alive for the
    session's whole life. Pass a path (the session opens and closes its own runner) or an open runner
    (the caller owns it). Caches are NDArrays the runtime updates in place; they persist between calls,
    and start=0 simply overwrites from position 0 (stale entries beyond the current position are masked).
    """

    def __init__(self, path_or_runner):
        self._owns_runner = isinstance(path_or_runner, (str, Path))
        self._source = path_or_runner

    def __enter__(self) -> "CoreAISession":
        from zoo.targets.coreai import CoreAIRunner

        self.runner = CoreAIRunner(Path(self._source)) if self._owns_runner else self._source
        self._init_states()
        return self

    def __exit__(self, *exc) -> None:
        self.states = {}  # cache NDArrays must die before the runtime that made them (see CoreAIRunner.close)
        if self._owns_runner:
            self.runner.close()

    def _init_states(self) -> None:
        """(Re)allocate zeroed caches, sized from the bundle's own state descriptors (so the session
        needs no side channel to know the exported context length)."""
        specs = self.runner.state_specs("decode")
        if not specs:
            raise RuntimeError("the bundle's decode function declares no cache states")
        self.states = {n: self.runner.new_state(np.zeros(shape, dtype)) for n, (shape, dtype) in specs.items()}
        self.context_len = int(next(iter(specs.values()))[0][2])

    def call(self, function: str, input_ids: Sequence[int], start: int) -> np.ndarray:
        """Raw call: logits [V] of the last position; caches updated in place."""
        inputs = {"input_ids": np.asarray([input_ids], dtype=np.int32), "start": np.asarray([start], dtype=np.int32)}
        return self.runner.run(function, inputs, self.states)["logits"].reshape(-1)

    def step(self, token_ids: Sequence[int], start: int) -> np.ndarray:
        """generation.StepFn: prefill for several tokens, decode for one. Refuses anything past the
        exported context (the compiled graph would silently mis-index instead)."""
        n = len(token_ids)
        check_fits(start, n, self.context_len)
        if start == 0:
            self._init_states()  # not needed for correctness (stale entries are masked); reproducible runs
        limit = max_prefill(self.context_len)
        for i in range(0, n, limit):  # more than one chunk only for a full-context prompt
            chunk = list(token_ids[i : i + limit])
            logits = self.call("decode" if len(chunk) == 1 else "prefill", chunk, start + i)
        return logits
