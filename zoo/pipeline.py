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
import traceback
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from omegaconf import OmegaConf

from zoo import gates, weights
from zoo.content_key import bundle_key, key_parts
from zoo.bundle import (MANIFEST, REPORT, BundleWriter, ensure_free_space, ensure_writable, expected_bundle_bytes,
                        file_hashes, folder_bytes, is_disk_full, safe_out_dir, temp_prefix, write_json)
from zoo.errors import ZooError
from zoo.precision import Precision, resolve_precision
from zoo.registry import Component, ModelSpec, get_spec
from zoo.schema import BundleStatus, StageOutcome
from zoo.stages import StageLog
from zoo.targets import Entry, get_target
from zoo.targets.coreai_bundle import BundleFacts


@dataclass
class BundleResult:
    model: str
    component: str
    target: str
    precision: str
    status: BundleStatus
    path: Path | None
    gates: list = field(default_factory=list)
    stages: list = field(default_factory=list)
    error: str = ""
    bytes: int = 0
    note: str = ""        # what the status must carry, e.g. "GPU: not checked — <reason>"
    traceback: str = ""   # a bug (not a ZooError) in a stage: the full traceback, also in report.json

    @property
    def ok(self) -> bool:
        return self.status == BundleStatus.PASSED

    @property
    def status_text(self) -> str:
        """`passed (GPU: not checked — no Vulkan adapter)`: the status with everything it must say."""
        return f"{self.status} ({self.note})" if self.note else str(self.status)


@dataclass
class VerifyContext:
    """What a gate needs: the saved artifact's runner and the reference's answers on the same inputs."""

    runner: object
    session: object   # the component's session over `runner`
    target: str
    inputs: dict[str, np.ndarray]
    reference_outputs: dict[str, np.ndarray]
    thresholds: dict[str, float]
    checkpoint: weights.Checkpoint
    cfg: object
    bundle_dir: Path
    # What verify learned that later checks may reuse, never serialized (e.g. a generative component's
    # reference token streams, which the LiteRT GPU check replays on the GPU's fp16 path).
    evidence: dict = field(default_factory=dict)


def default_verify(ctx: VerifyContext) -> tuple[list, dict]:
    """The config's array thresholds on every output of one call through the component's session (metrics
    over token streams, detection sets or sampler steps belong to the components that produce those)."""
    with ctx.session as session:
        outputs = session.run(ctx.inputs)
    thresholds = {m: t for m, t in ctx.thresholds.items() if gates.METRICS[m].compares == "arrays"}
    return gates.evaluate(outputs, ctx.reference_outputs, thresholds), {"outputs": io_contract(outputs)}


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


def resolve_all_precisions(cfg, targets: list[str], requested: str, force: bool,
                           component: str | None = None) -> dict[str, Precision]:
    """Check every target's precision before any work, so a bad request costs nothing."""
    return {t: resolve_precision(requested, t, cfg, force, component) for t in targets}


def convert_model(cfg, targets: list[str], precision: str = "default", force_precision: bool = False,
                  out_dir: Path = Path("exports"), console=None, weights_spec: str | None = None,
                  components: list[str] | None = None, no_wait: bool = False) -> list[BundleResult]:
    """Every component (or the named ones) of one model through every requested target. Returns one
    result per bundle.

    `no_wait`: fail at once (ZooError) instead of waiting when another run is writing the same bundle."""
    out_dir = safe_out_dir(out_dir)  # refuses an empty out_dir or one inside a bundle, before any work
    spec = get_spec(cfg)
    selected = [spec.component(n) for n in components] if components else spec.components
    by_component = {c.name: resolve_all_precisions(cfg, targets, precision, force_precision, c.name) for c in selected}
    ensure_writable(out_dir)
    shared = StageLog(**(console.stage_log_hooks() if console else {}))
    with shared.stage("resolve_weights") as record:
        checkpoint = weights.resolve(cfg, weights_spec or cfg.weights, spec.tiny_dir, spec.random_checkpoint,
                                     embedded=spec.embedded, module_weights=spec.module_weights)
        record.note = f"source={checkpoint.source}"
    results = []
    for component in selected:
        with shared.stage(f"build:{component.name}"), weights.built_from(checkpoint, spec.name):
            module = component.build(checkpoint, cfg)
            reference = component.reference(checkpoint, cfg)
            inputs = component.example_inputs(checkpoint, cfg)
        with shared.stage(f"reference:{component.name}") as record:
            reference_outputs = run_module(reference, inputs, component.output_names)
            port_outputs = run_module(module, inputs, component.output_names)
            port_parity = {n: gates.cosine(port_outputs[n], reference_outputs[n]) for n in component.output_names}
            record.note = "port vs reference cosine " + ", ".join(f"{k}={v:.9f}" for k, v in port_parity.items())
        del reference
        precisions = by_component[component.name]
        for target in targets:
            if console:
                console.begin(spec.name, component.name, target, precisions[target].name)
            final = bundle_path(out_dir, spec, component, target, precisions[target].name)
            with BundleWriter(final, no_wait=no_wait) as writer:  # lock, recovery, cleanup on any exit
                results.append(
                    convert_bundle(spec, component, cfg, checkpoint, module, inputs, reference_outputs, port_parity,
                                   target, precisions[target], writer, shared, console,
                                   key_parts(cfg, target, precisions[target].name, weights_spec or cfg.weights,
                                             checkpoint.provenance, force_precision))
                )
    return results


