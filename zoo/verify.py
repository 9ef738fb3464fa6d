"""`python -m zoo.verify BUNDLE [--fast] [--gates]` (`zoo verify`): is this bundle intact, and does it
still pass its gates here?

For a bundle from anywhere (a download, a colleague's disk, an old exports/ folder):
1. the manifest: present, valid JSON, every file listed with sha256 and size, the artifact among them;
2. every listed file against its sha256 (`--fast`: sizes of all, hashes of small files only — catches a
   missing or truncated file, not a flipped byte inside a large artifact);
3. with `--gates`: the bundle's gates re-run on this machine's runtime, without re-converting anything —
   the reference is rebuilt from what the bundle records (report.json `model_config`, the manifest's
   `weights` provenance, whose file hashes must match the weights found here), run on the component's
   example inputs, and compared with the saved artifact by the component's own verify hook (default:
   the config's metrics on every output). The LiteRT GPU-delegate check is not re-run here
   (`python -m zoo.targets.litert_gpu BUNDLE/model.tflite` does that).

Exit status: 0 intact (and, with --gates, every gate passed); 2 damaged, or not a bundle; 1 intact but a
gate failed on this machine (the same code `zoo convert` uses for a failed gate).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import zoo.quiet  # noqa: F401
from rich.markup import escape

from zoo.bundle import MANIFEST, REPORT
from zoo.cli import returns_exit_code, run_script
from zoo.console import Console
from zoo.errors import GateFailure, ZooError
from zoo.integrity import DamagedBundle, refetch_fix, describe_damage, inspect_bundle

WEIGHTS_SPEC = {"tiny": "tiny", "random": "random", "hub": "hub", "embedded": "embedded"}  # + local:PATH


def bundle_folder(path: Path) -> Path:
    """The bundle folder, also when given its artifact (model.tflite, model.aimodel/) or its manifest."""
    path = Path(path)
    if not (path / MANIFEST).exists() and (path.parent / MANIFEST).is_file():
        return path.parent
    return path


def print_check(check, console: Console) -> None:
    mode = "sha256 of every file" if check.mode == "full" else f"sizes of every file, sha256 of {check.hashed}"
    m = check.manifest  # from anywhere: every value is escaped before rich sees it
    head = f"{check.folder}: {m.get('model', '?')} · {m.get('component', '?')} → {m.get('target', '?')} · {m.get('precision', '?')}"
    console.rich.print(escape(head))
    if check.intact:
        console.rich.print(f"  [green]✓[/] {check.files} files, {check.bytes / 2**20:.2f} MiB match the manifest ({mode})")
    for problem in check.problems:
        console.rich.print(f"  [red]✗[/] {escape(problem)}")
    status = check.manifest.get("status")
    if status and status != "passed":
        console.rich.print(f"  [yellow]![/] its manifest records status '{escape(str(status))}': it did not pass its gates")


# ---------------------------------------------------------------- --gates


def read_report(folder: Path) -> dict:
    path = folder / REPORT
    try:
        report = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError as exc:
        raise DamagedBundle(f"{folder} has no {REPORT}: its gates cannot be re-run.", refetch_fix(folder)) from exc
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise DamagedBundle(f"{path} is not valid JSON ({exc}).", refetch_fix(folder)) from exc
    if not isinstance(report, dict) or not isinstance(report.get("model_config"), dict):
        raise ZooError(f"{path} records no model_config, so the reference cannot be rebuilt (a bundle made by an "
                       "older zoo).", f"re-convert it, or check only its hashes: python -m zoo.verify {folder}")
    return report


def weights_spec_of(provenance: dict) -> str:
    source = provenance.get("source")
    if source == "local":
        return f"local:{provenance.get('path')}"
    if source in WEIGHTS_SPEC:
        return WEIGHTS_SPEC[source]
    raise ZooError(f"The manifest records weights from '{source}', which zoo cannot load again.",
                   "re-convert the bundle with WEIGHTS=tiny, hub, random, embedded or local:PATH.")


def same_weights_or_refuse(recorded: dict, found: dict, where: str) -> None:
    """The reference must be built from the very files the bundle was made from, or the comparison
    says nothing about the bundle."""
    recorded_files, found_files = recorded.get("files") or {}, found.get("files") or {}
    if recorded_files and recorded_files != found_files:
        differ = sorted(set(recorded_files) ^ set(found_files)) or sorted(
            n for n in recorded_files if recorded_files[n] != found_files.get(n))
        raise ZooError(f"The weights at {where} differ from those this bundle was made from ({', '.join(differ[:3])}).",
                       "point the check at the original checkpoint (re-run where it was converted), or re-convert.")


def rerun_gates(folder: Path, manifest: dict) -> list:
    """The bundle's gates, on this machine, from what the bundle records (no re-conversion)."""
    from omegaconf import OmegaConf

    from zoo.pipeline import VerifyContext, default_verify, run_module, thresholds_for, to_numpy
    from zoo.registry import get_spec
    from zoo.targets import get_target
    from zoo.weights import built_from, resolve

    cfg = OmegaConf.create(read_report(folder)["model_config"])
    spec = get_spec(cfg)
    component = spec.component(manifest["component"])
    provenance = manifest.get("weights") or {}
    checkpoint = resolve(cfg, weights_spec_of(provenance), spec.tiny_dir, spec.random_checkpoint, embedded=spec.embedded)
    same_weights_or_refuse(provenance, checkpoint.provenance, checkpoint.provenance.get("path", checkpoint.source))
    with built_from(checkpoint, spec.name):
        reference = component.reference(checkpoint, cfg)
        inputs = component.example_inputs(checkpoint, cfg)
    reference_outputs = run_module(reference, inputs, component.output_names)
    thresholds = thresholds_for(cfg, manifest["precision"], component.name)
    target = get_target(manifest["target"])
    runner = target.open(folder / target.artifact)
    try:
        # A verify hook may write evidence (e.g. transcript.json) into bundle_dir: never into the bundle.
        with tempfile.TemporaryDirectory(prefix="zoo-verify-") as scratch:
            ctx = VerifyContext(runner=runner, session=component.session(runner, target.name), target=target.name,
                                inputs=to_numpy(inputs), reference_outputs=reference_outputs, thresholds=thresholds,
                                checkpoint=checkpoint, cfg=cfg, bundle_dir=Path(scratch))
            results, _ = (component.verify or default_verify)(ctx)
    finally:
        runner.close()
    return results


