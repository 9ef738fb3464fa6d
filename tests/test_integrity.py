"""A bundle is checked against its manifest before anything runs it (zoo/integrity.py), and
`python -m zoo.verify` says so from the command line: 0 intact, 2 damaged, 1 a gate failed here.

The bundles are the session's tiny ones (tests/tiny_bundles.py); every test damages its own copy.
"""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
from tiny_bundles import copy_bundle, flip_byte, truncate

from zoo.errors import ZooError
from zoo.integrity import DamagedBundle, inspect_bundle, verify_artifact_in_bundle, verify_bundle


@pytest.fixture(scope="module")
def bundles(tiny_bundles):
    return tiny_bundles.wait()


@pytest.fixture
def copy_of(bundles, tmp_path):
    return lambda name: copy_bundle(bundles[name], tmp_path / name)


# ---------------------------------------------------------------- verify_bundle


def test_an_intact_bundle_passes_with_every_file_hashed(copy_of):
    bundle = copy_of("gqa-llm-coreai")
    check = verify_bundle(bundle)
    listed = json.loads((bundle / "manifest.json").read_text())["files"]
    assert check.intact and check.files == len(listed) == check.hashed
    assert "model.aimodel/main.mlirb" in listed and "tokenizer/tokenizer.json" in listed


@pytest.mark.parametrize("rel", ["model.aimodel/main.mlirb", "model.aimodel/metadata.json", "report.json"])
def test_one_flipped_byte_anywhere_is_refused(copy_of, rel):
    bundle = copy_of("t5-coreai")
    flip_byte(bundle / rel)
    with pytest.raises(DamagedBundle, match=f"{rel} has sha256"):
        verify_bundle(bundle)


def test_a_flipped_first_byte_is_refused(copy_of):
    bundle = copy_of("t5-litert")
    flip_byte(bundle / "model.tflite", offset=0)
    with pytest.raises(DamagedBundle, match="model.tflite has sha256"):
        verify_bundle(bundle)


def test_truncated_missing_and_grown_files_are_named(copy_of):
    bundle = copy_of("gqa-llm-litert")
    truncate(bundle / "model.tflite")
    (bundle / "tokenizer" / "tokenizer.json").unlink()
    with open(bundle / "report.json", "a") as f:
        f.write(" ")
    check = inspect_bundle(bundle)
    text = " | ".join(check.problems)
    assert not check.intact and len(check.problems) == 3, text
    assert "model.tflite is" in text and "(truncated)" in text
    assert "tokenizer/tokenizer.json is missing" in text and "(grown)" in text


def test_fast_mode_catches_truncation_but_only_hashes_small_files(copy_of, monkeypatch):
    import zoo.integrity as integrity

    bundle = copy_of("t5-litert")
    monkeypatch.setattr(integrity, "FAST_HASH_LIMIT_BYTES", 10_000)  # the tiny artifact counts as large
    flip_byte(bundle / "model.tflite")
    fast = inspect_bundle(bundle, fast=True)
    assert fast.intact and fast.hashed == 1  # report.json only: a flipped byte in a large file is not seen
    assert not inspect_bundle(bundle).intact  # ...which is why the default hashes everything
    truncate(bundle / "model.tflite")
    assert "(truncated)" in " ".join(inspect_bundle(bundle, fast=True).problems)


