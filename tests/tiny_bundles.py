"""Tiny fp32 bundles made by the real CLI, once per test session, and the damage tests do to copies.

T5 (one-shot) and gqa-llm (generative), each on Core AI and LiteRT: two `zoo.convert` processes that run
side by side (~30 s on 2 cores). `start()` launches them and returns at once, so a test module can run
cases that need no bundle meanwhile; `wait()` returns {"t5-coreai": Path, ...} once both have passed.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MODELS = ("t5", "gqa-llm")
BUNDLES = {f"{m}-{t}": (m, f"{t}-fp32") for m in MODELS for t in ("coreai", "litert")}


def cli_env() -> dict[str, str]:
    """The GPU check is off for these bundles (model.gpu.check=false): CI's requirement that it ran
    (ZOO_REQUIRE_GPU_CHECK=1) would mark them failed, and nothing here is about the GPU."""
    env = dict(os.environ)
    env.pop("ZOO_REQUIRE_GPU_CHECK", None)
    return env


class TinyBundles:
    def __init__(self, out: Path):
        self.out = out
        self._procs: dict[str, subprocess.Popen] = {}
        self._paths: dict[str, Path] | None = None

    def start(self) -> None:
        for model in MODELS:
            if model not in self._procs:
                self._procs[model] = subprocess.Popen(
                    [sys.executable, "-m", "zoo.convert", f"model={model}", "target=all", "precision=fp32",
                     "weights=tiny", "model.gpu.check=false", f"out_dir={self.out}"],
                    cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=cli_env())

    def wait(self) -> dict[str, Path]:
        if self._paths is None:
            self.start()
            for model, proc in self._procs.items():
                output, _ = proc.communicate(timeout=900)
                assert proc.returncode == 0, f"converting the tiny {model} bundles failed:\n{output[-4000:]}"
            self._paths = {name: self.out / model / folder for name, (model, folder) in BUNDLES.items()}
        return self._paths


# ---------------------------------------------------------------- damage (always to a copy)


def copy_bundle(source: Path, dest: Path) -> Path:
    shutil.copytree(source, dest)
    return dest


def flip_byte(path: Path, offset: int | None = None) -> None:
    """One bit of one byte, in the middle of the file unless told where."""
    data = bytearray(path.read_bytes())
    data[len(data) // 2 if offset is None else offset] ^= 0x01
    path.write_bytes(bytes(data))


def truncate(path: Path, keep: float = 0.5) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: int(len(data) * keep)])
