"""The stage chain for one model × target × precision, and the report it leaves in the bundle.

    resolve weights → build (+ reference) → export → convert → optimize-or-skip → save (staging)
    → verify on the saved artifact (gates) → report + manifest → commit, or set aside as failed

Nothing downstream runs after a failed stage, and nothing is ever written into a live bundle: the
bundle is built in a staging folder and swapped in only after its gates pass (zoo/bundle.py).
"""

from __future__ import annotations

import gc
import platform
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from omegaconf import OmegaConf

from zoo import gates, weights
from zoo.bundle import (MANIFEST, REPORT, BundleWriter, ensure_free_space, ensure_writable, expected_bundle_bytes,
                        file_hashes, folder_bytes, is_disk_full, safe_out_dir, temp_prefix, write_json)
from zoo.errors import ZooError
from zoo.precision import Precision, resolve_precision
from zoo.registry import Component, ModelSpec, get_spec
from zoo.stages import StageLog
from zoo.targets import Entry, get_target

COMPRESSION_SKIPPED = {
    "coreai": "no compression pass at this precision (graph optimization always runs inside to_coreai on coreai-torch 0.4.3)",
    "litert": "no post-conversion quantization at fp32",
}


@dataclass
class BundleResult:
    model: str
    component: str
    target: str
    precision: str
    status: str  # passed | gate_failed | error
    path: Path | None
    gates: list = field(default_factory=list)
    stages: list = field(default_factory=list)
    error: str = ""
    bytes: int = 0

    @property
    def ok(self) -> bool:
        return self.status == "passed"


@dataclass
class VerifyContext:
    """What a gate needs: the saved artifact's runner and the reference's answers on the same inputs."""

    runner: object
    target: str
    inputs: dict[str, np.ndarray]
    reference_outputs: dict[str, np.ndarray]
    thresholds: dict[str, float]
    checkpoint: weights.Checkpoint
    cfg: object
    bundle_dir: Path


def default_verify(ctx: VerifyContext) -> tuple[list, dict]:
    outputs = ctx.runner.run("main", ctx.inputs)
    return gates.evaluate(outputs, ctx.reference_outputs, ctx.thresholds), {"outputs": io_contract(outputs)}


def io_contract(arrays: dict[str, np.ndarray]) -> list[dict]:
    return [{"name": k, "shape": list(np.shape(v)), "dtype": str(np.asarray(v).dtype)} for k, v in arrays.items()]


def to_numpy(tensors: dict[str, torch.Tensor]) -> dict[str, np.ndarray]:
    return {k: v.detach().cpu().numpy() for k, v in tensors.items()}


@torch.no_grad()
def run_module(module, inputs: dict[str, torch.Tensor], output_names: list[str]) -> dict[str, np.ndarray]:
    outputs = module(*inputs.values())
    if not isinstance(outputs, (tuple, list)):
        outputs = (outputs,)
    return {name: out.float().numpy() for name, out in zip(output_names, outputs)}


def bundle_path(out_dir: Path, spec: ModelSpec, component: Component, target: str, precision: str) -> Path:
    folder = Path(out_dir) / spec.name
    if len(spec.components) > 1:
        folder = folder / component.name
    return folder / f"{target}-{precision}"


def resolve_all_precisions(cfg, targets: list[str], requested: str, force: bool) -> dict[str, Precision]:
    """Check every target's precision before any work, so a bad request costs nothing."""
    return {t: resolve_precision(requested, t, cfg, force) for t in targets}


