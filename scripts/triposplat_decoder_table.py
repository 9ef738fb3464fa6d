"""The TripoSplat decoder gate table in models/triposplat/README.md, from the bundles' own report.json files.

    python -m zoo.convert model=triposplat 'component=[octree-decoder,gaussian-decoder]' target=all precision=fp32
    python -m zoo.convert model=triposplat 'component=[octree-decoder,gaussian-decoder]' target=all   # fp16
    python scripts/triposplat_decoder_table.py [exports/triposplat ...]

One row per decoder bundle (a gate-failed bundle, kept as `<bundle>.failed`, too): the whole-output cosine, the lowest named-slice
cosine (Gaussian decoder) or the lowest per-level cosine, lowest per-level child-logit (channel) cosine and largest
per-level rel. max-abs over the 8 octree levels, the colour gate's two deviations, the LiteRT GPU verdict with its fp32 / fp16 errors vs the CPU interpreter,
and export + convert + optimize + save seconds.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

ORDER = {"fp32": 0, "fp16": 1, "bf16": 2, "int8": 3}


def value(gates: list[dict], metric: str, output: str | None = None, worst_of=min) -> str:
    values = [g["value"] for g in gates if g["metric"] == metric and (output is None or output(g["output"]))]
    return f"{worst_of(values):.7g}" if values else "—"


def gpu_cell(report: dict) -> str:
    if report["target"] != "litert":
        return "—"
    gpu = report.get("gpu") or {}
    parts = [gpu.get("status", "not run")]
    for metric, label in (("gpu_fp32_rel_err", "fp32 rel"), ("gpu_fp16_rel_err", "fp16 rel")):
        values = [g["value"] for g in report["gates"] if g["metric"] == metric]
        if values:
            parts.append(f"{label} {max(values):.2g}")
    return ", ".join(parts)


def bundle_reports(pattern: str):
    """(report, row head, conversion seconds) for every bundle matching `pattern` under the folders on the command
    line: the head is component, target, sort key, precision and status (a gate-failed bundle is kept as .failed)."""
    folders = [Path(p) for p in sys.argv[1:]] or [Path("exports/triposplat")]
    for folder in folders:
        for path in folder.glob(f"{pattern}/*/report.json"):
            r = json.loads(path.read_text())
            stages = {s["name"]: s for s in r.get("stages", [])}
            seconds = sum(stages.get(n, {}).get("seconds", 0) or 0 for n in ("export", "convert", "optimize", "save"))
            head = (r["component"], r["target"], ORDER.get(r["precision"], 9), r["precision"],
                    r["status"] + (" (kept as .failed)" if path.parent.name.endswith(".failed") else ""))
            yield r, head, seconds


def print_table(header: list[str], rows: list[tuple]) -> None:
    print("| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header))
    for row in sorted(rows):
        print("| " + " | ".join(str(c) for i, c in enumerate(row) if i != 2) + " |")   # column 2: the sort key


def main() -> None:
    rows = []
    for r, head, seconds in bundle_reports("*-decoder"):
        g = r["gates"]
        octree = r["component"] == "octree-decoder"
        rows.append((*head,
                     value(g, "cosine", lambda o: "[" not in o and "levels" not in o),
                     value(g, "min_step_cosine") if octree else value(g, "cosine", lambda o: "[" in o),
                     value(g, "min_step_channel_cosine") if octree else "—",
                     value(g, "max_step_rel_max_abs", worst_of=max) if octree else "—",
                     value(g, "rgb_std_deviation", worst_of=max), value(g, "chroma_deviation", worst_of=max),
                     gpu_cell(r), f"{seconds:.1f}"))
    print_table(["component", "target", "precision", "status", "cosine", "min slice / level cosine",
                 "min level channel cosine", "max level rel max-abs", "rgb_std_deviation", "chroma_deviation",
                 "LiteRT GPU", "convert s"], rows)


if __name__ == "__main__":
    main()
