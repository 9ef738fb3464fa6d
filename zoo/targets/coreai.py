"""Apple Core AI: torch.export → coreai-torch → (palettize) → .aimodel, run on the Linux CPU runtime.

Facts this file relies on (../shared/notes/toolchain.md §2): `to_coreai()` already optimizes (there is
no `optimize()` on 0.4.3); `save_asset` deletes its destination first, so it only ever writes into a
staging folder; on Linux an asset runs through `AIModelAsset.executable()`, and the model must stay
alive while its functions are used, or calls silently return garbage.
"""

from __future__ import annotations

import asyncio
import contextlib
import warnings
from importlib.metadata import version
from pathlib import Path

import numpy as np
import torch

from zoo.precision import Precision, cast_for_export
from zoo.targets import Entry

warnings.filterwarnings("ignore", message=".*validated with torch.*")

ARTIFACT = "model.aimodel"


def _coreai_torch():
    # Import order matters: coreai_torch must come before coreai's compiler dialects (circular import).
    import coreai_torch

    return coreai_torch


def export_entry(entry: Entry):
    coreai_torch = _coreai_torch()
    if hasattr(entry.module, "reset"):  # stateful modules: trace with deterministic (zeroed) buffers
        entry.module.reset()
    with torch.no_grad():
        ep = torch.export.export(entry.module.eval(), tuple(entry.inputs.values()),
                                 dynamic_shapes=entry.dynamic_shapes, strict=False)
    return ep.run_decompositions(coreai_torch.get_decomp_table())


def convert_programs(entries: list[Entry], exported: list):
    coreai_torch = _coreai_torch()
    converter = coreai_torch.TorchConverter()
    for entry, ep in zip(entries, exported):
        converter = converter.add_exported_program(
            exported_program=ep,
            input_names=list(entry.inputs),
            output_names=list(entry.output_names),
            state_names=list(entry.state_names),
            entrypoint_name=entry.name,
        )
    return converter.to_coreai()


def palettize_int8(program, group_size: int = 32):
    """8-bit k-means palettization, one look-up table per group of 32 output channels.

    Weights whose leading axis is not a multiple of the group size are left in fp32 by coreai-opt
    (it says so on stdout); the summary's storage types show what was compressed.
    """
    _coreai_torch()
    from coreai_opt.coreai_utils import CompressionGranularity, palettize_weights

    return palettize_weights(
        program,
        None,
        n_bits=8,
        granularity=CompressionGranularity.PER_GROUPED_CHANNEL,
        group_size=group_size,
        num_kmeans_workers=1,
    )


class CoreAITarget:
    name = "coreai"
    artifact = ARTIFACT
    precisions = ("fp32", "fp16", "bf16", "int8")
    precision_notes: dict[str, str] = {}

    def prepare(self, module, precision: Precision, options: dict | None = None):
        """fp16/bf16 compute in that dtype on Core AI (the CPU runtime does not upcast).

        `options.fp32_linear_accumulation`: keep Linear weights in the reduced dtype but multiply in fp32
        (see zoo.precision.Fp32AccumulateLinear for the measurement behind it).
        """
        options = options or {}
        return cast_for_export(module, precision.dtype, bool(options.get("fp32_linear_accumulation", False)))

    def export(self, entries: list[Entry]):
        return [export_entry(e) for e in entries]

    def convert(self, entries: list[Entry], exported, scratch: Path):
        return convert_programs(entries, exported)

    def compress(self, program, precision: Precision, scratch: Path, int8_group_size: int = 32):
        """Returns (program, note); note None means the stage had nothing to do."""
        if precision.name == "int8":
            return palettize_int8(program, int8_group_size), f"8-bit palettization, per grouped channel, group {int8_group_size}"
        return program, None

    def save(self, program, dest: Path, metadata: dict) -> Path:
        _coreai_torch()
        import coreai.runtime as rt

        md = rt.AIModelAssetMetadata()
        md.author = metadata.get("author", "zoo")
        md.license = metadata.get("license", "")
        md.model_description = metadata.get("description", "")
        path = dest / ARTIFACT
        program.save_asset(path, md)
        return path

    def open(self, path: Path) -> "CoreAIRunner":
        return CoreAIRunner(path)

    def summary(self, path: Path) -> str:
        _coreai_torch()
        from coreai.authoring import AIModelAsset

        return str(AIModelAsset.load(path).summary())

    @staticmethod
    def versions() -> dict[str, str]:
        return {p: version(p) for p in ("coreai-core", "coreai-torch", "coreai-opt", "torch")}


class CoreAIRunner:
    """Keeps one `AIModel` alive (an open `executable()` context) for as long as the runner lives."""

    def __init__(self, path: Path):
        _coreai_torch()
        import coreai.runtime as rt
        from coreai.authoring import AIModelAsset

        self._rt = rt
        self._loop = asyncio.new_event_loop()
        self._stack = contextlib.AsyncExitStack()
        asset = AIModelAsset.load(Path(path))
        self._model = self._loop.run_until_complete(self._stack.enter_async_context(asset.executable()))
        self.function_names = list(self._model.function_names)
        self._functions = {name: self._model.load_function(name) for name in self.function_names}

    def state_specs(self, function: str) -> dict[str, tuple[tuple[int, ...], np.dtype]]:
        """Shape and dtype of each state a function declares, read from the bundle itself."""
        desc = self._functions[function].desc
        return {n: (tuple(desc.state_descriptor(n).shape), np.dtype(desc.state_descriptor(n).dtype))
                for n in desc.state_names}

    def new_state(self, array: np.ndarray):
        """A state buffer (e.g. a KV cache) the runtime updates in place across calls."""
        return self._rt.NDArray(np.ascontiguousarray(array))

    def run(self, function: str, inputs: dict[str, np.ndarray], states: dict | None = None) -> dict[str, np.ndarray]:
        feeds = {k: self._rt.NDArray(np.ascontiguousarray(v)) for k, v in inputs.items()}
        call = self._functions[function](feeds, states) if states else self._functions[function](feeds)
        outputs = self._loop.run_until_complete(call)
        return {k: np.array(v.numpy()) for k, v in outputs.items()}

    def close(self):
        if self._loop.is_closed():
            return
        self._functions.clear()
        self._loop.run_until_complete(self._stack.aclose())
        self._loop.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
