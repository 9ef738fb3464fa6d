"""LiteRT fp16 bundles stay on the GPU: lookup tables are kept fp32 (zoo.targets.litert.quantize).

The GPU delegate refuses an fp16 EMBEDDING_LOOKUP table ("Empty quantization params"), which made every
fp16 bundle of T5 and the LLM GPU-rejected. The negative control casts the table too, as before, and is
rejected by the same check on the same model.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from zoo.precision import PRECISIONS
from zoo.targets import Entry, litert_gpu
from zoo.targets.litert import LiteRTTarget, quantize

class LookupThenProject(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(64, 32)
        self.proj = nn.Linear(32, 32)

    def forward(self, ids):
        return self.proj(self.embed(ids))


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    torch.manual_seed(0)
    module, ids = LookupThenProject().eval(), torch.randint(0, 64, (1, 8), dtype=torch.int32)
    folder = tmp_path_factory.mktemp("fp16")
    fp32 = LiteRTTarget().convert([Entry("main", module, {"ids": ids}, ["y"])], None, folder)
    return module, ids, fp32, folder


def _check(path, ids):
    from gpu_mode import require_gpu

    require_gpu()
    return litert_gpu.gpu_check(path, {"main": {"ids": ids.numpy()}})


@pytest.mark.gpu
def test_fp16_bundle_with_a_lookup_table_is_gpu_resident_and_right(converted):
    module, ids, fp32, folder = converted
    fp16, note = quantize(fp32, PRECISIONS["fp16"], folder / "fp16.tflite")
    assert "lookup tables kept fp32" in note and fp16.stat().st_size < fp32.stat().st_size
    check = _check(fp16, ids)
    assert check.status == "accepted", check.reason
    errors = check.outputs["main"]["y"]
    assert errors.fp16_cosine > 0.999 and errors.fp32_rel_err < 1e-3


@pytest.mark.gpu
def test_negative_control_an_fp16_table_is_rejected(converted):
    from litert_quantizer import qtyping, quantizer, recipe

    module, ids, fp32, folder = converted
    q = quantizer.Quantizer(str(fp32))
    q.add_weight_only_config(regex=".*", operation_name=qtyping.TFLOperationName.ALL_SUPPORTED, num_bits=16,
                             algorithm_key=recipe.AlgorithmName.FLOAT_CASTING)
    q.quantize().export_model(str(folder / "fp16-table.tflite"))
    check = _check(folder / "fp16-table.tflite", ids)
    assert check.status == "rejected" and "EMBEDDING_LOOKUP" in check.reason


def test_int8_recipes_differ_as_declared(converted):
    """weight_only stores int8 weights behind DEQUANTIZE and computes in float; dynamic quantizes
    activations per call. Both shrink the fp32 file; the notes say which recipe made the bundle."""
    from zoo.targets.litert import LiteRTTarget

    module, ids, fp32, folder = converted
    dynamic, dynamic_note = quantize(fp32, PRECISIONS["int8"], folder / "dyn.tflite")
    weight_only, weight_only_note = quantize(fp32, PRECISIONS["int8"], folder / "wo.tflite", int8_recipe="weight_only")
    assert "dynamic-range" in dynamic_note and "weight-only" in weight_only_note
    assert weight_only.stat().st_size < fp32.stat().st_size and dynamic.stat().st_size < fp32.stat().st_size
    target = LiteRTTarget()
    for path in (dynamic, weight_only):
        with target.open(path) as runner:
            y = runner.run("main", {"ids": ids.numpy()})["y"]
        with torch.no_grad():
            reference = module(ids).numpy()
        assert float((y * reference).sum() / (np.linalg.norm(y) * np.linalg.norm(reference))) > 0.999
