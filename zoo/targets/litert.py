"""Google LiteRT: litert-torch → .tflite → (litert-quantizer) → run on the CPU interpreter.

LiteRT has no bf16, and its CPU kernels compute in fp32 whatever the weight storage: `fp16` here means
fp16 *weights* (litert-quantizer float casting) and `int8` means dynamic-range int8 weights. The GPU
delegate computes in fp16 by default regardless of storage (toolchain.md §3.1).
"""

from __future__ import annotations

import dataclasses
import os
import shutil
from importlib.metadata import version
from pathlib import Path

import numpy as np

from zoo.bundle import ensure_free_space, expected_bundle_bytes
from zoo.errors import ZooError
from zoo.precision import Precision
from zoo.targets import TARGET_PRECISIONS, Entry, NamedIO
from zoo.targets.litert_buffers import share_identical_buffers

ARTIFACT = "model.tflite"


def convert_entries(entries: list[Entry], out_path: Path, lightweight: bool = False) -> Path:
    """All entries become signatures of one .tflite that share weights.

    `lightweight`: litert-torch's lazy-constant conversion. Measured on the 28-layer LTX-Video DiT (models.md):
    peak RSS 24 GB -> 10.4 GB, same ops and numerics; it is what lets a 2B model convert on a 24 GB machine."""
    import litert_torch

    converter = None
    for entry in entries:
        named = NamedIO(entry.module, list(entry.inputs), entry.output_names).eval()
        add = litert_torch.signature if converter is None else converter.signature
        converter = add(entry.name, named, sample_kwargs=dict(entry.inputs))
    converter.convert(lightweight_conversion=lightweight).export(str(out_path))
    return out_path


def use_lightweight_conversion(setting, weight_bytes: int, above_gb: float) -> bool:
    """`litert.lightweight_conversion`: on / off, or auto = on when the weights exceed `above_gb`."""
    setting = str(setting).lower()
    if setting in ("on", "true"):
        return True
    if setting in ("off", "false"):
        return False
    return weight_bytes > above_gb * 1e9


def quantize(fp32_path: Path, precision: Precision, out_path: Path, keep_tables_fp32: bool = True,
             int8_recipe: str = "dynamic") -> tuple[Path, str]:
    """fp16 or int8 weights from the fp32 .tflite. keep_tables_fp32=False casts lookup tables too (what fp16
    did before; the tests' negative control). int8_recipe: "dynamic" (int8 activations per call on the CPU)
    or "weight_only" (int8 weights, float compute)."""
    # litert-quantizer is the maintained successor of ai-edge-quantizer (renamed, same API; byte-identical
    # output on dynamic_wi8, fp16 casting and dynamic_wi4b32 as measured in toolchain.md §5). The old name
    # gets no fixes; it stays installed only because litert-torch 0.10.0 still depends on it.
    from litert_quantizer import qtyping, quantizer, recipe

    if precision.name == "int8" and int8_recipe == "weight_only":
        q = quantizer.Quantizer(str(fp32_path))
        # Lookup tables are int8 too: the GPU delegate cannot create a weight-only bundle whatever the tables
        # hold (a dequantized FC weight: "Shape mismatch {64,1,1,256} vs {1,1,64,256}"), so an fp32 table would
        # only cost size (real SmolLM2: 254 MB with the fp32 table, 0.47x fp32).
        q.add_weight_only_config(regex=".*", operation_name=qtyping.TFLOperationName.ALL_SUPPORTED, num_bits=8)
        note = "weight-only int8 (litert-quantizer, per channel), weights dequantized to fp32, float compute"
    elif precision.name == "int8":
        q = quantizer.Quantizer(str(fp32_path), recipe.dynamic_wi8_afp32())
        note = "dynamic-range int8 weights (litert-quantizer dynamic_wi8_afp32), activations quantized per call"
    elif precision.name == "fp16":
        q = quantizer.Quantizer(str(fp32_path))
        q.add_weight_only_config(
            regex=".*",
            operation_name=qtyping.TFLOperationName.ALL_SUPPORTED,
            num_bits=16,
            algorithm_key=recipe.AlgorithmName.FLOAT_CASTING,
        )
        # The GPU delegate refuses an fp16 lookup table (EMBEDDING_LOOKUP: "Empty quantization params", and
        # the DEQUANTIZE in front of it), which sent every fp16 T5/LLM bundle back to the CPU. Tables stay
        # fp32; everything else is fp16 (tests/test_litert_fp16.py: rejected before, accepted after).
        if keep_tables_fp32:
            _keep_lookup_tables(q)
        note = ("fp16 weights (litert-quantizer float casting), lookup tables kept fp32 for the GPU delegate; "
                "CPU kernels compute in fp32")
    else:
        raise ValueError(precision.name)
    q.quantize().export_model(str(out_path))
    return out_path, f"{note}; {share_identical_buffers(out_path)}"