def print_gates(results: list, manifest: dict, console: Console) -> None:
    recorded = {(g.get("output"), g.get("metric")): g.get("value") for g in manifest.get("gates") or []}
    console.rich.print("  gates re-run on this machine (LiteRT GPU check not re-run):")
    for g in results:
        was = recorded.get((g.output, g.metric))
        then = f" (recorded {was:.7g})" if isinstance(was, (int, float)) else ""
        mark = "[green]✓[/]" if g.passed else "[red]✗[/]"
        console.rich.print(f"  {mark} {escape(g.describe())}{then}")


# ---------------------------------------------------------------- CLI


@returns_exit_code
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m zoo.verify", description=__doc__.splitlines()[0])
    parser.add_argument("bundle", type=Path, help="bundle folder (the one holding manifest.json)")
    parser.add_argument("--fast", action="store_true", help="sizes of every file, sha256 of small files only")
    parser.add_argument("--gates", action="store_true", help="also re-run the bundle's gates on this machine")
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    console = Console()
    folder = bundle_folder(args.bundle)
    check = inspect_bundle(folder, fast=args.fast)
    print_check(check, console)
    if not check.intact:
        raise DamagedBundle(describe_damage(check), refetch_fix(folder, check.manifest))
    if args.gates:
        results = rerun_gates(folder, check.manifest)
        print_gates(results, check.manifest, console)
        failed = [g for g in results if not g.passed]
        if failed or not results:
            raise GateFailure(f"{len(failed)} of {len(results)} gates failed on this machine for {folder}.",
                              "compare with the recorded values above: a runtime or toolchain here that differs from "
                              "the one in the manifest's `tools` can explain it; re-convert here to get a bundle "
                              "verified on this machine.")
    return 0


if __name__ == "__main__":
    run_script(main)
