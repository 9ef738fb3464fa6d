"""`zoo convert-all [model=a,b] [target=coreai,litert] [precision=fp32,int8] [--force] [hydra/launcher=...]`
(`make convert-all`): the zoo's whole matrix as one Hydra multirun, rebuilding only what changed.

1. The matrix: every model × target × precision asked for (default: all models, both targets, every
   precision the target supports). Cells the model refuses are reported as refused, never launched.
2. Skip what is unchanged: each cell's content key (zoo/content_key.py: weights, resolved config, tool
   versions, code) is compared with the manifests on disk; a cell whose bundles all passed with that key
   is "up to date". `--force` rebuilds anyway.
3. The rest is one Hydra multirun, `bundle=<model>/<target>/<precision>,...`, on the launcher the config
   selects — all existing engines, none home-made:
     hydra/launcher=joblib          local processes (default); n_jobs = what fits in cores and RAM
     hydra/launcher=ray             a Ray cluster (address=host:port), per-bundle memory/num_cpus resources
     hydra/launcher=submitit_slurm  SLURM through submitit: mem_gb / cpus_per_task
     hydra/launcher=submitit_local  submitit's local executor (every job at once: refused if they do not fit)
     hydra/launcher=basic           one after the other, in this process
   Each bundle declares its expected peak RSS: `bundle_memory_gb=` or its model's last bench
   (models/<m>/bench.json `peak_rss_mb`), times `memory_margin`. Hydra launchers take one resource
   request per sweep, so the request is the largest bundle's: no node ever gets more than it holds.
4. Every job runs to its end, whatever the others do; each leaves its result in the run folder inside
   `out_dir` (shared by every node). The run ends with the summary table, rewrites the catalog
   (`zoo catalog`: docs/catalog.md + catalog.json), and exits 0 only if nothing failed
   (1: a gate failed; 2: a stage failed or a job was lost), listing each failure with its report path.
"""

from __future__ import annotations

import json
import math
import os
import socket
import sys
import time
import traceback
from dataclasses import asdict, dataclass, field
from pathlib import Path

import zoo.quiet  # noqa: F401  (before the toolchains are imported)
import hydra
from omegaconf import DictConfig, OmegaConf
from rich.markup import escape
from rich.table import Table

from zoo.cli import check_overrides, error_boundary, run_script
from zoo.console import Console
from zoo.errors import ZooError
from zoo.registry import CONFIG_DIR, ROOT, check_choices, group_options, model_config_files, register_model_configs

LAUNCHERS = ("joblib", "ray", "submitit_local", "submitit_slurm", "basic")
RUNS_FOLDER = ".convert-all"  # inside out_dir: one folder per run, holding the jobs' results and logs
# Convert overrides every job receives (the rest of the command line configures convert-all itself).
CONVERT_KEYS = ("model.", "+model.", "~model.", "weights=", "precision.force=")
MATRIX_KEYS = ("model", "target", "precision")


# ---------------------------------------------------------------- the command line


@dataclass
class Request:
    models: list[str]
    targets: list[str]
    precisions: list[str] | None          # None: every precision each target supports
    launcher: str = "joblib"
    force: bool = False
    convert_overrides: list[str] = field(default_factory=list)
    settings_overrides: list[str] = field(default_factory=list)   # keys of configs/convert_all.yaml
    hydra_overrides: list[str] = field(default_factory=list)      # hydra.* passed through to the multirun


