"""`zoo bench model=<m>` (`make bench MODEL=<m>`): for every component, target and precision, conversion
cost, size, gates and what the component's `measure` hook times, in one run.

One bench for every model. Every precision each target supports and the config does not refuse is
converted at the model's bench size (e.g. T5: the real t5-v1_1-base architecture with seeded random
weights), gated like any bundle, then measured by the component's `Measure` (default: one-shot latency of
the saved artifact vs eager torch on the same inputs, timed back to back — ratios, because these machines
are noisy). Each bundle runs in its own fresh process, so its peak RSS is its own. Writes `bench.json`
and regenerates the README's Measured block (into the model folder, or `bench_dir=PATH`).
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import sys
import tempfile
import time
from datetime import date
from pathlib import Path

import zoo.quiet  # noqa: F401
import torch
from omegaconf import OmegaConf

from zoo import gates
from zoo.card import measured_table, update_readme
from zoo.cli import check_overrides, returns_exit_code, run_script
from zoo.config import compose_convert
from zoo.console import Console
from zoo.errors import ZooError
from zoo.integrity import verify_bundle
from zoo.pipeline import convert_model, to_numpy
from zoo.registry import Measure, MeasureContext, get_spec, model_config_files
from zoo.targets import TARGET_NAMES, get_target
from zoo.weights import resolve

CONVERT_STAGES = ("export", "convert", "optimize", "save")


def median_ms(fn, repeats: int) -> float:
    fn()  # warm-up: first calls pay for allocation, XNNPACK packing, lazy loading
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def measure_latency(ctx: MeasureContext) -> dict:
    """The default measure: eager reference, the raw converter's artifact (if the bench made one for this
    target), then the saved bundle through the component's session — median of `repeats` calls each, back
    to back on the same inputs, so all three see the same machine load and the ratios are fair."""
    reference = ctx.component.reference(ctx.checkpoint, ctx.cfg)
    with torch.no_grad():
        eager = median_ms(lambda: reference(*ctx.inputs.values()), ctx.repeats)
    target = get_target(ctx.target)
    arrays = to_numpy(ctx.inputs)
    raw = (ctx.header.get("raw_artifacts") or {}).get(ctx.target) or {"reason": "not measured"}
    if "path" in raw:
        with target.open(Path(raw["path"])) as runner:
            raw_ms = median_ms(lambda: runner.run("main", arrays), ctx.repeats)
    runner = target.open(ctx.bundle / target.artifact)
    try:
        with ctx.component.session(runner, ctx.target) as session:
            latency = median_ms(lambda: session.run(arrays), ctx.repeats)
    finally:
        runner.close()
    row = {"latency_ms": round(latency, 2), "eager_ms": round(eager, 2), "latency_vs_eager": round(latency / eager, 3)}
    if "path" in raw:
        row.update(raw_ms=round(raw_ms, 2), latency_vs_raw=round(latency / raw_ms, 3))
    else:
        row.update(raw_ms=raw["reason"], latency_vs_raw="–")
    return row


LATENCY = Measure(
    run=measure_latency,
    columns=[("latency_ms", "latency ms"), ("eager_ms", "eager ms"), ("latency_vs_eager", "vs eager"),
             ("raw_ms", "raw converter ms"), ("latency_vs_raw", "vs raw")],
    describe="latency = median of the configured repeats after one warm-up, one call of the saved artifact "
             "on this machine's runtime; eager = the upstream module in fp32 on the same inputs, timed "
             "right before it; raw converter = the upstream module converted as is (no zoo rewrites or "
             "passes) by the same target at fp32, timed in between",
    raw_baseline=True,
)


PROFILE_TOP_OPS = 6  # the ops a README lists per profiled function; bench.json keeps the same


def drive_one_call(ctx: MeasureContext, runner) -> None:
    """The default profile driver: one call of the component's session on the example inputs."""
    with ctx.component.session(runner, ctx.target) as session:
        session.run(to_numpy(ctx.inputs))


