"""Core AI 8-bit palettization on weights larger than 6.55 in magnitude.

coreai-opt 0.4.0's fast k-means mode rounds weights to 4 decimals in fp16 (x * 1e4 overflows there),
which turned SmolLM2's layer-27 MLP look-up tables into inf/NaN and every logit into NaN. These tests
keep both halves: our default (exact k-means) stays finite and matches eager on the artifact, and the
fast mode is still caught by the non-finite check before a bundle is saved (the negative control).
"""

import tempfile
from pathlib import Path

import pytest
import torch
from torch import nn

from zoo import gates
from zoo.errors import ZooError
from zoo.targets import Entry
from zoo.targets.coreai import CoreAITarget, nonfinite_lookup_tables, palettize_int8

LARGE = 6.66  # SmolLM2-135M's layer-27 up_proj reaches 6.657 (gate_proj 9.25); anything above 6.5504 overflowed


def _program_with_a_large_weight():
    torch.manual_seed(0)
    # 512 inputs: a 32-channel group then has >= 10,000 values, where coreai-opt uses its 1-D k-means
    # (SmolLM2's path); smaller groups go to scikit-learn, which rejects inf and skips the weight.
    module = nn.Sequential(nn.Linear(512, 64, bias=False)).eval()
    with torch.no_grad():
        module[0].weight.mul_(0.1)
        module[0].weight[3, 7] = LARGE
        module[0].weight[40, 100] = -LARGE
    x = torch.randn(1, 8, 512)
    target = CoreAITarget()
    entries = [Entry("main", module, {"x": x}, ["y"])]
    return module, x, target, target.convert(entries, target.export(entries), None)


def test_palettized_large_weights_stay_finite_and_match_eager():
    module, x, target, program = _program_with_a_large_weight()
    compressed = palettize_int8(program, kmeans_workers=1)
    assert nonfinite_lookup_tables(compressed) == []
    with tempfile.TemporaryDirectory() as folder:
        path = target.save(compressed, Path(folder), {})
        assert "lut_to_dense" in target.summary(path)  # really palettized
        with target.open(path) as runner:
            y = runner.run("main", {"x": x.numpy()})["y"]
    with torch.no_grad():
        reference = module(x).numpy()
    assert gates.cosine(y, reference) > 0.9999


def test_negative_control_fast_kmeans_overflows_and_is_refused():
    _, _, _, program = _program_with_a_large_weight()
    with pytest.raises(ZooError, match="non-finite look-up-table entries"):
        palettize_int8(program, kmeans_workers=1, fast_kmeans=True)
