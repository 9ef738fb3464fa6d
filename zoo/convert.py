"""`python -m zoo.convert model=t5 [target=coreai|litert|all] [precision=...] [weights=...]`
`python -m zoo.convert module=pkg.mod:factory [fix=true] [ignore=[rule-id,...]]`: any user module (a factory
returning `(module, example_inputs)`) through the same pipeline, gated against the original module
(zoo/user_module.py).

One model through the requested targets; prints a line per stage and a summary table; exits 0 only if
every bundle passed its gates (1: a gate failed; 2: bad input or a failed stage).

A Hydra multirun (`-m model=t5 precision=fp32,int8 hydra/launcher=zoo_joblib`) runs each combination as a
job, in parallel processes with the joblib launcher (configs/hydra/launcher/zoo_joblib.yaml: as many at
once as cores and memory allow). Every job runs to its end; the exit status is the worst job's.
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

import zoo.quiet  # noqa: F401  (before the toolchains are imported)
import hydra
from omegaconf import DictConfig, ListConfig, OmegaConf
from rich.markup import escape

from zoo.bundle import temp_prefix
from zoo.cli import check_overrides, error_boundary, run_script, translated_errors
from zoo.console import Console
from zoo.errors import ZooError
from zoo.registry import CONFIG_DIR, check_choices, register_model_configs


def run(cfg: DictConfig, console: Console | None = None) -> int:
    from zoo.pipeline import convert_model

    console = console or Console()
    results = convert_model(
        model_config(cfg), list(cfg.target.names), precision=cfg.precision.name, force_precision=bool(cfg.precision.force),
        out_dir=cfg.out_dir, console=console, weights_spec=cfg.weights, no_wait=bool(cfg.get("no_wait", False)),
        components=selected_components(cfg.get("component")),
    )
    console.summary(results)
    if any(r.status == "error" for r in results):
        for r in results:
            if r.error:
                console.rich.print(f"[red]{r.target}-{r.precision}:[/] {escape(r.error)}")
        return 2
    if not all(r.ok for r in results):
        console.rich.print("[red]A gate failed:[/] the failing bundle is kept in <bundle>.failed/ for inspection; "
                           "the previous good bundle (if any) is untouched.")
        return 1
    return 0


def selected_components(value) -> list[str] | None:
    """`component=NAME` or `component=[A,B]` -> names; unset -> None (every component)."""
    if not value:
        return None
    return [str(v) for v in value] if isinstance(value, (list, ListConfig)) else [str(value)]


def model_config(cfg: DictConfig):
    """The model config to convert: `model`, or the one synthesized for `module=pkg.mod:factory`."""
    if cfg.get("module"):
        from zoo.user_module import module_config

        return module_config(str(cfg.module), bool(cfg.get("fix")), list(cfg.get("ignore") or []))
    if cfg.get("fix") or cfg.get("ignore"):
        raise ZooError("fix=true and ignore=[...] apply to module=pkg.mod:factory only.",
                       "pass module=pkg.mod:factory, or lint a zoo model with `zoo doctor MODEL`.")
    return cfg.model


STATUS_DIR_ENV = "ZOO_MULTIRUN_STATUS_DIR"  # where multirun jobs leave their exit codes for the parent


def parallel_bundles(gb_per_bundle: str | float | None = None, cpus_per_bundle: int = 1) -> int:
    """How many bundles fit at once here: min(cores / cores per bundle, available RAM / RAM per bundle),
    at least 1 (also convert-all's joblib n_jobs, zoo/convert_all.py)."""
    import psutil

    gb = float(gb_per_bundle or os.environ.get("ZOO_BUNDLE_GB", 4))
    by_memory = int(psutil.virtual_memory().available / (gb * 2**30))
    return max(1, min((os.cpu_count() or 1) // max(1, cpus_per_bundle), by_memory))


OmegaConf.register_new_resolver("zoo_parallel_bundles", parallel_bundles, replace=True)


def _record_job_status(code: int) -> None:
    folder = os.environ.get(STATUS_DIR_ENV)
    if folder:
        with tempfile.NamedTemporaryFile("w", dir=folder, delete=False, suffix=".code") as f:
            f.write(str(code))


@hydra.main(version_base="1.3", config_path=str(CONFIG_DIR), config_name="convert")
def _hydra_main(cfg: DictConfig) -> None:
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    console = Console()
    try:
        with translated_errors():  # known bad input becomes a ZooError; a bug keeps its traceback
            code = run(cfg, console)
    except ZooError as exc:
        console.error(exc)
        code = exc.exit_code
    if HydraConfig.get().mode == RunMode.MULTIRUN:
        _record_job_status(code)  # a failing job must not cancel the others: the parent exits with the worst
        return
    if code:
        sys.exit(code)


def flags_as_overrides(argv: list[str]) -> list[str]:
    """`--module pkg.mod:factory` / `--module=...` and `--fix` (the spelling in the doctor's docs) are
    the Hydra overrides `module=...` and `fix=true`; everything else passes through unchanged."""
    out, args = [], iter(argv)
    for arg in args:
        if arg == "--fix":
            out.append("fix=true")
        elif arg == "--module":
            out.append(f"module={next(args, '')}")
        elif arg.startswith("--module="):
            out.append("module=" + arg.split("=", 1)[1])
        else:
            out.append(arg)
    return out


def main() -> None:
    sys.argv[1:] = flags_as_overrides(sys.argv[1:])
    with error_boundary():  # every bad override is refused here, before Hydra (which would exit 1)
        register_model_configs()
        check_choices(sys.argv[1:])
        check_overrides(sys.argv[1:])
    if not ({"-m", "--multirun"} & set(sys.argv[1:])):
        _hydra_main()
        return
    # Multirun jobs leave their exit codes here; the folder names this process, so a killed run's is
    # removed by the next run's recovery (zoo.bundle.remove_stale_temp_folders).
    with tempfile.TemporaryDirectory(prefix=temp_prefix("multirun")) as status_dir:
        os.environ[STATUS_DIR_ENV] = status_dir
        _hydra_main()
        codes = [int(p.read_text() or 1) for p in Path(status_dir).glob("*.code")]
    if codes and max(codes):
        sys.exit(max(codes))


if __name__ == "__main__":
    run_script(main)