def convert_model(cfg, targets: list[str], precision: str = "default", force_precision: bool = False,
                  out_dir: Path = Path("exports"), console=None, weights_spec: str | None = None,
                  no_wait: bool = False) -> list[BundleResult]:
    """Every component of one model through every requested target. Returns one result per bundle.

    `no_wait`: fail at once (ZooError) instead of waiting when another run is writing the same bundle."""
    out_dir = safe_out_dir(out_dir)  # refuses an empty out_dir or one inside a bundle, before any work
    spec = get_spec(cfg)
    precisions = resolve_all_precisions(cfg, targets, precision, force_precision)
    ensure_writable(out_dir)
    shared = StageLog(on_finish=console.stage if console else None)
    with shared.stage("resolve_weights") as record:
        checkpoint = weights.resolve(cfg, weights_spec or cfg.weights, spec.tiny_dir, spec.random_checkpoint,
                                     embedded=spec.meta.get("embedded"))
        record.note = f"source={checkpoint.source}"
    results = []
    for component in spec.components:
        with shared.stage(f"build:{component.name}"):
            module = component.build(checkpoint, cfg)
            reference = component.reference(checkpoint, cfg)
            inputs = component.example_inputs(checkpoint, cfg)
        with shared.stage(f"reference:{component.name}") as record:
            reference_outputs = run_module(reference, inputs, component.output_names)
            port_outputs = run_module(module, inputs, component.output_names)
            port_parity = {n: gates.cosine(port_outputs[n], reference_outputs[n]) for n in component.output_names}
            record.note = "port vs reference cosine " + ", ".join(f"{k}={v:.9f}" for k, v in port_parity.items())
        del reference
        for target in targets:
            if console:
                console.begin(spec.name, component.name, target, precisions[target].name)
            final = bundle_path(out_dir, spec, component, target, precisions[target].name)
            with BundleWriter(final, no_wait=no_wait) as writer:  # lock, recovery, cleanup on any exit
                results.append(
                    convert_bundle(spec, component, cfg, checkpoint, module, inputs, reference_outputs, port_parity,
                                   target, precisions[target], writer, shared, console)
                )
    return results


def convert_bundle(spec, component, cfg, checkpoint, module, inputs, reference_outputs, port_parity,
                   target_name: str, precision: Precision, writer: BundleWriter, shared: StageLog,
                   console) -> BundleResult:
    target = get_target(target_name)
    log = StageLog(on_finish=console.stage if console else None)
    report = {
        "model": spec.name, "component": component.name, "target": target_name, "precision": precision.name,
        "weights": _weights_summary(checkpoint), "port_parity_cosine": port_parity,
        "model_config": config_snapshot(cfg),  # thresholds, lengths, options: what this bundle was made with
        "created_unix": int(time.time()), "status": "running",
        "recovered": writer.recovered,  # what this run put right after an earlier killed run
    }
    result = BundleResult(spec.name, component.name, target_name, precision.name, "error", None)
    try:
        with tempfile.TemporaryDirectory(prefix=temp_prefix("scratch")) as scratch:
            gate_results, details = _stages(target, component, cfg, checkpoint, module, inputs, reference_outputs,
                                            precision, Path(scratch), writer.staging, log)
        report.update(details)
        result.gates = gate_results
        result.status = "passed" if gates.all_passed(gate_results) else "gate_failed"
    except KeyboardInterrupt:
        writer.discard()  # the live bundle was never touched
        raise
    except Exception as exc:  # a failed stage: record it, keep the evidence, never touch the live bundle
        if is_disk_full(exc):
            raise  # no evidence to keep on a full disk: the writer removes staging and names the folder
        failed = next((r for r in log.records if r.outcome == "failed"), None)
        result.error = f"stage '{failed.name if failed else '?'}' failed: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
        if isinstance(exc, ZooError):
            result.error += f" Fix: {exc.fix}"
    report.update(status=result.status, error=result.error, gates=gates.as_dicts(result.gates),
                  stages=shared.as_dicts() + log.as_dicts())
    result.stages = report["stages"]
    write_json(writer.staging / REPORT, report)
    write_json(writer.staging / MANIFEST, _manifest(report, checkpoint, target, inputs, writer.staging))
    result.bytes = folder_bytes(writer.staging)
    result.path = writer.commit() if result.ok else writer.reject()
    return result


