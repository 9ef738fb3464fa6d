"""One stored copy of each weight in a multi-signature .tflite after quantization.

litert-torch's converter stores a weight once however many signatures use it, but litert-quantizer rewrites
each subgraph's tensors into buffers of their own: the LLM's tied embedding, split into an fp32 lookup copy and an
fp16 head copy, was split again per signature. The real SmolLM2 LiteRT fp16 bundle (`python -m zoo.convert
model=gqa-llm target=litert precision=fp16`, 2026-12-01; .tflite + .litertlm) measured 1,060.78 MiB without this
pass, no smaller than fp32, and 736.84 MiB with it.
This pass points every tensor whose buffer holds the same bytes, dtype and shape as an earlier one at that
earlier buffer and empties the copy (buffer indices stay valid; an empty buffer costs a few bytes).
"""

from __future__ import annotations

import hashlib
import os
from collections import defaultdict
from pathlib import Path

import numpy as np

# flatbuffers cannot address more than 2 GiB; litert-quantizer writes larger models with buffers appended after
# the flatbuffer (offset/size), which this pass does not rewrite.
FLATBUFFER_LIMIT = 2**31 - 2**20
MIN_SHARED_BYTES = 1024   # small constants are not worth hashing


def share_identical_buffers(path: Path) -> str:
    """Rewrite `path` in place (atomically) with duplicate weight buffers shared. Returns the note for the
    compression stage: what was shared, or why the pass did not run."""
    from ai_edge_litert.tools import flatbuffer_utils
    from litert_quantizer.utils import tfl_flatbuffer_utils

    if path.stat().st_size > FLATBUFFER_LIMIT:
        return "duplicate buffers not shared (not run: model over the 2 GiB flatbuffer limit)"
    model = tfl_flatbuffer_utils.read_model(str(path))
    if any(getattr(b, "offset", 0) for b in model.buffers):
        return "duplicate buffers not shared (not run: the model stores buffers outside the flatbuffer)"
    duplicates = duplicate_buffers(model)
    if not duplicates:
        return "no duplicate buffers"
    for subgraph in model.subgraphs:
        for tensor in subgraph.tensors:
            tensor.buffer = duplicates.get(tensor.buffer, tensor.buffer)
    freed = 0
    for copy in duplicates:
        freed += len(model.buffers[copy].data)
        model.buffers[copy].data = None
    for buffer in model.buffers:
        # read_model hands out memoryviews, which flatbuffers packs one byte per Python call, and numpy arrays in
        # one copy: the real SmolLM2 fp16 row's convert s went 215 -> 60.2 (`make bench MODEL=gqa-llm
        # TARGET=litert` before this line, `... PRECISION=fp16` after; fp32's, which skips the pass, is 44.3)
        if buffer.data is not None and not isinstance(buffer.data, np.ndarray):
            buffer.data = np.frombuffer(buffer.data, dtype=np.uint8)
    data = flatbuffer_utils.convert_object_to_bytearray(model)
    scratch = path.with_name(path.name + ".sharing")
    scratch.write_bytes(data)
    os.replace(scratch, path)
    return f"{len(duplicates)} duplicate weight buffers shared across signatures ({freed / 2**20:.1f} MiB saved)"


def duplicate_buffers(model) -> dict[int, int]:
    """{copy buffer index: first buffer index with the same bytes}, only where every tensor on both buffers
    reads them as the same dtype and shape (identical bytes under another type are not the same weight)."""
    readings: dict[int, set] = defaultdict(set)
    for subgraph in model.subgraphs:
        for tensor in subgraph.tensors:
            readings[tensor.buffer].add((tensor.type, tuple(tensor.shape if tensor.shape is not None else ())))
    first_by_content: dict[tuple, int] = {}
    duplicates: dict[int, int] = {}
    for index, buffer in enumerate(model.buffers):
        data = buffer.data
        if data is None or len(data) < MIN_SHARED_BYTES or len(readings[index]) != 1:
            continue
        key = (hashlib.sha256(memoryview(data).cast("B")).digest(), len(data), next(iter(readings[index])))
        if key in first_by_content:
            duplicates[index] = first_by_content[key]
        else:
            first_by_content[key] = index
    return duplicates
