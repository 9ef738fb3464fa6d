"""What `zoo bench` times for the LLM: prefill and decode tokens/s of the saved bundle vs eager
transformers with a KV cache, plus the per-prompt token-gate table (the `Component.measure` hook).

The shared bench (zoo/bench.py) converts and gates each bundle in its own fresh process and fills the
common columns (gate, conversion seconds, peak RSS, size); this file adds only what is LLM-specific:
a fixed 64-token prompt, one prefill call then 32 greedy decode calls, timed on the bundle's own
session and on transformers `LlamaForCausalLM` fp32 (sdpa) with a `DynamicCache`, right before the
artifact so both see the same machine load (the ratio is what to read: these machines are noisy).
"""

from __future__ import annotations

import gc
import json
import os
import statistics
import time
from pathlib import Path
from typing import Sequence

import numpy as np
import torch

from zoo.generation import StepFn
from zoo.registry import Measure, MeasureContext

PROMPT_TOKENS = 64   # = LiteRT's prefill_len: one prefill call on both targets
DECODE_TOKENS = 32
REPEATS = 3          # timed runs after one warm-up; medians reported
PROFILE_DECODE_TOKENS = 8  # decode calls in the profiled run (each Core AI decode call profiles alike)
TIMING_BUDGET_S = 60  # ...but no new run once this much was spent timing (Core AI int8 decodes at ~3 s/token)
# A fixed text, cut to exactly PROMPT_TOKENS tokens by the bundle's own tokenizer.
PROMPT_TEXT = (
    "The history of computing is a story of machines that grew smaller, faster and cheaper with every decade. "
    "Early computers filled whole rooms, consumed enormous amounts of power and were programmed with switches "
    "and punched cards. The invention of the transistor, and later of the integrated circuit, made it possible "
    "to put millions and then billions of switches on a single chip, and today a phone in a pocket runs "
    "language models that would have needed a supercomputer a generation ago."
)


def bench_prompt(tokenizer, n: int = PROMPT_TOKENS) -> list[int]:
    ids = tokenizer(PROMPT_TEXT)["input_ids"]
    while len(ids) < n:  # a tokenizer with long tokens: repeat the text
        ids = ids + tokenizer(" " + PROMPT_TEXT)["input_ids"]
    return [int(t) for t in ids[:n]]


def eager_step(hf) -> StepFn:
    """A StepFn over transformers with a KV cache (what `generate` does): a new DynamicCache at
    start=0, then one forward per call; logits of the last position only, like the bundles."""
    from transformers import DynamicCache

    state = {}

    @torch.inference_mode()
    def step(token_ids: Sequence[int], start: int) -> np.ndarray:
        if start == 0:
            state["cache"] = DynamicCache(config=hf.config)
        if state["cache"].get_seq_length() != start:
            raise ValueError(f"step at start={start}, but the cache holds {state['cache'].get_seq_length()} tokens")
        ids = torch.tensor([list(token_ids)], dtype=torch.long)
        out = hf(input_ids=ids, cache=state["cache"], use_cache=True, logits_to_keep=1)
        return out.logits[0, -1].float().numpy()

    return step


def time_generation(step: StepFn, prompt_ids: list[int], new_tokens: int = DECODE_TOKENS,
                    repeats: int = REPEATS, budget_s: float = TIMING_BUDGET_S) -> dict:
    """One prefill call of the whole prompt, then `new_tokens` greedy decode calls. One warm-up run, then
    medians of up to `repeats` runs: at least one, and no new one after `budget_s` seconds of timed runs."""

    def once() -> tuple[float, float]:
        t0 = time.perf_counter()
        logits = step(prompt_ids, 0)
        t1 = time.perf_counter()
        for i in range(new_tokens):
            logits = step([int(np.argmax(logits))], len(prompt_ids) + i)
        return t1 - t0, time.perf_counter() - t1

    once()  # first calls pay for allocation, XNNPACK packing, lazy loading
    runs = [once()]
    while len(runs) < repeats and sum(map(sum, runs)) < budget_s:
        runs.append(once())
    prefill_s = statistics.median(r[0] for r in runs)
    decode_s = statistics.median(r[1] for r in runs)
    return {"prefill_ms": round(prefill_s * 1e3, 2), "prefill_tok_s": round(len(prompt_ids) / prefill_s, 1),
            "decode_ms_per_token": round(decode_s * 1e3 / new_tokens, 2),
            "decode_tok_s": round(new_tokens / decode_s, 2), "runs": len(runs)}


