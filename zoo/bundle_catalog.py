"""`zoo catalog [--exports DIR] [--out DIR]`: the state of the zoo at a glance, from every bundle on disk.

Writes `docs/catalog.md` and `docs/catalog.json`: one row per model × component × target × precision —
status (passed / GPU not checked / failed / refused) with a one-line reason, the worst value of every
gate, size, the latency ratio of the model's last bench, the weights' source (tiny / hub / ...), the build
date and the content key. Nothing
in it is typed by hand: `zoo convert-all` rewrites it after every run.

(Not to be confused with `zoo list` (zoo/catalog.py: what the models declare) or zoo/catalog_entry.py
(entries for Apple's coreai-catalog).)
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from zoo.bundle import MANIFEST, REPORT, write_json
from zoo.cli import returns_exit_code, run_script
from zoo.registry import load_model_config, model_config_files

FAILED_SUFFIX = ".failed"
GPU_NOT_CHECKED = "GPU: not checked"
REASON_CHARS = 160


def bundle_folders(exports: Path) -> list[Path]:
    """Every bundle folder under `exports` (live ones and `.failed` ones), skipping hidden folders (staging,
    convert-all's run folders)."""
    found = []
    for manifest in sorted(Path(exports).rglob(MANIFEST)):
        rel = manifest.parent.relative_to(exports)
        if any(part.startswith(".") for part in rel.parts):
            continue
        found.append(manifest.parent)
    return found


def one_line(text: str) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= REASON_CHARS else text[: REASON_CHARS - 1] + "…"


def gate_summary(gate_dicts: list[dict]) -> tuple[dict, list[str]]:
    """({metric: worst value}, [failing gates, described]) from a report's gates."""
    from zoo.gates import GateResult, worst

    results = [GateResult(**g) for g in gate_dicts]
    worst_values = {m: worst(results, m) for m in dict.fromkeys(g.metric for g in results)}
    return ({m: (v if v == v else "nan") for m, v in worst_values.items()},
            [g.describe() for g in results if not g.passed])


def status_of(report: dict, failing: list[str]) -> tuple[str, str]:
    """(status, one-line reason) as the catalog shows it."""
    status, note = report.get("status"), report.get("status_note") or ""
    if status == "passed":
        if note.startswith(GPU_NOT_CHECKED):
            return "GPU not checked", one_line(note.split("—", 1)[-1].strip())
        return "passed", one_line(note)
    if status == "gate_failed":
        return "failed", one_line("gate failed: " + "; ".join(failing))
    return "failed", one_line(report.get("error") or f"status {status}")


def bench_latency(model: str, component: str, target: str, precision: str) -> float | None:
    """latency vs eager from the model's last bench (bench size, this target × precision), if it measured one."""
    path = model_config_files().get(model)
    if path is None:
        return None
    try:
        rows = json.loads((path.parent / "bench.json").read_text()).get("rows", [])
    except (OSError, ValueError):
        return None
    for row in rows:
        if row.get("target") == target and row.get("precision") == precision and row.get("component", component) == component:
            value = row.get("latency_vs_eager", (row.get("measure") or {}).get("latency_vs_eager"))
            return value if isinstance(value, (int, float)) else None
    return None


def bundle_row(folder: Path) -> dict:
    manifest = json.loads((folder / MANIFEST).read_text())
    report = json.loads((folder / REPORT).read_text()) if (folder / REPORT).is_file() else {}
    worst, failing = gate_summary(report.get("gates") or manifest.get("gates") or [])
    status, reason = status_of(report or manifest, failing)
    model, component = manifest["model"], manifest["component"]
    created = report.get("created_unix")
    return {
        "model": model, "component": component, "target": manifest["target"], "precision": manifest["precision"],
        "status": status, "reason": reason, "gates": worst,
        "bytes": sum(f["bytes"] for f in manifest.get("files", {}).values()),
        "latency_vs_eager": bench_latency(model, component, manifest["target"], manifest["precision"]),
        "date": time.strftime("%Y-%m-%d", time.gmtime(created)) if created else "",
        "created_unix": created or 0,
        "content_key": (manifest.get("content_key") or {}).get("sha256", ""),
        "weights": (manifest.get("weights") or {}).get("source", ""),
        "path": str(folder),
    }


def refused_rows(models: set[str]) -> list[dict]:
    """What a model's config refuses (e.g. T5 fp16 on Core AI) is a cell of the matrix too, with its reason."""
    rows = []
    for model in sorted(models):
        cfg = load_model_config(model)
        for target, refusals in (cfg.get("refused_precisions") or {}).items():
            for precision, reason in refusals.items():
                rows.append({"model": model, "component": "*", "target": target, "precision": precision,
                             "status": "refused", "reason": one_line(reason), "gates": {}, "bytes": 0,
                             "latency_vs_eager": None, "date": "", "created_unix": 0, "content_key": "",
                             "weights": "", "path": ""})
    return rows


def catalog_rows(exports: Path) -> list[dict]:
    """One row per model × component × target × precision: the newest of its live and `.failed` bundles
    (a failed rebuild keeps the older good bundle live; the row says so)."""
    cells: dict[tuple, dict] = {}
    for folder in bundle_folders(exports):
        row = bundle_row(folder)
        cell = (row["model"], row["component"], row["target"], row["precision"])
        kept = cells.get(cell)
        if kept is None or row["created_unix"] > kept["created_unix"]:
            if kept is not None and kept["status"] != "failed" and row["status"] == "failed":
                row["reason"] = one_line(f"{row['reason']} (the older {kept['status']} bundle stays live)")
            cells[cell] = row
    rows = list(cells.values()) + refused_rows({m for m, *_ in cells if m in model_config_files()})
    return sorted(rows, key=lambda r: (r["model"], r["component"], r["target"], r["precision"]))


def _gates_text(gates: dict) -> str:
    return ", ".join(f"{m} {v:.6g}" if isinstance(v, float) else f"{m} {v}" for m, v in gates.items())


def catalog_markdown(rows: list[dict], exports: Path) -> str:
    lines = [
        "# zoo catalog",
        "",
        f"Every bundle under `{exports}`, generated by `zoo catalog` (rewritten by `zoo convert-all`). "
        "Status: passed / GPU not checked / failed / refused, with the reason in one line. Gates: the worst "
        "value of each metric. Latency: the model's last `make bench` (bench size), bundle vs eager torch.",
        "",
        "| model | component | target | precision | status | reason | gates | size | latency vs eager | weights | date | content key |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        size = f"{r['bytes'] / 2**20:.2f} MiB" if r["bytes"] else "–"
        latency = f"{r['latency_vs_eager']:g}×" if r["latency_vs_eager"] is not None else "–"
        cells = [r["model"], r["component"], r["target"], r["precision"], r["status"], r["reason"] or "",
                 _gates_text(r["gates"]) or "–", size, latency, r["weights"] or "–", r["date"] or "–",
                 r["content_key"][:12] or "–"]
        lines.append("| " + " | ".join(str(c).replace("|", "\\|") for c in cells) + " |")
    return "\n".join(lines) + "\n"


def write_catalog(exports: Path, out_dir: Path) -> list[dict]:
    rows = catalog_rows(Path(exports))
    out_dir.mkdir(parents=True, exist_ok=True)
    shown = exports_label(Path(exports))
    write_json(out_dir / "catalog.json", {"exports": shown, "bundles": [
        {k: v for k, v in r.items() if k != "created_unix"} | {"path": _relative(r["path"])} for r in rows]})
    (out_dir / "catalog.md").write_text(catalog_markdown(rows, shown))
    return rows


def exports_label(exports: Path) -> str:
    return _relative(str(exports)) or str(exports)


def _relative(path: str) -> str:
    """Inside the project: relative to it (the committed catalog must not name one machine's checkout)."""
    from zoo.registry import ROOT

    if not path:
        return ""
    try:
        return str(Path(path).resolve().relative_to(ROOT))
    except ValueError:
        return path


@returns_exit_code
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="zoo catalog", description=__doc__.split("\n\n")[0])
    parser.add_argument("--exports", default="exports", help="folder holding the bundles (default: exports)")
    parser.add_argument("--out", default="docs", help="where catalog.md and catalog.json go (default: docs)")
    args = parser.parse_args(argv)
    rows = write_catalog(Path(args.exports), Path(args.out))
    print(f"{len(rows)} rows -> {Path(args.out) / 'catalog.md'}, {Path(args.out) / 'catalog.json'}")
    return 0


if __name__ == "__main__":
    run_script(main)
