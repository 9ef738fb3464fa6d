"""`make bench MODEL=t5`: conversion cost, runtime latency vs eager torch, and size, in one run.

Every precision each target supports is converted at the model's bench size (for T5: the real
t5-v1_1-base architecture with seeded random weights), gated like any bundle, then timed against eager
torch on the same inputs in the same process — ratios, because these machines are noisy. Writes
`models/<model>/bench.json` and regenerates the README's Measured table.
"""

from __future__ import annotations

import json
import platform
import statistics
import sys
import tempfile
import time
from datetime import date
from pathlib import Path

import zoo.quiet  # noqa: F401
import numpy as np
import torch
from omegaconf import OmegaConf

from zoo.card import measured_table, update_readme
from zoo.config import compose_convert
from zoo.console import Console
from zoo.errors import ZooError
from zoo.pipeline import convert_model, to_numpy
from zoo.registry import ROOT, get_spec
from zoo.targets import TARGET_NAMES, get_target
from zoo.weights import resolve

CONVERT_STAGES = ("export", "convert", "optimize", "save")


def median_ms(fn, repeats: int) -> float:
    fn()  # warm-up: first calls pay for allocation, XNNPACK packing, lazy loading
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def bundle_latency_ms(target_name: str, path: Path, inputs: dict[str, np.ndarray], repeats: int) -> float:
    runner = get_target(target_name).open(path / get_target(target_name).artifact)
    try:
        return median_ms(lambda: runner.run("main", inputs), repeats)
    finally:
        runner.close()


def row_from(result, eager_ms: float, latency_ms: float) -> dict:
    """`eager_ms` is measured right before `latency_ms`, so both saw the same machine load."""
    stages = {s["name"]: s for s in result.stages}
    return {
        "target": result.target, "precision": result.precision, "status": result.status,
        "gate": "; ".join(f"{g.metric} {g.value:.6g}" for g in result.gates) + ("" if result.ok else " (FAILED)"),
        "convert_s": round(sum(stages[n]["seconds"] for n in CONVERT_STAGES if n in stages), 2),
        "peak_rss_mb": max(s["peak_rss_mb"] for s in result.stages),
        "latency_ms": round(latency_ms, 2), "eager_ms": round(eager_ms, 2),
        "latency_vs_eager": round(latency_ms / eager_ms, 3),
        "size_mb": round(result.bytes / 1e6, 2),
    }


def in_fresh_process(fn, *args):
    """Run fn(*args) in a new spawned interpreter: peak RSS per bundle is then that bundle's own, not
    the high-water mark of every conversion before it (measured: the T5 bench's peak-RSS column climbed
    3049 -> 5405 MB over seven bundles in one process)."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    with ProcessPoolExecutor(max_workers=1, mp_context=multiprocessing.get_context("spawn")) as pool:
        return pool.submit(fn, *args).result()


def bench_config(model: str, overrides: list[str]):
    cfg = compose_convert([f"model={model}", *overrides]).model
    return OmegaConf.merge(cfg, {"variant": cfg.bench.variant})


def measure_bundle(model: str, overrides: list[str], target: str, precision: str, out: str) -> dict:
    """One bundle, meant for a fresh process: convert + gate it, then time eager torch and the artifact
    back to back on the same inputs. Returns its table row plus `bytes` and `weights` (provenance)."""
    cfg = bench_config(model, overrides)
    bench = cfg.bench
    spec = get_spec(cfg)
    component = spec.components[0]
    checkpoint = resolve(cfg, bench.weights, spec.tiny_dir, spec.random_checkpoint)
    inputs = component.example_inputs(checkpoint, cfg)
    reference = component.reference(checkpoint, cfg)
    console = Console()
    console.begin(model, component.name, target, precision)
    [result] = convert_model(cfg, [target], precision=precision, out_dir=Path(out), console=console,
                             weights_spec=bench.weights)
    if result.status == "error":
        return {"error": result.error}
    with torch.no_grad():
        baseline = median_ms(lambda: reference(*inputs.values()), int(bench.repeats))
    latency = bundle_latency_ms(target, result.path, to_numpy(inputs), int(bench.repeats))
    return {**row_from(result, baseline, latency), "bytes": result.bytes,
            "weights": f"{bench.weights} ({checkpoint.provenance.get('note', checkpoint.source)}), variant {bench.variant}"}


def run_bench(model: str, overrides: list[str], console: Console) -> dict:
    """Every (target, precision) the config allows, each bundle in its own fresh process."""
    cfg = bench_config(model, overrides)
    rows, weights = [], None
    with tempfile.TemporaryDirectory(prefix="zoo-bench-") as out:
        for target in TARGET_NAMES:
            fp32_bytes = None
            for precision in get_target(target).precisions:
                refusal = (cfg.get("refused_precisions") or {}).get(target, {}).get(precision)
                if refusal:
                    rows.append({"target": target, "precision": precision, "status": "refused",
                                 "reason": refusal.split(" (")[0]})
                    continue
                row = in_fresh_process(measure_bundle, model, overrides, target, precision, out)
                if "error" in row:
                    raise ZooError(f"bench conversion {target}-{precision} failed: {row['error']}",
                                   "fix the conversion first (make convert shows the failing stage).")
                nbytes, weights = row.pop("bytes"), row.pop("weights")
                fp32_bytes = fp32_bytes or (nbytes if precision == "fp32" else None)
                row["size_vs_fp32"] = round(nbytes / fp32_bytes, 3) if fp32_bytes else None
                rows.append(row)
    return {
        "header": {
            "command": f"make bench MODEL={model}", "date": date.today().isoformat(),
            "machine": f"{platform.machine()}, {torch.get_num_threads()} threads, Python {platform.python_version()}",
            "weights": weights, "repeats": int(cfg.bench.repeats),
            "process": "each bundle converted, gated and timed in its own fresh process",
        },
        "rows": rows,
    }


def main(argv: list[str]) -> int:
    overrides = [a for a in argv if not a.startswith("model=")]
    model = next((a.split("=", 1)[1] for a in argv if a.startswith("model=")), "t5")
    console = Console()
    try:
        cfg = compose_convert([f"model={model}", *overrides])
        hooks = get_spec(cfg.model).meta  # a model with its own bench (e.g. an LLM) registers meta["bench"]
        data = hooks["bench"](cfg, console) if "bench" in hooks else run_bench(model, overrides, console)
    except ZooError as exc:
        console.error(exc)
        return exc.exit_code
    folder = ROOT / "models" / cfg.model.package.split(".")[-1]
    (folder / "bench.json").write_text(json.dumps(data, indent=2) + "\n")
    table = hooks.get("bench_table", measured_table)(data)
    update_readme(folder / "README.md", table)
    console.rich.print(table)
    return 0 if all(r.get("status") in ("passed", "refused") for r in data["rows"]) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