def _stages(target, component, cfg, checkpoint, module, inputs, reference_outputs, precision, scratch, staging, log):
    prepared = target.prepare(module, precision, cfg.get(target.name))
    entries = (component.entries(prepared, inputs, target.name, cfg) if component.entries
               else [Entry("main", prepared, dict(inputs), list(component.output_names))])
    if target.name == "litert":
        log.skip("export", "litert_torch.convert runs torch.export itself; its time is counted under convert")
        exported = None
    else:
        with log.stage("export"):
            exported = target.export(entries)
    with log.stage("convert"):
        artifact = target.convert(entries, exported, scratch)
    del exported
    with log.stage("optimize") as record:
        artifact, note = target.compress(artifact, precision, scratch, **_compress_options(cfg))
        record.outcome, record.note = ("ok", note) if note else ("skipped", COMPRESSION_SKIPPED[target.name])
    with log.stage("save"):
        ensure_free_space(staging.parent, expected_bundle_bytes(artifact, prepared))
        path = target.save(artifact, staging, {"author": "zoo", "description": f"{cfg.name} {component.name}"})
    entry_inputs = {e.name: to_numpy(e.inputs) for e in entries}
    function_names = list(entry_inputs)
    del artifact, prepared, entries
    gc.collect()
    with log.stage("verify") as record:
        runner = target.open(path)
        try:
            ctx = VerifyContext(runner, target.name, to_numpy(inputs), reference_outputs, _thresholds(cfg, precision),
                                checkpoint, cfg, staging)
            verify = component.verify or default_verify
            gate_results, details = verify(ctx)
        finally:
            runner.close()
        record.note = "; ".join(g.describe() for g in gate_results)
    details.setdefault("inputs", io_contract(to_numpy(inputs)))
    details["functions"] = function_names
    if target.name == "litert":
        gate_results += _gpu_stage(path, entry_inputs, cfg, precision, details, log)
    return gate_results, details


def _gpu_stage(path: Path, entry_inputs: dict, cfg, precision: Precision, details: dict, log: StageLog) -> list:
    """LiteRT GPU delegate on software Vulkan: residency with the delegate's reasons, fp32 and fp16 error."""
    gpu_cfg = cfg.get("gpu") or {}
    if not gpu_cfg.get("check", True):
        log.skip("gpu_check", "disabled by configuration (model.gpu.check=false)")
        details["gpu"] = {"status": "not_run", "reason": "disabled by configuration (model.gpu.check=false)"}
        return []
    from zoo.targets.litert_gpu import gpu_check

    with log.stage("gpu_check") as record:
        check = gpu_check(path, entry_inputs).to_dict()
        details["gpu"] = check
        if check["status"] == "not_run":
            record.outcome = "skipped"
            record.note = f"NOT RUN: {check['reason']}"
        else:
            rejected = ", ".join(f"{o['op']} ({o['reason']})" for o in check["rejected_ops"])
            errors = [f"{mode} rel err {e[f'{mode}_rel_err']:.2g}" for outs in check["outputs"].values()
                      for e in outs.values() for mode in ("fp32", "fp16") if isinstance(e.get(f"{mode}_rel_err"), float)]
            record.note = check["status"] + (f": {rejected}" if rejected else "") + (f"; {', '.join(errors)}" if errors else "")
    tolerance = (gpu_cfg.get("fp32_rel_tol") or {}).get(precision.name, 1e-3)
    return gates.gpu_gates(check, precision.name, list(gpu_cfg.get("require_resident", [])), float(tolerance))


def _compress_options(cfg) -> dict:
    workers = cfg.get("int8_kmeans_workers")  # null: every core
    return {"int8_group_size": int(cfg.get("int8_group_size", 32)),
            "int8_kmeans_workers": int(workers) if workers else None}


def _thresholds(cfg, precision: Precision) -> dict[str, float]:
    thresholds = cfg.gates.get(precision.name)
    if not thresholds:
        raise ZooError(f"Model '{cfg.name}' has no gate thresholds for {precision.name}.",
                       f"add gates.{precision.name} to configs/model/{cfg.name}.yaml.")
    return {k: float(v) for k, v in thresholds.items()}


def _weights_summary(checkpoint: weights.Checkpoint) -> dict:
    return {k: v for k, v in checkpoint.provenance.items() if k != "files"}


def _manifest(report: dict, checkpoint: weights.Checkpoint, target, inputs, staging: Path) -> dict:
    return {
        "model": report["model"], "component": report["component"], "target": report["target"],
        "precision": report["precision"], "status": report["status"],
        "weights": checkpoint.provenance,
        "real_weights": checkpoint.is_real,
        "tools": {**target.versions(), "python": platform.python_version()},
        "io": {"inputs": report.get("inputs", io_contract(to_numpy(inputs))), "outputs": report.get("outputs", [])},
        "gates": report["gates"],
        "files": file_hashes(staging),
    }


def config_snapshot(cfg) -> dict:
    return OmegaConf.to_container(cfg, resolve=True)
