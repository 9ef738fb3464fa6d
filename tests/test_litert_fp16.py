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


class TiedLookupAndHead(nn.Module):
    """An LLM's tied embedding in miniature: one table read by EMBEDDING_LOOKUP (kept fp32) and by the output
    projection (cast to fp16 / int8), so the quantizer must split it into two differently stored tensors."""

    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(64, 32)
        self.mix = nn.Linear(32, 32)

    def forward(self, ids):
        return nn.functional.linear(self.mix(self.embed(ids)), self.embed.weight)


@pytest.fixture(scope="module")
def two_signatures(tmp_path_factory):
    """Prefill- and decode-like signatures over the same weights, as the LLM's .tflite has."""
    torch.manual_seed(0)
    module = TiedLookupAndHead().eval()
    inputs = {"prefill": torch.randint(0, 64, (1, 8), dtype=torch.int32),
              "decode": torch.randint(0, 64, (1, 1), dtype=torch.int32)}
    folder = tmp_path_factory.mktemp("signatures")
    entries = [Entry(name, module, {"ids": ids}, ["y"]) for name, ids in inputs.items()]
    return module, inputs, LiteRTTarget().convert(entries, None, folder), folder


def _stored_buffers(path):
    from litert_quantizer.utils import tfl_flatbuffer_utils

    model = tfl_flatbuffer_utils.read_model(str(path))
    return model, sum(len(b.data) for b in model.buffers if b.data is not None)


def test_quantized_signatures_share_one_copy_of_each_weight(two_signatures, precision="fp16"):
    """litert-quantizer gives each signature its own copy of every weight it rewrites (the real SmolLM2 fp16
    file was larger than its fp32 source: the tied table, split into an fp32 lookup copy and an fp16 head copy,
    was split again per signature); after the pass each is stored once and every output is unchanged."""
    from litert_quantizer import qtyping, quantizer, recipe

    from zoo.targets.litert_buffers import duplicate_buffers

    module, inputs, fp32, folder = two_signatures
    shared, note = quantize(fp32, PRECISIONS[precision], folder / f"{precision}.tflite")
    # the same recipe without the pass: the negative control, duplicates and all
    q = quantizer.Quantizer(str(fp32))
    q.add_weight_only_config(regex=".*", operation_name=qtyping.TFLOperationName.ALL_SUPPORTED, num_bits=16,
                             algorithm_key=recipe.AlgorithmName.FLOAT_CASTING)
    q.update_quantization_recipe(regex=".*", operation_name=qtyping.TFLOperationName.EMBEDDING_LOOKUP,
                                 algorithm_key=recipe.AlgorithmName.NO_QUANTIZE)
    unshared = folder / f"{precision}-unshared.tflite"
    q.quantize().export_model(str(unshared))
    unshared_model, unshared_bytes = _stored_buffers(unshared)
    shared_model, shared_bytes = _stored_buffers(shared)
    assert duplicate_buffers(unshared_model), "the quantizer no longer duplicates: this pass may be unneeded"
    assert not duplicate_buffers(shared_model) and "duplicate weight buffers shared" in note
    assert shared_bytes < unshared_bytes and shared.stat().st_size < unshared.stat().st_size
    target = LiteRTTarget()
    for name, ids in inputs.items():
        with target.open(shared) as a, target.open(unshared) as b:
            assert np.array_equal(a.run(name, {"ids": ids.numpy()})["y"], b.run(name, {"ids": ids.numpy()})["y"])


def test_same_bytes_read_as_another_shape_are_not_shared(two_signatures):
    from litert_quantizer.utils import tfl_flatbuffer_utils

    from zoo.targets.litert_buffers import duplicate_buffers

    module, inputs, fp32, folder = two_signatures
    shared, _ = quantize(fp32, PRECISIONS["fp16"], folder / "reshaped.tflite")
    q_model = tfl_flatbuffer_utils.read_model(str(folder / "fp16-unshared.tflite"))
    copies = duplicate_buffers(q_model)
    copy = next(iter(copies))
    for subgraph in q_model.subgraphs:
        for tensor in subgraph.tensors:
            if tensor.buffer == copy:
                tensor.shape = [int(np.prod(tensor.shape))]   # same bytes, read as a flat vector
    assert copy not in duplicate_buffers(q_model)