def _keep_lookup_tables(q) -> None:
    """Leave EMBEDDING_LOOKUP tables fp32 in a weight-only recipe: the GPU delegate refuses a reduced
    table (fp16: "Empty quantization params")."""
    from litert_quantizer import qtyping, recipe

    q.update_quantization_recipe(regex=".*", operation_name=qtyping.TFLOperationName.EMBEDDING_LOOKUP,
                                 algorithm_key=recipe.AlgorithmName.NO_QUANTIZE)


class LiteRTTarget:
    name = "litert"
    artifact = ARTIFACT
    precisions = TARGET_PRECISIONS["litert"]
    precision_notes = {
        "bf16": "LiteRT has no bf16 kernels; its GPU delegate computes in fp16 or fp32.",
    }

    export_skip_reason = "litert_torch.convert runs torch.export itself; its time is counted under convert"
    lightweight = False   # how the last convert() ran: conversion_note reports it
    compression_skipped = "no post-conversion quantization at fp32"

    def prepare(self, module, precision: Precision, options: dict | None = None):
        # Always convert the fp32 module: fp16/int8 are weight-storage passes after conversion
        # (converting an fp16 torch module fails on LayerNorm dtypes, models.md).
        return module

    def export(self, entries: list[Entry]):
        return None  # litert_torch.convert runs torch.export itself; its time is under `convert`

    def convert(self, entries: list[Entry], exported, scratch: Path, lightweight_conversion: str = "auto",
                lightweight_above_gb: float = 2.0, **_) -> Path:
        # The converter writes through LLVM, which aborts the whole process on a full disk: check first.
        largest = max(expected_bundle_bytes(None, e.module) for e in entries)
        ensure_free_space(scratch, largest)
        self.lightweight = use_lightweight_conversion(lightweight_conversion, largest, lightweight_above_gb)  # for the note
        return convert_entries(entries, scratch / "fp32.tflite", lightweight=self.lightweight)

    def conversion_note(self, artifact) -> str | None:
        # the op list is in the GPU check's report section; what is said here is how it was converted
        return "lightweight conversion (lazy constants)" if self.lightweight else None

    def compress(self, fp32_path: Path, precision: Precision, scratch: Path, int8_recipe: str = "dynamic", **_):
        if precision.name in ("fp16", "int8"):
            ensure_free_space(scratch, fp32_path.stat().st_size)  # the compressed copy is never larger
            return quantize(fp32_path, precision, scratch / f"{precision.name}.tflite", int8_recipe=int8_recipe)
        return fp32_path, None

    def save(self, tflite_path: Path, dest: Path, metadata: dict) -> Path:
        path = dest / ARTIFACT
        shutil.copyfile(tflite_path, path)
        return path

    def open(self, path: Path) -> "LiteRTRunner":
        return LiteRTRunner(path)

    def describe_bundle(self, bundle_dir: Path, facts) -> None:
        """Nothing yet: a .tflite bundle has no ecosystem-wide bundle descriptor (LiteRT-LM packs its
        metadata inside the .litertlm file instead)."""

    def doctor_targets(self, cfg) -> list[str]:
        """Which zoo.doctor rule targets apply: the GPU delegate's rules too when its check runs."""
        gpu = (cfg.get("gpu") or {}).get("check", True)
        return ["litert", "litert-gpu"] if gpu else ["litert"]

    def post_save_checks(self, path: Path, entry_inputs: dict, cfg, precision: Precision, details: dict,
                         log, evidence: dict | None = None) -> tuple[list, str]:
        """The LiteRT GPU delegate on software Vulkan, GPU-only: residency with the delegate's reasons,
        and the GPU-vs-CPU error computing in enforced fp32 and in fp16 (what phones run by default).
        A generative component (its verify left reference token streams in `evidence`) is also judged
        on the GPU's fp16 path by its own token gate. Returns (gates, status note); the note says what
        the bundle's status must carry ("GPU: ...")."""
        from zoo import gates
        from zoo.schema import StageOutcome

        policy = gpu_policy(cfg, precision.name, (evidence or {}).get("component"))
        if not policy.check:
            # Asked for explicitly: no residency gate, but the status says so, and CI
            # (ZOO_REQUIRE_GPU_CHECK=1, policy.require_check) still fails the bundle.
            reason = "disabled by configuration (model.gpu.check=false)"
            log.skip("gpu_check", reason)
            details["gpu"] = {"status": "not_run", "reason": reason}
            unchecked = dataclasses.replace(policy, require_resident=False)
            return gates.gpu_gates(details["gpu"], precision.name, unchecked), f"GPU: not checked — {reason}"
        from zoo.targets.litert_gpu import gpu_check

        with log.stage("gpu_check") as record:
            check = gpu_check(path, entry_inputs, timeout_s=float((cfg.get("gpu") or {}).get("timeout_s", 300))).to_dict()
            details["gpu"] = check
            record.note = describe_gpu_check(check)
            if check["status"] == "not_run":
                record.outcome = StageOutcome.SKIPPED
        results = gates.gpu_gates(check, precision.name, policy)
        streams = (evidence or {}).get("reference_streams")
        if streams and check["status"] == "accepted" and not policy.fp32_only:
            with log.stage("gpu_fp16_tokens") as record:
                token_gates = gpu_fp16_token_gates(path, cfg, precision, evidence)
                record.note = "; ".join(g.describe() for g in token_gates)
            results += token_gates
        details["gpu"]["policy"] = {"require_resident": policy.require_resident, "fp32_only": policy.fp32_only,
                                    "fp32_rel_tol": policy.fp32_rel_tol, "fp16_rel_tol": policy.fp16_rel_tol}
        return results, gpu_status_note(check, policy)

    @staticmethod
    def versions() -> dict[str, str]:
        return {p: version(p) for p in ("litert-torch", "ai-edge-litert", "litert-quantizer", "jax", "torch")}