def parse_request(argv: list[str]) -> Request:
    """Split the command line: the matrix (model/target/precision), convert overrides for every job,
    convert-all's own settings, and Hydra's launcher settings. Anything else is refused."""
    from zoo.targets import TARGET_NAMES

    selection: dict[str, list[str]] = {}
    request = Request(models=[], targets=[], precisions=None)
    settings = set(OmegaConf.load(CONFIG_DIR / "convert_all.yaml")) - {"defaults", "hydra", "bundle", "run_dir",
                                                                        "convert_overrides"}
    for arg in argv:
        key, eq, value = arg.partition("=")
        if arg in ("--force", "force=true"):
            request.force = True
        elif key in MATRIX_KEYS and eq:
            selection[key] = [] if value in ("all", "") else value.split(",")
        elif key == "hydra/launcher" and eq:
            if value not in LAUNCHERS:
                raise ZooError(f"Unknown launcher '{value}'. Valid: {', '.join(LAUNCHERS)}.",
                               "pick one of those, e.g. hydra/launcher=joblib (local) or hydra/launcher=ray address=HOST:PORT.")
            request.launcher = value
        elif arg.startswith(CONVERT_KEYS):
            request.convert_overrides.append(arg)
        elif key.startswith("hydra."):
            request.hydra_overrides.append(arg)
        elif key in settings and eq:
            request.settings_overrides.append(arg)
        else:
            raise ZooError(f"convert-all does not understand '{arg}'.",
                           "give model=, target=, precision= (comma-separated lists), --force, hydra/launcher=NAME, "
                           "model.* / weights= overrides for every bundle, or one of "
                           f"{', '.join(sorted(settings))} (configs/convert_all.yaml).")
    request.models = selection.get("model") or group_options("model")
    request.targets = selection.get("target") or list(TARGET_NAMES)
    if "default" in request.targets:
        raise ZooError("convert-all takes target names, not 'default'.", "use target=coreai,litert (or leave it out for both).")
    request.precisions = selection.get("precision") or None
    # Unknown names and broken model configs are refused by the registry's own check (one message for every tool).
    check_choices([f"model={','.join(request.models)}", f"target={','.join(request.targets)}",
                   *([f"precision={','.join(request.precisions)}"] if request.precisions else [])])
    for model in request.models:  # every override must compose for every model it will reach
        check_overrides([f"model={model}", *request.convert_overrides])
    return request


def compose_settings(request: Request) -> DictConfig:
    from hydra import compose, initialize_config_dir

    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
        return compose(config_name="convert_all", overrides=request.settings_overrides)


# ---------------------------------------------------------------- the matrix


@dataclass
class Cell:
    model: str
    target: str
    precision: str
    refusal: str = ""           # the model refuses this precision on this target (never launched)
    outcome: str = "pending"    # up to date | to build | refused | built | failed | lost
    reason: str = ""            # why it is built (what changed), or why it failed
    bundles: list[dict] = field(default_factory=list)  # {component, path, key} per component
    expected_gb: float = 0.0    # declared peak RSS of one of its bundles
    exit_code: int = 0          # a failed cell's: 1 a gate failed, 2 a stage failed or the job was lost

    @property
    def name(self) -> str:
        return f"{self.model}/{self.target}/{self.precision}"


def model_cfg_for(cell: Cell, convert_overrides: list[str]):
    from zoo.config import compose_convert

    return compose_convert([f"model={cell.model}", f"target={cell.target}", f"precision={cell.precision}",
                            *convert_overrides])


def expand_matrix(request: Request) -> list[Cell]:
    from zoo.targets import get_target

    cells = []
    for model in request.models:
        cfg = model_cfg_for(Cell(model, request.targets[0], "default"), request.convert_overrides)
        force = bool(cfg.precision.force)
        for target in request.targets:
            supported = get_target(target).precisions
            for precision in request.precisions or supported:
                if precision not in supported:
                    continue  # e.g. bf16 on LiteRT: not a cell of the matrix, nothing to report
                refusal = (cfg.model.get("refused_precisions") or {}).get(target, {}).get(precision)
                cells.append(Cell(model, target, precision, refusal="" if force else str(refusal or "")))
    if not cells:
        raise ZooError("The requested matrix is empty: no target supports those precisions.",
                       "check precision= against `zoo list` (LiteRT has no bf16).")
    return cells


