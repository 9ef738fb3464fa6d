import os
import sys
from pathlib import Path

import pytest

import zoo.quiet  # noqa: F401

ROOT = Path(__file__).resolve().parent.parent
# The Hub must never be contacted by the default suite: point it at a closed local port, so a test that
# reaches for the network fails fast and deterministically whatever the machine's connectivity.
os.environ.setdefault("HF_ENDPOINT", "http://127.0.0.1:9")


@pytest.fixture
def compose():
    from zoo.config import compose_convert

    return compose_convert


@pytest.fixture
def run_cli():
    """Run `python -m zoo.<module> ...` in a subprocess; returns CompletedProcess (text)."""
    import subprocess

    def run(module: str, *args: str, env: dict | None = None, timeout: int = 600):
        return subprocess.run([sys.executable, "-m", module, *args], cwd=ROOT, capture_output=True, text=True,
                              timeout=timeout, env={**os.environ, **(env or {})})

    return run
