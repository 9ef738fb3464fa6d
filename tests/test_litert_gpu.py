"""The LiteRT GPU-delegate check on software Vulkan (zoo/targets/litert_gpu.py, toolchain.md §3.1-3.2).

GPU tests need `scripts/setup_vulkan.sh`. Without it they skip, except under ZOO_REQUIRE_GPU_CHECK=1
(CI), where they fail: a CI run that silently skipped the GPU check would look like a pass.
The log-parsing and verdict tests at the bottom need nothing and always run.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from zoo.targets import litert_gpu
from zoo.targets.litert_gpu import GpuCheck, OutputErrors, gpu_available, gpu_check, parse_delegate_log

gpu = pytest.mark.gpu


@pytest.fixture(scope="module")
def vulkan():
    """Fail (CI) or skip (elsewhere) when no WebGPU adapter can be made."""
    ok, why = gpu_available()
    if ok:
        return why
    if os.environ.get("ZOO_REQUIRE_GPU_CHECK") == "1":
        pytest.fail(f"ZOO_REQUIRE_GPU_CHECK=1 but the LiteRT GPU check cannot run: {why}. "
                    "Run scripts/setup_vulkan.sh (as root on a fresh machine).", pytrace=False)
    pytest.skip(f"LiteRT GPU check unavailable ({why}); run scripts/setup_vulkan.sh")


# ---------------------------------------------------------------- tiny models


class LinearGelu(nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(16, 32)

    def forward(self, x):
        return nn.functional.gelu(self.linear(x))


class RepeatKV(nn.Module):
    """GQA's repeat_kv: a rank-5 expand that lowers to BROADCAST_TO (LiteRT#9191)."""

    def forward(self, kv):  # [B, n_kv, S, D] -> [B, 2 * n_kv, S, D]
        b, n_kv, s, d = kv.shape
        return kv[:, :, None].expand(b, n_kv, 2, s, d).reshape(b, n_kv * 2, s, d) * 2.0


class HeadBroadcastMatmul(nn.Module):
    """[1,1,M,S] @ [1,2,S,D]: BATCH_MATMUL broadcast on the head axis, accepted but wrong (§3.2)."""

    def forward(self, a, b):
        return a @ b


class LinearPlusConstant(nn.Module):
    """FULLY_CONNECTED (rank-2 output) + a full-shape rank-3 constant: accepted but wrong (§3.2)."""

    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(16, 32)
        self.pos = nn.Parameter(torch.randn(1, 8, 32))

    def forward(self, x):
        return self.linear(x) + self.pos


def _convert(tmp_dir: Path, name: str, module: nn.Module, *args: torch.Tensor) -> Path:
    import litert_torch

    torch.manual_seed(0)
    path = tmp_dir / f"{name}.tflite"
    litert_torch.convert(module.eval(), args).export(str(path))
    return path


def _inputs(*arrays: torch.Tensor, signature: str = "serving_default") -> dict:
    return {signature: {f"args_{i}": a.numpy() for i, a in enumerate(arrays)}}


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """name -> (tflite path, inputs). Converted once: conversion dominates the file's run time."""
    torch.manual_seed(0)
    out = tmp_path_factory.mktemp("litert_gpu")
    x = torch.randn(1, 8, 16)
    kv = torch.randn(1, 2, 8, 16)
    a, b = torch.randn(1, 1, 8, 16), torch.randn(1, 2, 16, 8)
    return {
        "linear_gelu": (_convert(out, "linear_gelu", LinearGelu(), x), _inputs(x)),
        "repeat_kv": (_convert(out, "repeat_kv", RepeatKV(), kv), _inputs(kv)),
        "hardtanh01": (_convert(out, "hardtanh01", nn.Hardtanh(0, 1), x), _inputs(x)),
        "bmm_head_broadcast": (_convert(out, "bmm_head_broadcast", HeadBroadcastMatmul(), a, b), _inputs(a, b)),
        "fc_plus_constant": (_convert(out, "fc_plus_constant", LinearPlusConstant(), x), _inputs(x)),
    }


# ---------------------------------------------------------------- GPU tests


@gpu
def test_adapter_is_lavapipe(vulkan):
    assert "llvmpipe" in vulkan


@gpu
def test_linear_gelu_is_accepted_and_matches_cpu(vulkan, models):
    check = gpu_check(*models["linear_gelu"])
    assert check.status == "accepted", check.reason
    assert check.rejected_ops == [] and check.errors == []
    errs = check.outputs["serving_default"]["output_0"]
    assert errs.fp32_rel_err < 1e-5 and errs.fp32_cosine > 0.999999
    assert errs.fp16_rel_err < 1e-2 and errs.fp16_cosine > 0.9999  # real fp16 kernels: not exact
    assert check.passes(1e-4)
    json.dumps(check.to_dict(), allow_nan=False)  # JSON-able as promised