def convert_bundle(spec, component, cfg, checkpoint, module, inputs, reference_outputs, port_parity,
                   target_name: str, precision: Precision, writer: BundleWriter, shared: StageLog,
                   console, content_key_parts: dict | None = None) -> BundleResult:
    target = get_target(target_name)
    log = StageLog(**(console.stage_log_hooks() if console else {}))
    report = {
        "model": spec.name, "component": component.name, "target": target_name, "precision": precision.name,
        "weights": _weights_summary(checkpoint), "port_parity_cosine": port_parity,
        "model_config": config_snapshot(cfg),  # thresholds, lengths, options: what this bundle was made with
        "created_unix": int(time.time()), "status": "running",
        "recovered": writer.recovered,  # what this run put right after an earlier killed run
    }
    if content_key_parts is not None:  # what convert-all compares to skip an unchanged bundle (zoo/content_key.py)
        report["content_key"] = {"sha256": bundle_key(content_key_parts, component.name), "parts": content_key_parts}
    result = BundleResult(spec.name, component.name, target_name, precision.name, BundleStatus.ERROR, None)
    try:
        with tempfile.TemporaryDirectory(prefix=temp_prefix("scratch")) as scratch:
            gate_results, details, note = _stages(target, component, cfg, checkpoint, module, inputs,
                                                  reference_outputs, precision, Path(scratch), writer.staging, log)
        report.update(details)
        result.gates, result.note = gate_results, note
        result.status = BundleStatus.PASSED if gates.all_passed(gate_results) else BundleStatus.GATE_FAILED
    except KeyboardInterrupt:
        writer.discard()  # the live bundle was never touched
        raise
    except Exception as exc:  # a failed stage: record it, keep the evidence, never touch the live bundle
        if is_disk_full(exc):
            raise  # no evidence to keep on a full disk: the writer removes staging and names the folder
        result.error, result.traceback = describe_failure(exc, log)
    report.update(status=str(result.status), status_note=result.note, error=result.error,
                  traceback=result.traceback, session=_session_kind(component),
                  gates=gates.as_dicts(result.gates), stages=shared.as_dicts() + log.as_dicts())
    result.stages = report["stages"]
    write_json(writer.staging / REPORT, report)
    write_json(writer.staging / MANIFEST, _manifest(report, checkpoint, target, inputs, writer.staging))
    result.bytes = folder_bytes(writer.staging)
    result.path = writer.commit() if result.ok else writer.reject()
    return result


def describe_failure(exc: BaseException, log: StageLog) -> tuple[str, str]:
    """(one-paragraph error, traceback). A ZooError is bad input or a known limit: its message and fix,
    no traceback. Anything else is a bug: the first line here, the whole traceback kept for report.json
    (and printed with ZOO_DEBUG=1)."""
    failed = next((r for r in log.records if r.outcome == StageOutcome.FAILED), None)
    stage = failed.name if failed else "?"
    if isinstance(exc, ZooError):
        return f"stage '{stage}' failed: {exc.problem} Fix: {exc.fix}", ""
    first_line = str(exc).splitlines()[0] if str(exc) else ""
    error = (f"stage '{stage}' failed: {type(exc).__name__}: {first_line} (a bug: the full traceback is in "
             f"the bundle's report.json; ZOO_DEBUG=1 prints it)")
    return error, "".join(traceback.format_exception(exc))


def _session_kind(component: Component) -> str:
    return "generative" if component.generative else "one_shot"


def _doctor_note(target_name: str, cfg, entries) -> str:
    """Lint the graphs about to be exported (zoo.doctor): the findings go into the report, conversion goes on
    (a fatal trap fails in `convert` anyway; the note then says which rule and which line)."""
    from zoo import doctor

    targets = get_target(target_name).doctor_targets(cfg)
    findings = doctor.merge_targets([f for t in targets for f in doctor.diagnose_entries(entries, t)])
    return doctor.pipeline_note(findings) if findings else "no findings"


