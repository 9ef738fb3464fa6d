"""`zoo real-size MODEL` (`make real-size MODEL=...`): a model at its real size on this machine.

Converts every bundle the model's `RealSize` hook lists (zoo/registry.py; seeded random weights of the real
architectures: conversion time, peak RSS and size do not depend on the weight values, and the Hub is not
reachable here), each in a fresh process so its peak RSS is its own, then runs the hook's numeric checks
(fp32, the saved artifact vs eager on the same seeded inputs, against the model's fp32 cosine gate). Results go
to models/<model>/real_size.json and the README block between the real-size markers.

    zoo real-size ltx-video                        # every row and check, README block regenerated
    zoo real-size ltx-video --resume               # keep the converted rows of an interrupted run
    zoo real-size ltx-video --readme-only          # regenerate the README block from the committed json
    zoo real-size triposplat --only vae-encoder    # re-measure one component: the others' rows stay
    zoo real-size triposplat --only dit --targets litert --layers 2    # a quick look (writes nothing)

What makes a big network fit in 24 GB (models.md): Core AI — the torch module and the exported program are
released before the program is converted and saved; LiteRT — litert-torch's lightweight (lazy-constant)
conversion, the model's `litert.lightweight_conversion` (auto: above `lightweight_above_gb` of weights).
A process the kernel kills (out of memory) is a measured result: its row says so. A failed row, a check that
could not run, or a check under its floor (NaN included) makes the exit status 1.
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import os
import platform
import re
import shutil
import tempfile
import time
from pathlib import Path

from zoo.cli import returns_exit_code, run_script
from zoo.errors import ZooError

START, END = "<!-- real-size:start -->", "<!-- real-size:end -->"
RESULTS_FILE = "real_size.json"
KILLED = ("the conversion process was killed (the kernel's OOM killer: out of memory on this 24 GB machine)")


# ---------------------------------------------------------------- the model's hook and config


def hook_of(model: str):
    """(model folder, RealSize hook); a model without one is refused."""
    from zoo.registry import get_spec, load_model_config, model_config_files

    cfg = load_model_config(model)
    hook = get_spec(cfg).real_size
    if hook is None:
        with_hook = [name for name in model_config_files() if _declares(name)]
        raise ZooError(f"Model '{model}' declares no real-size measurement (ModelSpec.real_size).",
                       f"pick one that does ({', '.join(with_hook) or 'none'}), or declare a RealSize hook in its package.")
    return model_config_files()[model].parent, hook


def _declares(name: str) -> bool:
    from zoo.registry import get_spec, load_model_config

    try:
        return get_spec(load_model_config(name)).real_size is not None
    except ZooError:
        return False


def real_config(model: str, variant: str, overrides: list[str]):
    """The model config at a variant, made real size by the hook's overrides, then the caller's."""
    from zoo.config import compose_convert

    _, hook = hook_of(model)
    return compose_convert([f"model={model}", f"model.variant={variant}", *hook.overrides, *overrides]).model


def parameter_count(module) -> int:
    return sum(p.numel() for p in module.parameters())


# ---------------------------------------------------------------- one row, one check (each in a fresh process)


def convert_row(model: str, overrides: list[str], component: str, variant: str, target_name: str,
                precision_name: str, layers: int | None, out_dir: str) -> dict:
    """One bundle at real size: build, convert (memory released as it goes), save; time, peak RSS, size."""
    import torch

    from zoo.pipeline import _convert_options
    from zoo.precision import PRECISIONS
    from zoo.stages import StageLog
    from zoo.targets import Entry, get_target
    from zoo.targets.litert import use_lightweight_conversion

    torch.set_grad_enabled(False)
    _, hook = hook_of(model)
    cfg = real_config(model, variant, overrides)
    log, target, precision = StageLog(), get_target(target_name), PRECISIONS[precision_name]
    # the variant the config resolved to (an override such as model.variant=tiny wins over the declared row's)
    row = {"component": component, "variant": str(cfg.variant), "target": target_name, "precision": precision_name,
           "layers": layers or "all"}
    dest = Path(out_dir)
    dest.mkdir(parents=True, exist_ok=True)
    with log.stage("build"):
        built = hook.build(cfg, component, layers, False)
        module, inputs, outputs = built.module, built.inputs, built.output_names
        del built
        row["params_m"] = round(parameter_count(module) / 1e6, 1)
        weight_bytes = sum(p.numel() * p.element_size() for p in module.parameters())
    try:  # a converter that fails at real size is a measured result: the row says so
        if target_name == "coreai":
            with log.stage("export"):
                # Linear weights stay in the reduced dtype, multiplied in it (no fp32 copy of the weights)
                prepared = target.prepare(module, precision, {"fp32_linear_accumulation": False})
                entries = [Entry("main", prepared, inputs, outputs)]
                exported = target.export(entries)
            # The exported program shares the module's tensors; once converted, the program holds its own copy.
            # Release both before saving (models.md: the raw order peaks ~26 GB fp32 for LTX-Video's 2B DiT,
            # ~18.6 GB with the release).
            for entry in entries:
                entry.module = None
            del module, prepared
            with log.stage("convert"):
                program = target.convert(entries, exported, dest)
            del exported
            gc.collect()
            with log.stage("save"):
                path = target.save(program, dest, {"description": f"{model} {component} real size"})
            del program
        else:
            options = _convert_options(cfg)
            lightweight = use_lightweight_conversion(options["lightweight_conversion"], weight_bytes,
                                                     options["lightweight_above_gb"])
            with log.stage("convert") as record:
                entries = [Entry("main", module, inputs, outputs)]
                fp32_path = target.convert(entries, None, dest, lightweight_conversion=str(lightweight))
                record.note = "lightweight" if lightweight else "default"
            del module, entries
            gc.collect()
            row["lightweight_conversion"] = lightweight
            with log.stage("optimize"):
                path, _ = target.compress(fp32_path, precision, dest)
            if path != fp32_path:
                Path(fp32_path).unlink()
        row.update(status="converted", size_mb=round(sum(f.stat().st_size for f in Path(path).parent.rglob("*")
                                                          if f.is_file()) / 1e6, 1))
    except Exception as exc:
        row.update(status="failed", error=f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"[:300])
    stages = log.as_dicts()
    row["stage_s"] = {s["name"]: round(float(s["seconds"]), 1) for s in stages}
    row["convert_s"] = round(sum(row["stage_s"].get(n, 0.0) for n in ("export", "convert", "optimize", "save")), 1)
    row["peak_rss_mb"] = round(max(float(s["peak_rss_mb"]) for s in stages), 0) if stages else None
    return row


def compare(got: dict, expected: dict, names: list[str]) -> tuple[float, float]:
    """(worst cosine, worst max-abs / max-abs(ref)) over the outputs; NaN anywhere stays NaN (and fails)."""
    import numpy as np

    from zoo import gates

    cosines = [gates.cosine(np.asarray(got[n]), expected[n]) for n in names]
    rels = [gates.measure("rel_max_abs", np.asarray(got[n]), expected[n]) for n in names]
    worst = lambda values, pick: (math.nan if any(math.isnan(v) for v in values) else pick(values))  # noqa: E731
    return worst(cosines, min), worst(rels, max)


def convert_and_save(target, entries, dest: Path, cfg, description: str) -> tuple[Path, float]:
    """A check's fp32 artifact: export, convert with the model's converter options, save; (path, seconds)."""
    from zoo.pipeline import _convert_options

    started = time.perf_counter()
    artifact = target.convert(entries, target.export(entries), dest, **_convert_options(cfg))
    path = target.save(artifact, dest, {"description": description})
    return path, time.perf_counter() - started


def check_row(model: str, overrides: list[str], component: str, variant: str, target_name: str,
              layers: int | None, out_dir: str) -> dict:
    """Real-size numerics: the hook's build at `layers` (None: the whole network), fp32, the saved artifact vs
    eager on the same inputs, against the model's fp32 cosine gate."""
    import torch

    from zoo.precision import PRECISIONS
    from zoo.targets import Entry, get_target

    torch.set_grad_enabled(False)
    _, hook = hook_of(model)
    cfg = real_config(model, variant, overrides)
    target, fp32 = get_target(target_name), PRECISIONS["fp32"]
    built = hook.build(cfg, component, layers, True)
    module, inputs, outputs, what = built.module, built.inputs, built.output_names, built.what
    params_m = round(parameter_count(module) / 1e6, 1)
    started = time.perf_counter()
    out = (built.reference or module)(*inputs.values())
    out = out if isinstance(out, (tuple, list)) else (out,)
    expected = {name: o.float().numpy() for name, o in zip(outputs, out)}
    eager_s = time.perf_counter() - started
    print(f"[real-size]   eager call {eager_s:.0f} s; converting", flush=True)   # a real-size check runs for minutes
    del out
    built.reference = None   # a separate reference is no longer needed: free it before converting
    entries = [Entry("main", target.prepare(module, fp32, {}), inputs, outputs)]
    del built, module
    dest = Path(out_dir)
    dest.mkdir(parents=True, exist_ok=True)
    path, convert_s = convert_and_save(target, entries, dest, cfg, f"{model} {component} check")
    print(f"[real-size]   converted in {convert_s:.0f} s; one call of the saved artifact", flush=True)
    feed = {k: v.numpy() for k, v in inputs.items()}
    del entries, inputs
    gc.collect()
    runner = target.open(path)
    try:
        started = time.perf_counter()
        got = runner.run("main", feed)
        run_s = time.perf_counter() - started
    finally:
        runner.close()
    cosine, rel = compare(got, expected, outputs)
    floor = float(cfg.gates.fp32.cosine)
    return {"component": component, "variant": str(cfg.variant), "target": target_name, "block": what,
            "params_m": params_m, "cosine": cosine, "floor": floor,
            "passed": bool(cosine >= floor),  # NaN fails
            "rel_max_abs": rel, "convert_s": round(convert_s, 1), "run_s": round(run_s, 1), "eager_s": round(eager_s, 1)}


