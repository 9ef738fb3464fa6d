"""Shared test helpers for the CLI run in a subprocess: a conversion started at once in the background (the slow
part of a model's tests overlaps its port tests), and the plan lines `zoo convert-all` prints."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def start(out: Path, overrides: list[str], model_folder: str):
    """Yields (process, out/model_folder) for `python -m zoo.convert *overrides out_dir=out`; kills it if no test
    waited for it (deselected), so nothing is left running."""
    proc = subprocess.Popen([sys.executable, "-m", "zoo.convert", *overrides, f"out_dir={out}"], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    yield proc, out / model_folder
    if proc.poll() is None:
        proc.kill()
        proc.communicate()


def finished(converted) -> Path:
    """Waits for the background conversion; it must have succeeded. Returns its model folder."""
    proc, folder = converted
    output, _ = proc.communicate(timeout=900)
    assert proc.returncode == 0, output[-4000:]
    return folder


def plan_outcomes(stdout: str) -> dict[str, str]:
    """{model/target/precision: outcome} from the plan lines convert-all prints before it launches anything."""
    found = {}
    for line in stdout.splitlines():
        name, sep, rest = line.strip().partition(": ")
        if sep and name.count("/") == 2 and " " not in name:
            found[name] = rest.split(" (")[0]
    return found
