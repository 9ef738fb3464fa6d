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
import warnings
from pathlib import Path
from typing import Sequence

import numpy as np
import torch

from .generation import check_fits
from .model import CoreAIStatefulLM, GQAForCausalLM, with_pretransposed_weights

INPUT_NAMES = ["input_ids", "start"]
OUTPUT_NAMES = ["logits"]


def _coreai():
    # Import order matters: coreai_torch must come before coreai's compiler dialects.
    warnings.filterwarnings("ignore", message=".*validated with torch.*")
    import coreai_torch  # noqa: F401
    import coreai.runtime  # noqa: F401

    return coreai_torch


def example_inputs(t: int) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.zeros(1, t, dtype=torch.int32), torch.zeros(1, dtype=torch.int32)


def max_prefill(context_len: int) -> int:
    """Longest single prefill call. T == context_len makes the cache slice write contiguous,
    torch.export guards on it and refuses the dynamic dim, so the range stops one short; the
    session splits a full-context prompt into prefill(context_len - 1) + decode(1)."""
    return context_len - 1


def export_functions(stateful: CoreAIStatefulLM) -> dict[str, torch.export.ExportedProgram]:
    """torch.export the stateful module twice: dynamic-T prefill and T=1 decode, decomposed for
    coreai-torch. Both programs mutate the same named buffers, which become shared states."""
    coreai_torch = _coreai()
    seq = torch.export.Dim("T", min=1, max=max_prefill(stateful.context_len))
    specs = {
        "prefill": (example_inputs(min(8, stateful.context_len)), {"input_ids": {1: seq}, "start": None}),
        "decode": (example_inputs(1), None),
    }
    programs = {}
    for name, (args, dynamic) in specs.items():
        stateful.reset()
        with torch.no_grad():
            ep = torch.export.export(stateful.eval(), args, dynamic_shapes=dynamic, strict=False)
        programs[name] = ep.run_decompositions(coreai_torch.get_decomp_table())
    stateful.reset()
    return programs


def convert(lm: GQAForCausalLM, context_len: int):
    """-> coreai AIProgram with `prefill` and `decode` sharing the cache states."""
    coreai_torch = _coreai()
    # W^T weights: the runtime would otherwise transpose every weight on every call.
    stateful = CoreAIStatefulLM(with_pretransposed_weights(lm), context_len).eval()
    programs = export_functions(stateful)
    converter = coreai_torch.TorchConverter()
    for name, ep in programs.items():
        converter.add_exported_program(exported_program=ep, input_names=INPUT_NAMES, output_names=OUTPUT_NAMES,
                                       state_names=stateful.state_names(), entrypoint_name=name)
    return converter.to_coreai()


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
