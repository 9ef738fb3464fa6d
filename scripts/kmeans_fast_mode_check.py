"""Why Core AI int8 keeps coreai-opt's fast k-means off: measured on a real checkpoint.

    .venv/bin/python scripts/kmeans_fast_mode_check.py [HF_FOLDER]   # default: the embedded SmolLM2

Lists the weight matrices with |w| > 6.5504 (where coreai-opt 0.4.0's fast mode, which rounds to 4
decimals in fp16, overflows), then palettizes the worst one as a one-Linear Core AI program both ways
through `zoo.targets.coreai.palettize_int8` (1 k-means worker) and reports the time, the non-finite
look-up tables and the artifact's output cosine against eager torch.
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

import torch
from safetensors.torch import load_file
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from zoo import gates  # noqa: E402
from zoo.errors import ZooError  # noqa: E402
from zoo.targets import Entry  # noqa: E402
from zoo.targets.coreai import CoreAITarget, nonfinite_lookup_tables, palettize_int8  # noqa: E402

FP16_ROUNDING_LIMIT = 65504 / 1e4  # x * 10**4 must stay below fp16's max


def large_weights(state_dict: dict[str, torch.Tensor]) -> list[tuple[str, float]]:
    rows = [(k, float(v.abs().max())) for k, v in state_dict.items() if v.ndim == 2]
    return sorted([r for r in rows if r[1] > FP16_ROUNDING_LIMIT], key=lambda r: -r[1])


def palettize_one(weight: torch.Tensor, fast: bool) -> dict:
    linear = nn.Linear(weight.shape[1], weight.shape[0], bias=False).eval()
    linear.weight.data.copy_(weight)
    x = torch.randn(1, 8, weight.shape[1], generator=torch.Generator().manual_seed(0))
    target = CoreAITarget()
    entries = [Entry("main", linear, {"x": x}, ["y"])]
    program = target.convert(entries, target.export(entries), None)
    t0 = time.perf_counter()
    try:
        compressed = palettize_int8(program, kmeans_workers=1, fast_kmeans="all" if fast else "off")
    except ZooError as exc:  # the non-finite check refused it
        return {"seconds": round(time.perf_counter() - t0, 1), "refused": str(exc).split(";")[0]}
    seconds = round(time.perf_counter() - t0, 1)
    with tempfile.TemporaryDirectory() as folder:
        path = target.save(compressed, Path(folder), {})
        with target.open(path) as runner:
            y = runner.run("main", {"x": x.numpy()})["y"]
    with torch.no_grad():
        cosine = gates.cosine(y, linear(x).numpy())
    return {"seconds": seconds, "nonfinite_luts": len(nonfinite_lookup_tables(compressed)), "cosine": cosine}


def main(folder: Path) -> None:
    state_dict = load_file(folder / "model.safetensors")
    found = large_weights(state_dict)
    print(f"{len(found)} weight matrices with |w| > {FP16_ROUNDING_LIMIT:.4f}:")
    for name, value in found:
        print(f"  {name}: max |w| = {value:.4f}")
    if not found:
        return
    worst = found[0][0]
    for fast in (False, True):
        print(f"{worst}, fast_kmeans={fast}: {palettize_one(state_dict[worst].float(), fast)}")


if __name__ == "__main__":
    from zoo.weights import in_zoo_cache

    default = in_zoo_cache("gqa_llm/smollm2-135m-instruct")
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else default)
