"""Binned 1-D k-means for Core AI palettization: coreai-opt's optimal clustering on a coarsened histogram.

coreai-opt clusters each group of 32 output channels with an optimal 1-D k-means (a dynamic programme over
the group's distinct fp16 values, `coreai_opt.deps._kmeans1d`). Its cost grows with the number of distinct
values, ~10,000–15,000 in a 32 × 768 fp16 group, and it dominated palettization: T5-base int8 spent 740 s of
its 744 s conversion in that stage (`make bench MODEL=t5`, the optimize stage in bench.json).

Here the same optimal solver runs on at most `bins` weighted points instead — adjacent distinct values merged
into bins spaced by the density an optimal quantizer places its levels at (∝ pdf^(1/3), Panter–Dite), so the
tails keep their resolution — and a few Lloyd iterations on the full set of distinct values then refine the
centroids. `python scripts/kmeans_binned_check.py` measures both solvers on the same groups, in one run:
time per group and squared reconstruction error as a ratio to the optimum.

The groups are handed to coreai-opt's own grouping through its "CUSTOM" mode (zoo.targets.coreai), so the
layout of look-up tables and indices stays coreai-opt's.
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

from zoo.registry import ROOT

LLOYD_ITERATIONS = 50  # refinement after the binned solve; measured converging in < 30 (scripts/kmeans_binned_check.py)


def keep_compiled_extensions_in_project() -> None:
    """coreai-opt's 1-D k-means compiles a C++ extension with torch.utils.cpp_extension on first use, which
    builds into ~/.cache/torch_extensions unless told otherwise: runs write only inside the project. Set
    before coreai-opt's k-means pool starts, so its workers inherit it."""
    os.environ.setdefault("TORCH_EXTENSIONS_DIR", str(Path(ROOT) / ".cache" / "torch_extensions"))


def _optimal_kmeans1d():
    """coreai-opt's optimal 1-D k-means (a dynamic programme over sorted values, in C++)."""
    keep_compiled_extensions_in_project()
    from coreai_opt.deps import _kmeans1d

    return _kmeans1d


def _bin_by_quantizer_density(values: np.ndarray, counts: np.ndarray, bins: int):
    """Merge adjacent sorted distinct values into at most `bins` weighted points (mean, total count).

    Bin edges follow the cumulative of pdf^(1/3) — the level density of an optimal quantizer — with the pdf at
    each distinct value estimated as its count over the gap it covers, so sparse tails (outliers) keep bins
    of their own instead of being merged into the bulk."""
    edges = np.concatenate([[values[0] - (values[1] - values[0]) / 2], (values[:-1] + values[1:]) / 2,
                            [values[-1] + (values[-1] - values[-2]) / 2]])
    gaps = np.maximum(np.diff(edges), np.finfo(np.float64).tiny)
    level_density = np.cbrt(counts / gaps) * gaps
    cumulative = np.cumsum(level_density)
    bin_of = np.minimum(((cumulative - level_density / 2) / cumulative[-1] * bins).astype(np.int64), bins - 1)
    weight = np.bincount(bin_of, counts, bins)
    weighted_sum = np.bincount(bin_of, counts * values, bins)
    kept = weight > 0
    return weighted_sum[kept] / weight[kept], weight[kept]


def _lloyd(values: np.ndarray, counts: np.ndarray, centroids: np.ndarray, iterations: int) -> np.ndarray:
    """Weighted Lloyd iterations on sorted distinct values: each cluster is a contiguous run, so a step is
    two cumulative-sum lookups per cluster."""
    cum_count = np.concatenate([[0.0], np.cumsum(counts)])
    cum_mass = np.concatenate([[0.0], np.cumsum(counts * values)])
    for _ in range(iterations):
        cuts = np.searchsorted(values, (centroids[:-1] + centroids[1:]) / 2)
        lo, hi = np.concatenate([[0], cuts]), np.concatenate([cuts, [len(values)]])
        members = cum_count[hi] - cum_count[lo]
        updated = np.where(members > 0, (cum_mass[hi] - cum_mass[lo]) / np.maximum(members, 1e-300), centroids)
        if np.array_equal(updated, centroids):
            break
        centroids = updated
    return centroids


def cluster_values(values: np.ndarray, counts: np.ndarray, k: int, bins: int | None) -> np.ndarray:
    """Sorted centroids (at most k) for sorted distinct `values` with multiplicities `counts`.

    bins None, or no more distinct values than bins: coreai-opt's optimal solver on every distinct value."""
    values = np.asarray(values, np.float64)
    counts = np.asarray(counts, np.float64)
    k = min(k, len(values))
    if bins is None or len(values) <= bins:
        return np.sort(np.asarray(_optimal_kmeans1d().cluster(values, k, weights=counts).centroids, np.float64))
    binned_values, binned_counts = _bin_by_quantizer_density(values, counts, bins)
    k = min(k, len(binned_values))
    start = np.sort(np.asarray(_optimal_kmeans1d().cluster(binned_values, k, weights=binned_counts).centroids))
    return _lloyd(values, counts, start, LLOYD_ITERATIONS)


def palettize_group(group: np.ndarray, nbits: int, bins: int | None) -> tuple[np.ndarray, np.ndarray]:
    """(look-up table of 2**nbits entries in the group's dtype, uint8 index per element), as coreai-opt's
    k-means mode returns them: unused table entries are zero; each element maps to its nearest centroid."""
    values, inverse, counts = np.unique(group, return_inverse=True, return_counts=True)
    centroids = cluster_values(values, counts, 1 << nbits, bins)
    nearest = np.searchsorted((centroids[:-1] + centroids[1:]) / 2, values.astype(np.float64), side="right")
    table = np.zeros(1 << nbits, dtype=group.dtype)
    table[: len(centroids)] = centroids
    return table, nearest[inverse.reshape(-1)].astype(np.uint8)


def palettize_groups(groups: list[np.ndarray], nbits: int, bins: int | None, workers: int):
    """palettize_group over every group, on `workers` threads: the solver is a C call through ctypes, which
    releases the GIL, so threads use every core without a process pool (and its start-method hazards)."""
    if not groups:
        return []
    first = palettize_group(groups[0], nbits, bins)  # alone: the solver's first call compiles/loads its library
    if workers <= 1:
        return [first] + [palettize_group(g, nbits, bins) for g in groups[1:]]
    with ThreadPoolExecutor(max_workers=workers) as pool:
        return [first] + list(pool.map(lambda g: palettize_group(g, nbits, bins), groups[1:]))


def squared_error(group: np.ndarray, table: np.ndarray, indices: np.ndarray) -> float:
    """Sum of squared reconstruction errors of one palettized group (the k-means objective)."""
    approx = table.astype(np.float64)[indices]
    return float(((group.reshape(-1).astype(np.float64) - approx) ** 2).sum())
