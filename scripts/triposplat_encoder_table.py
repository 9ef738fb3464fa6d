"""The TripoSplat image-encoder gate table in models/triposplat/README.md, from the bundles' own report.json files.

    python -m zoo.convert model=triposplat 'component=[image-encoder,vae-encoder]' target=all precision=fp32
    python -m zoo.convert model=triposplat 'component=[image-encoder,vae-encoder]' target=all   # fp16
    python scripts/triposplat_encoder_table.py [exports/triposplat ...]

One row per encoder bundle (a gate-failed one, kept as `<bundle>.failed`, too): the port-vs-library cosine (eager,
before conversion), the artifact's cosine and rel_max_abs vs the library reference, the LiteRT GPU verdict with its
fp32 / fp16 errors vs the CPU interpreter, export + convert + optimize + save seconds and the run's peak RSS so far.
"""

from __future__ import annotations

# the decoder table's cells (one place): worst gate value per metric, the LiteRT GPU verdict with its errors
from triposplat_decoder_table import bundle_reports, gpu_cell, print_table, value  # noqa: E402  (scripts/ is sys.path[0] when run)


def main() -> None:
    rows = []
    for r, head, seconds in bundle_reports("*-encoder"):
        rss = max((s.get("peak_rss_mb") or 0) for s in r.get("stages", []))
        parity = min(r.get("port_parity_cosine", {}).values(), default=float("nan"))
        rows.append((*head, f"{parity:.10g}", value(r["gates"], "cosine"),
                     value(r["gates"], "rel_max_abs", worst_of=max), gpu_cell(r), f"{seconds:.1f}", f"{rss:.0f}"))
    print_table(["component", "target", "precision", "status", "port vs library cosine (eager)", "cosine",
                 "rel_max_abs", "LiteRT GPU", "convert s", "peak RSS MB"], rows)


if __name__ == "__main__":
    main()
