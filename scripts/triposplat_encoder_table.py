"""The TripoSplat image-encoder gate table in models/triposplat/README.md, from the bundles' own report.json files.

    python -m zoo.convert model=triposplat 'component=[image-encoder,vae-encoder]' target=all precision=fp32
    python -m zoo.convert model=triposplat 'component=[image-encoder,vae-encoder]' target=all   # fp16
    python scripts/triposplat_encoder_table.py [exports/triposplat ...]

One row per encoder bundle (a gate-failed one, kept as `<bundle>.failed`, too): the port-vs-library cosine (eager,
before conversion), the artifact's cosine and rel_max_abs vs the library reference, the LiteRT GPU verdict with its
fp32 / fp16 errors vs the CPU interpreter, export + convert + optimize + save seconds and the run's peak RSS so far.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

# the decoder table's cells (one place): worst gate value per metric, the LiteRT GPU verdict with its errors
from triposplat_decoder_table import ORDER, gpu_cell, value  # noqa: E402  (scripts/ is sys.path[0] when run)


def main() -> None:
    folders = [Path(p) for p in sys.argv[1:]] or [Path("exports/triposplat")]
    rows = []
    for folder in folders:
        for path in folder.glob("*-encoder/*/report.json"):
            r = json.loads(path.read_text())
            g = r["gates"]
            stages = {s["name"]: s for s in r.get("stages", [])}
            seconds = sum(stages.get(n, {}).get("seconds", 0) or 0 for n in ("export", "convert", "optimize", "save"))
            rss = max((s.get("peak_rss_mb") or 0) for s in r.get("stages", []))
            parity = min(r.get("port_parity_cosine", {}).values(), default=float("nan"))
            rows.append((r["component"], r["target"], ORDER.get(r["precision"], 9), r["precision"],
                         r["status"] + (" (kept as .failed)" if path.parent.name.endswith(".failed") else ""),
                         f"{parity:.10g}", value(g, "cosine"), value(g, "rel_max_abs", worst_of=max), gpu_cell(r),
                         f"{seconds:.1f}", f"{rss:.0f}"))
    print("| component | target | precision | status | port vs library cosine (eager) | cosine | rel_max_abs "
          "| LiteRT GPU | convert s | peak RSS MB |")
    print("|" + "---|" * 10)
    for row in sorted(rows):
        print("| " + " | ".join(str(c) for i, c in enumerate(row) if i != 2) + " |")


if __name__ == "__main__":
    main()