def gpu_row(model: str, overrides: list[str], component: str, variant: str, layers: int | None,
            out_dir: str) -> dict:
    """Real size on the LiteRT GPU delegate (software Vulkan here): the hook's build at `layers` with its
    `gpu_overrides`, converted at fp32, saved, created GPU-only and run in enforced fp32 and in fp16 against the
    CPU interpreter on the same artifact — the check every LiteRT bundle gets, gated by the model's fp32 GPU
    policy (must be resident when the model requires it at fp32)."""
    import torch

    from zoo import gates
    from zoo.precision import PRECISIONS
    from zoo.targets import Entry, get_target
    from zoo.targets.litert import describe_gpu_check, gpu_policy
    from zoo.targets.litert_gpu import gpu_check

    torch.set_grad_enabled(False)
    _, hook = hook_of(model)
    cfg = real_config(model, variant, [*hook.gpu_overrides, *overrides])
    target = get_target("litert")
    built = hook.build(cfg, component, layers, False)
    module, inputs, outputs, what = built.module, built.inputs, built.output_names, built.what
    params_m = round(parameter_count(module) / 1e6, 1)
    entries = [Entry("main", target.prepare(module, PRECISIONS["fp32"], {}), inputs, outputs)]
    del built, module
    dest = Path(out_dir)
    dest.mkdir(parents=True, exist_ok=True)
    path, convert_s = convert_and_save(target, entries, dest, cfg, f"{model} {component} GPU check")
    print(f"[real-size]   converted in {convert_s:.0f} s; GPU check (software Vulkan)", flush=True)
    feed = {"main": {k: v.numpy() for k, v in inputs.items()}}
    del entries, inputs
    gc.collect()
    check = gpu_check(path, feed, timeout_s=float(cfg.gpu.timeout_s)).to_dict()
    results = gates.gpu_gates(check, "fp32", gpu_policy(cfg, "fp32", component))
    errors = [e for outs in check.get("outputs", {}).values() for e in outs.values()]

    def worst(key: str, pick) -> float:   # NaN anywhere (or no output) stays NaN
        values = [gates.json_number(e.get(key)) for e in errors]
        return math.nan if not values or any(math.isnan(v) for v in values) else pick(values)

    return {"component": component, "variant": str(cfg.variant), "block": what, "params_m": params_m,
            "status": check["status"],
            "describe": (describe_gpu_check(check) if check["status"] == "accepted" or check.get("rejected_ops")
                         else f"{check['status']}: {check.get('reason') or 'no reason given'}")[:300],
            "fp32_rel_err": worst("fp32_rel_err", max), "fp16_cosine": worst("fp16_cosine", min),
            "fp16_rel_err": worst("fp16_rel_err", max), "gates": [g.describe() for g in results],
            "passed": bool(results) and all(g.passed for g in results),   # a check that did not run fails
            "convert_s": round(convert_s, 1), "check_s": round(float(check.get("seconds") or 0.0), 1)}


