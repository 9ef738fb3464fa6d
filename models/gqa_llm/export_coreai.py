"""Core AI form of the GQA decoder: one .aimodel, functions `prefill` and `decode`, K/V caches as
states shared by both.

    prog = convert(lm, context_len=512)          # export x2 -> one AIProgram
    path = save(prog, Path("out/gqa-llm.aimodel"))
    with CoreAISession(path) as session:          # keeps the AIModel alive while functions run
        stream = greedy(session.step, prompt_ids)

Function signatures inside the bundle:
    prefill(input_ids [1, T] int32, 1 <= T < context_len dynamic, start [1] int32) -> logits [1, 1, V]
    decode (input_ids [1, 1] int32,                                  start [1] int32) -> logits [1, 1, V]
    states: k_cache_{i}, v_cache_{i}  [1, n_kv, context_len, head_dim] fp32, i = 0 .. layers-1
Prefill takes the exact prompt length (dynamic T), so there is no padding to get wrong and no
wasted compute; logits are the last position's only.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import time
import warnings
from pathlib import Path
from typing import Sequence

import numpy as np
import torch

from .generation import check_fits
from .model import ExportEntry, GQAForCausalLM, coreai_entries


def _coreai():
    # Import order matters: coreai_torch must come before coreai's compiler dialects.
    warnings.filterwarnings("ignore", message=".*validated with torch.*")
    import coreai_torch  # noqa: F401
    import coreai.runtime  # noqa: F401

    return coreai_torch


def max_prefill(context_len: int) -> int:
    """Longest single prefill call (see model.coreai_entries for why it is one short)."""
    return context_len - 1


def export_entry(entry: ExportEntry) -> torch.export.ExportedProgram:
    """torch.export (non-strict) + coreai-torch decompositions for one function."""
    coreai_torch = _coreai()
    entry.module.reset()  # export traces with whatever the buffers hold; keep it deterministic
    with torch.no_grad():
        ep = torch.export.export(entry.module.eval(), tuple(entry.inputs.values()),
                                 dynamic_shapes=entry.dynamic_shapes, strict=False)
    return ep.run_decompositions(coreai_torch.get_decomp_table())


def convert(lm: GQAForCausalLM, context_len: int, timings: dict | None = None):
    """-> coreai AIProgram with `prefill` and `decode` sharing the cache states.
    `timings`, if given, receives seconds per stage (export+decompose, to_coreai)."""
    coreai_torch = _coreai()
    timings = {} if timings is None else timings
    t0 = time.perf_counter()
    entries = coreai_entries(lm, context_len)
    programs = [export_entry(e) for e in entries]
    timings["export_s"] = round(time.perf_counter() - t0, 2)
    t0 = time.perf_counter()
    converter = coreai_torch.TorchConverter()
    for entry, ep in zip(entries, programs):
        converter.add_exported_program(exported_program=ep, input_names=list(entry.inputs),
                                       output_names=entry.output_names, state_names=entry.state_names,
                                       entrypoint_name=entry.name)
    program = converter.to_coreai()
    timings["to_coreai_s"] = round(time.perf_counter() - t0, 2)
    return program


def save(program, path: str | Path, metadata: dict | None = None) -> Path:
    """Atomic save: save_asset deletes its target first, so write a temporary sibling and rename
    it into place; a failure never destroys the previous bundle."""
    import coreai.runtime as rt

    path = Path(path)
    if path.suffix != ".aimodel":
        raise ValueError(f"{path}: a Core AI bundle path must end in .aimodel")
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.stem}.tmp.aimodel")
    meta = rt.AIModelAssetMetadata()
    if metadata:
        meta.model_description = metadata.get("description", "")
    program.save_asset(tmp, meta)
    old = path.with_name(f".{path.stem}.old.aimodel")
    if path.exists():
        os.replace(path, old)
    os.replace(tmp, path)
    shutil.rmtree(old, ignore_errors=True)
    return path


class CoreAISession:
    """A loaded bundle plus its cache states, driven synchronously.

    The AIModel is held open (executable() context) for the session's whole life: a function whose
    model was garbage-collected silently returns garbage. Caches are NDArrays the runtime updates in
    place; they persist between calls, and start=0 simply overwrites from position 0 (stale entries
    beyond the current position are masked out).
    """

    def __init__(self, path: str | Path):
        self.path = Path(path)

    def __enter__(self) -> "CoreAISession":
        _coreai()
        from coreai.authoring import AIModelAsset

        self._loop = asyncio.new_event_loop()
        self._stack = contextlib.AsyncExitStack()
        self.asset = AIModelAsset.load(self.path)
        self.model = self._loop.run_until_complete(self._stack.enter_async_context(self.asset.executable()))
        self.functions = {name: self.model.load_function(name) for name in ("prefill", "decode")}
        self._init_states()
        return self

    def __exit__(self, *exc) -> None:
        self.functions = {}
        self._loop.run_until_complete(self._stack.aclose())
        self._loop.close()

    def _init_states(self) -> None:
        """(Re)allocate zeroed caches."""
        import coreai.runtime as rt

        # Allocate the caches from the bundle's own state descriptors (shape, dtype), so the
        # session needs no side channel to know the exported context length.
        desc = self.functions["decode"].desc
        if not desc.state_names:
            raise RuntimeError(f"{self.path}: the decode function declares no cache states:\n{desc}")
        self.states = {}
        for name in desc.state_names:
            d = desc.state_descriptor(name)
            self.states[name] = rt.NDArray(np.zeros(tuple(d.shape), dtype=np.dtype(d.dtype)))
        self.context_len = int(desc.state_descriptor(desc.state_names[0]).shape[2])

    def call(self, function: str, input_ids: Sequence[int], start: int) -> np.ndarray:
        """Raw call: logits [V] of the last position; caches updated in place."""
        import coreai.runtime as rt

        inputs = {"input_ids": rt.NDArray(np.asarray([input_ids], dtype=np.int32)),
                  "start": rt.NDArray(np.asarray([start], dtype=np.int32))}
        out = self._loop.run_until_complete(self.functions[function](inputs, self.states))
        return out["logits"].numpy().reshape(-1)

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
