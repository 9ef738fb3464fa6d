"""The TripoSplat DiT gate table in models/triposplat/README.md, from the bundles' own report.json files.

    python -m zoo.convert model=triposplat target=all precision=fp32      # and precision=fp16 / bf16 / int8
    python scripts/triposplat_gate_table.py [exports/triposplat]

One row per (target, precision) bundle of the dit: the worst value of each gate over both outputs, the LiteRT GPU
verdict and its fp32 / fp16 errors vs the CPU interpreter, conversion time and peak RSS of the convert stage.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

COLUMNS = ("min_step_cosine", "min_step_channel_cosine", "max_step_rel_max_abs", "free_run_cosine", "free_run_rel_max_abs")
ORDER = {"fp32": 0, "fp16": 1, "bf16": 2, "int8": 3}


def worst(gates: list[dict], metric: str) -> str:
    values = [g["value"] for g in gates if g["metric"] == metric]
    if not values:
        return "not run"
    higher = metric.endswith("cosine")
    return f"{(min(values) if higher else max(values)):.7g}"


def gpu_cell(report: dict) -> str:
    gpu = report.get("gpu") or {}
    if report["target"] != "litert":
        return "—"
    status = gpu.get("status", "not run")
    errors = {}
    for g in report["gates"]:   # one per output: the worst
        if g["metric"].startswith("gpu_") and g["metric"].endswith("rel_err"):
            errors[g["metric"]] = max(errors.get(g["metric"], 0.0), g["value"])
    parts = [status]
    if "gpu_fp32_rel_err" in errors:
        parts.append(f"fp32 rel {errors['gpu_fp32_rel_err']:.2g}")
    if "gpu_fp16_rel_err" in errors:
        parts.append(f"fp16 rel {errors['gpu_fp16_rel_err']:.2g}")
    return ", ".join(parts)


def main() -> None:
    folder = Path(sys.argv[1] if len(sys.argv) > 1 else "exports/triposplat")
    rows = []
    for path in folder.glob("**/report.json"):
        report = json.loads(path.read_text())
        if report.get("component") != "dit":
            continue
        stages = {s["name"]: s for s in report.get("stages", [])}
        convert_s = sum(stages.get(n, {}).get("seconds", 0) or 0 for n in ("export", "convert", "optimize", "save"))
        peak = max((s.get("peak_rss_mb") or 0) for s in stages.values()) if stages else 0
        calls = len((report.get("sampler_steps") or {}).get("calls", []))
        rows.append((report["target"], ORDER.get(report["precision"], 9), report["precision"], report["status"], calls,
                     *(worst(report["gates"], m) for m in COLUMNS), gpu_cell(report), f"{convert_s:.1f}", f"{peak:.0f}"))
    print("| target | precision | status | gated calls | " + " | ".join(COLUMNS) + " | LiteRT GPU | convert s | peak RSS MB (whole run) |")
    print("|" + "---|" * (len(COLUMNS) + 7))
    for row in sorted(rows):
        target, _, *cells = row
        print("| " + " | ".join([target, *map(str, cells)]) + " |")


if __name__ == "__main__":
    main()
