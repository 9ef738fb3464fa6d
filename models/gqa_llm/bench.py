"""`make bench MODEL=gqa-llm`: prefill and decode tokens/s, conversion cost, size and gates, in one run.

The one measuring path for the LLM (it replaced the per-target `measure.py`). For each target and each
precision it supports that the config does not refuse, the embedded SmolLM2 (or `weights=...`) goes through
the shared pipeline (`zoo.pipeline.convert_model`: export → convert → optimize → save → token gate on the
saved artifact, + the LiteRT GPU-delegate check); then the saved bundle is opened with its session
(`CoreAISession` / `LiteRTSession`) and timed on a fixed 64-token prompt: one prefill call, then 32 greedy
decode calls. Eager torch — transformers `LlamaForCausalLM` fp32 (sdpa attention) with a `DynamicCache`,
same prompt, same loop — is timed right before each artifact, so both see the same machine load; the
table reports ratios because these machines are noisy. Each bundle runs in its own fresh process, so its
peak RSS is its own.

Registered as `SPEC.meta["bench"]` / `SPEC.meta["bench_table"]`; `zoo.bench` writes bench.json and
`zoo.card.update_readme` rewrites the README's Measured block.
"""

from __future__ import annotations

import gc
import json
import os
import platform
import shutil
import statistics
import tempfile
import time
from datetime import date
from pathlib import Path
from typing import Sequence

import numpy as np
import torch

from zoo.bench import in_fresh_process
from zoo.errors import ZooError
from zoo.gates import METRICS
from zoo.pipeline import convert_model
from zoo.registry import get_spec
from zoo.targets import TARGET_NAMES, get_target
from zoo.weights import resolve

from .generation import StepFn

CONVERT_STAGES = ("export", "convert", "optimize", "save")
PROMPT_TOKENS = 64   # = LiteRT's prefill_len: one prefill call on both targets
DECODE_TOKENS = 32
REPEATS = 3          # timed runs after one warm-up; medians reported
TIMING_BUDGET_S = 60  # ...but no new run once this much was spent timing (Core AI int8 decodes at ~3 s/token)
# A fixed text, cut to exactly PROMPT_TOKENS tokens by the bundle's own tokenizer.
PROMPT_TEXT = (
    "The history of computing is a story of machines that grew smaller, faster and cheaper with every decade. "
    "Early computers filled whole rooms, consumed enormous amounts of power and were programmed with switches "
    "and punched cards. The invention of the transistor, and later of the integrated circuit, made it possible "
    "to put millions and then billions of switches on a single chip, and today a phone in a pocket runs "
    "language models that would have needed a supercomputer a generation ago."
)


# ------------------------------------------------------------------------------------------ timing
def bench_prompt(tokenizer, n: int = PROMPT_TOKENS) -> list[int]:
    ids = tokenizer(PROMPT_TEXT)["input_ids"]
    while len(ids) < n:  # a tokenizer with long tokens: repeat the text
        ids = ids + tokenizer(" " + PROMPT_TEXT)["input_ids"]
    return [int(t) for t in ids[:n]]


def eager_step(hf) -> StepFn:
    """generation.StepFn over transformers with a KV cache (what `generate` does): a new DynamicCache at
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
    """One prefill call of the whole prompt, then `new_tokens` greedy decode calls (each picks the argmax
    of the previous logits). One warm-up run, then medians of up to `repeats` runs: at least one, and no
    new one after `budget_s` seconds of timed runs."""

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


def open_bundle_session(target: str, bundle: Path):
    from .export_coreai import CoreAISession
    from .export_litert import LiteRTSession

    artifact = bundle / get_target(target).artifact
    return CoreAISession(artifact) if target == "coreai" else LiteRTSession(artifact)


# ------------------------------------------------------------------------------------------ rows
def gate_summary(result) -> dict[str, float]:
    """Worst value per gate metric over prompts (and GPU checks)."""
    worst = {}
    for metric in dict.fromkeys(g.metric for g in result.gates):
        values = [g.value for g in result.gates if g.metric == metric]
        values = [v for v in values if v == v] or [float("nan")]
        worst[metric] = (min if METRICS[metric].higher_is_better else max)(values)
    return worst


def prompt_details(bundle: Path) -> list[dict]:
    """Per prompt, from the bundle's transcript.json: verdict, agreement, first divergence."""
    path = bundle / "transcript.json"
    if not path.is_file():
        return []
    rows = []
    for t in json.loads(path.read_text()):
        n = max(1, len(t["reference_tokens"]))
        agree = len(t["candidate_tokens"]) if t["first_divergence"] is None else t["first_divergence"]
        rows.append({"prompt": t["prompt_text"], "verdict": t["verdict"], "token_agreement": round(agree / n, 4),
                     "first_divergence": t["first_divergence"], "margin_at_divergence": t["margin_at_divergence"],
                     "min_logits_cosine": t["min_logits_cosine"], "reference_text": t["reference_text"],
                     "candidate_text": t["candidate_text"]})
    return rows