def plan(cells: list[Cell], request: Request, out_dir: Path) -> None:
    """Mark every cell refused, up to date or to build, comparing content keys with the bundles on disk."""
    from zoo import weights
    from zoo.content_key import bundle_key, key_parts, up_to_date, what_changed
    from zoo.pipeline import bundle_path
    from zoo.registry import get_spec

    provenance_cache: dict[tuple, dict] = {}
    for cell in cells:
        if cell.refusal:
            cell.outcome, cell.reason = "refused", cell.refusal
            continue
        composed = model_cfg_for(cell, request.convert_overrides)
        cfg, spec = composed.model, get_spec(composed.model)
        weights_spec = composed.weights or cfg.weights
        cache_key = (cell.model, str(weights_spec), json.dumps(OmegaConf.to_container(cfg, resolve=True), sort_keys=True))
        if cache_key not in provenance_cache:  # one weights resolution per model, not per cell
            checkpoint = weights.resolve(cfg, weights_spec, spec.tiny_dir, spec.random_checkpoint,
                                         embedded=spec.embedded, module_weights=spec.module_weights)
            provenance_cache[cache_key] = checkpoint.provenance
            del checkpoint
        parts = key_parts(cfg, cell.target, cell.precision, weights_spec, provenance_cache[cache_key],
                          bool(composed.precision.force))
        cell.bundles = []
        for component in spec.components:
            path = bundle_path(out_dir, spec, component, cell.target, cell.precision)
            cell.bundles.append({"component": component.name, "path": str(path), "key": bundle_key(parts, component.name)})
        stale = [b for b in cell.bundles if not up_to_date(Path(b["path"]), b["key"])]
        if request.force:
            cell.outcome, cell.reason = "to build", "--force"
        elif stale:
            cell.outcome, cell.reason = "to build", what_changed(Path(stale[0]["path"]), parts)
        else:
            cell.outcome, cell.reason = "up to date", ""


# ---------------------------------------------------------------- resources


def bench_peak_mb(model: str, target: str, precision: str) -> float | None:
    """The largest peak RSS the model's last bench measured for this target × precision (any component)."""
    bench = model_config_files()[model].parent / "bench.json"
    try:
        rows = json.loads(bench.read_text()).get("rows", [])
    except (OSError, ValueError):
        return None
    peaks = [r["peak_rss_mb"] for r in rows
             if r.get("target") == target and r.get("precision") == precision and r.get("peak_rss_mb")]
    return max(peaks) if peaks else None


def declare_memory(cells: list[Cell], settings: DictConfig) -> None:
    """What each bundle declares: `bundle_memory_gb`, else its model's last bench peak, else
    `default_bundle_gb`; bench figures get `memory_margin` on top (a peak measured once is not a bound)."""
    for cell in cells:
        if settings.bundle_memory_gb:
            cell.expected_gb = float(settings.bundle_memory_gb)
            continue
        peak_mb = bench_peak_mb(cell.model, cell.target, cell.precision)
        cell.expected_gb = (peak_mb / 1024 * float(settings.memory_margin) if peak_mb
                            else float(settings.default_bundle_gb))


def launcher_overrides(launcher: str, cells: list[Cell], settings: DictConfig, run_dir: Path) -> list[str]:
    """The one resource declaration (the largest bundle's memory, cpus_per_bundle) in each engine's terms."""
    import psutil

    gb = max(c.expected_gb for c in cells)
    cpus = int(settings.cpus_per_bundle)
    if launcher == "joblib":
        from zoo.convert import parallel_bundles

        return [f"hydra.launcher.n_jobs={parallel_bundles(gb, cpus)}"]
    if launcher == "ray":
        remote = {"memory": int(gb * 2**30), "num_cpus": cpus,
                  # a fresh worker process per bundle: its peak RSS is its own, and the Core AI runtime's
                  # threads never outlive the bundle that started them (zoo/cli.py end_process)
                  "max_calls": 1}
        out = [f"+hydra.launcher.ray.remote.{k}={v}" for k, v in remote.items()]
        if settings.address:
            # The launcher asks for a small object store by default, which Ray refuses when joining a cluster.
            out += [f"hydra.launcher.ray.init.address={settings.address}",
                    "+hydra.launcher.ray.init.object_store_memory=null"]
        else:  # a local Ray instance, its session files inside the project (Ray's default is /tmp/ray)
            out += [f"+hydra.launcher.ray.init._temp_dir={ray_temp_dir()}",
                    f"+hydra.launcher.ray.init.num_cpus={os.cpu_count() or 1}"]
        return out
    if launcher.startswith("submitit"):
        if launcher == "submitit_local":
            # submitit's local executor starts every job at once: refuse what would oversubscribe this machine.
            needed = sum(c.expected_gb for c in cells)
            available = psutil.virtual_memory().available / 2**30
            if needed > available:
                raise ZooError(
                    f"submitit_local would start {len(cells)} bundles at once, declaring {needed:.1f} GB of peak RSS "
                    f"together, but {available:.1f} GB are available.",
                    "use hydra/launcher=joblib (runs as many at once as fit), narrow the matrix, or declare a smaller "
                    "bundle_memory_gb= if you measured one.")
        return [f"hydra.launcher.mem_gb={max(1, math.ceil(gb))}", f"hydra.launcher.cpus_per_task={cpus}",
                f"hydra.launcher.timeout_min={int(settings.timeout_min)}",
                f"hydra.launcher.submitit_folder={run_dir}/submitit/%j"]
    return []