def profile_bundle(ctx: MeasureContext, measure: Measure) -> dict | None:
    """Per-op time of the saved bundle from the target runtime's own profiler, for the targets that have
    one (Core AI: zoo.targets.coreai.RuntimeOpProfile), else None. Its own runner, after the timed runs:
    the profiler's per-op callbacks cost time. One warm-up drive, then the profiled one."""
    target = get_target(ctx.target)
    if not getattr(target, "has_op_profiler", False):
        return None
    drive = measure.profile or drive_one_call
    with target.open(ctx.bundle / target.artifact, profile=True) as runner:
        drive(ctx, runner)
        runner.reset_profile()
        drive(ctx, runner)
        return runner.op_profile(top=PROFILE_TOP_OPS)


def convert_raw(model: str, overrides: list[str], component_name: str, target_name: str, out: str,
                header: dict | None = None) -> dict:
    """The upstream module (the component's `reference`) through the target's converter as is, at fp32:
    the baseline our artifact must beat. Meant for a fresh process. Returns {"path": artifact}, or
    {"reason": one line saying why upstream does not convert} (that line is the table cell)."""
    import zoo.quiet  # noqa: F401  (a spawned interpreter starts bare)
    from zoo.targets import Entry

    cfg = bench_config(model, overrides)
    spec = get_spec(cfg)
    component = spec.component(component_name)
    checkpoint = resolve(cfg, bench_weights(cfg, overrides), spec.tiny_dir, spec.random_checkpoint,
                         embedded=spec.embedded)
    target = get_target(target_name)
    measure = measure_of(component)
    inputs = measure.raw_inputs(header or {}) if measure.raw_inputs else component.example_inputs(checkpoint, cfg)
    entry = Entry("main", component.reference(checkpoint, cfg), inputs, list(component.output_names))
    dest = Path(out) / f"raw-{component.name}-{target_name}"
    dest.mkdir(parents=True, exist_ok=True)
    try:
        exported = None if target.export_skip_reason else target.export([entry])
        artifact = target.convert([entry], exported, dest)
        return {"path": str(target.save(artifact, dest, {}))}
    except Exception as exc:  # noqa: BLE001 — upstream not converting is a measured fact, shown in the table
        first = (str(exc).strip().splitlines() or [""])[0][:120]
        return {"reason": f"does not convert: {type(exc).__name__}: {first}"}


def measure_of(component) -> Measure:
    return component.measure or LATENCY


def in_fresh_process(fn, *args):
    """Run fn(*args) in a new spawned interpreter: peak RSS per bundle is then that bundle's own, not
    the high-water mark of every conversion before it (measured: the T5 bench's peak-RSS column climbed
    3049 -> 5405 MB over seven bundles in one process)."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    with ProcessPoolExecutor(max_workers=1, mp_context=multiprocessing.get_context("spawn")) as pool:
        return pool.submit(fn, *args).result()


def bench_config(model: str, overrides: list[str]):
    cfg = compose_convert([f"model={model}", *overrides]).model
    if cfg.bench.variant:
        cfg = OmegaConf.merge(cfg, {"variant": cfg.bench.variant})
    return cfg


def bench_targets(cfg) -> list[dict]:
    """The config's `bench.targets` as plain dicts, for bench.json's header (the card judges them on the rows)."""
    return OmegaConf.to_container(cfg.bench.targets, resolve=True) if cfg.bench.get("targets") else []


def bench_weights(cfg, overrides: list[str]) -> str:
    """`weights=...` on the command line wins, then the config's bench weights, then its default weights."""
    given = next((o.split("=", 1)[1] for o in overrides if o.startswith("weights=")), None)
    return given or cfg.bench.weights or cfg.weights


