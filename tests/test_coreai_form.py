"""The Core AI graph form pass (zoo/targets/coreai_form.py): Linears stored as W^T.

On T5-v1.1-base it removed 84 of 132 runtime transposes and made the artifact 1.9x faster in one run
(`scripts/coreai_form_check.py t5 encoder variant=base`). Here, on a tiny module: the same numbers, fewer
transposes in the converted program, and the caller's module untouched.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from zoo.precision import PRECISIONS, Fp32AccumulateLinear
from zoo.targets import Entry
from zoo.targets.coreai import CoreAITarget
from zoo.targets.coreai_form import PretransposedLinear, op_histogram, pretranspose_linears


class FeedForward(nn.Module):
    """Third-party style: reads `wo.weight.dtype` before the last Linear (as T5's feed-forward does)."""

    def __init__(self):
        super().__init__()
        self.wi = nn.Linear(32, 64)
        self.wo = nn.Linear(64, 32, bias=False)

    def forward(self, x):
        return self.wo(torch.relu(self.wi(x)).to(self.wo.weight.dtype))


def tiny():
    torch.manual_seed(0)
    return nn.Sequential(FeedForward(), FeedForward()).eval(), torch.randn(1, 8, 32)


def test_pretransposed_copy_is_exact_and_leaves_the_original_alone():
    module, x = tiny()
    keys_before = {k: v.clone() for k, v in module.state_dict().items()}
    form, swapped = pretranspose_linears(module)
    assert swapped == 4 and all(isinstance(m, PretransposedLinear) for m in (form[0].wi, form[0].wo))
    assert isinstance(module[0].wi, nn.Linear)  # the caller's module keeps upstream's layout and keys
    assert module.state_dict().keys() == keys_before.keys()
    assert all(torch.equal(module.state_dict()[k], v) for k, v in keys_before.items())
    assert form[0].wi.weight_t.data_ptr() == module[0].wi.weight.data_ptr()  # shared, not copied
    with torch.no_grad():
        assert torch.equal(form(x), module(x))


def test_fp32_accumulating_linears_keep_their_rule():
    module, x = tiny()
    bf16 = PRECISIONS["bf16"]
    prepared = CoreAITarget().prepare(module, bf16, {"fp32_linear_accumulation": True})
    layers = [m for m in prepared.modules() if isinstance(m, PretransposedLinear)]
    assert len(layers) == 4 and all(m.accumulate_fp32 for m in layers)
    assert not any(isinstance(m, (nn.Linear, Fp32AccumulateLinear)) for m in prepared.modules())


@pytest.mark.parametrize("pretranspose", [True, False])
def test_converted_program_has_fewer_transposes_and_the_same_outputs(pretranspose, tmp_path):
    """pretranspose=False is the negative control: the authored form keeps one transpose per Linear."""
    module, x = tiny()
    target = CoreAITarget()
    prepared = target.prepare(module, PRECISIONS["fp32"], {"pretranspose_linears": pretranspose})
    entries = [Entry("main", prepared, {"x": x}, ["y"])]
    program = target.convert(entries, target.export(entries), None)
    transposes = op_histogram(program).get("transpose", 0)
    assert "transpose" in target.conversion_note(program)
    if pretranspose:
        assert transposes == 0
    else:
        assert transposes >= 4
    with target.open(target.save(program, tmp_path, {})) as runner:
        y = runner.run("main", {"x": x.numpy()})["y"]
    with torch.no_grad():
        np.testing.assert_allclose(y, module(x).numpy(), rtol=1e-5, atol=1e-6)