# Ray's unix sockets live in <temp dir>/session_<date>_<time>_<usec>_<pid>/sockets/plasma_store.1 and an AF_UNIX
# path may not exceed 107 bytes. The longest suffix (7-digit pid) is 66 bytes, so the temp dir may use 41.
# CI checks the project out at /check/work/main, where .cache/pytest-scaleout/ray0 (44 bytes) failed.
RAY_SOCKET_SUFFIX = "/session_2026-12-01_16-36-51_273958_1234567/sockets/plasma_store.1"
MAX_RAY_TEMP_DIR = 107 - len(RAY_SOCKET_SUFFIX)


def ray_temp_dir(root: Path = ROOT) -> Path:
    """Ray's session folder for a local instance or a test cluster (created): see `choose_ray_temp_dir`."""
    folder = choose_ray_temp_dir(root)
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def choose_ray_temp_dir(root: Path) -> Path:
    """Inside the project and short enough for Ray's socket paths: root/.cache/ray, else root/.ray.
    A project too deep for either is exit 2 (Ray itself would raise a traceback from a worker's start)."""
    for folder in (root / ".cache" / "ray", root / ".ray"):
        if len(str(folder)) <= MAX_RAY_TEMP_DIR:
            return folder
    raise ZooError(
        f"the project folder {root} is too deep for Ray: its session sockets would live under {root / '.ray'}, "
        f"and a unix socket path may not exceed 107 bytes (the folder may use {MAX_RAY_TEMP_DIR}).",
        "move or link the project to a shorter path, or use hydra/launcher=joblib.")


def check_ray_address(address: str) -> None:
    """Refuse an unreachable cluster at once (ray.init would retry for a minute, then raise a traceback)."""
    host_port = address.split("://", 1)[-1]
    host, _, port = host_port.rpartition(":")
    if not host or not port.isdigit():
        raise ZooError(f"Ray address '{address}' is not HOST:PORT.",
                       "give the address `ray start --head` printed, e.g. address=10.0.0.5:6379.")
    try:
        socket.create_connection((host, int(port)), timeout=5).close()
    except OSError as exc:
        raise ZooError(f"No Ray cluster answers at {address} ({exc.strerror or exc}).",
                       "start one (`ray start --head --port PORT`) or pass the address of a running one; "
                       "leave address= out to start a local Ray instance for this run.") from None


# ---------------------------------------------------------------- one job (runs wherever the launcher puts it)


def ray_node_id() -> str:
    """The Ray node running this job (where the bundles of a run were built), empty outside Ray."""
    if "ray" not in sys.modules:
        return ""
    import ray

    return ray.get_runtime_context().get_node_id() if ray.is_initialized() else ""


def result_path(run_dir: Path, cell_name: str) -> Path:
    return Path(run_dir) / "results" / (cell_name.replace("/", "__") + ".json")


