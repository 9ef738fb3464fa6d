"""The TripoSplat background-remover gate table in models/triposplat/README.md, from the bundles' own report.json files.

    python -m zoo.convert model=triposplat component=background-remover target=all precision=fp32
    python -m zoo.convert model=triposplat component=background-remover target=all   # fp16
    python -m zoo.convert model=triposplat component=background-remover target=coreai precision=fp32 \
        'model.background.pixel_mean=[0.5,0.5,0.5]' 'model.background.pixel_std=[0.5,0.5,0.5]'   # must fail
    python -m zoo.convert model=triposplat component=background-remover target=coreai precision=bf16
    python -m zoo.convert model=triposplat component=background-remover target=all precision=int8
    python scripts/triposplat_background_table.py [exports/triposplat ...]

One row per background-remover bundle (a gate-failed one, kept as `<bundle>.failed`, too): the matte's cosine and
rel_max_abs vs the eager port (gather sampler, upstream's constants), the LiteRT GPU verdict with its fp32 / fp16
errors vs the CPU interpreter, export + convert + optimize + save seconds, the GPU check's seconds and the run's
peak RSS so far.
"""

from __future__ import annotations

# the decoder table's cells (one place): worst gate value per metric, the LiteRT GPU verdict with its errors
from triposplat_decoder_table import bundle_reports, gpu_cell, print_table, value  # noqa: E402  (scripts/ is sys.path[0] when run)


def main() -> None:
    rows = []
    for r, head, seconds in bundle_reports("background-remover"):
        stages = {s["name"]: s for s in r.get("stages", [])}
        rss = max((s.get("peak_rss_mb") or 0) for s in r.get("stages", []))
        gpu_seconds = (stages.get("gpu_check") or {}).get("seconds")
        rows.append((*head, value(r["gates"], "cosine"), value(r["gates"], "rel_max_abs", worst_of=max), gpu_cell(r),
                     f"{seconds:.1f}", "—" if gpu_seconds is None else f"{gpu_seconds:.1f}", f"{rss:.0f}"))
    print_table(["component", "target", "precision", "status", "cosine", "rel_max_abs", "LiteRT GPU", "convert s",
                 "GPU check s", "peak RSS MB"], rows)


if __name__ == "__main__":
    main()
