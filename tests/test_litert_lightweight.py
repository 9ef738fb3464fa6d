"""litert.lightweight_conversion: the lazy-constant path that lets the 2B LTX-Video DiT (and the real decoders) convert
here is taken when configured, says so in the convert stage's note, and converts to the same numbers."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from zoo.targets import Entry
from zoo.targets.litert import LiteRTRunner, LiteRTTarget, use_lightweight_conversion


class TwoLayers(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(16, 32), nn.Linear(32, 8)

    def forward(self, x):
        return (self.b(torch.relu(self.a(x))),)


def test_auto_turns_on_above_the_size_threshold_only():
    assert use_lightweight_conversion("auto", int(2.5e9), 2.0)
    assert not use_lightweight_conversion("auto", int(1.5e9), 2.0)
    assert use_lightweight_conversion("on", 0, 2.0) and use_lightweight_conversion(True, 0, 2.0)
    assert not use_lightweight_conversion("off", int(9e9), 2.0)


@pytest.mark.parametrize("setting, note", [("on", "lightweight conversion (lazy constants)"), ("off", None)])
def test_the_converter_path_is_the_configured_one_and_numbers_agree(tmp_path, setting, note):
    torch.manual_seed(0)
    module, x = TwoLayers().eval(), torch.randn(4, 16)
    target = LiteRTTarget()
    path = target.convert([Entry("main", module, {"x": x}, ["y"])], None, tmp_path, lightweight_conversion=setting)
    assert target.conversion_note(path) == note
    with LiteRTRunner(path) as runner:
        got = runner.run("main", {"x": x.numpy()})["y"]
    np.testing.assert_allclose(got, module(x)[0].detach().numpy(), rtol=1e-5, atol=1e-5)