def convert_cell(cfg: DictConfig) -> int:
    """One cell through zoo.pipeline; its result goes to the run folder. Never raises: a launcher stops
    collecting (and Hydra's sweeper stops the sweep) at the first job that raises, and one bundle's failure
    must not stop the others."""
    from zoo.bundle import write_json
    from zoo.cli import translated_errors
    from zoo.pipeline import convert_model

    model, target, precision = str(cfg.bundle).split("/")
    console = Console()
    record = {"cell": str(cfg.bundle), "host": socket.gethostname(), "pid": os.getpid(), "ray_node": ray_node_id(),
              "bundles": [], "error": ""}
    try:
        with translated_errors():
            composed = model_cfg_for(Cell(model, target, precision), list(cfg.convert_overrides))
            results = convert_model(composed.model, [target], precision=precision,
                                    force_precision=bool(composed.precision.force), out_dir=Path(cfg.out_dir),
                                    console=console, weights_spec=composed.weights)
        console.summary(results)
        record["bundles"] = [{"component": r.component, "status": str(r.status), "status_text": r.status_text,
                              "path": str(r.path or ""), "error": r.error,
                              "failed_gates": [g.describe() for g in r.gates if not g.passed]} for r in results]
        code = 0 if all(r.ok for r in results) else (2 if any(r.error for r in results) else 1)
    except ZooError as exc:
        console.error(exc)
        record["error"], code = f"{exc.problem} Fix: {exc.fix}", exc.exit_code
    except Exception as exc:  # a bug: keep its traceback with the result, go on with the other jobs
        record["error"] = f"{type(exc).__name__}: {exc} (a bug in zoo)"
        record["traceback"] = traceback.format_exc()
        print(record["traceback"], file=sys.stderr)
        code = 2
    record["exit_code"] = code
    path = result_path(Path(cfg.run_dir), str(cfg.bundle))
    path.parent.mkdir(parents=True, exist_ok=True)
    write_json(path, record)
    return code


@hydra.main(version_base="1.3", config_path=str(CONFIG_DIR), config_name="convert_all")
def _hydra_main(cfg: DictConfig) -> int:
    return convert_cell(cfg)


# ---------------------------------------------------------------- the run


def quoted(value: str) -> str:
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


def run_multirun(cells: list[Cell], request: Request, settings: DictConfig, out_dir: Path, run_dir: Path) -> None:
    register_model_configs()
    argv = ["-m", f"bundle={','.join(quoted(c.name) for c in cells)}",
            f"hydra/launcher={request.launcher}",
            *launcher_overrides(request.launcher, cells, settings, run_dir),
            f"out_dir={quoted(str(out_dir))}", f"run_dir={quoted(str(run_dir))}",
            f"convert_overrides=[{','.join(quoted(o) for o in request.convert_overrides)}]",
            *request.settings_overrides, *request.hydra_overrides]
    saved = sys.argv
    sys.argv = [saved[0], *argv]
    # Jobs import zoo wherever the launcher starts them: from this checkout, not some other installed copy.
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)
    try:
        _hydra_main()
    except (Exception, SystemExit) as exc:
        # The engine itself stopped (Hydra rejected a launcher setting, a Ray worker died, the cluster went
        # away): its own message is above. The jobs that left no result are reported as lost, the others
        # keep theirs, and the summary and catalog still come.
        (run_dir / "launcher-error.txt").write_text(traceback.format_exc())
        print(f"convert-all: the launcher stopped ({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}); "
              f"details in {run_dir / 'launcher-error.txt'}", file=sys.stderr)
    finally:
        sys.argv = saved


