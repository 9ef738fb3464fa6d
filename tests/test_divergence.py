"""zoo.divergence: the first intermediate whose fp16 error exceeds its tolerance, named by op, module and
source line; surfaced by `zoo doctor --fix` when the fp16 result is off."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from zoo import doctor
from zoo.divergence import first_divergence, relative_errors, tapped_module


@pytest.fixture(autouse=True)
def _factories_importable(monkeypatch):
    from pathlib import Path

    monkeypatch.syspath_prepend(str(Path(__file__).parent))


class Overflowing(nn.Module):
    """A scale-up, then x*x past fp16's 65504, then a harmless tail."""

    def forward(self, x):
        y = x * 300.0
        z = y * y  # 90000 > 65504: inf in fp16
        return (z + 1.0).sqrt() * 0.5


def test_locates_the_first_overflowing_op_and_its_line():
    found = first_divergence(Overflowing(), (torch.ones(2, 4),))
    assert found is not None and found.op.startswith("mul") and found.rel_error == float("inf")
    assert "test_divergence.py" in found.source and "z = y * y" in found.source
    assert found.module == "Overflowing"


def test_quiet_when_fp16_is_fine():
    # negative control: the same graph at a scale fp16 holds
    assert first_divergence(Overflowing(), (torch.full((2, 4), 0.1),)) is None


def test_taps_are_every_float_intermediate_in_graph_order():
    gm, taps = tapped_module(Overflowing(), (torch.ones(2, 4),))
    outs = gm(torch.ones(2, 4))
    assert len(outs) == len(taps) == 5 and float(outs[1][0, 0]) == 90000.0


def test_relative_error_is_inf_where_fp16_is_not_finite():
    assert relative_errors([[float("inf")]], [[1.0]]) == [float("inf")]
    assert relative_errors([[1.01]], [[1.0]])[0] == pytest.approx(0.01)


def test_cli_fix_surfaces_the_divergence_when_fp16_is_off(capsys):
    # the wide norm left unfixed on purpose: --fix reports fp16 off and names the op that overflows first
    argv = ["doctor_modules:wide", "--fix", "--precision", "fp16", "--ignore", "half-rms-norm"]
    assert doctor.main(argv) == 1
    out = capsys.readouterr().out
    assert "above 0.01" in out and "first fp16 divergence: pow" in out and "(WideMLP)" not in out
    assert "doctor_modules.py:" in out
    # fixed: within tolerance, nothing to locate
    assert doctor.main(["doctor_modules:wide", "--fix", "--precision", "fp16"]) == 0
    out = capsys.readouterr().out
    assert "within 0.01" in out and "divergence" not in out


@pytest.mark.gpu
def test_gpu_mode_finds_the_same_op_on_the_device():
    from gpu_mode import require_gpu

    require_gpu()
    found = first_divergence(Overflowing(), (torch.ones(2, 4),), mode="gpu")
    assert found is not None and found.op.startswith("mul") and "z = y * y" in found.source
    assert first_divergence(Overflowing(), (torch.full((2, 4), 0.1),), mode="gpu") is None
