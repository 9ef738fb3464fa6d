"""`make demo`: every model through both targets on its embedded default weights, then one gate table.

Extra arguments are Hydra overrides applied to every model (e.g. `out_dir=/tmp/demo`).
"""

from __future__ import annotations

import sys

import zoo.quiet  # noqa: F401
from zoo.cli import returns_exit_code, run_script
from zoo.config import compose_convert
from zoo.console import Console
from zoo.errors import ZooError
from zoo.registry import model_names


@returns_exit_code  # a bad override exits 2 with the fix, as in zoo convert
def main(argv: list[str]) -> int:
    from zoo.pipeline import convert_model

    console = Console()
    results = []
    for name in model_names():
        cfg = compose_convert([f"model={name}", "target=all", *argv])
        try:
            results += convert_model(cfg.model, list(cfg.target.names), out_dir=cfg.out_dir, console=console,
                                     weights_spec=cfg.weights)
        except ZooError as exc:
            console.error(exc)
            return exc.exit_code
    console.summary(results)
    return 0 if all(r.ok for r in results) else 1


if __name__ == "__main__":
    run_script(main, sys.argv[1:])