def _stages(target, component, cfg, checkpoint, module, inputs, reference_outputs, precision, scratch, staging, log):
    prepared = target.prepare(module, precision, cfg.get(target.name))
    entries = (component.entries(prepared, inputs, target.name, cfg) if component.entries
               else [Entry("main", prepared, dict(inputs), list(component.output_names))])
    with log.stage("doctor") as record:
        record.note = _doctor_note(target.name, cfg, entries)
    if target.export_skip_reason:
        log.skip("export", target.export_skip_reason)
        exported = None
    else:
        with log.stage("export"):
            exported = target.export(entries)
    with log.stage("convert") as record:
        artifact = target.convert(entries, exported, scratch, **_convert_options(cfg))
        record.note = target.conversion_note(artifact) or record.note
    del exported
    with log.stage("optimize") as record:
        artifact, note = target.compress(artifact, precision, scratch, **_compress_options(cfg),
                                         progress=record.progress)
        record.outcome, record.note = ((StageOutcome.OK, note) if note
                                       else (StageOutcome.SKIPPED, target.compression_skipped))
    with log.stage("save"):
        ensure_free_space(staging.parent, expected_bundle_bytes(artifact, prepared))
        path = target.save(artifact, staging, {"author": "zoo", "description": f"{cfg.name} {component.name}"})
        if component.extra_files:
            component.extra_files(checkpoint, cfg, staging)
        function_names = [e.name for e in entries]
        target.describe_bundle(staging, bundle_facts(component, cfg, checkpoint, target, path, function_names,
                                                     precision))
    entry_inputs = {e.name: to_numpy(e.inputs) for e in entries}
    del artifact, prepared, entries
    gc.collect()
    with log.stage("verify") as record:
        runner = target.open(path)
        try:
            ctx = VerifyContext(runner, component.session(runner, target.name), target.name, to_numpy(inputs),
                                reference_outputs, thresholds_for(cfg, precision.name, component.name), checkpoint, cfg, staging,
                                evidence={"model": cfg.name, "component": component.name})
            verify = component.verify or default_verify
            gate_results, details = verify(ctx)
        finally:
            runner.close()
        record.note = "; ".join(g.describe() for g in gate_results)
    details.setdefault("inputs", io_contract(to_numpy(inputs)))
    details["functions"] = function_names
    checks, note = target.post_save_checks(path, entry_inputs, cfg, precision, details, log, ctx.evidence)
    return gate_results + checks, details, note


def bundle_facts(component: Component, cfg, checkpoint: weights.Checkpoint, target, artifact_path: Path,
                 function_names: list[str], precision: Precision) -> BundleFacts:
    """What a target's bundle descriptor (Core AI: metadata.json) says, from the component's declarations."""
    spec_name = str(cfg.name)
    language = component.language(checkpoint, cfg) if component.language else None
    return BundleFacts(
        name=spec_name if len(get_spec(cfg).components) == 1 else f"{spec_name}-{component.name}",
        kind=component.bundle_kind, asset=Path(artifact_path).name, functions=list(function_names),
        weights=_weights_summary(checkpoint), precision=precision.name,
        int8_group_size=_compress_options(cfg)["int8_group_size"],
        language=language, tools=target.versions())


def _convert_options(cfg) -> dict:
    litert = cfg.get("litert") or {}
    return {"lightweight_conversion": str(litert.get("lightweight_conversion", "auto")),
            "lightweight_above_gb": float(litert.get("lightweight_above_gb", 2.0))}


def _compress_options(cfg) -> dict:
    workers = cfg.get("int8_kmeans_workers")  # null: every core
    return {"int8_group_size": int(cfg.get("int8_group_size", 32)),
            "int8_kmeans_workers": int(workers) if workers else None,
            "int8_fast_kmeans": str(cfg.get("int8_fast_kmeans", "off")),
            "int8_time_budget_s": cfg.get("int8_time_budget_s"),
            "int8_kmeans_bins": int(cfg.int8_kmeans_bins) if cfg.get("int8_kmeans_bins") else None,
            "int8_recipe": str((cfg.get("litert") or {}).get("int8_recipe", "dynamic"))}


def thresholds_for(cfg, precision: str, component: str) -> dict[str, float]:
    """gates.<precision>, with component_gates.<component>.<precision> merged over it."""
    thresholds = cfg.gates.get(precision)
    if not thresholds:
        raise ZooError(f"Model '{cfg.name}' has no gate thresholds for {precision}.",
                       f"add gates.{precision} to the model's config.yaml.")
    own = ((cfg.get("component_gates") or {}).get(component) or {}).get(precision) or {}
    return {k: float(v) for k, v in {**thresholds, **own}.items()}


def _weights_summary(checkpoint: weights.Checkpoint) -> dict:
    return {k: v for k, v in checkpoint.provenance.items() if k != "files"}


def _manifest(report: dict, checkpoint: weights.Checkpoint, target, inputs, staging: Path) -> dict:
    return {
        "model": report["model"], "component": report["component"], "target": report["target"],
        "precision": report["precision"], "status": report["status"], "status_note": report.get("status_note", ""),
        "session": report.get("session", "one_shot"),
        "weights": checkpoint.provenance,
        "real_weights": checkpoint.is_real,
        "tools": {**target.versions(), "python": platform.python_version()},
        "io": {"inputs": report.get("inputs", io_contract(to_numpy(inputs))), "outputs": report.get("outputs", [])},
        "gates": report["gates"],
        **({"content_key": report["content_key"]} if "content_key" in report else {}),
        "files": file_hashes(staging),
    }


def config_snapshot(cfg) -> dict:
    return OmegaConf.to_container(cfg, resolve=True)