@pytest.mark.parametrize("damage,message", [
    (lambda m: m.pop("files"), "lists no files"),
    (lambda m: m["files"].pop("model.tflite"), "does not list the artifact model.tflite"),
    (lambda m: m["files"].update({"../outside": {"sha256": "0" * 64, "bytes": 1}}), "a path outside the bundle"),
    (lambda m: m["files"]["model.tflite"].update(sha256="xyz"), "no valid sha256"),
    (lambda m: m.update(target="onnx"), "names target 'onnx'"),
])
def test_a_manifest_that_cannot_vouch_for_the_bundle_is_refused(copy_of, damage, message):
    bundle = copy_of("t5-litert")
    manifest = json.loads((bundle / "manifest.json").read_text())
    damage(manifest)
    (bundle / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(DamagedBundle, match=message):
        verify_bundle(bundle)


def test_a_file_changed_after_a_successful_check_is_checked_again(copy_of):
    """The in-process memo is keyed on the files' stat: a change after verification is never trusted."""
    bundle = copy_of("t5-litert")
    verify_bundle(bundle)
    verify_bundle(bundle)  # memoised
    flip_byte(bundle / "model.tflite")
    with pytest.raises(DamagedBundle):
        verify_bundle(bundle)


# ---------------------------------------------------------------- runners


def t5_inputs(bundle):
    manifest = json.loads((bundle / "manifest.json").read_text())
    return {i["name"]: np.ones(i["shape"], dtype=i["dtype"]) for i in manifest["io"]["inputs"]}


@pytest.mark.parametrize("name,rel", [("t5-coreai", "model.aimodel/main.mlirb"), ("t5-litert", "model.tflite"),
                                      ("gqa-llm-coreai", "model.aimodel/main.mlirb"), ("gqa-llm-litert", "model.tflite")])
def test_runners_refuse_a_flipped_byte_before_the_runtime_opens_it(copy_of, name, rel):
    from zoo.targets import get_target

    bundle = copy_of(name)
    target = get_target(name.split("-")[-1])
    with target.open(bundle / target.artifact) as runner:  # intact: opens (the positive control)
        assert runner.function_names
    flip_byte(bundle / rel)
    with pytest.raises(DamagedBundle, match="has sha256"):
        target.open(bundle / target.artifact)


def test_a_runner_opens_an_artifact_with_no_manifest_beside_it(bundles, tmp_path):
    """The pipeline's verify stage opens the artifact in its staging folder before the manifest exists."""
    from zoo.targets.coreai import CoreAIRunner
    from zoo.targets.litert import LiteRTRunner

    shutil.copytree(bundles["t5-coreai"] / "model.aimodel", tmp_path / "staging" / "model.aimodel")
    shutil.copy(bundles["t5-litert"] / "model.tflite", tmp_path / "staging" / "model.tflite")
    assert not verify_artifact_in_bundle(tmp_path / "staging" / "model.tflite")
    inputs = t5_inputs(bundles["t5-litert"])
    with CoreAIRunner(tmp_path / "staging" / "model.aimodel") as coreai, \
            LiteRTRunner(tmp_path / "staging" / "model.tflite") as litert:
        a, b = coreai.run("main", inputs), litert.run("main", inputs)
    assert np.allclose(a["last_hidden_state"], b["last_hidden_state"], atol=1e-4)


def test_verify_false_is_the_explicit_way_around(copy_of):
    from zoo.targets.litert import LiteRTRunner

    bundle = copy_of("t5-litert")
    (bundle / "report.json").write_text("{}")  # damage outside the artifact: the artifact itself still runs
    with pytest.raises(DamagedBundle):
        LiteRTRunner(bundle / "model.tflite")
    with LiteRTRunner(bundle / "model.tflite", verify=False) as runner:
        assert runner.function_names == ["main"]


def test_litert_runner_refuses_what_is_not_a_tflite(tmp_path):
    from zoo.targets.litert import LiteRTRunner

    (tmp_path / "x.tflite").write_text("not a model")
    with pytest.raises(ZooError, match="not a LiteRT/TensorFlow Lite model"):
        LiteRTRunner(tmp_path / "x.tflite")


def test_generate_refuses_a_flipped_byte_in_process(copy_of):
    """The issue's case: one flipped byte in main.mlirb ran and printed different text, exit 0."""
    import io

    from zoo.generate import generate

    bundle = copy_of("gqa-llm-coreai")
    assert generate(bundle, "The alphabet begins", 3, out=io.StringIO())  # intact: generates
    flip_byte(bundle / "model.aimodel" / "main.mlirb")
    with pytest.raises(DamagedBundle, match="main.mlirb has sha256"):
        generate(bundle, "The alphabet begins", 3, out=io.StringIO())


# ---------------------------------------------------------------- python -m zoo.verify


def test_verify_cli_intact_flipped_truncated_and_no_manifest(copy_of, run_cli):
    intact = copy_of("t5-coreai")
    proc = run_cli("zoo.verify", str(intact))
    assert proc.returncode == 0 and "match the manifest" in proc.stdout, proc.stdout + proc.stderr
    flipped = copy_bundle(intact, intact.parent / "flipped")
    flip_byte(flipped / "model.aimodel" / "main.mlirb")
    truncated = copy_bundle(intact, intact.parent / "truncated")
    truncate(truncated / "model.aimodel" / "main.mlirb")
    orphan = copy_bundle(intact, intact.parent / "orphan")
    (orphan / "manifest.json").unlink()
    for bundle, needle in ((flipped, "main.mlirb has sha256"), (truncated, "(truncated)"),
                           (orphan, "has no manifest.json")):
        proc = run_cli("zoo.verify", str(bundle))
        out = " ".join((proc.stdout + proc.stderr).split())
        assert proc.returncode == 2 and needle in out and "Traceback" not in out, out


def test_verify_cli_accepts_the_artifact_path(bundles, run_cli):
    proc = run_cli("zoo.verify", str(bundles["t5-litert"] / "model.tflite"))
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_verify_gates_reruns_the_bundles_gates_here(bundles, run_cli):
    """--gates rebuilds the reference from what the bundle records and compares the saved artifact."""
    for name in ("t5-litert", "gqa-llm-litert"):
        proc = run_cli("zoo.verify", str(bundles[name]), "--gates")
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
        assert "gates re-run on this machine" in proc.stdout and "(recorded" in proc.stdout
    assert not (bundles["gqa-llm-litert"].parent / "transcript.json").exists()


def test_verify_gates_fails_when_the_reference_differs(copy_of, run_cli):
    """Negative control: a threshold tightened beyond reach in the recorded config fails the re-run gate
    (exit 1, as `zoo convert` exits for a failed gate), while the hashes of the artifact are intact."""
    bundle = copy_of("t5-litert")
    report = json.loads((bundle / "report.json").read_text())
    report["model_config"]["gates"]["fp32"]["rel_max_abs"] = 1e-30
    (bundle / "report.json").write_text(json.dumps(report))
    manifest = json.loads((bundle / "manifest.json").read_text())
    from zoo.bundle import sha256_file

    manifest["files"]["report.json"] = {"sha256": sha256_file(bundle / "report.json"),
                                        "bytes": (bundle / "report.json").stat().st_size}
    (bundle / "manifest.json").write_text(json.dumps(manifest))
    proc = run_cli("zoo.verify", str(bundle), "--gates")
    out = " ".join((proc.stdout + proc.stderr).split())
    assert proc.returncode == 1 and "gates failed on this machine" in out and "rel_max_abs" in out, out


def test_verify_gates_refuses_weights_that_differ_from_the_recorded_ones(copy_of, run_cli):
    bundle = copy_of("t5-litert")
    manifest = json.loads((bundle / "manifest.json").read_text())
    manifest["weights"]["files"] = {"model.safetensors": "0" * 64}
    (bundle / "manifest.json").write_text(json.dumps(manifest))
    proc = run_cli("zoo.verify", str(bundle), "--gates")
    out = " ".join((proc.stdout + proc.stderr).split())
    assert proc.returncode == 2 and "differ from those this bundle was made from" in out, out
