"""Core AI bundles carry Apple's root metadata.json, and the ecosystem's own tool (coreai-cli) accepts them.

`coreai doctor` / `coreai verify` are the community CLI (pip `coreai-cli`, stdlib only) that Core AI users run
on a bundle folder; without metadata.json they answer "is not a bundle directory". These tests run the real
tool on a tiny T5 bundle made by the pipeline, plus a negative control that proves its bundle rules bite.
"""

import json
import shutil
import subprocess
import sys
from datetime import datetime, timezone
from pathlib import Path

import pytest

from zoo.errors import ZooError
from zoo.targets.coreai_bundle import BundleFacts, bundle_metadata, function_map, source_block

COREAI_CLI = [sys.executable, "-m", "coreai_cli"]


def coreai(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([*COREAI_CLI, *args], capture_output=True, text=True, timeout=120)


def facts(**overrides) -> BundleFacts:
    base = dict(name="t5", kind="model", asset="model.aimodel", functions=["main"],
                weights={"source": "tiny", "path": "/x"}, precision="bf16", int8_group_size=32)
    return BundleFacts(**{**base, **overrides})


# ------------------------------------------------------------------ the schema, without converting anything


def test_metadata_has_apples_required_fields_and_version():
    metadata = bundle_metadata(facts(), now=datetime(2026, 12, 1, tzinfo=timezone.utc))
    assert metadata["metadata_version"] == "0.2"   # Apple's ModelBundle rejects any other version
    assert {"kind", "name", "assets", "source", "compression", "compilation"} <= set(metadata)
    assert metadata["assets"] == {"main": "model.aimodel"}
    assert metadata["compilation"] == {"date": "2026-12-01T00:00:00+00:00", "targets": []}
    assert all(isinstance(v, str) for v in metadata["user_data"].values())   # ModelBundle: [String: String]
    assert "language" not in metadata


def test_source_names_the_hub_repo_and_revision_or_says_plainly_what_the_weights_are():
    hub = source_block({"source": "hub", "repo_id": "google/t5-v1_1-base", "revision": "b5fc947a"})
    assert hub["hf_model_id"] == "google/t5-v1_1-base" and hub["hf_revision"] == "b5fc947a"
    for plain in ("tiny", "random"):
        block = source_block({"source": plain})
        assert block["weights"] == plain and "hf_model_id" not in block   # no look-alike Hub oracle


def test_compression_is_named_only_for_palettized_int8():
    assert bundle_metadata(facts(precision="int8"))["compression"] == "8bit_weight_palettized_group32"
    assert bundle_metadata(facts(precision="bf16"))["compression"] is None


def test_llm_gets_a_language_block_with_a_prefill_decode_function_map():
    language = {"tokenizer": "tokenizer", "vocab_size": 49152, "max_context_length": 256}
    metadata = bundle_metadata(facts(kind="llm", functions=["prefill", "decode"], language=language))
    block = metadata["language"]
    assert (block["tokenizer"], block["vocab_size"], block["max_context_length"]) == ("tokenizer", 49152, 256)
    assert block["function_map"] == {"prefill": ["prefill"], "decode": ["decode"], "main": ["decode"]}
    assert function_map(["main"]) == {"main": ["main"]}


def test_llm_without_language_facts_is_refused_with_a_fix():
    with pytest.raises(ZooError, match="language"):
        bundle_metadata(facts(kind="llm"))


# ------------------------------------------------------------------ the real tool on a real tiny bundle


@pytest.fixture(scope="module")
def t5_bundle(tmp_path_factory) -> Path:
    from zoo.config import compose_convert
    from zoo.pipeline import convert_model

    cfg = compose_convert(["model=t5"]).model
    result = convert_model(cfg, ["coreai"], precision="bf16", out_dir=tmp_path_factory.mktemp("exports"))[0]
    assert result.ok, result.error
    return result.path


def test_metadata_is_in_the_bundle_and_hashed_by_the_manifest(t5_bundle):
    metadata = json.loads((t5_bundle / "metadata.json").read_text())
    assert (t5_bundle / metadata["assets"]["main"]).is_dir()
    assert metadata["source"] == {"model_definition": "torch", "weights": "tiny"}
    assert "metadata.json" in json.loads((t5_bundle / "manifest.json").read_text())["files"]


def test_coreai_doctor_recognises_the_bundle_and_its_bundle_rules_run_clean(t5_bundle):
    run = coreai("doctor", str(t5_bundle), "--json")
    assert run.returncode == 0, run.stdout + run.stderr
    report = json.loads(run.stdout)
    assert report["kind"] == "bundle"
    assert {"BUNDLE-INCOMPLETE", "BUNDLE-ASSET-MISSING"} <= set(report["rules_run"])
    assert report["findings"] == []


def test_coreai_doctor_negative_control_an_llm_claim_without_language_block_is_fatal(t5_bundle, tmp_path):
    broken = tmp_path / "broken"
    shutil.copytree(t5_bundle, broken)
    metadata = json.loads((broken / "metadata.json").read_text())
    (broken / "metadata.json").write_text(json.dumps({**metadata, "kind": "llm"}))
    run = coreai("doctor", str(broken), "--json")
    assert run.returncode == 2
    assert "BUNDLE-INCOMPLETE" in {f["id"] for f in json.loads(run.stdout)["findings"]}


def test_coreai_verify_plan_accepts_the_bundle(t5_bundle):
    # Tiny weights honestly have no Hub oracle, so the plan needs one named; Hub-weight bundles carry it.
    unnamed = coreai("verify", str(t5_bundle), "--plan")
    assert "no metadata.json" not in unnamed.stdout + unnamed.stderr
    assert "source.hf_model_id" in unnamed.stderr
    run = coreai("verify", str(t5_bundle), "--plan", "--hf-id", "google/t5-v1_1-base")
    assert run.returncode == 0, run.stdout + run.stderr
    assert "--- PLAN" in run.stdout and "driver         python-cpu" in run.stdout


# ------------------------------------------------------------------ coreai-catalog entries at publish/stage time


@pytest.fixture(scope="module")
def staged_repo(t5_bundle, tmp_path_factory) -> Path:
    from zoo.publish import parse_args, run

    stage = tmp_path_factory.mktemp("stage") / "repo"
    exports = t5_bundle.parent.parent
    assert run(parse_args(["t5", "--target", "coreai", "--exports", str(exports), "--stage-only", str(stage),
                           "--force", "--repo", "zoo-test/T5-CoreAI"]), out=lambda *_: None) == 0
    return stage


def test_stage_writes_a_catalog_entry_that_the_catalogs_own_schema_accepts(staged_repo):
    import yaml

    from zoo.catalog_entry import catalog_errors

    (entry_file,) = (staged_repo / "coreai-catalog").glob("*.yaml")
    entries = yaml.safe_load(entry_file.read_text())
    assert catalog_errors(entries) == []
    artifact, model = entries["artifact"], entries["model"]
    assert artifact["huggingface"]["url"] == "https://huggingface.co/zoo-test/T5-CoreAI"
    assert artifact["provenance"]["converted_by"]["tool"] == "zoo" and artifact["precision"] == "bf16"
    assert model["bundle_kind"] == "embedding" and model["confidence"] == "low"   # tiny weights, said plainly
    assert [i["name"] for i in model["io_contract"]["inputs"]] == ["input_ids", "attention_mask"]


def test_catalog_files_match_the_staged_bytes_as_its_installer_checks_them(staged_repo):
    import yaml

    from zoo.bundle import sha256_file

    (entry_file,) = (staged_repo / "coreai-catalog").glob("*.yaml")
    files = yaml.safe_load(entry_file.read_text())["artifact"]["huggingface"]["files"]
    bundle_files = {p.relative_to(staged_repo).as_posix() for p in (staged_repo / "coreai-bf16").rglob("*")
                    if p.is_file()}
    assert {f["path"] for f in files} == bundle_files   # every file, manifest.json and metadata.json included
    for f in files:
        assert f["sha256"] == sha256_file(staged_repo / f["path"])
        assert f["size_bytes"] == (staged_repo / f["path"]).stat().st_size


def test_catalog_validation_negative_control_rejects_a_broken_entry(staged_repo):
    import yaml

    from zoo.catalog_entry import catalog_errors

    (entry_file,) = (staged_repo / "coreai-catalog").glob("*.yaml")
    entries = yaml.safe_load(entry_file.read_text())
    entries["model"]["bundle_kind"] = "text-encoder"   # not in the catalog's vocabulary
    entries["artifact"]["huggingface"]["files"][0]["sha256"] = "not-a-digest"
    errors = catalog_errors(entries)
    assert any("bundle_kind" in e for e in errors) and any("sha256" in e for e in errors)