@gpu
def test_every_signature_is_checked(vulkan, tmp_path):
    import litert_torch

    module = LinearGelu().eval()
    short, long = torch.randn(1, 4, 16), torch.randn(1, 8, 16)
    path = tmp_path / "two_signatures.tflite"
    litert_torch.signature("short", module, (short,)).signature("long", module, (long,)).convert().export(str(path))
    inputs = {**_inputs(short, signature="short"), **_inputs(long, signature="long")}
    check = gpu_check(path, inputs)
    assert check.status == "accepted", check.reason
    assert set(check.outputs) == {"short", "long"}
    assert check.passes(1e-4)
    with pytest.raises(ValueError, match="every signature"):
        gpu_check(path, {"short": inputs["short"]})


@gpu
def test_gqa_repeat_kv_is_rejected_with_the_delegates_reason(vulkan, models):
    check = gpu_check(*models["repeat_kv"])
    assert check.status == "rejected"
    ops = {o["op"]: o["reason"] for o in check.rejected_ops}
    assert ops.get("BROADCAST_TO") == "Operation is not supported." or "must be less than 5" in ops.get("RESHAPE", "")
    assert "BROADCAST_TO" in check.reason or "RESHAPE" in check.reason
    assert check.partitions and check.partitions["cpu_ops"] > 0
    assert not check.passes(1.0)


@gpu
def test_hardtanh_0_1_is_rejected_as_relu_0_to_1(vulkan, models):
    check = gpu_check(*models["hardtanh01"])
    assert check.status == "rejected"
    assert [o["op"] for o in check.rejected_ops] == ["RELU_0_TO_1"]
    assert "RELU_0_TO_1" in check.rejected_ops[0]["reason"]  # "Not supported op RELU_0_TO_1"
    assert check.partitions == {"gpu_ops": 0, "cpu_ops": 1}


@gpu
@pytest.mark.parametrize("name", ["bmm_head_broadcast", "fc_plus_constant"])
def test_accepted_but_wrong_is_caught_by_the_numbers(vulkan, models, name):
    """Negative control: the delegate takes these and computes garbage even in fp32 (§3.2)."""
    check = gpu_check(*models[name])
    assert check.status == "accepted", check.reason
    errs = check.outputs["serving_default"]["output_0"]
    assert errs.fp32_rel_err > 0.1, errs  # if this starts passing, the upstream bug is fixed: update §3.2
    assert not check.passes(1e-3)


@gpu
def test_missing_icd_is_not_run(models, tmp_path):
    """Runs with or without setup: a broken Vulkan env must never read as accepted."""
    check = gpu_check(*models["linear_gelu"], env={"VK_ICD_FILENAMES": str(tmp_path / "missing.json")})
    assert check.status == "not_run"
    assert "adapter" in check.reason and "missing.json does not exist" in check.reason
    assert not check.passes(1.0)


@gpu
def test_icd_naming_a_missing_driver_is_not_run(models, tmp_path):
    icd = tmp_path / "icd.json"
    icd.write_text(json.dumps({"file_format_version": "1.0.0",
                               "ICD": {"library_path": str(tmp_path / "libnothing.so"), "api_version": "1.3.0"}}))
    check = gpu_check(*models["linear_gelu"], env={"VK_ICD_FILENAMES": str(icd)})
    assert check.status == "not_run"
    assert "No adapters found" in check.reason


@gpu
def test_timeout_is_not_run(vulkan, models):
    check = gpu_check(*models["linear_gelu"], timeout_s=0.01)
    assert check.status == "not_run" and "timed out" in check.reason


@gpu
def test_cli_prints_json(vulkan, models, capsys):
    path, _ = models["hardtanh01"]
    assert litert_gpu.main([str(path)]) == 1  # rejected
    out = json.loads(capsys.readouterr().out)
    assert out["status"] == "rejected" and out["rejected_ops"][0]["op"] == "RELU_0_TO_1"


# ---------------------------------------------------------------- parsing and verdicts (no GPU)

# Captured from the delegate (ai-edge-litert 2.3.0, lavapipe) for RepeatKV above.
REJECTED_LOG = """\
I0000 00:00:1796047062.435021   10814 environment.cc:532] Selected adapter: llvmpipe (LLVM 15.0.6, 256 bits)
INFO: [delegate_webgpu.cc:363] Created a WebGPU environment.
ERROR: Following operations are not supported by GPU delegate:
BROADCAST_TO: Operation is not supported.
RESHAPE: Tensor dimensions must be less than 5. __main__.RepeatKV;4
RESHAPE: Tensor dimensions must be less than 5. __main__.RepeatKV;4
1 operations will run on the GPU, and the remaining 3 operations will run on the CPU.
"""
NO_ADAPTER_LOG = """\
INFO: [delegate_webgpu.cc:342] Create WebGPU environment (use_low_power=0, enable_host_mapped_pointer=1)
ERROR: [delegate_webgpu.cc:359] Failed to initialize WebGPU environment: INTERNAL: No adapters found
"""
ADAPTER_OK_LOG = "I0000 00:00:1.0 1 environment.cc:532] Selected adapter: llvmpipe\n"


