"""`python -m zoo.convert model=t5 [target=coreai|litert|all] [precision=...] [weights=...]`

One model through the requested targets; prints a line per stage and a summary table; exits 0 only if
every bundle passed its gates (1: a gate failed; 2: bad input or a failed stage).
"""

from __future__ import annotations

import sys

import zoo.quiet  # noqa: F401  (before the toolchains are imported)
import hydra
from omegaconf import DictConfig

from zoo.console import Console
from zoo.errors import ZooError
from zoo.registry import CONFIG_DIR, check_choices


def run(cfg: DictConfig, console: Console | None = None) -> int:
    from zoo.pipeline import convert_model

    console = console or Console()
    results = convert_model(
        cfg.model, list(cfg.target.names), precision=cfg.precision.name, force_precision=bool(cfg.precision.force),
        out_dir=cfg.out_dir, console=console, weights_spec=cfg.weights, no_wait=bool(cfg.get("no_wait", False)),
    )
    console.summary(results)
    if any(r.status == "error" for r in results):
        for r in results:
            if r.error:
                console.rich.print(f"[red]{r.target}-{r.precision}:[/] {r.error}")
        return 2
    if not all(r.ok for r in results):
        console.rich.print("[red]A gate failed:[/] the failing bundle is kept in <bundle>.failed/ for inspection; "
                           "the previous good bundle (if any) is untouched.")
        return 1
    return 0


@hydra.main(version_base="1.3", config_path=str(CONFIG_DIR), config_name="convert")
def _hydra_main(cfg: DictConfig) -> None:
    console = Console()
    try:
        code = run(cfg, console)
    except ZooError as exc:
        console.error(exc)
        code = exc.exit_code
    if code:
        sys.exit(code)


def main() -> None:
    try:
        check_choices(sys.argv[1:])
    except ZooError as exc:
        Console().error(exc)
        sys.exit(exc.exit_code)
    _hydra_main()


if __name__ == "__main__":
    main()