TFLITE_IDENTIFIER = b"TFL3"  # the FlatBuffer file identifier at bytes 4..8 of every .tflite


def require_tflite_file(path: Path) -> None:
    """Refuse what is not a .tflite before the interpreter sees it (it raises a bare ValueError, or maps
    a folder and fails with errno 19)."""
    if not path.exists():
        raise ZooError(f"{path} does not exist.", "pass the path of a .tflite file, e.g. exports/t5/litert-fp32/model.tflite.")
    if path.is_dir():
        inside = path / ARTIFACT
        hint = f"pass {inside}" if inside.is_file() else "pass the .tflite file itself, not a folder"
        raise ZooError(f"{path} is a folder, not a .tflite file.", f"{hint}.")
    with open(path, "rb") as f:
        header = f.read(8)
    if len(header) < 8 or header[4:8] != TFLITE_IDENTIFIER:
        raise ZooError(f"{path} is not a LiteRT/TensorFlow Lite model (no 'TFL3' FlatBuffer identifier in its "
                       f"header; {path.stat().st_size} bytes).",
                       "pass a .tflite written by `zoo convert ... target=litert` (the bundle's model.tflite).")


class LiteRTRunner:
    """The CPU interpreter (XNNPACK) with one signature runner per exported function."""

    def __init__(self, path: Path, num_threads: int | None = None, verify: bool = True):
        if verify:  # a bundle's manifest hashes first: a damaged .tflite would run and compute wrong numbers
            from zoo.integrity import verify_artifact_in_bundle

            verify_artifact_in_bundle(Path(path))
        require_tflite_file(Path(path))
        from ai_edge_litert.interpreter import Interpreter

        self.path = Path(path)  # a component's verify may look beside it (an LLM's model.litertlm)
        self._interpreter = Interpreter(model_path=str(path), num_threads=num_threads or os.cpu_count())
        self.function_names = list(self._interpreter.get_signature_list())
        self._runners = {n: self._interpreter.get_signature_runner(n) for n in self.function_names}

    def input_details(self, function: str) -> dict:
        return self._runners[function].get_input_details()

    def input_specs(self, function: str) -> dict[str, tuple[tuple[int, ...], np.dtype]]:
        """Shape and dtype of each graph input, read from the bundle (checked by zoo.sessions.check_inputs)."""
        return {n: (tuple(int(v) for v in d["shape"]), np.dtype(d["dtype"]))
                for n, d in self.input_details(function).items()}

    def run(self, function: str, inputs: dict[str, np.ndarray], states: dict | None = None) -> dict[str, np.ndarray]:
        outputs = self._runners[function](**{k: np.ascontiguousarray(v) for k, v in inputs.items()})
        return {k: np.array(v) for k, v in outputs.items()}

    def close(self):
        self._runners.clear()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def gpu_policy(cfg, precision: str, component: str | None = None):
    """The model's `gpu:` config block at one precision, as a gates.GpuPolicy; a component's entry under
    `gpu.components` replaces the keys it names."""
    from zoo.gates import GpuPolicy

    gpu = dict(cfg.get("gpu") or {})
    if component is not None:
        gpu.update((gpu.get("components") or {}).get(component) or {})
    fp16_tol = (gpu.get("fp16_rel_tol") or {}).get(precision)
    fp16_cos = (gpu.get("fp16_min_cosine") or {}).get(precision)
    return GpuPolicy(
        check=bool(gpu.get("check", True)),
        require_resident=precision in list(gpu.get("require_resident") or []),
        fp32_rel_tol=float((gpu.get("fp32_rel_tol") or {}).get(precision, 1e-3)),
        fp16_rel_tol=None if fp16_tol is None else float(fp16_tol),
        fp16_min_cosine=None if fp16_cos is None else float(fp16_cos),
        fp32_only=(gpu.get("fp32_only") or {}).get(precision),
        require_check=os.environ.get("ZOO_REQUIRE_GPU_CHECK") == "1",
    )


