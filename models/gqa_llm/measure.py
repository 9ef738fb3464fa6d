"""Measure one target end to end on real or tiny weights: convert, save, load, gate, time.

    python -m models.gqa_llm.measure --target coreai --weights smollm2 --out /tmp/gqa/coreai.json
    python -m models.gqa_llm.measure --target litert --weights tiny

Run one target per process: peak RSS (ru_maxrss) is per process, so the number printed is the
peak of "load weights + convert + save + run" for that target alone. Writes a JSON report with
stage times, peak RSS, file size, per-call latencies and the token gate's transcripts.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from . import generation as gen
from . import weights as W
from .model import GQAForCausalLM

DEFAULT_CACHE = Path(__file__).resolve().parents[2] / ".cache" / "gqa_llm"


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def checkpoint(weights: str, cache: Path) -> Path:
    if weights == "smollm2":
        return W.ensure_smollm2(cache / "smollm2-135m-instruct")
    return W.make_tiny_checkpoint(cache / "tiny")


def latency(fn, repeats: int) -> dict:
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return {"median_ms": round(1000 * float(np.median(times)), 3), "min_ms": round(1000 * min(times), 3),
            "repeats": repeats}


def run(target: str, weights: str, context_len: int, prefill_len: int, new_tokens: int, out_dir: Path,
        cache: Path, prompts: tuple[str, ...], threads: int | None = None) -> dict:
    report: dict = {"target": target, "weights": weights, "context_len": context_len,
                    "torch_threads": torch.get_num_threads(), "load_avg_at_start": os.getloadavg()[0]}
    t0 = time.perf_counter()
    folder = checkpoint(weights, cache)
    lm = GQAForCausalLM.from_pretrained(folder)
    reference = W.load_reference(folder)
    tokenizer = W.load_tokenizer(folder)
    report["load_s"] = round(time.perf_counter() - t0, 2)
    report["rss_after_load_mb"] = round(peak_rss_mb(), 1)

    t0 = time.perf_counter()
    if target == "coreai":
        from . import export_coreai as ex

        report["convert_stages"] = {}
        program = ex.convert(lm, context_len, report["convert_stages"])
        report["convert_s"] = round(time.perf_counter() - t0, 2)
        t0 = time.perf_counter()
        path = ex.save(program, out_dir / f"gqa-llm-{weights}.aimodel")
        del program
        session_cls = ex.CoreAISession
        size = sum(f.stat().st_size for f in path.rglob("*") if f.is_file())
    else:
        from . import export_litert as ex

        report["prefill_len"] = prefill_len
        path = ex.convert(lm, context_len, prefill_len, out_path=out_dir / f"gqa-llm-{weights}.tflite")
        report["convert_s"] = round(time.perf_counter() - t0, 2)
        t0 = time.perf_counter()
        session_cls = lambda p: ex.LiteRTSession(p, num_threads=threads)  # noqa: E731
        size = path.stat().st_size
        op_report = ex.op_report(path)
        report["ops"] = op_report["ops"]
        report["max_rank"] = op_report["max_rank"]
        report["gpu_clean_findings"] = ex.gpu_clean_findings(op_report)
    report["save_s"] = round(time.perf_counter() - t0, 2)
    report["file_mb"] = round(size / 2**20, 1)
    report["rss_after_convert_mb"] = round(peak_rss_mb(), 1)

    t0 = time.perf_counter()
    with session_cls(path) as session:
        report["session_open_s"] = round(time.perf_counter() - t0, 2)
        gates = []
        for prompt in prompts:
            ids = tokenizer(prompt).input_ids
            ref = gen.greedy(gen.hf_step(reference), ids, new_tokens)
            t0 = time.perf_counter()
            cand = gen.greedy(session.step, ids, new_tokens)
            elapsed = time.perf_counter() - t0
            result = gen.token_exact_gate(ref, cand, decode=tokenizer.decode, prompt_text=prompt)
            result.transcript["generate_s"] = round(elapsed, 3)
            gates.append(result.transcript)
        report["gates"] = gates
        ids = tokenizer(prompts[0]).input_ids
        report["prompt_tokens"] = len(ids)
        report["prefill_latency"] = latency(lambda: session.step(ids, 0), 5)
        for n in (64, 256):
            if n < context_len:
                report[f"prefill_latency_{n}_tokens"] = latency(lambda: session.step(list(range(n)), 0), 3)
        report["decode_latency"] = latency(lambda: session.step([ids[-1]], len(ids)), 20)
    report["peak_rss_mb"] = round(peak_rss_mb(), 1)
    report["load_avg_at_end"] = os.getloadavg()[0]
    report["path"] = str(path)
    return report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--target", choices=["coreai", "litert"], required=True)
    parser.add_argument("--weights", choices=["smollm2", "tiny"], default="smollm2")
    parser.add_argument("--context-len", type=int, default=512)
    parser.add_argument("--prefill-len", type=int, default=64)
    parser.add_argument("--new-tokens", type=int, default=gen.DEFAULT_NEW_TOKENS)
    parser.add_argument("--out-dir", type=Path, default=None)
    parser.add_argument("--cache", type=Path, default=DEFAULT_CACHE)
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--threads", type=int, default=None,
                        help="torch and LiteRT threads (default: torch's). Use 1 on a shared machine: with "
                             "2 OpenMP threads and another busy process on 2 cores, small matmuls ran ~30x slower")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    out_dir = args.out_dir or Path(tempfile.mkdtemp(prefix="gqa-llm-"))
    report = run(args.target, args.weights, args.context_len, args.prefill_len, args.new_tokens, out_dir,
                 args.cache, gen.DEFAULT_PROMPTS, args.threads)
    text = json.dumps(report, indent=2)
    if args.json:
        args.json.write_text(text + "\n")
    summary = {k: v for k, v in report.items() if k not in ("gates", "ops")}
    summary["verdicts"] = [(g["prompt_text"], g["verdict"], g["min_logits_cosine"]) for g in report["gates"]]
    print(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
