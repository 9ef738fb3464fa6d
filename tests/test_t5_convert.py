"""The tiny T5 through both targets in every CI precision, gated on the saved, reloaded artifact."""

import json
from pathlib import Path

import pytest
import torch

from zoo.bundle import sha256_file
from zoo.pipeline import convert_model
from zoo.registry import get_spec

MATRIX = [("coreai", "fp32"), ("coreai", "bf16"), ("coreai", "int8"),
          ("litert", "fp32"), ("litert", "fp16"), ("litert", "int8")]


def snapshot(folder: Path) -> dict[str, bytes]:
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def cfg():
    from gpu_mode import gpu_ready, gpu_required
    from zoo.config import compose_convert

    overrides = ["model=t5"]
    if not gpu_required() and not gpu_ready()[0]:
        overrides.append("model.gpu.check=false")  # said so in each report; tests/test_t5_gpu.py covers the GPU
    return compose_convert(overrides).model


@pytest.fixture(scope="module")
def bundles(cfg, tmp_path_factory):
    out = tmp_path_factory.mktemp("exports")
    return {(t, p): convert_model(cfg, [t], precision=p, out_dir=out)[0] for t, p in MATRIX}


@pytest.mark.parametrize("target,precision", MATRIX)
def test_bundle_passes_its_gates_on_the_loaded_artifact(bundles, target, precision):
    result = bundles[(target, precision)]
    assert result.status == "passed", result.error or [g.describe() for g in result.gates]
    report = json.loads((result.path / "report.json").read_text())
    assert report["status"] == "passed" and report["gates"] and all(g["passed"] for g in report["gates"])
    stages = {s["name"]: s for s in report["stages"]}
    assert {"resolve_weights", "doctor", "convert", "optimize", "save", "verify"} <= set(stages)
    assert stages["doctor"]["note"] == "no findings"  # zoo.doctor lints the graphs before conversion
    assert all(s["outcome"] in ("ok", "skipped") for s in report["stages"])
    assert all(s["seconds"] >= 0 and (s["outcome"] == "skipped" or s["peak_rss_mb"] > 0) for s in report["stages"])
    assert report["port_parity_cosine"]["last_hidden_state"] >= 0.999999


@pytest.mark.parametrize("target,precision", MATRIX)
def test_manifest_hashes_every_file_and_states_the_contract(bundles, target, precision):
    result = bundles[(target, precision)]
    manifest = json.loads((result.path / "manifest.json").read_text())
    on_disk = {p.relative_to(result.path).as_posix() for p in result.path.rglob("*") if p.is_file()} - {"manifest.json"}
    assert set(manifest["files"]) == on_disk
    for rel, entry in manifest["files"].items():
        assert entry["sha256"] == sha256_file(result.path / rel)
    assert manifest["weights"]["source"] == "tiny" and manifest["real_weights"] is False
    assert manifest["io"]["inputs"] == [
        {"name": "input_ids", "shape": [1, 128], "dtype": "int32"},
        {"name": "attention_mask", "shape": [1, 128], "dtype": "int32"},
    ]
    assert manifest["io"]["outputs"] == [{"name": "last_hidden_state", "shape": [1, 128, 64], "dtype": "float32"}]
    assert manifest["tools"]["torch"].startswith("2.13.0")


def test_compression_actually_compresses(bundles):
    from zoo.targets.coreai import CoreAITarget

    size = {k: r.bytes for k, r in bundles.items()}
    # fp16 float-casting halves the matmul weights but leaves other constants (here the [1, 4, 128, 128]
    # position bias, a third of the tiny model) and the lookup table (kept fp32 for the GPU delegate,
    # zoo/targets/litert.py; a sixth of the tiny model) in fp32: measured 0.795 of fp32.
    assert size[("litert", "fp16")] < 0.85 * size[("litert", "fp32")]
    assert size[("litert", "int8")] < 0.6 * size[("litert", "fp32")]
    assert size[("litert", "int8")] < size[("litert", "fp16")]
    assert size[("coreai", "bf16")] < 0.7 * size[("coreai", "fp32")]
    summary = CoreAITarget().summary(bundles[("coreai", "int8")].path / "model.aimodel")
    assert "UInt8" in summary and "lut_to_dense" in summary  # palettized weights and their look-up op
    assert "UInt8" not in CoreAITarget().summary(bundles[("coreai", "fp32")].path / "model.aimodel")


