"""Google LiteRT: litert-torch → .tflite → (ai-edge-quantizer) → run on the CPU interpreter.

LiteRT has no bf16, and its CPU kernels compute in fp32 whatever the weight storage: `fp16` here means
fp16 *weights* (ai-edge-quantizer float casting) and `int8` means dynamic-range int8 weights. The GPU
delegate computes in fp16 by default regardless of storage (toolchain.md §3.1).
"""

from __future__ import annotations

import os
import shutil
from importlib.metadata import version
from pathlib import Path

import numpy as np

from zoo.bundle import ensure_free_space, expected_bundle_bytes
from zoo.precision import Precision
from zoo.targets import Entry, NamedIO

ARTIFACT = "model.tflite"


def convert_entries(entries: list[Entry], out_path: Path) -> Path:
    """All entries become signatures of one .tflite that share weights."""
    import litert_torch

    converter = None
    for entry in entries:
        named = NamedIO(entry.module, list(entry.inputs), entry.output_names).eval()
        add = litert_torch.signature if converter is None else converter.signature
        converter = add(entry.name, named, sample_kwargs=dict(entry.inputs))
    converter.convert().export(str(out_path))
    return out_path


def quantize(fp32_path: Path, precision: Precision, out_path: Path) -> tuple[Path, str]:
    from ai_edge_quantizer import qtyping, quantizer, recipe

    if precision.name == "int8":
        q = quantizer.Quantizer(str(fp32_path), recipe.dynamic_wi8_afp32())
        note = "dynamic-range int8 weights (ai-edge-quantizer dynamic_wi8_afp32), fp32 activations"
    elif precision.name == "fp16":
        q = quantizer.Quantizer(str(fp32_path))
        q.add_weight_only_config(
            regex=".*",
            operation_name=qtyping.TFLOperationName.ALL_SUPPORTED,
            num_bits=16,
            algorithm_key=recipe.AlgorithmName.FLOAT_CASTING,
        )
        note = "fp16 weights (ai-edge-quantizer float casting); CPU kernels compute in fp32"
    else:
        raise ValueError(precision.name)
    q.quantize().export_model(str(out_path))
    return out_path, note


class LiteRTTarget:
    name = "litert"
    artifact = ARTIFACT
    precisions = ("fp32", "fp16", "int8")
    precision_notes = {
        "bf16": "LiteRT has no bf16 kernels; its GPU delegate computes in fp16 or fp32.",
    }

    def prepare(self, module, precision: Precision, options: dict | None = None):
        # Always convert the fp32 module: fp16/int8 are weight-storage passes after conversion
        # (converting an fp16 torch module fails on LayerNorm dtypes, models.md).
        return module

    def export(self, entries: list[Entry]):
        return None  # litert_torch.convert runs torch.export itself; its time is under `convert`

    def convert(self, entries: list[Entry], exported, scratch: Path) -> Path:
        # The converter writes through LLVM, which aborts the whole process on a full disk: check first.
        ensure_free_space(scratch, max(expected_bundle_bytes(None, e.module) for e in entries))
        return convert_entries(entries, scratch / "fp32.tflite")

    def compress(self, fp32_path: Path, precision: Precision, scratch: Path, **_):
        if precision.name in ("fp16", "int8"):
            ensure_free_space(scratch, fp32_path.stat().st_size)  # the compressed copy is never larger
            return quantize(fp32_path, precision, scratch / f"{precision.name}.tflite")
        return fp32_path, None

    def save(self, tflite_path: Path, dest: Path, metadata: dict) -> Path:
        path = dest / ARTIFACT
        shutil.copyfile(tflite_path, path)
        return path

    def open(self, path: Path) -> "LiteRTRunner":
        return LiteRTRunner(path)

    @staticmethod
    def versions() -> dict[str, str]:
        return {p: version(p) for p in ("litert-torch", "ai-edge-litert", "ai-edge-quantizer", "jax", "torch")}


class LiteRTRunner:
    """The CPU interpreter (XNNPACK) with one signature runner per exported function."""

    def __init__(self, path: Path, num_threads: int | None = None):
        from ai_edge_litert.interpreter import Interpreter

        self._interpreter = Interpreter(model_path=str(path), num_threads=num_threads or os.cpu_count())
        self.function_names = list(self._interpreter.get_signature_list())
        self._runners = {n: self._interpreter.get_signature_runner(n) for n in self.function_names}

    def input_details(self, function: str) -> dict:
        return self._runners[function].get_input_details()

    def run(self, function: str, inputs: dict[str, np.ndarray], states: dict | None = None) -> dict[str, np.ndarray]:
        outputs = self._runners[function](**{k: np.ascontiguousarray(v) for k, v in inputs.items()})
        return {k: np.array(v) for k, v in outputs.items()}

    def close(self):
        self._runners.clear()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