def common_row(result) -> dict:
    """What every bundle's row has, whatever its component measures."""
    stages = {s["name"]: s for s in result.stages}
    worst = {m: gates.worst(result.gates, m) for m in dict.fromkeys(g.metric for g in result.gates)}
    return {
        "component": result.component, "target": result.target, "precision": result.precision,
        "status": str(result.status), "status_note": result.note,
        "gate": "; ".join(f"{m} {v:.7g}" for m, v in worst.items()) + ("" if result.ok else " (FAILED)"),
        "gate_worst": {m: (v if v == v else "nan") for m, v in worst.items()},
        "convert_s": round(sum(stages[n]["seconds"] for n in CONVERT_STAGES if n in stages), 2),
        "stage_s": {n: s["seconds"] for n, s in stages.items()},
        "peak_rss_mb": max(s["peak_rss_mb"] for s in result.stages),
        "size_mb": round(result.bytes / 1e6, 2),
    }


def measure_bundle(model: str, overrides: list[str], component_name: str, target: str, precision: str,
                   out: str, header: dict) -> dict:
    """One bundle, meant for a fresh process: convert + gate it through the pipeline, then run the
    component's measure on the saved bundle. Returns its row plus `bytes`, or {"error": ...}."""
    import zoo.quiet  # noqa: F401  (a spawned interpreter starts bare)

    cfg = bench_config(model, overrides)
    spec = get_spec(cfg)
    component = spec.component(component_name)
    weights_spec = bench_weights(cfg, overrides)
    console = Console()
    console.begin(model, component.name, target, precision)
    [result] = convert_model(cfg, [target], precision=precision, out_dir=Path(out), console=console,
                             weights_spec=weights_spec, components=[component.name])
    if str(result.status) == "error":
        return {"error": result.error}
    # The saved bundle against its manifest, before (and outside) any timing: the runner's own check
    # is then a stat-only memo hit, so a measured load time is the runtime's, not sha256's.
    verify_bundle(result.path)
    checkpoint = resolve(cfg, weights_spec, spec.tiny_dir, spec.random_checkpoint, embedded=spec.embedded)
    ctx = MeasureContext(cfg, checkpoint, component, target, result.path,
                         component.example_inputs(checkpoint, cfg), int(cfg.bench.repeats), header)
    row = {**common_row(result), "measure": measure_of(component).run(ctx), "bytes": result.bytes,
           "weights": f"{weights_spec} ({checkpoint.provenance.get('note', checkpoint.source)})"}
    profile = profile_bundle(ctx, measure_of(component))
    if profile:
        row["profile"] = profile
    return row


def requested(overrides: list[str], key: str) -> list[str] | None:
    """`target=litert` / `precision=fp32,int8` / `component=[a,b]` on the bench command line narrow the matrix."""
    value = next((o.split("=", 1)[1] for o in overrides if o.startswith(f"{key}=")), None)
    value = value.strip("[]") if value else value
    return None if value in (None, "", "all", "default") else value.split(",")


def make_command(model: str, overrides: list[str]) -> str:
    """The `make bench` line that re-runs this bench (TARGET/PRECISION are Make variables, as for convert)."""
    as_make = {"target": "TARGET", "precision": "PRECISION", "component": "COMPONENT"}
    words = []
    for override in overrides:
        key, _, value = override.partition("=")
        if key in as_make and value in ("all", "default"):
            continue  # the Makefile's defaults
        words.append(f"{as_make[key]}={value}" if key in as_make else override)
    return " ".join([f"make bench MODEL={model}", *words])


def refusal_of(cfg, target: str, precision: str) -> str | None:
    return ((cfg.get("refused_precisions") or {}).get(target) or {}).get(precision)


