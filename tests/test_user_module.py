"""`zoo convert module=pkg.mod:factory [fix=true]`: third-party-style modules (tests/doctor_modules.py, plain
F.* calls and their own classes) through the shared pipeline, gated against the original module.

Together the factories cover ten seed-table patterns: grid_sample, bicubic upsampling, hardtanh(0, 1)
(`warp`), a repeat_kv expand (`gqa`), a rank-6 window partition (`window`), a wide RMSNorm and a long-K
matmul under fp16 (`wide`), an int64 comparison chain (`span`), a softmax over a length-1 axis that lowers
to a DIV with identical inputs (`pool`); and three more: complex RoPE (`rope`), a sinusoidal table of large
angles and an add of a same-shape constant that the GPU computes wrong even in fp32 (`timesteps`).
`rope` has no negative control in process: unfixed, coreai-torch aborts the interpreter."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpu_mode import require_gpu
from zoo.errors import ZooError

TESTS = Path(__file__).parent
FACTORIES = ("warp", "gqa", "window", "wide", "span", "pool", "rope", "timesteps")
# The factories whose unfixed form the LiteRT GPU refuses or computes wrongly in fp16 (negative controls).
# `span`'s trap is on the Core AI GPU (macOS), which this machine cannot run: its unfixed form passes here.
GPU_TRAPS = ("warp", "gqa", "window", "wide", "pool", "timesteps")


@pytest.fixture(autouse=True)
def _factories_importable(monkeypatch):
    monkeypatch.syspath_prepend(str(TESTS))


def convert(overrides: list[str], out: Path) -> int:
    """zoo.convert's exit code for these overrides, in process (the same run() the CLI calls)."""
    from zoo.cli import translated_errors
    from zoo.config import compose_convert
    from zoo.console import Console
    from zoo.convert import run

    cfg = compose_convert([*overrides, f"out_dir={out}"])
    try:
        with translated_errors():
            return run(cfg, Console())
    except ZooError as exc:
        print(f"error: {exc.problem} Fix: {exc.fix}")
        return exc.exit_code


def report(out: Path, name: str, target: str) -> dict:
    return json.loads((out / name / f"{target}-fp32" / "report.json").read_text())


def gpu_gate(rep: dict, metric: str) -> float:
    return next(g["value"] for g in rep["gates"] if g["metric"] == metric)


# ---------------------------------------------------------------- bad input: exit 2, one paragraph


@pytest.mark.parametrize("overrides, message", [
    (["module=no_such_pkg.mod:build"], "Cannot import 'no_such_pkg.mod'"),
    (["module=doctor_modules:missing"], "has no callable 'missing'"),
    (["module=doctor_modules:not_a_pair"], "not (module, example_inputs)"),
    (["module=doctor_modules:clean", "fix=true", "ignore=[no-such-rule]"], "Unknown rule id"),
    (["fix=true"], "apply to module=pkg.mod:factory only"),
    (["module=doctor_modules:data_dependent", "fix=true"], "does not export"),
])
def test_bad_module_input_exits_2_with_one_message(overrides, message, tmp_path, capsys):
    assert convert(overrides, tmp_path) == 2
    out = capsys.readouterr().out
    assert message in out and "Traceback" not in out
    assert not list(tmp_path.iterdir())  # refused before any work


def test_module_and_fix_flags_are_the_overrides():
    from zoo.convert import flags_as_overrides

    assert flags_as_overrides(["--module", "a.b:c", "--fix", "target=litert"]) == ["module=a.b:c", "fix=true", "target=litert"]
    assert flags_as_overrides(["--module=a.b:c"]) == ["module=a.b:c"]


def test_cli_refuses_a_factory_that_does_not_import_without_a_traceback(run_cli, tmp_path):
    done = run_cli("zoo.convert", "--module", "no_such_pkg.mod:build", "--fix", f"out_dir={tmp_path}")
    assert done.returncode == 2, done.stdout + done.stderr
    text = done.stdout + done.stderr
    assert "Cannot import 'no_such_pkg.mod'" in text and "Traceback" not in text


# ---------------------------------------------------------------- a module through the pipeline


@pytest.mark.gpu
def test_fix_makes_a_third_party_gqa_gpu_resident_and_gates_it_against_the_original(tmp_path, capsys):
    require_gpu()
    assert convert(["module=doctor_modules:gqa", "fix=true"], tmp_path / "fixed") == 0
    rep = report(tmp_path / "fixed", "doctor_modules-gqa", "litert")
    assert rep["weights"]["source"] == "module" and rep["weights"]["fixes"] == {"repeat-kv-expand": 2}
    assert gpu_gate(rep, "gpu_resident") == 1.0 and gpu_gate(rep, "gpu_fp16_rel_err") <= 1e-2
    assert report(tmp_path / "fixed", "doctor_modules-gqa", "coreai")["status"] == "passed"
    # negative control: the same module unfixed is refused by the GPU delegate, and the run exits 1
    assert convert(["module=doctor_modules:gqa", "target=litert"], tmp_path / "raw") == 1
    assert "BROADCAST_TO" in capsys.readouterr().out


def test_the_reference_is_the_original_module_not_the_fixed_graph():
    from zoo.user_module import load

    loaded = load("doctor_modules:gqa", True)
    assert loaded.converted is not loaded.original and loaded.fixes == {"repeat-kv-expand": 2}
    assert type(loaded.original).__name__ == "TinyGQA" and list(loaded.inputs) == ["x"]


def test_a_fix_that_changes_the_numbers_fails_the_gate(tmp_path, monkeypatch):
    """Negative control for 'gated against the original': a broken fix (outputs off by 1%) converts
    fine and must still fail, because the reference is the untouched module."""
    from torch import nn

    from zoo import user_module

    class OffByOnePercent(nn.Module):
        def __init__(self, module):
            super().__init__()
            self.module = module

        def forward(self, *args):
            return self.module(*args) * 1.01

    def broken_fix(module, args, ignore=()):
        return type("Result", (), {"module": OffByOnePercent(module), "applied": {"broken": 1}})()

    user_module.load.cache_clear()
    monkeypatch.setattr(user_module, "fix_for_pipeline", broken_fix)
    try:
        assert convert(["module=doctor_modules:clean", "fix=true", "target=coreai"], tmp_path) == 1
    finally:
        user_module.load.cache_clear()
    failed = json.loads((tmp_path / "doctor_modules-clean" / "coreai-fp32.failed" / "report.json").read_text())
    assert any(g["metric"] == "rel_max_abs" and not g["passed"] for g in failed["gates"])


@pytest.mark.gpu
@pytest.mark.slow
@pytest.mark.parametrize("factory", FACTORIES)
def test_every_third_party_module_converts_with_fix_on_both_targets(factory, tmp_path):
    require_gpu()
    assert convert([f"module=doctor_modules:{factory}", "fix=true"], tmp_path) == 0
    name = f"doctor_modules-{factory}"
    rep = report(tmp_path, name, "litert")
    assert gpu_gate(rep, "gpu_resident") == 1.0 and gpu_gate(rep, "gpu_fp16_rel_err") <= 1e-2
    assert report(tmp_path, name, "coreai")["status"] == "passed"


@pytest.mark.gpu
@pytest.mark.slow
@pytest.mark.parametrize("factory", GPU_TRAPS)
def test_without_fix_the_gpu_gates_fail(factory, tmp_path):
    require_gpu()
    assert convert([f"module=doctor_modules:{factory}", "target=litert"], tmp_path) == 1
