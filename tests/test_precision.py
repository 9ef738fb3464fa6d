"""The reduced-precision wrapper: I/O stays fp32, the caller's module is untouched, and the fp32
accumulation option fixes the Core AI CPU runtime's bf16 Linear drift (with its negative control)."""

import tempfile
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from zoo import gates
from zoo.precision import PRECISIONS, IOCast
from zoo.targets import Entry
from zoo.targets.coreai import CoreAITarget


def test_iocast_keeps_io_fp32_and_the_original_module_fp32():
    module = nn.Linear(8, 8)
    wrapped = IOCast(module, torch.bfloat16)
    y = wrapped(torch.randn(2, 8))
    assert y.dtype == torch.float32 and module.weight.dtype == torch.float32
    assert wrapped.module.weight.dtype == torch.bfloat16


def _coreai_bf16_error(accumulate_fp32: bool) -> tuple[float, str]:
    torch.manual_seed(0)
    module = nn.Sequential(nn.Linear(2048, 768, bias=False)).eval()
    x = torch.randn(1, 128, 2048)
    target = CoreAITarget()
    prepared = target.prepare(module, PRECISIONS["bf16"], {"fp32_linear_accumulation": accumulate_fp32})
    entries = [Entry("main", prepared, {"x": x}, ["y"])]
    program = target.convert(entries, target.export(entries), None)
    with tempfile.TemporaryDirectory() as folder:
        path = target.save(program, Path(folder), {})
        with target.open(path) as runner:
            y = runner.run("main", {"x": x.numpy()})["y"]
        summary = target.summary(path)
    with torch.no_grad():
        reference = module(x).numpy()
    return 1 - gates.cosine(y, reference), summary


def test_fp32_accumulation_restores_bf16_accuracy_and_keeps_bf16_storage():
    error, summary = _coreai_bf16_error(accumulate_fp32=True)
    assert error < 2e-5
    assert "BFloat16, 1572864" in summary  # the 2048x768 weight is still stored as bf16


def test_negative_control_plain_bf16_linear_drifts_on_the_coreai_cpu_runtime():
    """If a runtime upgrade fixes this, the test says so and the option can go."""
    error, _ = _coreai_bf16_error(accumulate_fp32=False)
    assert error > 3e-4