def run_bench(model: str, overrides: list[str], console: Console, components: list[str] | None = None) -> dict:
    """Every component × (target, precision) the config allows, each bundle in its own fresh process."""
    cfg = bench_config(model, overrides)
    spec = get_spec(cfg)
    weights_spec = bench_weights(cfg, overrides)
    selected = [spec.component(n) for n in components] if components else spec.components
    checkpoint = resolve(cfg, weights_spec, spec.tiny_dir, spec.random_checkpoint, embedded=spec.embedded)
    headers = {c.name: (measure_of(c).prepare(cfg, checkpoint) if measure_of(c).prepare else {}) for c in selected}
    del checkpoint
    started = time.perf_counter()
    rows, weights = [], None
    with tempfile.TemporaryDirectory(prefix="zoo-bench-") as out:
        for component in selected:
            for target in requested(overrides, "target") or TARGET_NAMES:
                if measure_of(component).raw_baseline:  # time upstream's own conversion too
                    raw = in_fresh_process(convert_raw, model, overrides, component.name, target, out,
                                           {k: v for k, v in headers[component.name].items() if k != "raw_artifacts"})
                    headers[component.name].setdefault("raw_artifacts", {})[target] = raw
                fp32_bytes = None
                wanted = requested(overrides, "precision")
                for precision in [p for p in get_target(target).precisions if not wanted or p in wanted]:
                    refusal = refusal_of(cfg, target, precision)
                    if refusal:
                        rows.append({"component": component.name, "target": target, "precision": precision,
                                     "status": "refused", "reason": refusal.split(" (")[0]})
                        continue
                    row = in_fresh_process(measure_bundle, model, overrides, component.name, target, precision,
                                           out, headers[component.name])
                    if "error" in row:
                        raise ZooError(f"bench conversion {component.name} {target}-{precision} failed: {row['error']}",
                                       "fix the conversion first (zoo convert shows the failing stage).")
                    nbytes, weights = row.pop("bytes"), row.pop("weights")
                    fp32_bytes = fp32_bytes or (nbytes if precision == "fp32" else None)
                    row["size_vs_fp32"] = round(nbytes / fp32_bytes, 3) if fp32_bytes else None
                    rows.append(row)
    return {
        "header": {
            "command": make_command(model, overrides),
            "date": date.today().isoformat(),
            "machine": f"{platform.machine()}, {os.cpu_count()} cores, torch {torch.get_num_threads()} threads, "
                       f"Python {platform.python_version()}",
            "weights": weights, "variant": cfg.variant, "repeats": int(cfg.bench.repeats),
            "process": "each bundle converted, gated and measured in its own fresh process",
            "bench_wall_s": round(time.perf_counter() - started, 1),
            "gates": {p: {k: float(v) for k, v in t.items()} for p, t in cfg.gates.items()},
            "targets": bench_targets(cfg),
        },
        "measures": {c.name: {"describe": measure_of(c).describe,
                              "header": {k: v for k, v in headers[c.name].items()
                                         if k not in ("prompt_ids", "raw_artifacts")}}
                     for c in selected},
        "rows": rows,
    }


def merge_earlier_rows(data: dict, spec, earlier: Path, overrides: list[str]) -> dict:
    """A narrowed bench (`target=` / `precision=` / `component=`) replaces only the rows it re-ran: the committed
    bench.json's other rows stay, each stamped with the command and date of the run that made it (the README says
    so), and so do the measure headers of the components it did not re-run."""
    stamp = {"command": data["header"]["command"], "date": data["header"]["date"]}
    for row in data["rows"]:
        row["run"] = stamp
    narrowed = any(requested(overrides, key) for key in ("target", "precision", "component"))
    if not narrowed or not earlier.is_file():
        return data
    old = json.loads(earlier.read_text())
    data["measures"] = {**old.get("measures", {}), **data.get("measures", {})}
    old_stamp = {"command": old["header"]["command"], "date": old["header"]["date"]}
    names = [c.name for c in spec.components]
    fresh = {(r["component"], r["target"], r["precision"]) for r in data["rows"]}
    # Rows of a one-component model's older bench.json carry no component: it can only be that one.
    old_rows = [{"component": names[0], **r} for r in old.get("rows", [])]
    kept = [{**r, "run": r.get("run", old_stamp)} for r in old_rows
            if (r["component"], r["target"], r["precision"]) not in fresh]

    def order(row):
        precisions = get_target(row["target"]).precisions
        return (names.index(row["component"]) if row["component"] in names else len(names),
                TARGET_NAMES.index(row["target"]),
                precisions.index(row["precision"]) if row["precision"] in precisions else len(precisions))

    data["rows"] = sorted(kept + data["rows"], key=order)
    fill_size_vs_fp32(data["rows"])
    return data