def row_from(result, eager: dict, artifact: dict, load_s: float, load_avg: float) -> dict:
    stages = {s["name"]: s for s in result.stages}
    worst = gate_summary(result)
    return {
        "target": result.target, "precision": result.precision, "status": result.status,
        "gate": "; ".join(f"{m} {v:.7g}" for m, v in worst.items()) + ("" if result.ok else " (FAILED)"),
        "gate_worst": worst,
        "convert_s": round(sum(stages[n]["seconds"] for n in CONVERT_STAGES if n in stages), 2),
        "stage_s": {n: s["seconds"] for n, s in stages.items()},
        "peak_rss_mb": max(s["peak_rss_mb"] for s in result.stages),
        "size_mb": round(result.bytes / 1e6, 1),
        "size_vs_fp32": None,  # filled by `bench`, which knows the fp32 bundle of the same target
        "load_s": round(load_s, 3),
        **{k: v for k, v in artifact.items()},
        "eager": eager,
        "prefill_vs_eager": round(artifact["prefill_tok_s"] / eager["prefill_tok_s"], 3),
        "decode_vs_eager": round(artifact["decode_tok_s"] / eager["decode_tok_s"], 3),
        "load_avg_1m": round(load_avg, 2),
        "prompts": prompt_details(result.path),
    }


# ------------------------------------------------------------------------------------------ bench
def measure_bundle(model_cfg: dict, weights_spec: str, target: str, precision: str, out_dir: str,
                   prompt_ids: list[int]) -> dict:
    """One bundle, in a fresh process (see `bench`): convert + gate through the pipeline, then time eager
    and the saved artifact on the same prompt. Returns the row, or {"error": ...}."""
    import zoo.quiet  # noqa: F401
    from omegaconf import OmegaConf

    from zoo.console import Console

    from .spec import reference_hf

    model_cfg = OmegaConf.create(model_cfg)
    console = Console()
    [result] = convert_model(model_cfg, [target], precision=precision, out_dir=Path(out_dir), console=console,
                             weights_spec=weights_spec)
    if result.status == "error":
        return {"error": result.error}
    spec = get_spec(model_cfg)
    checkpoint = resolve(model_cfg, weights_spec, spec.tiny_dir, spec.random_checkpoint,
                         embedded=spec.meta.get("embedded"))
    hf = reference_hf(checkpoint)
    hf.set_attn_implementation("sdpa")  # transformers' default; the gate's oracle uses eager attention
    del checkpoint
    gc.collect()
    load_avg = os.getloadavg()[0]
    eager = time_generation(eager_step(hf), prompt_ids)  # right before the artifact: same machine load
    t0 = time.perf_counter()
    with open_bundle_session(target, result.path) as session:
        load_s = time.perf_counter() - t0
        artifact = time_generation(session.step, prompt_ids)
    row = row_from(result, eager, artifact, load_s, load_avg)
    row["bytes"] = result.bytes
    shutil.rmtree(result.path, ignore_errors=True)  # ~0.5 GB each
    return row