def test_skipped_stages_say_why(bundles):
    report = json.loads((bundles[("coreai", "fp32")].path / "report.json").read_text())
    optimize = next(s for s in report["stages"] if s["name"] == "optimize")
    assert optimize["outcome"] == "skipped" and "to_coreai" in optimize["note"]
    report = json.loads((bundles[("litert", "int8")].path / "report.json").read_text())
    optimize = next(s for s in report["stages"] if s["name"] == "optimize")
    assert optimize["outcome"] == "ok" and "int8" in optimize["note"]


@pytest.mark.parametrize("precision", ["fp16", "int8"])
def test_litert_quantizes_with_the_maintained_litert_quantizer(bundles, precision):
    """ai-edge-quantizer's successor does the fp16/int8 passes (their gates above are the regression check)."""
    result = bundles[("litert", precision)]
    optimize = next(s for s in result.stages if s["name"] == "optimize")
    assert "litert-quantizer" in optimize["note"]
    manifest = json.loads((result.path / "manifest.json").read_text())
    assert manifest["tools"]["litert-quantizer"] == "0.11.0" and "ai-edge-quantizer" not in manifest["tools"]


# --- negative controls: a broken artifact and a tightened threshold must fail, and lose nothing ---

@pytest.fixture
def broken_build(cfg, monkeypatch):
    """The re-authored module with one projection scaled: converts fine, answers wrong."""
    component = get_spec(cfg).components[0]
    original = component.build

    def build(checkpoint, cfg_):
        module = original(checkpoint, cfg_)
        with torch.no_grad():
            module.encoder.block[1].layer[1].DenseReluDense.wo.weight.mul_(3.0)
        return module

    monkeypatch.setattr(component, "build", build)


@pytest.mark.parametrize("target", ["coreai", "litert"])
def test_broken_artifact_fails_its_gate_and_leaves_the_good_bundle_untouched(cfg, tmp_path, target, request):
    good = convert_model(cfg, [target], precision="fp32", out_dir=tmp_path)[0]
    assert good.ok
    before = snapshot(good.path)
    request.getfixturevalue("broken_build")
    bad = convert_model(cfg, [target], precision="fp32", out_dir=tmp_path)[0]
    assert bad.status == "gate_failed"
    assert bad.path.name.endswith(".failed") and json.loads((bad.path / "report.json").read_text())["status"] == "gate_failed"
    assert snapshot(good.path) == before
    assert not [p for p in tmp_path.rglob(".*tmp-*")], "staging folders must not be left behind"


def test_threshold_tightened_100x_fails(cfg, tmp_path):
    from omegaconf import OmegaConf

    result = convert_model(cfg, ["coreai"], precision="bf16", out_dir=tmp_path)[0]
    assert result.ok
    cosine = result.gates[0].value
    tight = OmegaConf.merge(cfg, {"gates": {"bf16": {"cosine": 1 - (1 - float(cfg.gates.bf16.cosine)) / 100}}})
    assert 1 - cosine > (1 - float(cfg.gates.bf16.cosine)) / 100  # the real error exceeds the tight bound
    assert convert_model(tight, ["coreai"], precision="bf16", out_dir=tmp_path)[0].status == "gate_failed"


@pytest.mark.parametrize("failure", [KeyboardInterrupt, RuntimeError])
def test_interrupted_or_failed_save_keeps_the_previous_bundle(cfg, tmp_path, monkeypatch, failure):
    from zoo.targets.litert import LiteRTTarget

    good = convert_model(cfg, ["litert"], precision="fp32", out_dir=tmp_path)[0]
    before = snapshot(good.path)

    def save(*args, **kwargs):
        raise failure("interrupted mid-save")

    monkeypatch.setattr(LiteRTTarget, "save", save)
    if failure is KeyboardInterrupt:
        with pytest.raises(KeyboardInterrupt):
            convert_model(cfg, ["litert"], precision="fp32", out_dir=tmp_path)
    else:
        result = convert_model(cfg, ["litert"], precision="fp32", out_dir=tmp_path)[0]
        assert result.status == "error" and "stage 'save' failed" in result.error
    assert snapshot(good.path) == before
    assert not [p for p in tmp_path.rglob(".*tmp-*")]
