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


def real_weights_required() -> bool:
    """CI sets ZOO_REQUIRE_REAL_WEIGHTS=1: a real-weights test that cannot find them fails, never skips."""
    return os.environ.get("ZOO_REQUIRE_REAL_WEIGHTS") == "1"


def convert_with_target(target_name: str, entries, folder: Path) -> Path:
    """Entries → saved artifact through the shared target code (export, convert, save), for tests that
    exercise one export form without the gates. Bundles with gates come from zoo.pipeline."""
    import torch

    from zoo.targets import get_target

    target = get_target(target_name)
    folder.mkdir(parents=True, exist_ok=True)
    with torch.no_grad():
        exported = None if target.export_skip_reason else target.export(entries)
        artifact = target.convert(entries, exported, folder)
    return target.save(artifact, folder, {})


@pytest.fixture(scope="session")
def tiny_bundles(tmp_path_factory):
    """Tiny fp32 T5 and gqa-llm bundles on both targets, converted once per session by the real CLI
    (tests/tiny_bundles.py). `.wait()` returns their folders; damage only copies of them."""
    from tiny_bundles import TinyBundles

    return TinyBundles(tmp_path_factory.mktemp("tiny-bundles"))


@pytest.fixture(scope="module")
def one_torch_thread():
    """Tiny graphs whose ops are microseconds each: torch's thread pool only adds contention on a shared machine
    (TripoSplat's 40-call tiny sampler took 45 s with the default pool next to a conversion subprocess, 2 s
    alone). Modules opt in with `pytestmark = pytest.mark.usefixtures("one_torch_thread")`."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
