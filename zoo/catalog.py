"""`python -m zoo.catalog` (`make list`): models, components, targets and default precisions."""

from __future__ import annotations

import zoo.quiet  # noqa: F401
from rich.console import Console
from rich.table import Table

from zoo.registry import get_spec, load_model_config, model_names
from zoo.targets import TARGET_NAMES, get_target


def catalog_rows() -> list[dict]:
    rows = []
    for name in model_names():
        cfg = load_model_config(name)
        spec = get_spec(cfg)
        rows.append({
            "model": name,
            "summary": spec.summary,
            "components": [c.name + (" (generative)" if c.generative else "") for c in spec.components],
            "gpu_fp32_only": dict(cfg.gpu.fp32_only),
            "defaults": {t: cfg.default_precision[t] for t in TARGET_NAMES},
            "component_defaults": {c: dict(v) for c, v in (cfg.get("component_precision") or {}).items()},
            "precisions": {t: list(get_target(t).precisions) for t in TARGET_NAMES},
            "refused": {t: list(v) for t, v in (cfg.get("refused_precisions") or {}).items()},
            "weights": cfg.weights,
            "variants": list(cfg.get("variants", {})),
        })
    return rows


def main() -> None:
    table = Table(title="zoo models")
    for col in ("model", "components", "default weights", "Core AI default", "LiteRT default", "also", "about"):
        table.add_column(col)
    for row in catalog_rows():
        also = "; ".join(
            f"{t}: {', '.join(p for p in row['precisions'][t] if p != row['defaults'][t] and p not in row['refused'].get(t, []))}"
            for t in TARGET_NAMES
        )
        refused = "; ".join(f"{t} refuses {', '.join(v)} (precision.force=true)" for t, v in row["refused"].items())
        if row["gpu_fp32_only"]:
            refused += f"\nLiteRT GPU: fp32 only at {', '.join(row['gpu_fp32_only'])}"
        defaults = {t: row["defaults"][t] + "".join(f"\n({c}: {v[t]})" for c, v in row["component_defaults"].items() if t in v)
                    for t in TARGET_NAMES}
        table.add_row(row["model"], ", ".join(row["components"]), row["weights"], defaults["coreai"],
                      defaults["litert"], also + (f"\n{refused}" if refused else ""), row["summary"])
    Console(width=160).print(table)
    print("targets: coreai (.aimodel, Core AI CPU runtime here), litert (.tflite, CPU interpreter)")


if __name__ == "__main__":
    main()
