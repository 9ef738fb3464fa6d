"""Hub I/O against the loopback Hub (tests/hub_server.py): the real huggingface_hub client, a local server.

publish → download back through zoo.hub.download (the weights=hub path) → hashes and gates again;
an upload killed midway and resumed; every broken cache state detected and repaired; the messages for
offline / gated / missing repo / missing revision; a sentinel token that must never be printed or written.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).parent))
from hub_server import LoopbackHub  # noqa: E402

from zoo import hub as zoo_hub  # noqa: E402
from zoo.errors import ZooError  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
SENTINEL = "hf_SENTINELtokenNEVERprintMEzoo0123456789"
TINY_T5 = ROOT / "models" / "t5" / "tiny"


# ---------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def exports(tmp_path_factory) -> Path:
    """Tiny T5 bundles for both targets (GPU check off: fast, and its 'GPU: not checked' must reach the card)."""
    from zoo.config import compose_convert
    from zoo.pipeline import convert_model

    out = tmp_path_factory.mktemp("exports")
    saved = os.environ.pop("ZOO_REQUIRE_GPU_CHECK", None)  # CI's strict mode would fail an unchecked bundle
    try:
        cfg = compose_convert(["model=t5", "weights=tiny", "model.gpu.check=false"])
        results = convert_model(cfg.model, ["coreai", "litert"], out_dir=out, weights_spec="tiny")
    finally:
        if saved is not None:
            os.environ["ZOO_REQUIRE_GPU_CHECK"] = saved
    assert all(r.ok for r in results), [r.error for r in results]
    return out


@pytest.fixture
def loopback(monkeypatch, tmp_path):
    """A loopback Hub, with the real client pointed at it in this process and in child processes."""
    from huggingface_hub import constants

    with LoopbackHub(token=SENTINEL, lifetime_s=120) as hub:
        cache = tmp_path / "hf-cache"
        env = {"HF_ENDPOINT": hub.url, "HF_TOKEN": SENTINEL, "HF_HUB_CACHE": str(cache), "HF_HUB_DISABLE_XET": "1",
               "HF_HUB_DISABLE_PROGRESS_BARS": "1", "HF_HUB_OFFLINE": "0"}
        for key, value in env.items():
            monkeypatch.setenv(key, value)
        # huggingface_hub reads these at import: patch the module constants for this process
        monkeypatch.setattr(constants, "ENDPOINT", hub.url)
        monkeypatch.setattr(constants, "HUGGINGFACE_CO_URL_TEMPLATE", hub.url + "/{repo_id}/resolve/{revision}/{filename}")
        monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
        monkeypatch.setattr(constants, "HF_HUB_DISABLE_XET", True)
        monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
        monkeypatch.setattr(zoo_hub, "RETRY_BACKOFF_S", 0.01)
        hub.cache = cache
        hub.env = env
        yield hub


def publish(*args: str) -> int:
    from zoo.publish import main

    return main(list(args))


def cli(module: str, *args: str, env: dict | None = None, timeout: int = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", module, *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, **(env or {})})


def seed_tiny_checkpoint(hub: LoopbackHub, repo_id: str = "zoo-test/t5-tiny") -> str:
    files = {p.name: p.read_bytes() for p in TINY_T5.iterdir() if p.is_file()}
    return hub.seed_repo(repo_id, files)


def assert_no_sentinel(*texts: str, folders: tuple[Path, ...] = ()) -> None:
    for text in texts:
        assert SENTINEL not in text
    for folder in folders:
        for path in Path(folder).rglob("*"):
            if path.is_file():
                assert SENTINEL.encode() not in path.read_bytes(), path


# ---------------------------------------------------------------- publish: dry run, card, refusals


def test_dry_run_refuses_tiny_weights_and_force_stamps_the_banner(exports, tmp_path):
    refused = cli("zoo.publish", "t5", "--dry-run", "--exports", str(exports), env={"HF_TOKEN": SENTINEL})
    assert refused.returncode == 2, refused.stderr
    assert "target repo:" in refused.stdout and "staged files" in refused.stdout
    assert "litert-fp32/model.tflite" in refused.stdout and "coreai-bf16/model.aimodel/" in refused.stdout
    assert "----- README.md (model card) -----" in refused.stdout
    said = " ".join((refused.stdout + refused.stderr).split())  # the shared boundary prints the paragraph
    assert "tiny weights" in said and "--force" in said and "Traceback" not in said

    forced = cli("zoo.publish", "t5", "--dry-run", "--force", "--exports", str(exports), env={"HF_TOKEN": SENTINEL})
    assert forced.returncode == 0, forced.stderr
    assert "Not for use: these bundles were made from tiny weights" in forced.stdout
    assert_no_sentinel(refused.stdout, refused.stderr, forced.stdout, forced.stderr)


def test_card_parses_back_with_its_metadata_and_the_gpu_not_checked_note(exports, tmp_path):
    from huggingface_hub import ModelCard

    stage = tmp_path / "stage"
    assert publish("t5", "--stage-only", str(stage), "--force", "--repo", "org/t5-zoo", "--exports", str(exports)) == 0
    card = ModelCard.load(stage / "README.md")
    data = card.data.to_dict()
    assert data["base_model"] == "google/t5-v1_1-base" and data["base_model_relation"] == "quantized"
    assert data["library_name"] == "zoo" and data["pipeline_tag"] == "feature-extraction"
    assert data["license"] == "apache-2.0" and {"coreai", "litert"} <= set(data["tags"])
    metrics = [m["type"] for r in data["model-index"][0]["results"] for m in r["metrics"]]
    assert "cosine" in metrics
    for section in ("## Bundles", "## Graph contract", "## How to run", "## Deployment notes", "## Measured",
                    "## Provenance"):
        assert section in card.text
    assert "GPU: not checked" in card.text and "input_ids" in card.text and "org/t5-zoo" in card.text
    assert "python -m zoo.convert model=t5 target=litert precision=fp32 weights=tiny" in card.text
    assert not any(p.is_symlink() for p in stage.rglob("*"))


def test_modified_failed_and_linked_bundles_are_never_published(exports, tmp_path):
    local = tmp_path / "exports"
    shutil.copytree(exports, local)
    bundle = local / "t5" / "litert-fp32"
    shutil.copytree(bundle, local / "t5" / "litert-int8.failed")  # a failed bundle is never even looked at
    (bundle / "extra.bin").write_bytes(b"added after verification")
    with pytest.raises(ZooError, match="not in the manifest"):
        _run_publish("t5", "--dry-run", "--force", "--exports", str(local))
    (bundle / "extra.bin").unlink()
    (bundle / "model.tflite").write_bytes(b"tampered")
    with pytest.raises(ZooError, match="sha256|bytes"):
        _run_publish("t5", "--dry-run", "--force", "--exports", str(local))
    shutil.copy2(exports / "t5" / "litert-fp32" / "model.tflite", bundle / "model.tflite")
    (bundle / "escape").symlink_to("/etc/hostname")
    with pytest.raises(ZooError, match="symlink"):
        _run_publish("t5", "--dry-run", "--force", "--exports", str(local))
    (bundle / "escape").unlink()
    manifest = json.loads((bundle / "manifest.json").read_text())
    manifest["status"], manifest["gates"][0]["passed"] = "gate_failed", False
    (bundle / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(ZooError, match="failed gates"):
        _run_publish("t5", "--dry-run", "--force", "--exports", str(local))


def _run_publish(*argv: str) -> int:
    from zoo.publish import parse_args, run

    return run(parse_args(list(argv)), out=lambda *_: None)


def test_default_repos_follow_the_ecosystem_naming_one_per_target(exports, loopback, capsys):
    """No --repo: Core AI bundles go to <user>/<Model>-CoreAI (coreai-catalog's convention), LiteRT ones to
    <user>/<Model>-LiteRT; tiny weights never borrow the real model's name."""
    assert publish("t5", "--force", "--exports", str(exports)) == 0
    out = capsys.readouterr().out
    coreai, litert = loopback.head_files("loopback-user/t5-tiny-CoreAI"), loopback.head_files("loopback-user/t5-tiny-LiteRT")
    assert "coreai-bf16/model.aimodel/metadata.json" in coreai and not any(f.startswith("litert-") for f in coreai)
    assert "litert-fp32/model.tflite" in litert and not any(f.startswith("coreai-") for f in litert)
    assert out.count("published: ") == 2


def test_repo_model_name_is_the_upstream_models_own_name():
    from omegaconf import OmegaConf

    from zoo.publish import Bundle, default_repo, repo_model_name

    cfg = OmegaConf.create({"variant": "v", "variants": {"v": {"hub": {"repo_id": "HuggingFaceTB/SmolLM2-135M-Instruct"}}}})
    spec = type("Spec", (), {"name": "gqa-llm"})

    def bundle(real: bool, source: str):
        manifest = {"real_weights": real, "weights": {"source": source}, "target": "coreai"}
        return Bundle(Path("."), "coreai-fp32", manifest, {}, 0)

    assert repo_model_name(cfg, spec, [bundle(True, "embedded")]) == "SmolLM2-135M-Instruct"
    assert default_repo("SmolLM2-135M-Instruct", "coreai") == "<your Hub user>/SmolLM2-135M-Instruct-CoreAI"
    assert default_repo("SmolLM2-135M-Instruct", "litert") == "<your Hub user>/SmolLM2-135M-Instruct-LiteRT"
    assert repo_model_name(cfg, spec, [bundle(True, "embedded"), bundle(False, "tiny")]) == "gqa-llm-tiny"


# ---------------------------------------------------------------- publish → download → verify → gate


def test_publish_round_trip_then_hashes_and_gates_on_the_downloaded_bundles(exports, loopback, capsys):
    assert publish("t5", "--force", "--repo", "zoo-test/t5-zoo", "--exports", str(exports)) == 0
    out, err = capsys.readouterr()
    assert "published: " + loopback.url + "/zoo-test/t5-zoo/commit/" in out
    assert SENTINEL in loopback.auth_seen  # the token was used ...
    commit = out.strip().rsplit("/", 1)[1]
    files = loopback.head_files("zoo-test/t5-zoo")
    assert "README.md" in files and "litert-fp32/model.tflite" in files and files["litert-fp32/model.tflite"].lfs

    from zoo.publish import recheck_bundle_hashes

    folder = zoo_hub.download("zoo-test/t5-zoo", commit, ["*"])
    assert zoo_hub.check_repo_cache("zoo-test/t5-zoo", commit, ["*"]).ok
    for bundle in ("coreai-bf16", "litert-fp32"):
        assert recheck_bundle_hashes(folder / bundle, allow_links=True) == []
        assert_gate_passes_again(folder / bundle)
    assert_no_sentinel(out, err, folders=(loopback.cache, exports))  # ... and never printed or written


def assert_gate_passes_again(bundle: Path) -> None:
    """Load the downloaded artifact with its target's runner and gate it against the reference again."""
    from zoo import gates
    from zoo.pipeline import run_module, to_numpy
    from zoo.registry import get_spec, load_model_config
    from zoo.targets import get_target
    from zoo.weights import resolve

    manifest = json.loads((bundle / "manifest.json").read_text())
    cfg = load_model_config("t5")
    spec = get_spec(cfg)
    component = spec.component(manifest["component"])
    checkpoint = resolve(cfg, "tiny", spec.tiny_dir, spec.random_checkpoint)
    inputs = component.example_inputs(checkpoint, cfg)
    reference = run_module(component.reference(checkpoint, cfg), inputs, component.output_names)
    artifact = bundle / ("model.tflite" if manifest["target"] == "litert" else "model.aimodel")
    runner = get_target(manifest["target"]).open(artifact)
    try:
        outputs = runner.run("main", to_numpy(inputs))
    finally:
        runner.close()
    thresholds = {k: float(v) for k, v in cfg.gates[manifest["precision"]].items()}
    results = gates.evaluate(outputs, reference, thresholds)
    assert gates.all_passed(results), [r.describe() for r in results]


# ---------------------------------------------------------------- resumable upload


def test_interrupted_upload_resumes_and_sends_only_the_missing_files(exports, loopback, capsys):
    loopback.stall_lfs_after = 1  # one LFS object gets through; the process is killed during the others
    child = subprocess.Popen([sys.executable, "-m", "zoo.publish", "t5", "--force", "--repo", "zoo-test/resume",
                              "--exports", str(exports)], cwd=ROOT, env={**os.environ, **loopback.env},
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 90
    while not (loopback.stalled and len(loopback.lfs_uploads) == 1) and time.monotonic() < deadline:
        # (the admitted upload completes; every later one is held, so this is reached in about a second)
        assert child.poll() is None, child.communicate()
        time.sleep(0.05)
    assert loopback.stalled, "the upload never reached the held LFS transfer"
    child.send_signal(signal.SIGKILL)
    out, err = child.communicate(timeout=30)
    loopback.release()
    assert_no_sentinel(out, err)
    assert loopback.head_files("zoo-test/resume") == {}, "nothing may be committed by the killed upload"
    first = list(loopback.lfs_uploads)

    assert publish("t5", "--force", "--repo", "zoo-test/resume", "--exports", str(exports)) == 0
    resent = loopback.lfs_uploads[len(first):]
    committed = loopback.head_files("zoo-test/resume")
    lfs_objects = {f.sha256 for f in committed.values() if f.lfs}
    assert len(lfs_objects) >= 2
    assert not set(first) & set(resent), "an object the Hub already held was sent again"
    assert len(first) == 1 and set(first) | set(resent) == lfs_objects and len(resent) == len(lfs_objects) - 1


# ---------------------------------------------------------------- the cache: every broken state


def _blob(folder: Path, name: str) -> Path:
    return Path(os.path.realpath(folder / name))


def corrupt(state: str, folder: Path) -> None:
    weights, config = folder / "model.safetensors", folder / "config.json"
    blob = _blob(folder, "model.safetensors")
    size = blob.stat().st_size
    if state == "sparse":  # apparent size right, holes inside: what a killed mixed-transport attempt leaves
        with open(blob, "r+b") as f:
            f.truncate(0)
            f.truncate(size)
    elif state == "hash":
        with open(blob, "r+b") as f:
            f.seek(size // 2)
            byte = f.read(1)
            f.seek(size // 2)
            f.write(bytes([byte[0] ^ 0xFF]))
    elif state == "size":
        with open(blob, "r+b") as f:
            f.truncate(size // 2)
    elif state == "dangling":
        blob.unlink()
    elif state == "cross_linked":
        weights.unlink()
        weights.symlink_to(os.path.relpath(_blob(folder, "config.json"), weights.parent))
    elif state == "incomplete":
        (blob.parent / f"{blob.name}.1a2b3c4d.incomplete").write_bytes(b"partial")
    else:
        raise AssertionError(state)
    assert config.exists()


STATES = ["sparse", "hash", "size", "dangling", "cross_linked", "incomplete"]


@pytest.mark.parametrize("state", STATES)
def test_each_broken_cache_state_is_detected_and_repaired(state, loopback, capsys):
    from zoo.weights import load_folder

    sha = seed_tiny_checkpoint(loopback)
    folder = zoo_hub.download("zoo-test/t5-tiny", sha)
    corrupt(state, folder)
    report = zoo_hub.check_repo_cache("zoo-test/t5-tiny", sha, zoo_hub.WEIGHT_PATTERNS)
    assert [p.kind for p in report.problems] == [state], report.summary()

    repo = f"zoo-test/t5-tiny@{sha}"
    assert zoo_hub.main(["check", "--repo", repo]) == 1
    assert zoo_hub.main(["repair", "--repo", repo]) == 0
    assert zoo_hub.main(["check", "--repo", repo]) == 0
    out = capsys.readouterr().out
    assert state in out and "repaired" in out
    load_folder(folder)  # the checkpoint loads again


def test_repair_that_needs_the_network_fails_offline_with_exit_1(loopback, monkeypatch, capsys):
    from huggingface_hub import constants

    sha = seed_tiny_checkpoint(loopback)
    corrupt("hash", zoo_hub.download("zoo-test/t5-tiny", sha))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    assert zoo_hub.main(["repair", "--repo", f"zoo-test/t5-tiny@{sha}"]) == 1
    assert "still broken" in capsys.readouterr().out


@pytest.mark.parametrize("state", ["sparse", "cross_linked"])
def test_the_weights_hub_path_repairs_the_cache_by_itself(state, loopback):
    from zoo.registry import get_spec, load_model_config
    from zoo.weights import resolve

    sha = seed_tiny_checkpoint(loopback)
    cfg = load_model_config("t5")
    cfg.variant = "tiny"
    cfg.variants.tiny.hub = {"repo_id": "zoo-test/t5-tiny", "revision": sha}
    spec = get_spec(cfg)
    first = resolve(cfg, "hub", spec.tiny_dir, spec.random_checkpoint)
    corrupt(state, Path(first.provenance["path"]))
    again = resolve(cfg, "hub", spec.tiny_dir, spec.random_checkpoint)
    assert again.provenance["files"] == first.provenance["files"]
    assert zoo_hub.check_repo_cache("zoo-test/t5-tiny", sha).ok


def test_transient_download_failures_are_retried(loopback):
    sha = seed_tiny_checkpoint(loopback)
    loopback.fail_downloads = 2
    folder = zoo_hub.download("zoo-test/t5-tiny", sha)
    assert (folder / "model.safetensors").is_file() and loopback.fail_downloads == 0


# ---------------------------------------------------------------- messages


def test_offline_gated_missing_repo_and_missing_revision_messages(loopback, monkeypatch, capsys):
    from huggingface_hub import constants

    sha = seed_tiny_checkpoint(loopback)
    with pytest.raises(ZooError, match="has no revision") as missing_revision:
        zoo_hub.download("zoo-test/t5-tiny", "f" * 40)
    with pytest.raises(ZooError, match="has no repo zoo-test/nope") as missing_repo:
        zoo_hub.download("zoo-test/nope", sha)
    loopback.gated.add("zoo-test/t5-tiny")
    monkeypatch.delenv("HF_TOKEN")
    with pytest.raises(ZooError, match=r"refused access .*401") as gated:
        zoo_hub.download("zoo-test/t5-tiny", sha)
    monkeypatch.setenv("HF_TOKEN", SENTINEL)
    with pytest.raises(ZooError, match=r"refused access .*403") as forbidden:
        zoo_hub.download("zoo-test/t5-tiny", sha)
    monkeypatch.setattr(constants, "ENDPOINT", "http://127.0.0.1:9")  # nothing listens there
    with pytest.raises(ZooError, match="unreachable") as offline:
        zoo_hub.download("zoo-test/t5-tiny", sha)
    for error in (missing_revision, missing_repo, gated, forbidden, offline):
        assert error.value.fix and SENTINEL not in str(error.value)
    assert_no_sentinel(*capsys.readouterr())


def test_publish_without_a_token_and_to_a_forbidden_repo(exports, loopback, monkeypatch, capsys):
    monkeypatch.delenv("HF_TOKEN")
    assert publish("t5", "--force", "--repo", "zoo-test/x", "--exports", str(exports)) == 2
    assert "No Hugging Face token" in "".join(capsys.readouterr())
    monkeypatch.setenv("HF_TOKEN", SENTINEL)
    loopback.seed_repo("zoo-test/locked", {"README.md": b"x"})
    loopback.gated.add("zoo-test/locked")
    assert publish("t5", "--force", "--repo", "zoo-test/locked", "--exports", str(exports)) == 2
    said = "".join(capsys.readouterr())
    assert "refused access" in said and "Traceback" not in said
    assert_no_sentinel(said)


def test_cache_command_is_in_the_console_script(tmp_path):
    result = cli("zoo.commands", "cache", "check", "t5", env={"HF_HUB_CACHE": str(tmp_path)})
    assert result.returncode == 0, result.stderr
    assert "t5/base: google/t5-v1_1-base@b5fc947a416e: not cached" in result.stdout
    assert "publish" in cli("zoo.commands", "--help").stdout