def describe_gpu_check(check: dict) -> str:
    if check["status"] == "not_run":
        return f"NOT RUN: {check['reason']}"
    rejected = ", ".join(f"{o['op']} ({o['reason']})" for o in check["rejected_ops"])
    errors = [f"{mode} rel err {e[f'{mode}_rel_err']:.2g}" if isinstance(e.get(f"{mode}_rel_err"), float)
              else f"{mode} rel err {e.get(f'{mode}_rel_err')}"
              for outs in check["outputs"].values() for e in outs.values() for mode in ("fp32", "fp16")
              if e.get(f"{mode}_rel_err") is not None]
    return check["status"] + (f": {rejected}" if rejected else "") + (f"; {', '.join(errors)}" if errors else "")


def gpu_status_note(check: dict, policy) -> str:
    """What a bundle's status says about the GPU, so a check that did not run is never invisible."""
    if check["status"] == "not_run":
        return f"GPU: not checked — {check.get('reason', '')}".rstrip(" —")
    if check["status"] == "rejected":
        return "GPU: rejected" + ("" if policy.require_resident else " (not required at this precision)")
    if policy.fp32_only:
        return f"GPU: fp32 only — {policy.fp32_only}"
    return "GPU: resident, fp32 + fp16 checked"


def no_stricter_than(gpu_gate: dict, own_gate: dict) -> dict[str, float]:
    """The GPU fp16 token gate, per metric never stricter than the bundle's own precision gate on the CPU: an
    int8 bundle allowed token agreement 0.5 on the CPU is not asked 0.75 on the GPU's fp16 path, which only
    adds rounding. Measured before this rule (`make bench MODEL=gqa-llm TARGET=litert`, commit "Bench: ..."
    of 2026-12-01): real SmolLM2 int8, GPU fp16 token agreement 1 / 0.625 / 0.75 with the prompt's last token
    through decode as LiteRT-LM runs it (a one-off rerun with the whole prompt in prefill: 1 / 1 / 0.75; the
    split moves a knife-edge at token 10 of prompt 1); the gate failed at 0.75, its CPU gate asks 0.5."""
    from zoo.gates import METRICS

    out = {}
    for metric, value in gpu_gate.items():
        value = float(value)
        if metric in own_gate:
            own = float(own_gate[metric])
            value = min(value, own) if METRICS[metric].higher_is_better else max(value, own)
        out[metric] = value
    return out


def gpu_fp16_token_gates(path: Path, cfg, precision: Precision, evidence: dict) -> list:
    """Greedy generation on the GPU computing in fp16, through the component's own session in a GPU
    child, judged against the same reference streams by the model's token gate for the GPU's fp16 path
    (`gpu.fp16_token_gate`; else its fp16 gate; else its precision's)."""
    from zoo import gates
    from zoo.generation import streams_from_arrays
    from zoo.targets.litert_gpu import gpu_session_run

    references = evidence["reference_streams"]
    chosen = (cfg.get("gpu") or {}).get("fp16_token_gate") or cfg.gates.get("fp16") or cfg.gates[precision.name]
    thresholds = no_stricter_than(chosen, cfg.gates.get(precision.name) or {})
    payload = {"model": evidence["model"], "component": evidence["component"], "target": "litert",
               "new_tokens": max(len(s.tokens) for s in references.values()),
               "prompts": {label: list(s.prompt_ids) for label, s in references.items()}}
    status, reason, arrays = gpu_session_run(path, "zoo.generation:greedy_driver", payload)
    candidates = streams_from_arrays(arrays, references) if status == "ran" else {}
    labelled = {f"gpu_fp16:{k}": v for k, v in candidates.items()}
    results = gates.evaluate(labelled, {f"gpu_fp16:{k}": v for k, v in references.items()}, thresholds)
    if status != "ran":
        for result in results:
            result.output += f" ({status}: {reason})"[:200]
    return results
