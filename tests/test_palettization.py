"""Core AI 8-bit palettization on weights larger than 6.55 in magnitude.

coreai-opt 0.4.0's fast k-means mode rounds weights to 4 decimals in fp16 (x * 1e4 overflows there),
which turned SmolLM2's layer-27 MLP look-up tables into inf/NaN and every logit into NaN. These tests
keep both halves: our default (exact k-means) stays finite and matches eager on the artifact, and the
fast mode is still caught by the non-finite check before a bundle is saved (the negative control).
"""

import tempfile
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from zoo import gates
from zoo.errors import ZooError
from zoo.targets import Entry
from zoo.targets.coreai import CoreAITarget, PalettizationStats, nonfinite_lookup_tables, palettize_int8
from zoo.targets.coreai_kmeans import palettize_group, squared_error

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


# Binned k-means (zoo/targets/coreai_kmeans.py): the optimal solver on density-spaced bins, refined by Lloyd.

def _heavy_tailed_group(seed: int = 0) -> np.ndarray:
    """A 32 x 1024 fp16 group with a Student-t(3) spread: ~15,000 distinct values and real outliers."""
    return (np.random.default_rng(seed).standard_t(3, size=(32, 1024)) * 0.02).astype(np.float16)


def _error_ratio(group: np.ndarray, bins: int) -> float:
    optimal = squared_error(group, *palettize_group(group, 8, None))
    return squared_error(group, *palettize_group(group, 8, bins)) / optimal


@pytest.mark.parametrize("bins, within", [(1024, 1.02), (2048, 1.005)])  # 1024: the config default
def test_binned_kmeans_stays_close_to_the_optimal_error(bins, within):
    group = _heavy_tailed_group()
    assert len(np.unique(group)) > 2048  # the binned path really runs
    assert _error_ratio(group, bins) < within


def test_negative_control_one_bin_per_table_entry_is_measurably_worse():
    """256 bins leave the solver no choice (one centroid per bin): the tolerances above reject it."""
    assert _error_ratio(_heavy_tailed_group(), 256) > 1.02


def test_binned_table_and_indices_have_coreai_opts_layout():
    group = _heavy_tailed_group(1)
    table, indices = palettize_group(group, 8, 2048)
    assert table.dtype == np.float16 and table.shape == (256,) and np.isfinite(table).all()
    assert indices.dtype == np.uint8 and indices.shape == (group.size,)
    # each element sits at its nearest table entry (what the runtime reconstructs)
    gaps = np.abs(group.reshape(-1, 1).astype(np.float64) - table.astype(np.float64)[None, :])
    chosen = gaps[np.arange(group.size), indices]
    assert np.all(chosen <= gaps.min(axis=1) + 1e-3 * np.abs(group.reshape(-1)).max())


def test_binned_palettization_matches_eager_and_the_optimal_bundle_on_the_artifact():
    """Through coreai-opt's own grouping ("CUSTOM" mode), saved, loaded and run: the binned bundle computes
    what eager torch does, and clusters each distinct weight once, like the optimal path."""
    module, x, target, _ = _program_with_a_large_weight()
    outputs = {}
    for bins in (None, 2048):
        _, _, _, program = _program_with_a_large_weight()
        stats = PalettizationStats()
        compressed = palettize_int8(program, kmeans_workers=2, stats=stats, kmeans_bins=bins)
        assert (stats.clustered, stats.shared) == (1, 0)
        with tempfile.TemporaryDirectory() as folder:
            path = target.save(compressed, Path(folder), {})
            assert "lut_to_dense" in target.summary(path)
            with target.open(path) as runner:
                outputs[bins] = runner.run("main", {"x": x.numpy()})["y"]
    with torch.no_grad():
        reference = module(x).numpy()
    assert gates.cosine(outputs[2048], reference) > 0.9999
    assert gates.cosine(outputs[2048], outputs[None]) > 0.99999


def test_binned_palettization_shares_tables_between_functions():
    _, _, _, program = _two_function_program(shared=True)
    stats = PalettizationStats()
    palettize_int8(program, kmeans_workers=2, stats=stats, kmeans_bins=2048)
    assert (stats.clustered, stats.shared) == (2, 2)


def test_prefill_and_decode_copies_share_tables_across_a_leading_unit_axis(tmp_path):
    """The tiny gqa-llm through the pipeline at Core AI int8: prefill holds its projections as [1, in, out]
    (batched matmul), decode as [in, out] — the same bytes, grouped along the same axis — so each is clustered once,
    and the shared tables, reshaped to the other rank, still compute the model on the saved artifact (a table or
    index laid out for the wrong rank would put the logits nowhere near transformers')."""
    from zoo.config import compose_convert
    from zoo.pipeline import convert_model

    cfg = compose_convert(["model=gqa-llm", "weights=tiny", "model.gpu.check=false"]).model
    [result] = convert_model(cfg, ["coreai"], precision="int8", out_dir=tmp_path, weights_spec="tiny")
    optimize = next(s for s in result.stages if s["name"] == "optimize")
    # 14 projections (2 layers x 7) in both functions plus the untied head: each clustered once
    assert "15 distinct weight(s) clustered" in optimize["note"] and "14 reused" in optimize["note"], optimize["note"]
    cosines = [g.value for g in result.gates if g.metric == "min_logits_cosine"]
    assert len(cosines) == len(cfg.prompts) and min(cosines) > 0.95, cosines  # measured 0.9686 at worst