def bench(cfg, console) -> dict:
    """SPEC.meta["bench"]: every (target, precision) the config allows → {"header", "rows"}."""
    from omegaconf import OmegaConf

    from .spec import tokenizer_for

    model_cfg = cfg.model
    weights_spec = cfg.get("weights") or model_cfg.weights
    spec = get_spec(model_cfg)
    checkpoint = resolve(model_cfg, weights_spec, spec.tiny_dir, spec.random_checkpoint,
                         embedded=spec.meta.get("embedded"))
    tokenizer = tokenizer_for(checkpoint)
    prompt_ids = bench_prompt(tokenizer)
    provenance = checkpoint.provenance.get("note", checkpoint.source)
    del checkpoint
    if len(prompt_ids) + DECODE_TOKENS > int(model_cfg.context_len):
        raise ZooError(f"The bench needs {len(prompt_ids) + DECODE_TOKENS} positions; context_len is "
                       f"{model_cfg.context_len}.", "raise model.context_len.")
    model_dict = OmegaConf.to_container(model_cfg, resolve=True)
    refused = model_cfg.get("refused_precisions") or {}
    started = time.perf_counter()
    rows = []
    with tempfile.TemporaryDirectory(prefix="zoo-bench-") as out:
        for target in TARGET_NAMES:
            fp32_bytes = None
            for precision in get_target(target).precisions:
                refusal = (refused.get(target) or {}).get(precision)
                if refusal:
                    rows.append({"target": target, "precision": precision, "status": "refused",
                                 "reason": refusal.split(" (")[0]})
                    continue
                row = in_fresh_process(measure_bundle, model_dict, weights_spec, target, precision, out,
                                       prompt_ids)
                if "error" in row:
                    raise ZooError(f"bench conversion {target}-{precision} failed: {row['error']}",
                                   "fix the conversion first (make convert MODEL=gqa-llm shows the failing stage).")
                nbytes = row.pop("bytes")
                fp32_bytes = fp32_bytes or (nbytes if precision == "fp32" else None)
                row["size_vs_fp32"] = round(nbytes / fp32_bytes, 3) if fp32_bytes else None
                rows.append(row)
                e = row["eager"]
                console.rich.print(
                    f"  [bold]{target}-{precision}[/]: prefill {row['prefill_tok_s']} tok/s (eager "
                    f"{e['prefill_tok_s']}), decode {row['decode_tok_s']} tok/s (eager {e['decode_tok_s']}), "
                    f"convert {row['convert_s']} s, peak RSS {row['peak_rss_mb']} MB, {row['size_mb']} MB")
    gates = {p: {k: float(v) for k, v in model_cfg.gates[p].items()} for p in model_cfg.gates}
    return {
        "header": {
            "command": "make bench MODEL=gqa-llm" + ("" if weights_spec == "embedded" else f" WEIGHTS={weights_spec}"),
            "date": date.today().isoformat(),
            "machine": f"{platform.machine()}, {os.cpu_count()} cores, torch {torch.get_num_threads()} threads, "
                       f"Python {platform.python_version()}",
            "weights": f"{weights_spec} ({provenance})",
            "context_len": int(model_cfg.context_len), "prefill_len": int(model_cfg.prefill_len),
            "prompt_tokens": len(prompt_ids), "decode_tokens": DECODE_TOKENS, "repeats": REPEATS,
            "timing_budget_s": TIMING_BUDGET_S,
            "prompt_text": tokenizer.decode(prompt_ids),
            "gate_prompts": list(model_cfg.prompts), "gate_new_tokens": int(model_cfg.new_tokens),
            "gates": gates, "bench_wall_s": round(time.perf_counter() - started, 1),
        },
        "rows": rows,
    }


# ------------------------------------------------------------------------------------------ card
def _g(value, digits=3) -> str:
    if value is None:
        return "—"
    return f"{value:.{digits}g}" if isinstance(value, float) else str(value)


def _x(value) -> str:
    return "—" if value is None else f"{_g(value)}×"


def _rate(value) -> str:
    """tokens/s: whole numbers from 100 up, 3 significant digits below."""
    return f"{value:.0f}" if value >= 100 else f"{value:.3g}"