def collect(cells: list[Cell], run_dir: Path) -> None:
    """Each launched cell's outcome from the result its job left; a missing result is a lost job."""
    for cell in (c for c in cells if c.outcome == "to build"):
        path = result_path(run_dir, cell.name)
        if not path.is_file():
            cell.outcome, cell.exit_code = "lost", 2
            stopped = run_dir / "launcher-error.txt"
            cell.reason = (f"the launcher stopped before this job left a result: {stopped}" if stopped.is_file()
                           else f"the job left no result (killed? out of memory?); its log is under {run_dir}")
            continue
        record = json.loads(path.read_text())
        failed = [b for b in record["bundles"] if b["status"] != "passed"]
        if record.get("error") or failed or not record["bundles"]:
            cell.outcome = "failed"
            cell.reason = record.get("error") or "; ".join(
                f"{b['component']}: {b['status_text']}" + (f" — {b['error']}" if b["error"] else "")
                + (f" — {', '.join(b.get('failed_gates') or [])}" if b.get("failed_gates") else "") for b in failed)
            cell.exit_code = record.get("exit_code", 2)
        else:
            cell.outcome = "built"


def report_of(cell: Cell) -> str:
    """The report.json a failure points at: the failed bundle's (kept in <bundle>.failed/) if there is one."""
    for b in cell.bundles:
        for folder in (Path(b["path"] + ".failed"), Path(b["path"])):
            if (folder / "report.json").is_file():
                return str(folder / "report.json")
    return "-"


def summary(cells: list[Cell], console: Console, seconds: float) -> None:
    table = Table(title="zoo convert-all")
    for col in ("model", "target", "precision", "this run", "why / bundle"):
        table.add_column(col)
    colors = {"built": "green", "up to date": "green", "refused": "yellow"}
    for c in cells:
        where = c.reason if c.outcome != "built" and c.outcome != "up to date" else ", ".join(b["path"] for b in c.bundles)
        if c.outcome == "built" and c.reason:
            where = f"{where} ({c.reason})"
        table.add_row(c.model, c.target, c.precision, f"[{colors.get(c.outcome, 'red')}]{c.outcome}[/]", escape(where))
    console.rich.print(table)
    counts = {k: sum(c.outcome == k for c in cells) for k in ("built", "up to date", "refused", "failed", "lost")}
    console.rich.print(", ".join(f"{v} {k}" for k, v in counts.items() if v) + f" in {seconds:.0f} s")
    failures = [c for c in cells if c.outcome in ("failed", "lost")]
    if failures:
        console.rich.print(f"[red]{len(failures)} cell(s) failed:[/]")
        for c in failures:
            console.rich.print(f"  [red]✗[/] {c.name}: {escape(c.reason)}\n    report: {escape(report_of(c))}")


def exit_code(cells: list[Cell]) -> int:
    codes = [c.exit_code or 2 for c in cells if c.outcome in ("failed", "lost")]
    return max(codes, default=0)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    started = time.monotonic()
    console = Console()
    with error_boundary(console):
        register_model_configs()
        request = parse_request(argv)
        settings = compose_settings(request)
        if request.launcher == "ray" and settings.address:
            check_ray_address(str(settings.address))  # before any work
        out_dir = Path(str(settings.out_dir)).resolve()
        cells = expand_matrix(request)
        plan(cells, request, out_dir)
        declare_memory(cells, settings)
        to_build = [c for c in cells if c.outcome == "to build"]
        for c in cells:
            console.rich.print(f"  {c.name}: {c.outcome}" + (f" ({escape(c.reason)})" if c.reason else ""))
        run_dir = out_dir / RUNS_FOLDER / f"{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}"
        if to_build:
            run_dir.mkdir(parents=True, exist_ok=True)
            console.rich.print(f"converting {len(to_build)} cell(s) with hydra/launcher={request.launcher} "
                               f"(each declares {max(c.expected_gb for c in to_build):.1f} GB, "
                               f"{settings.cpus_per_bundle} CPU); results in {run_dir}")
            run_multirun(to_build, request, settings, out_dir, run_dir)
            collect(cells, run_dir)
    from zoo.bundle_catalog import write_catalog

    write_catalog(out_dir, Path(str(settings.catalog_dir)))
    summary(cells, console, time.monotonic() - started)
    console.rich.print(f"catalog: {Path(str(settings.catalog_dir)) / 'catalog.md'}")
    return exit_code(cells)


if __name__ == "__main__":
    run_script(main)
