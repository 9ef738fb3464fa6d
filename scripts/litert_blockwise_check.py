"""Does litert-quantizer quantize weights blockwise? Measured on a small Linear stack, per bit width.

    .venv/bin/python scripts/litert_blockwise_check.py

Converts a 2-Linear module (256 wide) to an fp32 .tflite through the zoo's LiteRT target, then quantizes it
weight-only with one scale per output channel (what `litert.int8_recipe: weight_only` uses) and with one scale
per block of 32 inputs, at 8 and 4 bits, and prints each file's size as a ratio to fp32. A ratio near 1 means
the recipe left the weights fp32. (Why the LLM's LiteRT int8 has no blockwise option: models/gqa_llm/README.md.)
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import zoo.quiet  # noqa: E402,F401
from zoo.targets import Entry  # noqa: E402
from zoo.targets.litert import LiteRTTarget  # noqa: E402


def main() -> None:
    from litert_quantizer import qtyping, quantizer

    torch.manual_seed(0)
    module = nn.Sequential(nn.Linear(256, 256), nn.GELU(), nn.Linear(256, 256)).eval()
    target = LiteRTTarget()
    with tempfile.TemporaryDirectory() as folder:
        entries = [Entry("main", module, {"x": torch.randn(1, 8, 256)}, ["y"])]
        fp32 = target.save(target.convert(entries, None, Path(folder)), Path(folder), {})
        base = fp32.stat().st_size
        print("| scales | bits | size / fp32 |\n|---|---|---|")
        for granularity in ("CHANNELWISE", "BLOCKWISE_32"):
            for bits in (8, 4):
                q = quantizer.Quantizer(str(fp32))
                q.add_weight_only_config(regex=".*", operation_name=qtyping.TFLOperationName.ALL_SUPPORTED,
                                         num_bits=bits, granularity=getattr(qtyping.QuantGranularity, granularity))
                out = Path(folder) / f"{granularity}-{bits}.tflite"
                try:
                    q.quantize().export_model(str(out))
                    cell = f"{out.stat().st_size / base:.3f}"
                except Exception as exc:  # noqa: BLE001 — a refused recipe is the measurement
                    cell = f"refused: {type(exc).__name__}: {str(exc).splitlines()[0][:100]}"
                print(f"| {granularity.lower()} | {bits} | {cell} |")


if __name__ == "__main__":
    main()
