"""Binned vs optimal 1-D k-means for Core AI 8-bit palettization, on the same groups in one run.

    .venv/bin/python scripts/kmeans_binned_check.py [HF_FOLDER] [--groups N] [--bins B ...]
    # default: the embedded SmolLM2, 24 groups, bins 1024 2048

Takes N groups of 32 output channels (coreai-opt's grouping for Linear weights) spread over the checkpoint's
2-D weights, in fp16 as coreai-opt clusters them, and palettizes each to 256 entries with
`zoo.targets.coreai_kmeans`: the optimal solver on every distinct value (what coreai-opt runs) and the binned
solver. Prints, per setting: mean seconds per group, speed-up over the optimal solver, and the squared
reconstruction error as a ratio to the optimum (mean and worst over the groups). One thread, so the times
compare the solvers, not the pool.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
from safetensors.numpy import load_file

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from zoo.targets.coreai_kmeans import palettize_group, squared_error  # noqa: E402

GROUP_CHANNELS = 32


def sample_groups(state_dict: dict[str, np.ndarray], count: int) -> list[tuple[str, np.ndarray]]:
    """`count` 32-row groups, evenly spread over the 2-D weights (by name order), in fp16."""
    matrices = [(name, w) for name, w in sorted(state_dict.items()) if w.ndim == 2 and w.shape[0] % GROUP_CHANNELS == 0]
    picks = np.linspace(0, len(matrices) - 1, count).round().astype(int)
    groups = []
    for i, pick in enumerate(picks):
        name, weight = matrices[pick]
        row = (i * 7 % (weight.shape[0] // GROUP_CHANNELS)) * GROUP_CHANNELS
        groups.append((f"{name}[{row}:{row + GROUP_CHANNELS}]",
                       np.ascontiguousarray(weight[row:row + GROUP_CHANNELS]).astype(np.float16)))
    return groups


def solve_all(groups, bins):
    start = time.perf_counter()
    errors = [squared_error(g, *palettize_group(g, 8, bins)) for _, g in groups]
    return (time.perf_counter() - start) / len(groups), np.array(errors)


def main() -> None:
    from zoo.weights import in_zoo_cache

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", nargs="?", type=Path, default=in_zoo_cache("gqa_llm/smollm2-135m-instruct"))
    parser.add_argument("--groups", type=int, default=24)
    parser.add_argument("--bins", type=int, nargs="+", default=[1024, 2048])
    args = parser.parse_args()
    state_dict = {k: v.astype(np.float32) for k, v in load_file(args.folder / "model.safetensors").items()}
    groups = sample_groups(state_dict, args.groups)
    distinct = [len(np.unique(g)) for _, g in groups]
    print(f"{len(groups)} groups of {GROUP_CHANNELS} channels from {args.folder.name}; distinct fp16 values per "
          f"group: {min(distinct)}–{max(distinct)}")
    optimal_s, optimal_err = solve_all(groups, None)
    print(f"| solver | s / group | speed-up | error / optimal (mean) | error / optimal (worst) |")
    print(f"|---|---|---|---|---|")
    print(f"| optimal on every distinct value | {optimal_s:.4f} | 1× | 1 | 1 |")
    for bins in args.bins:
        seconds, err = solve_all(groups, bins)
        ratio = err / np.maximum(optimal_err, np.finfo(np.float64).tiny)
        print(f"| optimal on {bins} bins + Lloyd | {seconds:.4f} | {optimal_s / seconds:.1f}× | "
              f"{ratio.mean():.5f} | {ratio.max():.5f} |")


if __name__ == "__main__":
    main()