def test_parse_rejected_ops_and_partitions():
    parsed = parse_delegate_log(REJECTED_LOG)
    assert parsed.rejected_ops == [
        {"op": "BROADCAST_TO", "reason": "Operation is not supported."},
        {"op": "RESHAPE", "reason": "Tensor dimensions must be less than 5. __main__.RepeatKV;4"},
    ]
    assert parsed.partitions == {"gpu_ops": 1, "cpu_ops": 3}
    assert parsed.adapter.startswith("llvmpipe") and parsed.adapter_created and parsed.adapter_failure is None


def test_parse_rejected_op_with_an_empty_reason():
    """Seen on the T5 fp16-weights bundle: `DEQUANTIZE: ` has no reason; the list must not stop there."""
    log = ("ERROR: Following operations are not supported by GPU delegate:\n"
           "DEQUANTIZE: \n"
           "EMBEDDING_LOOKUP: EMBEDDING_LOOKUP: Empty quantization params.\n"
           "87 operations will run on the GPU, and the remaining 22 operations will run on the CPU.\n")
    parsed = parse_delegate_log(log)
    assert [op["op"] for op in parsed.rejected_ops] == ["DEQUANTIZE", "EMBEDDING_LOOKUP"]
    assert parsed.rejected_ops[1]["reason"] == "EMBEDDING_LOOKUP: Empty quantization params."
    assert parsed.partitions == {"gpu_ops": 87, "cpu_ops": 22}


def test_parse_all_on_cpu_and_kernel_errors():
    log = ("No operations will run on the GPU, and all 1 operations will run on the CPU.\n"
           "E0000 00:00:1.5 77 delegate_webgpu.cc:478] Failed to create DelegateKernelLiteRt: RESOURCE_EXHAUSTED: "
           "Buffer with size - 536870912 can not be created\n"
           "E0000 00:00:2.5 78 delegate_webgpu.cc:478] Failed to create DelegateKernelLiteRt: RESOURCE_EXHAUSTED: "
           "Buffer with size - 536870912 can not be created\n")
    parsed = parse_delegate_log(log)
    assert parsed.partitions == {"gpu_ops": 0, "cpu_ops": 1}
    assert len(parsed.errors) == 1 and "RESOURCE_EXHAUSTED" in parsed.errors[0]  # deduped across timestamps


def _classify(returncode, stdout, stderr, tmp_path):
    return litert_gpu._classify(returncode, stdout, stderr, "fp32", tmp_path)


def test_crash_while_creating_the_model_is_rejected(tmp_path):
    run = _classify(-11, "", ADAPTER_OK_LOG, tmp_path)
    assert run.status == "rejected" and "SIGSEGV" in run.reason and "creating" in run.reason


def test_crash_while_running_is_rejected(tmp_path):
    stdout = f"{litert_gpu.CREATED}\n{litert_gpu.RUN_START} decode\n"
    run = _classify(-11, stdout, ADAPTER_OK_LOG, tmp_path)
    assert run.status == "rejected" and "running signature decode" in run.reason


def test_crash_before_an_adapter_is_not_run(tmp_path):
    run = _classify(-11, "", "INFO: loading\n", tmp_path)
    assert run.status == "not_run" and "SIGSEGV" in run.reason


def test_no_adapter_is_not_run_even_though_creation_failed(tmp_path):
    run = _classify(0, f'{litert_gpu.CREATE_FAILED} "RuntimeError: boom"\n', NO_ADAPTER_LOG, tmp_path)
    assert run.status == "not_run" and "No adapters found" in run.reason


def test_broken_child_is_not_run(tmp_path):
    run = _classify(1, "", "Traceback ...\nModuleNotFoundError: No module named 'numpy'\n", tmp_path)
    assert run.status == "not_run" and "numpy" in run.reason


def test_passes_needs_accepted_and_finite_fp32_errors():
    good = {"s": {"y": OutputErrors(fp32_rel_err=1e-7)}}
    assert GpuCheck("accepted", outputs=good).passes(1e-6)
    assert not GpuCheck("rejected", outputs=good).passes(1e-6)
    assert not GpuCheck("not_run", outputs=good).passes(1e-6)
    assert not GpuCheck("accepted").passes(1e-6)  # nothing compared
    assert not GpuCheck("accepted", outputs={"s": {"y": OutputErrors(fp32_rel_err=float("nan"))}}).passes(1.0)
    assert not GpuCheck("accepted", outputs={"s": {"y": OutputErrors()}}).passes(1.0)  # fp32 never ran
    nan = GpuCheck("accepted", outputs={"s": {"y": OutputErrors(fp32_rel_err=float("nan"))}}).to_dict()
    assert nan["outputs"]["s"]["y"]["fp32_rel_err"] == "nan"


def test_no_setup_is_not_run(monkeypatch, tmp_path):
    monkeypatch.setenv("ZOO_VULKAN_DIR", str(tmp_path / "nowhere"))
    assert litert_gpu.vulkan_env() is None
    relu = tmp_path / "relu.tflite"
    relu.write_bytes(litert_gpu._relu_model())
    check = gpu_check(relu, {"serving_default": {"x": np.zeros((1, 4), np.float32)}})
    assert check.status == "not_run" and "setup_vulkan.sh not run" in check.reason