def time_litertlm(bundle: Path, prompt_text: str, new_tokens: int = DECODE_TOKENS, repeats: int = REPEATS) -> dict:
    """The bundle's model.litertlm on LiteRT-LM (CPU, cache off): one warm-up generation, then medians of
    `repeats` as the engine counts them. It tokenizes the text itself and sends the last prompt token
    through decode, so its prefill count is one short of the prompt; a stop token may end decode early
    (both counts are reported). None for bundles without one (Core AI)."""
    from .litertlm import ARTIFACT, LiteRTLMSession

    if not (bundle / ARTIFACT).is_file():
        return {}
    with LiteRTLMSession(bundle / ARTIFACT, benchmark=True) as session:
        session.timed(prompt_text, new_tokens)
        runs = [session.timed(prompt_text, new_tokens) for _ in range(repeats)]
    return {"litertlm_prefill_tok_s": round(statistics.median(r["prefill_tok_s"] for r in runs), 1),
            "litertlm_decode_tok_s": round(statistics.median(r["decode_tok_s"] for r in runs), 2),
            "litertlm_tokens": f"{runs[-1]['prefill_tokens']}+{runs[-1]['decode_tokens']}",
            "litertlm_load_s": round(session.load_s, 3)}


def prompt_details(bundle: Path) -> list[dict]:
    """Per prompt, from the bundle's transcript.json: verdict, agreement, first divergence."""
    path = bundle / "transcript.json"
    if not path.is_file():
        return []
    return [{"prompt": t["prompt_text"], "verdict": t["verdict"], "token_agreement": t.get("token_agreement"),
             "first_divergence": t["first_divergence"], "margin_at_divergence": t["margin_at_divergence"],
             "min_logits_cosine": t["min_logits_cosine"], "reference_text": t["reference_text"],
             "candidate_text": t["candidate_text"]} for t in json.loads(path.read_text())]


def prepare(cfg, checkpoint) -> dict:
    """Once per bench: the fixed prompt, cut by this checkpoint's tokenizer."""
    from zoo.errors import ZooError

    from .spec import tokenizer_for

    tokenizer = tokenizer_for(checkpoint)
    prompt_ids = bench_prompt(tokenizer)
    if len(prompt_ids) + DECODE_TOKENS > int(cfg.context_len):
        raise ZooError(f"The bench needs {len(prompt_ids) + DECODE_TOKENS} positions; context_len is "
                       f"{cfg.context_len}.", "raise model.context_len.")
    return {"prompt_ids": prompt_ids, "prompt_text": tokenizer.decode(prompt_ids), "prompt_tokens": len(prompt_ids),
            "decode_tokens": DECODE_TOKENS, "timing_repeats": REPEATS, "timing_budget_s": TIMING_BUDGET_S,
            "context_len": int(cfg.context_len), "prefill_len": int(cfg.prefill_len),
            "gate_prompts": list(cfg.prompts), "gate_new_tokens": int(cfg.new_tokens)}


def run(ctx: MeasureContext) -> dict:
    """Eager transformers, then the saved bundle through its own session, on the same prompt."""
    from zoo.targets import get_target

    from .spec import open_session, reference_hf

    prompt_ids = ctx.header["prompt_ids"]
    hf = reference_hf(ctx.checkpoint)
    hf.set_attn_implementation("sdpa")  # transformers' default; the gate's oracle uses eager attention
    gc.collect()
    load_avg = os.getloadavg()[0]
    eager = time_generation(eager_step(hf), prompt_ids)  # right before the artifact: same machine load
    target = get_target(ctx.target)
    t0 = time.perf_counter()
    runner = target.open(ctx.bundle / target.artifact)
    try:
        with open_session(runner, ctx.target) as session:
            load_s = time.perf_counter() - t0
            artifact = time_generation(session.step, prompt_ids)
    finally:
        runner.close()
    litertlm = time_litertlm(ctx.bundle, ctx.header["prompt_text"])
    raw = time_raw_prefill(ctx, prompt_ids, artifact["prefill_tok_s"])
    return {
        "load_s": round(load_s, 3), **artifact, **raw, **litertlm,
        "eager_prefill_tok_s": eager["prefill_tok_s"], "eager_decode_tok_s": eager["decode_tok_s"],
        "prefill_vs_eager": round(artifact["prefill_tok_s"] / eager["prefill_tok_s"], 3),
        "decode_vs_eager": round(artifact["decode_tok_s"] / eager["decode_tok_s"], 3),
        "load_avg_1m": round(load_avg, 2),
        "prompts": prompt_details(ctx.bundle),
    }


def raw_inputs(header: dict) -> dict:
    """The raw converter's baseline is upstream's forward over the bench prompt (no cache: a prefill)."""
    return {"input_ids": torch.tensor([header["prompt_ids"]], dtype=torch.int32)}