def in_fresh_process(fn, *args) -> dict:
    """fn in a fresh process; a process the kernel killed (out of memory at real size) is a result, not a crash."""
    from concurrent.futures.process import BrokenProcessPool

    from zoo.bench import in_fresh_process as fresh

    try:
        return fresh(fn, *args)
    except BrokenProcessPool:
        return {"status": "failed", "error": KILLED, "convert_s": "—"}


# ---------------------------------------------------------------- the README block


def row_key(row: dict) -> tuple:
    return tuple(row.get(k) for k in ("component", "variant", "target", "precision", "block"))


def table(results: dict, model: str, conditions: str) -> str:
    lines = [f"Generated by `make real-size MODEL={model}` on {results['date']} ({results['machine']}); "
             f"seeded random weights of the real architectures (the Hub is not reachable here; time, memory and size "
             f"do not depend on the values); {conditions}; wall time of the last run {results['wall_min']:.0f} min "
             f"(`--resume` keeps the rows an interrupted run had converted, with their own figures)."
             f"{earlier_run_sentence(results)}{gpu_run_sentence(results)}", "",
             "| component | variant | target | precision | params M | convert s | peak RSS GB | size GB | how |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in results["rows"]:
        how = (r.get("error") if r["status"] == "failed"
               else ("lightweight conversion" if r.get("lightweight_conversion") else
                     ("torch weights released before convert/save" if r["target"] == "coreai" else "default conversion")))
        peak = f"{r['peak_rss_mb'] / 1024:.1f}" if r.get("peak_rss_mb") else "—"
        size = f"{r['size_mb'] / 1000:.2f}" if r.get("size_mb") else "—"
        lines.append(f"| {r['component']} | {r['variant']} | {r['target']} | {r['precision']} | {r.get('params_m', '—')} "
                     f"| {r['convert_s']} | {peak} | {size} | {r['status']}: {how} |")
    lines += _section("Real-size numerics per block (fp32, saved artifact vs the eager port, same seeded inputs):",
                      ["component", "variant", "target", "block", "params M", "cosine (fp32 gate)",
                       "max-abs / max-abs(ref)", "convert s", "one call s"], results.get("blocks") or [], _block_cells)
    lines += _section("Real-size LiteRT GPU check (the fp32 artifact created GPU-only on software Vulkan, run in enforced "
                      "fp32 and in fp16 — the phone default — against the CPU interpreter on the same inputs):",
                      ["component", "variant", "block", "params M", "GPU", "fp32 rel err", "fp16 cosine", "fp16 rel err",
                       "gates", "convert s", "check s"], results.get("gpu") or [], _gpu_cells)
    return "\n".join(lines)


def _section(title: str, columns: list[str], items: list[dict], cells) -> list[str]:
    """A titled table of `items` (none: no section); an item that could not run says so in its row."""
    if not items:
        return []
    lines = ["", title, "", "| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    for item in items:
        row = (cells(item) if "error" not in item else
               [item["component"], item["variant"], *([item["target"]] if "target" in item else []), "—", "—",
                f"not run: {item['error']}"])
        lines.append("| " + " | ".join(str(c) for c in row + [""] * (len(columns) - len(row))) + " |")
    return lines


def _block_cells(b: dict) -> list:
    return [b["component"], b["variant"], b["target"], b["block"], b["params_m"],
            f"{b['cosine']:.9f} ({'passed' if b['passed'] else 'FAILED'} ≥ {b['floor']})", f"{b['rel_max_abs']:.2e}",
            b["convert_s"], b["run_s"]]


def _gpu_cells(g: dict) -> list:
    describe = " ".join(str(g["describe"]).replace("|", "/").split())   # one table cell: no newlines, no pipes
    return [g["component"], g["variant"], g["block"], g["params_m"], describe, _fmt(g["fp32_rel_err"], ".2e"),
            _fmt(g["fp16_cosine"], ".7f"), _fmt(g["fp16_rel_err"], ".2e"), _gpu_verdict(g),
            g["convert_s"], g["check_s"]]


def _gpu_verdict(g: dict) -> str:
    """passed, or FAILED with the gates that failed (a check with no gate at all could not run)."""
    if g["passed"]:
        return "passed"
    failed = [text.split(": ", 1)[-1].removesuffix(": FAIL").replace(" <= ", ", needs <= ").replace(" >= ", ", needs >= ")
              for text in g.get("gates", []) if text.endswith("FAIL")]
    return "FAILED" + (f": {'; '.join(failed)}" if failed else ": the check could not run")


def _fmt(value, spec: str) -> str:
    return "—" if value is None or (isinstance(value, float) and math.isnan(value)) else format(value, spec)


def write_readme(readme: Path, block_text: str, intro: str) -> None:
    """Replace the block between the markers; the first time, put a "Real size" section (intro + block) before
    "## Not done yet" (else "## Measured")."""
    text = readme.read_text()
    block = f"{START}\n{block_text}\n{END}"
    if START in text and END in text:
        text = re.sub(re.escape(START) + r".*?" + re.escape(END), lambda _: block, text, count=1, flags=re.S)
    else:
        anchor = "## Not done yet" if "## Not done yet" in text else "## Measured"
        if anchor not in text:
            raise ZooError(f"{readme} has neither the real-size markers nor a '## Not done yet' / '## Measured' heading.",
                           f"add the line {START} and the line {END} where the table belongs.")
        text = text.replace(anchor, f"## Real size\n\n{intro}\n\n{block}\n\n{anchor}", 1)
    readme.write_text(text)


def failures(results: dict) -> list[dict]:
    return ([r for r in results["rows"] if r.get("status") != "converted"]
            + [b for b in results.get("blocks", []) + results.get("gpu", []) if not b.get("passed")])


def ordered(items: list[dict], declared: list[tuple], fields: tuple[str, ...]) -> list[dict]:
    """`items` in the order the hook declares them (matched on `fields`); undeclared ones last."""
    order = {tuple(d[:len(fields)]): i for i, d in enumerate(declared)}
    return sorted(items, key=lambda r: order.get(tuple(r.get(f) for f in fields), len(order)))


def merge_committed(fresh: dict, committed: dict, component: str, hook) -> dict:
    """A one-component run's rows and checks, put among the committed results of the other components (in the
    hook's order); the date and wall time of the run that measured those are kept beside them, and the table
    says so."""
    kept_rows = [r for r in committed.get("rows", []) if r.get("component") != component]
    kept_blocks = [b for b in committed.get("blocks", []) if b.get("component") != component]
    kept_gpu = [g for g in committed.get("gpu", []) if g.get("component") != component]
    kept = sorted({r["component"] for r in kept_rows + kept_blocks + kept_gpu})
    earlier = committed.get("earlier_run") or {"date": committed.get("date"), "wall_min": committed.get("wall_min")}
    if "components" in earlier:   # an earlier --only run's component was measured then, not in the full run
        kept = [c for c in earlier["components"] if c in kept]
    merged = {**fresh,
              "rows": ordered(kept_rows + fresh["rows"], hook.rows, ("component", "variant", "target", "precision")),
              "blocks": ordered(kept_blocks + fresh["blocks"], hook.checks, ("component", "variant", "target")),
              "gpu": ordered(kept_gpu + fresh.get("gpu", []), hook.gpu_checks, ("component", "variant"))}
    if kept:
        merged["earlier_run"] = {**earlier, "components": kept}
    return merged


def merge_gpu_checks(fresh: dict, committed: dict, hook) -> dict:
    """A `--gpu-only` run: its GPU checks replace the committed ones of the same components; every row and numeric
    check stays as committed, and the table says when the GPU checks ran."""
    ran = {g["component"] for g in fresh["gpu"]}
    kept = [g for g in committed.get("gpu", []) if g.get("component") not in ran]
    gpu = ordered(kept + fresh["gpu"], hook.gpu_checks, ("component", "variant"))
    earlier = committed.get("gpu_run") or {"components": [], "wall_min": 0.0}   # successive --gpu-only runs add up
    return {**committed, "gpu": gpu,
            "gpu_run": {"date": fresh["date"], "wall_min": earlier["wall_min"] + fresh["wall_min"],
                        "components": sorted(set(earlier["components"]) | ran)}}


def earlier_run_sentence(results: dict) -> str:
    earlier = results.get("earlier_run")
    if not earlier:
        return ""
    return (f" Rows and checks of {', '.join(earlier['components'])}: from the full run on {earlier['date']} "
            f"({earlier['wall_min']:.0f} min); the others from `--only COMPONENT` runs, the last on {results['date']}.")


def gpu_run_sentence(results: dict) -> str:
    run = results.get("gpu_run")
    return (f" GPU checks of {', '.join(run['components'])}: from `--gpu-only` runs, the last on {run['date']} "
            f"({run['wall_min']:.0f} min in all)." if run else "")


# ---------------------------------------------------------------- the run


def parse(argv):
    parser = argparse.ArgumentParser(prog="zoo real-size", description=__doc__.splitlines()[0])
    parser.add_argument("model")
    parser.add_argument("overrides", nargs="*", help="Hydra overrides of the model config (key=value): a run with "
                                                     "any is a look, not the table, unless --results names a file")
    parser.add_argument("--only", help="one component")
    parser.add_argument("--targets", default="coreai,litert")
    parser.add_argument("--layers", type=int, help="layers per network (a quick look; the table needs all)")
    parser.add_argument("--no-checks", "--no-blocks", dest="no_checks", action="store_true",
                        help="skip the numeric checks")
    parser.add_argument("--no-rows", action="store_true", help="only the numeric checks (convert no bundle)")
    parser.add_argument("--no-gpu", action="store_true", help="skip the LiteRT GPU checks at real size")
    parser.add_argument("--gpu-only", action="store_true",
                        help="only the LiteRT GPU checks (all, or --only's): they replace the committed ones, every "
                             "row and numeric check stays")
    parser.add_argument("--no-readme", action="store_true")
    parser.add_argument("--resume", action="store_true",
                        help="keep the converted rows of an interrupted run (real_size.partial.json)")
    parser.add_argument("--readme-only", action="store_true",
                        help="regenerate the README block from the results file; convert nothing")
    parser.add_argument("--results", type=Path, help="results file (default models/<model>/real_size.json)")
    parser.add_argument("--readme", type=Path, help="README to write (default models/<model>/README.md)")
    return parser.parse_args(argv)


@returns_exit_code  # bad input exits 2 with one paragraph and its fix; bugs keep their traceback
def main(argv=None) -> int:
    args = parse(argv)
    folder, hook = hook_of(args.model)
    results_path = args.results or folder / RESULTS_FILE
    readme = args.readme or folder / "README.md"
    bad = [o for o in args.overrides if "=" not in o]
    if bad:
        raise ZooError(f"'{bad[0]}' is not a config override (key=value).",
                       "pass overrides as model.key=value, flags as --flag.")
    components = {r[0] for r in hook.rows} | {c[0] for c in hook.checks}
    if args.only and args.only not in components:
        raise ZooError(f"'{args.only}' has no real-size rows for {args.model}. Components: {', '.join(sorted(components))}.",
                       "pick one of those for --only.")
    targets = args.targets.split(",")
    if args.readme_only:
        if not results_path.is_file():
            raise ZooError(f"No results at {results_path}.", f"run `zoo real-size {args.model}` first.")
        results = json.loads(results_path.read_text())
        write_readme(readme, table(results, args.model, hook.conditions), hook.intro)
        print(table(results, args.model, hook.conditions))
        return 0
    # A look (fewer layers, one component or target, other config) never overwrites the committed table,
    # unless the caller names the files.
    # `--only COMPONENT` at full size re-measures that component: its rows and checks replace the committed ones,
    # every other component's stay (merge_committed).
    one_component = bool(args.only) and not (args.layers or len(targets) < 2 or args.overrides or args.no_rows
                                             or args.no_checks or args.no_gpu or args.gpu_only)
    look = bool(args.layers or args.only or len(targets) < 2 or args.overrides or args.no_rows or args.no_checks
                or args.no_gpu or args.gpu_only)
    gpu_only = args.gpu_only and not (args.layers or args.overrides or "litert" not in targets or args.no_gpu)
    if args.gpu_only:
        args.no_rows = args.no_checks = True
    writes = not look or one_component or gpu_only or args.results is not None
    started = time.perf_counter()
    rows, blocks, gpu = [], [], []
    partial = results_path.with_suffix(".partial.json")
    done = ({row_key(r): r for r in json.loads(partial.read_text())["rows"] if r.get("status") == "converted"}
            if args.resume and partial.is_file() else {})
    scratch_root = Path(__file__).resolve().parent.parent / ".cache"
    scratch_root.mkdir(exist_ok=True)
    with tempfile.TemporaryDirectory(dir=scratch_root) as scratch:
        for i, (component, variant, target, precision) in enumerate(hook.rows):
            if (args.only and component != args.only) or target not in targets or args.no_rows:
                continue
            print(f"[real-size] {component} {variant} {target} {precision} ...", flush=True)
            key = (component, variant, target, precision, None)
            row = done.get(key) or {"component": component, "variant": variant, "target": target,
                                    "precision": precision,
                                    **in_fresh_process(convert_row, args.model, args.overrides, component, variant,
                                                       target, precision, args.layers, f"{scratch}/{i}")}
            print(f"[real-size]   {json.dumps(row)}", flush=True)
            rows.append(row)
            if writes:
                partial.write_text(json.dumps({"rows": rows}, indent=2) + "\n")
            shutil.rmtree(Path(scratch, str(i)), ignore_errors=True)   # a real-size bundle is GBs: free the disk
        if not args.no_checks:
            for i, (component, variant, target, layers) in enumerate(hook.checks):
                if (args.only and component != args.only) or target not in targets:
                    continue
                layers = args.layers or layers
                print(f"[real-size] check {component} {variant} {target} layers={layers or 'all'} ...", flush=True)
                try:
                    block = in_fresh_process(check_row, args.model, args.overrides, component, variant, target,
                                             layers, f"{scratch}/c{i}")
                except Exception as exc:   # a check that could not run is reported as not run (and fails the run)
                    block = {"error": f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"[:200]}
                if "error" in block:
                    block = {"component": component, "variant": variant, "target": target, "error": block["error"]}
                print(f"[real-size]   {json.dumps(block)}", flush=True)
                blocks.append(block)
                shutil.rmtree(Path(scratch, f"c{i}"), ignore_errors=True)
        if not args.no_gpu and (args.gpu_only or not args.no_checks):
            for i, (component, variant, layers) in enumerate(hook.gpu_checks):
                if (args.only and component != args.only) or "litert" not in targets:
                    continue
                layers = args.layers or layers
                print(f"[real-size] GPU check {component} {variant} layers={layers or 'all'} ...", flush=True)
                try:
                    row = in_fresh_process(gpu_row, args.model, args.overrides, component, variant, layers,
                                           f"{scratch}/g{i}")
                except Exception as exc:   # could not run: reported as not run (and fails the run)
                    row = {"error": f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"[:200]}
                if "error" in row:
                    row = {"component": component, "variant": variant, "error": row["error"], "passed": False}
                print(f"[real-size]   {json.dumps(row)}", flush=True)
                gpu.append(row)
                shutil.rmtree(Path(scratch, f"g{i}"), ignore_errors=True)
    results = {"date": time.strftime("%Y-%m-%d"), "wall_min": (time.perf_counter() - started) / 60,
               "machine": f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}",
               "layers": args.layers or hook.full_layers, "rows": rows, "blocks": blocks, "gpu": gpu}
    if one_component and results_path.is_file():
        results = merge_committed(results, json.loads(results_path.read_text()), args.only, hook)
    elif gpu_only and results_path.is_file():
        results = merge_gpu_checks(results, json.loads(results_path.read_text()), hook)
    if writes:
        results_path.write_text(json.dumps(results, indent=2) + "\n")
        partial.unlink(missing_ok=True)
        if not args.no_readme:
            write_readme(readme, table(results, args.model, hook.conditions), hook.intro)
    print(table(results, args.model, hook.conditions))
    failed = failures(results)
    if failed:
        print(f"[real-size] FAILED: {len(failed)} row(s)/check(s) did not convert or pass (see the table).", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    run_script(main)
