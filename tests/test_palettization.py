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
from zoo.targets.coreai import CoreAITarget, PalettizationStats, nonfinite_lookup_tables, palettize_int8

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
    """'safe' rounds only weights that cannot overflow fp16: this one is clustered exact."""
    module, x, target, program = _program_with_a_large_weight()
    stats = PalettizationStats()
    compressed = palettize_int8(program, kmeans_workers=1, fast_kmeans="safe", stats=stats)
    assert (stats.clustered, stats.rounded, stats.exact_too_large) == (1, 0, 1)
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
        palettize_int8(program, kmeans_workers=1, fast_kmeans="all")


def _two_function_program(shared: bool):
    """Two functions, as an LLM's prefill and decode: each holds its own copy of every weight."""
    torch.manual_seed(1)
    first = nn.Sequential(nn.Linear(512, 64, bias=False), nn.GELU(), nn.Linear(64, 64, bias=False)).eval()
    second = first if shared else nn.Sequential(nn.Linear(512, 64, bias=False), nn.GELU(),
                                                nn.Linear(64, 64, bias=False)).eval()
    target = CoreAITarget()
    entries = [Entry("prefill", first, {"x": torch.randn(1, 8, 512)}, ["y"]),
               Entry("decode", second, {"x": torch.randn(1, 1, 512)}, ["y"])]
    return (first, second), entries, target, target.convert(entries, target.export(entries), None)


def test_identical_weights_in_two_functions_are_clustered_once_and_both_functions_stay_exact():
    modules, entries, target, program = _two_function_program(shared=True)
    stats = PalettizationStats()
    compressed = palettize_int8(program, kmeans_workers=1, stats=stats)
    assert (stats.clustered, stats.shared, stats.rounded) == (2, 2, 0)
    with tempfile.TemporaryDirectory() as folder, target.open(target.save(compressed, Path(folder), {})) as runner:
        for entry, module in zip(entries, modules):
            y = runner.run(entry.name, {"x": entry.inputs["x"].numpy()})["y"]
            with torch.no_grad():
                assert gates.cosine(y, module(entry.inputs["x"]).numpy()) > 0.999


def test_negative_control_different_weights_of_the_same_shape_share_nothing():
    _, _, _, program = _two_function_program(shared=False)
    stats = PalettizationStats()
    palettize_int8(program, kmeans_workers=1, stats=stats)
    assert (stats.clustered, stats.shared) == (4, 0)


def test_palettization_past_its_time_budget_fails_with_what_was_done():
    _, _, _, program = _two_function_program(shared=True)
    with pytest.raises(ZooError, match=r"time budget of 0 s: 0 weight\(s\) were palettized .* and 4 were not"):
        palettize_int8(program, kmeans_workers=1, budget_s=0)
    stats = PalettizationStats()  # negative control: a budget it fits in changes nothing
    palettize_int8(program, kmeans_workers=1, budget_s=600, stats=stats)
    assert (stats.clustered, stats.shared, stats.skipped_over_budget) == (2, 2, 0)
