"""The T5 LiteRT bundles on the GPU delegate (software Vulkan): residency, reasons, and GPU gates."""

import json

import pytest
from omegaconf import OmegaConf

from gpu_mode import gpu_ready, gpu_required
from zoo.pipeline import convert_model

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def cfg():
    ok, reason = gpu_ready()
    if not ok:
        if gpu_required():
            pytest.fail(f"GPU check required (ZOO_REQUIRE_GPU_CHECK=1) but unavailable: {reason}")
        pytest.skip(f"LiteRT GPU check unavailable: {reason} (run scripts/setup_vulkan.sh)")
    from zoo.config import compose_convert

    return compose_convert(["model=t5"]).model


@pytest.fixture(scope="module")
def litert(cfg, tmp_path_factory):
    out = tmp_path_factory.mktemp("gpu")
    return {p: convert_model(cfg, ["litert"], precision=p, out_dir=out)[0] for p in ("fp32", "fp16")}


def test_fp32_bundle_is_gpu_resident_and_exact(litert):
    result = litert["fp32"]
    assert result.ok, [g.describe() for g in result.gates]
    gpu = json.loads((result.path / "report.json").read_text())["gpu"]
    assert gpu["status"] == "accepted" and gpu["rejected_ops"] == []
    errors = gpu["outputs"]["main"]["last_hidden_state"]
    assert errors["fp32_rel_err"] < 1e-5
    # The GPU's default fp16 run stays finite: the masked-score constant fits fp16 (models/t5/model.py).
    assert isinstance(errors["fp16_rel_err"], float) and errors["fp16_rel_err"] < 1e-2
    assert {g.metric for g in result.gates} >= {"gpu_resident", "gpu_fp32_rel_err"}


def test_fp16_weights_bundle_is_gpu_resident_with_its_table_in_fp32(litert):
    """Before zoo.targets.litert kept lookup tables fp32, this bundle was rejected (EMBEDDING_LOOKUP:
    Empty quantization params) and ran on the CPU."""
    result = litert["fp16"]
    assert result.ok, [g.describe() for g in result.gates]
    gpu = json.loads((result.path / "report.json").read_text())["gpu"]
    assert gpu["status"] == "accepted" and gpu["rejected_ops"] == []
    assert gpu["outputs"]["main"]["last_hidden_state"]["fp32_rel_err"] < 1e-3
    assert any(g.metric == "gpu_resident" and g.passed for g in result.gates)


def test_negative_control_an_fp16_table_is_rejected_and_fails_residency(cfg, tmp_path, monkeypatch):
    """The same fp16 bundle with its lookup table cast as well (the old recipe): the delegate names the
    table, and the residency that models/t5/config.yaml requires for fp16 fails the bundle."""
    from zoo.targets import litert as litert_target

    original = litert_target.quantize
    monkeypatch.setattr(litert_target, "quantize", lambda *a, **k: original(*a, **k, keep_tables_fp32=False))
    result = convert_model(cfg, ["litert"], precision="fp16", out_dir=tmp_path)[0]
    assert result.path.name.endswith(".failed")
    gpu = json.loads((result.path / "report.json").read_text())["gpu"]
    assert gpu["status"] == "rejected"
    assert any(o["op"] == "EMBEDDING_LOOKUP" and "quantization" in o["reason"] for o in gpu["rejected_ops"])
    assert result.status == "gate_failed"
    assert any(g.metric == "gpu_resident" and not g.passed for g in result.gates)


def test_negative_control_fp32_tolerance_tightened_fails(cfg, tmp_path):
    strict = OmegaConf.merge(cfg, {"gpu": {"fp32_rel_tol": {"fp32": 1e-9}}})
    result = convert_model(strict, ["litert"], precision="fp32", out_dir=tmp_path)[0]
    assert result.status == "gate_failed"
    assert any(g.metric == "gpu_fp32_rel_err" and not g.passed for g in result.gates)


def test_check_that_cannot_run_never_passes(cfg, tmp_path, monkeypatch):
    monkeypatch.setenv("ZOO_VULKAN_DIR", str(tmp_path / "no-vulkan-here"))
    from zoo.targets import litert_gpu

    if hasattr(litert_gpu.gpu_available, "cache_clear"):
        litert_gpu.gpu_available.cache_clear()
    result = convert_model(cfg, ["litert"], precision="fp32", out_dir=tmp_path)[0]
    report = json.loads((result.path / "report.json").read_text())
    assert report["gpu"]["status"] == "not_run" and report["gpu"]["reason"]
    stage = next(s for s in report["stages"] if s["name"] == "gpu_check")
    assert stage["outcome"] == "skipped" and stage["note"].startswith("NOT RUN")
    assert result.status == "gate_failed"  # fp32 must be resident: "could not check" is not a pass
