"""LiteRT form of the GQA decoder: one .tflite with signatures `prefill` and `decode` that share
weights, in the LiteRT-LM runtime's contract, so the same file runs under our interpreter session and
packed into `model.litertlm` (models/gqa_llm/litertlm.py); the K/V caches travel as explicit inputs and
outputs (the GPU-clean recipe of notes/toolchain.md §3.2).

    make convert MODEL=gqa-llm TARGET=litert      # the shared pipeline exports model.litert_entries
    with LiteRTSession(bundle / "model.tflite") as session:
        stream = greedy(session.step, prompt_ids)

Signatures (caches have the same names in and out):
    prefill(tokens [1, P] int32, input_pos [P] int32, k_cache_{i}, v_cache_{i} [1, n_kv, context_len, D] fp32)
        -> logits [1, 1, V] (last real position), k_cache_{i}, v_cache_{i}
    decode (tokens [1, 1] int32, input_pos [1] int32, k_cache_*, v_cache_*) -> logits [1, 1, V], caches
P (prefill_len) is static: GPU delegates want static shapes. A shorter chunk is right-padded the way
LiteRT-LM pads it (token 0 at position 0; the graph keeps such rows out of the cache); a longer prompt is
fed in P-sized chunks. Like LiteRT-LM, the session sends the last prompt token through `decode`, so both
runtimes take the same path through the graph.
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

import numpy as np

from zoo.generation import check_fits
from zoo.rewrites.inspect import op_report  # noqa: F401  (re-exported: the LLM's graph checks)


# --------------------------------------------------------------------------------------------
# Graph inspection: the GPU-clean claims, checked on the flatbuffer itself
# --------------------------------------------------------------------------------------------
GPU_UNCLEAN_OPS = ("BROADCAST_TO", "GATHER_ND", "STABLEHLO_COMPOSITE")


def gpu_clean_findings(report: dict) -> list[str]:
    """Reasons the graph is not GPU-clean (empty list = clean by these static rules).
    `report` is `zoo.rewrites.inspect.op_report(path)`: every subgraph, read from the flatbuffer."""
    findings = [f"{op} x{report['ops'][op]}" for op in GPU_UNCLEAN_OPS if op in report["ops"]]
    if report["max_rank"] > 4:
        findings.append(f"rank-{report['max_rank']} tensor {report['max_rank_tensor']}")
    return findings


# --------------------------------------------------------------------------------------------
# Runtime
# --------------------------------------------------------------------------------------------
class LiteRTSession:
    """Host-held caches over the shared `zoo.targets.litert.LiteRTRunner`; `step` is a
    generation.StepFn. Pass a path (the session opens its own runner) or an open runner."""

    def __init__(self, path_or_runner, num_threads: int | None = None):
        self._owns_runner = isinstance(path_or_runner, (str, Path))
        self._source = path_or_runner
        self.num_threads = num_threads

    def __enter__(self) -> "LiteRTSession":
        from zoo.targets.litert import LiteRTRunner

        self.runner = LiteRTRunner(Path(self._source), self.num_threads) if self._owns_runner else self._source
        inputs = self.runner.input_details("prefill")
        self.prefill_len = int(inputs["tokens"]["shape"][1])
        self.cache_names = sorted(n for n in inputs if n.startswith(("k_cache_", "v_cache_")))
        self.cache_shape = tuple(int(x) for x in inputs[self.cache_names[0]]["shape"])
        self.context_len = self.cache_shape[2]
        self.reset()
        return self

    def __exit__(self, *exc) -> None:
        if self._owns_runner:
            self.runner.close()

    def reset(self) -> None:
        self.caches = {n: np.zeros(self.cache_shape, dtype=np.float32) for n in self.cache_names}

    def _run(self, signature: str, **inputs) -> np.ndarray:
        out = self.runner.run(signature, {**self.caches, **inputs})
        self.caches = {n: out[n] for n in self.cache_names}
        return out["logits"].reshape(-1)

    def prefill(self, token_ids: Sequence[int], start: int) -> np.ndarray:
        """Up to prefill_len tokens in one call, padded as LiteRT-LM pads (token 0 at position 0)."""
        n = len(token_ids)
        tokens = np.zeros((1, self.prefill_len), dtype=np.int32)
        positions = np.zeros(self.prefill_len, dtype=np.int32)
        tokens[0, :n] = token_ids
        positions[:n] = np.arange(start, start + n)
        return self._run("prefill", tokens=tokens, input_pos=positions)

    def decode(self, token: int, start: int) -> np.ndarray:
        return self._run("decode", tokens=np.array([[token]], np.int32), input_pos=np.array([start], np.int32))

    def step(self, token_ids: Sequence[int], start: int) -> np.ndarray:
        """generation.StepFn. The graph cannot raise, and a position past the cache has no one-hot
        column (RoPE and the write silently become zero), so the limit is enforced here. All but the
        last token go through prefill chunks, the last through decode (what LiteRT-LM does)."""
        n = len(token_ids)
        check_fits(start, n, self.context_len)
        if start == 0:
            self.reset()  # not needed for correctness (stale entries are masked), but keeps runs reproducible
        head = list(token_ids[:-1])
        for i in range(0, len(head), self.prefill_len):
            self.prefill(head[i : i + self.prefill_len], start + i)
        return self.decode(int(token_ids[-1]), start + n - 1)