def time_raw_prefill(ctx: MeasureContext, prompt_ids: list[int], prefill_tok_s: float) -> dict:
    """Prefill tokens/s of upstream `LlamaForCausalLM` converted as is (the bench's raw artifact, exported on
    the same prompt), right after the bundle; `prefill_vs_raw` = the bundle's tokens/s over it. Decode has no
    raw counterpart: upstream's graph has no cache to carry between calls."""
    from zoo.bench import median_ms
    from zoo.targets import get_target

    raw = (ctx.header.get("raw_artifacts") or {}).get(ctx.target) or {"reason": "not measured"}
    if "path" not in raw:
        return {"raw_prefill_tok_s": raw["reason"], "prefill_vs_raw": "–"}
    feeds = {"input_ids": np.asarray([prompt_ids], dtype=np.int32)}
    with get_target(ctx.target).open(Path(raw["path"])) as runner:
        ms = median_ms(lambda: runner.run("main", feeds), REPEATS)
    raw_tok_s = len(prompt_ids) / (ms / 1e3)
    return {"raw_prefill_tok_s": round(raw_tok_s, 1), "prefill_vs_raw": round(prefill_tok_s / raw_tok_s, 3)}


def drive_for_profile(ctx: MeasureContext, runner) -> None:
    """What `run` times, once, for the runtime's profiler: a prefill of the bench prompt, then 8 decodes."""
    from .spec import open_session

    prompt_ids = ctx.header["prompt_ids"]
    with open_session(runner, ctx.target) as session:
        logits = session.step(prompt_ids, 0)
        for i in range(PROFILE_DECODE_TOKENS):
            logits = session.step([int(np.argmax(logits))], len(prompt_ids) + i)


def _g(value, digits=3) -> str:
    if value is None:
        return "—"
    return f"{value:.{digits}g}" if isinstance(value, float) else str(value)


def details(rows: list[dict], header: dict) -> list[str]:
    """Under the table: how throughput was measured, and the token gate per prompt."""
    lines = [
        f"Throughput: one prefill call of a fixed {header['prompt_tokens']}-token prompt, then "
        f"{header['decode_tokens']} greedy decode calls; median of {header['timing_repeats']} runs after one "
        f"warm-up (fewer, at least one, once {header['timing_budget_s']} s were spent: the runs column). "
        "Eager = transformers `LlamaForCausalLM` fp32 (sdpa) with a `DynamicCache`, same prompt and loop, "
        f"timed right before each artifact. Context {header['context_len']}, LiteRT prefill chunk "
        f"{header['prefill_len']}; load s = opening the saved bundle (Core AI `executable()` lowers it); load "
        f"avg = 1-minute load average before the timing. Gate: greedy decoding of {header['gate_new_tokens']} "
        f"tokens on each of the {len(header['gate_prompts'])} config prompts, artifact vs transformers fp32. "
        "LiteRT-LM = the LiteRT bundle's model.litertlm on the LiteRT-LM runtime (CPU backend, cache off), "
        f"the same prompt text and {header['decode_tokens']} greedy tokens, tokens/s as the engine's own "
        "counters report them (it sends the last prompt token through decode).",
        "",
        "Token gate per prompt (first divergence = index of the first generated token that differs from "
        "transformers fp32; agreement = tokens before it / tokens generated):",
        "",
        "| target | precision | prompt | verdict | agreement | first divergence | ref top-2 margin there "
        "| min logits cosine | candidate text |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    from zoo.card import row_measure

    for r in rows:
        for p in row_measure(r).get("prompts", []):
            text = (p["candidate_text"] or "").replace("\n", "\\n").replace("|", "\\|")
            lines.append(f"| {r['target']} | {r['precision']} | `{p['prompt']}` | {p['verdict']} | "
                         f"{_g(p['token_agreement'])} | {_g(p['first_divergence'])} | "
                         f"{_g(p['margin_at_divergence'])} | {_g(p['min_logits_cosine'], 7)} | `{text}` |")
    return lines


GENERATION_MEASURE = Measure(
    run=run,
    prepare=prepare,
    details=details,
    profile=drive_for_profile,
    raw_baseline=True,
    raw_inputs=raw_inputs,
    describe="prefill and decode tokens/s of the bundle's session vs eager transformers with a KV cache; raw "
             "converter = upstream LlamaForCausalLM converted as is at fp32 on the bench prompt (one call, no "
             "cache: a prefill), timed after the bundle",
    columns=[("load_s", "load s"), ("prefill_tok_s", "prefill tok/s"), ("eager_prefill_tok_s", "eager"),
             ("prefill_vs_eager", "vs eager"), ("raw_prefill_tok_s", "raw converter prefill tok/s"),
             ("prefill_vs_raw", "vs raw"), ("decode_tok_s", "decode tok/s"), ("eager_decode_tok_s", "eager"),
             ("decode_vs_eager", "vs eager"), ("litertlm_prefill_tok_s", "LiteRT-LM prefill tok/s"),
             ("litertlm_decode_tok_s", "LiteRT-LM decode tok/s"), ("runs", "runs"), ("load_avg_1m", "load avg")],
)