def fill_size_vs_fp32(rows: list[dict]) -> None:
    """A narrowed run that did not rebuild fp32 still gets its size ratio, from the fp32 row kept beside it
    (sizes do not depend on the machine's load)."""
    fp32 = {(r["component"], r["target"]): r.get("size_mb") for r in rows if r.get("precision") == "fp32"}
    for row in rows:
        base = fp32.get((row["component"], row["target"]))
        if row.get("size_vs_fp32") is None and row.get("size_mb") and base:
            row["size_vs_fp32"] = round(row["size_mb"] / base, 3)


def rerender_only(cfg, bench_json: Path) -> dict:
    """`--readme-only`: the committed bench.json, re-rendered with the config's current `bench.targets` (goals and
    reasons are config; every measured value stays the run's own)."""
    if not bench_json.is_file():
        raise ZooError(f"--readme-only needs a bench.json at {bench_json}; there is none.",
                       "run the bench once without --readme-only.")
    data = json.loads(bench_json.read_text())
    data["header"]["targets"] = bench_targets(cfg)
    return data


def bench_components(overrides: list[str]) -> list[str] | None:
    """`component=NAME` / `component=[A,B]` (Make: COMPONENT=) -> those names; none or `all` -> every component."""
    return requested(overrides, "component")


def bench_folder(cfg, given: str | None) -> Path:
    return Path(given) if given else model_config_files()[cfg.name].parent


@returns_exit_code  # bad overrides (Hydra parse/compose, wrong types) exit 2 with the fix; bugs keep their traceback
def main(argv: list[str]) -> int:
    model = next((a.split("=", 1)[1] for a in argv if a.startswith("model=")), "t5")
    bench_dir = next((a.split("=", 1)[1] for a in argv if a.startswith("bench_dir=")), None)
    overrides = [a for a in argv if not a.startswith(("model=", "bench_dir="))
                 and not (a.startswith("component=") and bench_components([a]) is None)]   # Make's COMPONENT=all
    readme_only = "--readme-only" in overrides
    overrides = [o for o in overrides if o != "--readme-only"]
    console = Console()
    try:
        check_overrides([f"model={model}", *overrides])  # parse, compose and cross-check, before any work
        cfg = compose_convert([f"model={model}", *overrides]).model
        spec = get_spec(cfg)
        folder = bench_folder(cfg, bench_dir)
        data = (rerender_only(cfg, folder / "bench.json") if readme_only
                else run_bench(model, overrides, console, bench_components(overrides)))
    except ZooError as exc:
        console.error(exc)
        return exc.exit_code
    folder.mkdir(parents=True, exist_ok=True)
    if not readme_only:
        data = merge_earlier_rows(data, spec, folder / "bench.json", overrides)
    (folder / "bench.json").write_text(json.dumps(data, indent=2) + "\n")
    measures = {c.name: measure_of(c) for c in spec.components}
    table = measured_table(data, measures)
    readme = folder / "README.md"
    if not readme.exists():
        readme.write_text(f"# {cfg.name}\n")
    update_readme(readme, table)
    console.rich.print(table, markup=False)
    return 0 if all(r.get("status") in ("passed", "refused") for r in data["rows"]) else 1


if __name__ == "__main__":
    run_script(main, sys.argv[1:])
