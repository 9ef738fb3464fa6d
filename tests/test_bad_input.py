"""Bad input gets one clear paragraph naming the problem and the fix, a non-zero exit, and loses nothing."""

import json
import shutil
from pathlib import Path

import pytest

from models import t5
from zoo.errors import ZooError
from zoo.pipeline import convert_model
from zoo.weights import resolve


@pytest.fixture(scope="module")
def cfg():
    from zoo.config import compose_convert

    return compose_convert(["model=t5"]).model


def test_cli_converts_tiny_t5_on_both_targets(run_cli, tmp_path):
    from gpu_mode import gpu_ready, gpu_required

    gpu = [] if gpu_required() or gpu_ready()[0] else ["model.gpu.check=false"]
    proc = run_cli("zoo.convert", "model=t5", "target=all", "weights=tiny", f"out_dir={tmp_path}", *gpu)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for bundle in ("coreai-bf16", "litert-fp32"):
        report = json.loads((tmp_path / "t5" / bundle / "report.json").read_text())
        assert report["status"] == "passed" and all(g["passed"] for g in report["gates"])
    assert "zoo: bundles and gates" in proc.stdout


@pytest.mark.parametrize("args,needle", [
    (["model=nope"], "Unknown model 'nope'. Valid models: gqa-llm, ltx-video, rf-detr, t5, triposplat"),
    (["model=t5", "target=nope"], "Unknown target 'nope'. Valid: all, coreai, litert"),
    (["model=t5", "precision=fp8"], "Unknown precision 'fp8'. Valid: bf16, default, fp16, fp32, int8"),
    (["model=t5", "target=litert", "precision=bf16"], "Target 'litert' cannot honour precision 'bf16'"),
    (["model=t5", "target=coreai", "precision=fp16"], "refuses fp16 on coreai"),
    (["model=t5", "weights=nope"], "Unknown weights source 'nope'"),
])
def test_bad_choices_exit_non_zero_with_the_fix(run_cli, tmp_path, args, needle):
    proc = run_cli("zoo.convert", *args, f"out_dir={tmp_path}")
    assert proc.returncode == 2, proc.stdout + proc.stderr
    out = " ".join((proc.stdout + proc.stderr).split())
    assert needle in out and "Fix:" in out
    assert "Traceback" not in out
    assert not list(tmp_path.rglob("*.aimodel")) and not list(tmp_path.rglob("*.tflite"))


def test_hub_unreachable_says_how_to_run_offline(cfg, tmp_path):
    with pytest.raises(ZooError) as err:
        convert_model(cfg, ["litert"], out_dir=tmp_path, weights_spec="hub")
    assert "Hub is unreachable" in err.value.problem and "WEIGHTS=tiny" in err.value.fix


def test_hub_requires_a_pinned_revision(cfg):
    from omegaconf import OmegaConf

    unpinned = OmegaConf.merge(cfg, {"variant": "xxl"})
    with pytest.raises(ZooError, match="pinned revision"):
        resolve(unpinned, "hub", t5.TINY_DIR, t5.random_checkpoint)


@pytest.fixture
def tiny_copy(tmp_path):
    folder = tmp_path / "ckpt"
    shutil.copytree(t5.TINY_DIR, folder)
    return folder


def test_truncated_checkpoint_is_named(cfg, tiny_copy):
    weights = tiny_copy / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    with pytest.raises(ZooError, match="corrupt or truncated") as err:
        resolve(cfg, f"local:{tiny_copy}", t5.TINY_DIR, t5.random_checkpoint)
    assert str(weights) in err.value.problem


def test_garbage_checkpoint_is_named(cfg, tiny_copy):
    (tiny_copy / "model.safetensors").write_bytes(b"\x00" * 64)
    with pytest.raises(ZooError, match="corrupt or truncated"):
        resolve(cfg, f"local:{tiny_copy}", t5.TINY_DIR, t5.random_checkpoint)


def test_checkpoint_with_wrong_keys_is_refused_by_the_cli(run_cli, tiny_copy, tmp_path):
    from safetensors.torch import load_file, save_file

    tensors = load_file(tiny_copy / "model.safetensors")
    tensors["encoder.final_norm.weight"] = tensors.pop("encoder.final_layer_norm.weight")
    save_file(tensors, tiny_copy / "model.safetensors")
    proc = run_cli("zoo.convert", "model=t5", "target=litert", f"weights=local:{tiny_copy}", f"out_dir={tmp_path}/out")
    assert proc.returncode == 2
    assert "keys do not match" in " ".join(proc.stdout.split())


def test_missing_local_folder_is_named(cfg, tmp_path):
    with pytest.raises(ZooError, match="not a checkpoint folder"):
        resolve(cfg, f"local:{tmp_path / 'nowhere'}", t5.TINY_DIR, t5.random_checkpoint)


def test_unwritable_output_folder_fails_before_any_work(cfg, tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    with pytest.raises(ZooError, match="not writable"):
        convert_model(cfg, ["litert"], out_dir=blocker / "exports")


def test_forced_fp16_is_allowed_and_recorded(cfg, tmp_path):
    """The refusal is a guard, not a wall: precision.force=true converts (and the gate still judges)."""
    result = convert_model(cfg, ["coreai"], precision="fp16", force_precision=True, out_dir=tmp_path)[0]
    assert result.precision == "fp16" and result.status in ("passed", "gate_failed")


def test_a_hub_cache_snapshot_loads_through_the_real_hub_path(cfg, tmp_path, monkeypatch):
    """The pinned-revision code path, offline: a snapshot laid out exactly as huggingface_hub caches it."""
    from omegaconf import OmegaConf

    revision = "0123456789abcdef0123456789abcdef01234567"
    repo = tmp_path / "hub" / "models--zoo-test--tiny-t5"
    snapshot = repo / "snapshots" / revision
    shutil.copytree(t5.TINY_DIR, snapshot)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(revision)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_CACHE", str(tmp_path / "hub"))
    pinned = OmegaConf.merge(cfg, {"variants": {"base": {"hub": {"repo_id": "zoo-test/tiny-t5", "revision": revision}}}})
    checkpoint = resolve(pinned, "hub", t5.TINY_DIR, t5.random_checkpoint)
    assert checkpoint.provenance["revision"] == revision and checkpoint.is_real
    # corrupt cache: named, and the repair attempt (offline here) fails with the fix
    (snapshot / "model.safetensors").write_bytes(b"junk")
    with pytest.raises(ZooError, match="corrupt, and re-downloading it failed"):
        resolve(pinned, "hub", t5.TINY_DIR, t5.random_checkpoint)