def bench_table(data: dict) -> str:
    """SPEC.meta["bench_table"]: the README's Measured block (markdown) from bench.json."""
    head = data["header"]
    rows = data["rows"]
    measured = [r for r in rows if r.get("status") != "refused"]
    lines = [
        f"Generated by `{head['command']}` on {head['date']} ({head['machine']}); weights: {head['weights']}; "
        f"context {head['context_len']}, LiteRT prefill chunk {head['prefill_len']}; bench wall time "
        f"{head['bench_wall_s'] / 60:.1f} min.",
        "",
        f"Throughput: one prefill call of a fixed {head['prompt_tokens']}-token prompt, then "
        f"{head['decode_tokens']} greedy decode calls; median of {head['repeats']} runs after one warm-up "
        f"(fewer, at least one, once {head.get('timing_budget_s', TIMING_BUDGET_S)} s were spent: the runs "
        "column). "
        "Eager = transformers `LlamaForCausalLM` fp32 (sdpa) with a `DynamicCache`, same prompt and loop, "
        "timed right before each artifact (the ratio is what to read: this box is shared and noisy). "
        "Runtimes: Core AI Linux CPU runtime, LiteRT CPU interpreter (XNNPACK).",
        "",
        "| target | precision | gate (worst over prompts) | convert s | peak RSS MB | size MB | vs fp32 | load s "
        "| prefill tok/s | eager | vs eager | decode tok/s | eager | vs eager | runs | load avg |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        if r.get("status") == "refused":
            lines.append(f"| {r['target']} | {r['precision']} | refused: {r['reason']} |" + " |" * 13)
            continue
        e = r["eager"]
        lines.append(
            f"| {r['target']} | {r['precision']} | {r['gate']} | {_g(r['convert_s'])} | {_g(r['peak_rss_mb'], 4)} | "
            f"{_g(r['size_mb'])} | {_x(r['size_vs_fp32'])} | {_g(r['load_s'])} | "
            f"{_rate(r['prefill_tok_s'])} | {_rate(e['prefill_tok_s'])} | {_x(r['prefill_vs_eager'])} | "
            f"{_rate(r['decode_tok_s'])} | {_rate(e['decode_tok_s'])} | {_x(r['decode_vs_eager'])} | "
            f"{r.get('runs', head['repeats'])} | {_g(r['load_avg_1m'])} |")
    lines += [
        "",
        "convert s = export + convert + optimize + save (LiteRT's torch.export runs inside convert; Core AI int8 "
        "= 8-bit k-means palettization, LiteRT int8 = dynamic-range int8 weights); peak RSS = the highest RSS "
        "sampled during that bundle's pipeline stages (weights, reference, conversion, gate, GPU check), each "
        "bundle in its own fresh process; load s = opening "
        "the saved bundle (Core AI `executable()` lowers it); load avg = 1-minute load average before the timing. Gate: greedy decoding of "
        f"{head['gate_new_tokens']} tokens on each of the {len(head['gate_prompts'])} config prompts, artifact vs "
        "transformers fp32; LiteRT rows include the GPU-delegate check (software Vulkan).",
        "",
        "Token gate per prompt (first divergence = index of the first generated token that differs from "
        "transformers fp32; agreement = tokens before it / tokens generated):",
        "",
        "| target | precision | prompt | verdict | agreement | first divergence | ref top-2 margin there "
        "| min logits cosine | candidate text |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in measured:
        for p in r.get("prompts", []):
            text = (p["candidate_text"] or "").replace("\n", "\\n").replace("|", "\\|")
            lines.append(f"| {r['target']} | {r['precision']} | `{p['prompt']}` | {p['verdict']} | "
                         f"{_g(p['token_agreement'])} | {_g(p['first_divergence'])} | "
                         f"{_g(p['margin_at_divergence'])} | {_g(p['min_logits_cosine'], 7)} | `{text}` |")
    int8 = [r for r in measured if r["precision"] == "int8"]
    thresholds = head["gates"].get("int8", {})
    if int8 and thresholds:
        parts = []
        for metric, threshold in thresholds.items():
            got = ", ".join(f"{r['target']} {_g(r['gate_worst'].get(metric), 6)}" for r in int8)
            parts.append(f"`{metric}` ≥ {threshold:g} (measured worst: {got})")
        lines += ["", "int8 gate thresholds (`gates.int8` in configs/model/gqa-llm.yaml) vs this run: "
                  + "; ".join(parts) + "."]
    return "\n".join(lines)
