"""Does the LiteRT GPU delegate take a .tflite, and does it compute the same thing as the CPU?

LiteRT 2.3.0 ships a WebGPU accelerator that runs on Mesa's software Vulkan driver (lavapipe), so GPU
acceptance can be checked without a GPU (toolchain.md §3.1). `scripts/setup_vulkan.sh` unpacks the
driver into `.cache/vulkan/`; this module points a child process at it.

The check creates a `CompiledModel` **GPU-only** (no CPU fallback: either every op is delegated or
creation fails), once computing in fp16 (the phone default) and once with `enforce_f32`, runs every
signature and compares each output with the CPU `Interpreter` on the same inputs.

Why a child process: creation segfaults on some models (STABLEHLO_COMPOSITE, int8 weight-only), and
the delegate explains itself only on the C++ stderr, which a child lets us capture and parse.

Verdicts: `accepted` means created GPU-only without error and ran every signature, nothing more —
numbers are reported separately (`passes()`), because some accepted models compute wrong results
(toolchain.md §3.2). `not_run` means the check could not say (no adapter, timeout, broken child); it is
never a pass.

CLI: `python -m zoo.targets.litert_gpu MODEL.tflite` runs the check on random inputs and prints JSON
(exit 0 accepted, 1 rejected, 2 not run); `--probe` only says whether an adapter can be created.
"""

from __future__ import annotations

import argparse
import atexit
import functools
import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

REPO_ROOT = Path(__file__).resolve().parents[2]
SETUP_HINT = "scripts/setup_vulkan.sh not run"
MODES = {"fp32": True, "fp16": False}  # mode name -> GpuOptions.enforce_f32; fp32 first (see gpu_check)
LOG_LIMIT_CHARS = 16_000

# Child -> parent protocol: marker lines on stdout (flushed one by one, so they survive a crash).
CREATED, CREATE_FAILED = "ZOO_GPU_CREATED", "ZOO_GPU_CREATE_FAILED"
RUN_START, RAN, RUN_FAILED = "ZOO_GPU_RUN_START", "ZOO_GPU_RAN", "ZOO_GPU_RUN_FAILED"

# Delegate messages (C++ stderr).
UNSUPPORTED_HEADER = "Following operations are not supported by GPU delegate:"
UNSUPPORTED_OP = re.compile(r"^([A-Z][A-Z0-9_]*):(?: (.*))?$")  # the reason may be empty (DEQUANTIZE:)
PARTITION = re.compile(r"(\d+|No) operations? will run on the GPU, "
                       r"and the remaining (\d+) operations? will run on the CPU")
ALL_ON_CPU = re.compile(r"No operations will run on the GPU, and all (\d+) operations? will run on the CPU")
ADAPTER = re.compile(r"Selected adapter: (.+)$")
NO_ADAPTER = ("No adapters found", "Failed to initialize WebGPU environment", "Couldn't load Vulkan",
              "Failed to get or create delegate WebGPU environment")
ADAPTER_CREATED = ("Selected adapter:", "Created a WebGPU environment")
ERROR_LINE = re.compile(r"^(ERROR: |E\d{4} )|Failed to create|RESOURCE_EXHAUSTED")
WARNING_LINE = re.compile(r"^W\d{4} ")  # glog warnings from the delegate, e.g. "Shape mismatch in GpuModelBuilder"
GLOG_PREFIX = re.compile(r"^([EW])\d{4} [\d:.]+\s+\d+ ")  # "E0000 00:00:1796.. 14390 " -> "E "
NOISE = re.compile(r"accelerator_registry|gpu_registry|npu_registry|cpu_registry|compiler_plugin|IntelOpenvino|"
                   r"environment\.cc:(36|47)|libOpenCL|Logging before InitGoogle|artificially reduced|"
                   r"# of threads to|^\s*$")


# ---------------------------------------------------------------- environment


def vulkan_dir() -> Path:
    return Path(os.environ.get("ZOO_VULKAN_DIR", REPO_ROOT / ".cache" / "vulkan"))


@functools.cache
def _xdg_runtime_dir() -> str:
    # Mesa/Dawn want a private runtime dir; mkdtemp makes it 0700. One per process, removed at exit
    # (or, after a SIGKILL, by the next run: the PID in the name says whose it is, see zoo/bundle.py).
    path = tempfile.mkdtemp(prefix=_temp_prefix("xdg"))
    atexit.register(shutil.rmtree, path, ignore_errors=True)
    return path


def _temp_prefix(kind: str) -> str:
    # Same as zoo.bundle.temp_prefix (this file also runs as the child, without the zoo package).
    return f"zoo-{kind}-{os.getpid()}-"


def vulkan_env() -> dict[str, str] | None:
    """Env vars that point LiteRT at the private lavapipe, or None if setup_vulkan.sh has not been run."""
    root = vulkan_dir()
    icd, lib = root / "lvp_icd.json", root / "lib"
    if not (icd.is_file() and (lib / "libvulkan_lvp.so").is_file()):
        return None
    ld_path = os.pathsep.join(p for p in (str(lib), os.environ.get("LD_LIBRARY_PATH", "")) if p)
    return {
        "VK_ICD_FILENAMES": str(icd),
        "LD_LIBRARY_PATH": ld_path,
        "XDG_RUNTIME_DIR": _xdg_runtime_dir(),
        # Host Vulkan layers (overlays, device_select from the system Mesa) have no business here.
        "VK_LOADER_LAYERS_DISABLE": "~implicit~",
    }


# ---------------------------------------------------------------- result


@dataclass
class OutputErrors:
    """GPU vs CPU Interpreter for one output; None where that mode did not run."""

    fp32_max_abs: float | None = None
    fp32_rel_err: float | None = None  # max |gpu - cpu| / max |cpu|
    fp32_cosine: float | None = None
    fp16_max_abs: float | None = None
    fp16_rel_err: float | None = None
    fp16_cosine: float | None = None


@dataclass
class GpuCheck:
    status: str  # "accepted" | "rejected" | "not_run"
    reason: str = ""
    rejected_ops: list[dict[str, str]] = field(default_factory=list)  # [{"op", "reason"}], as the delegate wrote them
    partitions: dict[str, int] | None = None  # {"gpu_ops", "cpu_ops"} when the delegate printed them
    errors: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    adapter: str | None = None
    outputs: dict[str, dict[str, OutputErrors]] = field(default_factory=dict)  # signature -> output -> errors
    log: str = ""  # delegate stderr, registry noise removed, trimmed
    seconds: float = 0.0

    def passes(self, fp32_rel_tol: float) -> bool:
        """Accepted, and every output of every signature within `fp32_rel_tol` in enforced-fp32 mode."""
        if self.status != "accepted" or not self.outputs:
            return False
        errs = [o.fp32_rel_err for outs in self.outputs.values() for o in outs.values()]
        return bool(errs) and all(e is not None and e <= fp32_rel_tol for e in errs)  # NaN fails the <=

    def to_dict(self) -> dict:
        """JSON-able; non-finite errors become the strings "nan" / "inf"."""
        return _json_safe(asdict(self))


def _json_safe(value):
    if isinstance(value, float) and not math.isfinite(value):
        return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")
    if isinstance(value, dict):
        return {k: _json_safe(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_json_safe(v) for v in value]
    return value


# ---------------------------------------------------------------- log parsing


@dataclass
class DelegateLog:
    rejected_ops: list[dict[str, str]]
    partitions: dict[str, int] | None
    errors: list[str]
    warnings: list[str]
    adapter: str | None
    adapter_created: bool
    adapter_failure: str | None  # the lines saying no adapter could be made


def parse_delegate_log(text: str) -> DelegateLog:
    lines = [line.rstrip() for line in text.splitlines()]
    errors = [line for line in lines if ERROR_LINE.search(line) and UNSUPPORTED_HEADER not in line]
    no_adapter = [line.strip() for line in lines if any(marker in line for marker in NO_ADAPTER)]
    return DelegateLog(
        rejected_ops=_rejected_ops(lines),
        partitions=_partitions(text),
        errors=_unique(_strip_glog(line) for line in errors),
        warnings=_unique(_strip_glog(line) for line in lines if WARNING_LINE.search(line)),
        adapter=next((m.group(1).strip() for line in lines if (m := ADAPTER.search(line))), None),
        adapter_created=any(marker in text for marker in ADAPTER_CREATED),
        adapter_failure="; ".join(_unique(no_adapter)) or None,
    )


def _rejected_ops(lines: list[str]) -> list[dict[str, str]]:
    """`OPNAME: reason` lines that follow the delegate's "not supported" header."""
    ops, in_block = [], False
    for line in lines:
        if UNSUPPORTED_HEADER in line:
            in_block = True
            continue
        m = UNSUPPORTED_OP.match(line) if in_block else None
        if m:
            ops.append({"op": m.group(1), "reason": (m.group(2) or "").strip() or "(no reason given)"})
        else:
            in_block = False
    return _unique_dicts(ops)


def _partitions(text: str) -> dict[str, int] | None:
    if m := ALL_ON_CPU.search(text):
        return {"gpu_ops": 0, "cpu_ops": int(m.group(1))}
    if m := PARTITION.search(text):
        return {"gpu_ops": 0 if m.group(1) == "No" else int(m.group(1)), "cpu_ops": int(m.group(2))}
    return None


def _strip_glog(line: str) -> str:
    # Timestamps and thread ids differ between the two modes; without them the same message dedups.
    return GLOG_PREFIX.sub(r"\1 ", line.strip())


def _unique(items) -> list:
    return list(dict.fromkeys(items))


def _unique_dicts(items: list[dict]) -> list[dict]:
    return [dict(t) for t in dict.fromkeys(tuple(d.items()) for d in items)]


def _trim_log(text: str) -> str:
    kept = "\n".join(line for line in text.splitlines() if not NOISE.search(line))
    return kept if len(kept) <= LOG_LIMIT_CHARS else "[...]\n" + kept[-LOG_LIMIT_CHARS:]


# ---------------------------------------------------------------- parent side


@dataclass
class _ModeRun:
    """One child process: one precision mode, every signature."""

    status: str
    reason: str = ""
    outputs: dict[str, dict[str, np.ndarray]] = field(default_factory=dict)
    log: str = ""
    errors: list[str] = field(default_factory=list)


def gpu_check(
    tflite_path: Path,
    inputs: dict[str, dict[str, np.ndarray]],
    *,
    timeout_s: float = 300,
    env: dict[str, str] | None = None,
) -> GpuCheck:
    """Create `tflite_path` GPU-only (fp32 and fp16 compute) in a child and compare with the CPU.

    `inputs` maps every signature name to its input arrays by input name. `timeout_s` bounds the
    whole check (both children). `env` adds to / overrides the Vulkan env vars (tests use it to break
    the setup on purpose).
    """
    start = time.monotonic()
    tflite_path = Path(tflite_path).resolve()
    reference = cpu_reference(tflite_path, inputs)  # raises on a bad model or bad inputs: caller's error
    base_env = vulkan_env()
    if base_env is None and env is None:
        return GpuCheck("not_run", f"no Vulkan adapter: {SETUP_HINT} ({vulkan_dir()} missing)")
    child_env = {**os.environ, **(base_env or {}), **(env or {})}

    runs: dict[str, _ModeRun] = {}
    with tempfile.TemporaryDirectory(prefix=_temp_prefix("gpu")) as tmp:
        inputs_npz = _save_inputs(Path(tmp), inputs)
        for mode, enforce_f32 in MODES.items():
            time_left = max(timeout_s - (time.monotonic() - start), 0.1)
            runs[mode] = _run_mode(tflite_path, inputs_npz, enforce_f32, child_env, time_left, Path(tmp) / mode)
            if runs[mode].status != "accepted":
                break  # same ops in both modes; a second refusal would only repeat the first

    check = _combine(runs, reference, child_env)
    check.seconds = round(time.monotonic() - start, 3)
    return check


def cpu_reference(tflite_path: Path, inputs: dict[str, dict[str, np.ndarray]]) -> dict[str, dict[str, np.ndarray]]:
    from ai_edge_litert.interpreter import Interpreter

    interpreter = Interpreter(model_path=str(tflite_path))
    signatures = interpreter.get_signature_list()
    missing = sorted(set(signatures) - set(inputs))
    unknown = sorted(set(inputs) - set(signatures))
    if missing or unknown:
        raise ValueError(f"inputs must name every signature of {tflite_path.name} ({sorted(signatures)}); "
                         f"missing {missing}, unknown {unknown}")
    out = {}
    for sig, arrays in inputs.items():
        runner = interpreter.get_signature_runner(sig)
        out[sig] = {name: np.array(value) for name, value in runner(**arrays).items()}
    return out


def _save_inputs(tmp: Path, inputs: dict[str, dict[str, np.ndarray]]) -> Path:
    # npz keys are file names, so signature/input names go in an index rather than in the keys.
    arrays, index = {}, {}
    for sig, named in inputs.items():
        index[sig] = {}
        for name, value in named.items():
            key = f"a{len(arrays)}"
            arrays[key] = np.ascontiguousarray(value)
            index[sig][name] = key
    path = tmp / "inputs.npz"
    np.savez(path, **arrays)
    (tmp / "inputs.json").write_text(json.dumps(index))
    return path


def _run_mode(model: Path, inputs_npz: Path, enforce_f32: bool, env: dict, timeout_s: float, out_dir: Path) -> _ModeRun:
    out_dir.mkdir()
    # -P: do not put zoo/targets/ on sys.path; running the file (not -m) skips zoo/targets/__init__
    # (torch), so the child loads only numpy and LiteRT.
    cmd = [sys.executable, "-P", str(Path(__file__).resolve()), "--child", str(model), str(inputs_npz),
           str(out_dir), "1" if enforce_f32 else "0", str(os.getpid())]
    mode = "fp32" if enforce_f32 else "fp16"
    try:
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, errors="replace", timeout=timeout_s)
    except subprocess.TimeoutExpired as exc:
        log = _text(exc.stderr)
        return _ModeRun("not_run", f"GPU check timed out ({mode} child killed after {timeout_s:.1f} s)", log=log)
    return _classify(proc.returncode, proc.stdout, proc.stderr, mode, out_dir)


def _text(data) -> str:
    return data.decode(errors="replace") if isinstance(data, bytes) else (data or "")


def _classify(returncode: int, stdout: str, stderr: str, mode: str, out_dir: Path) -> _ModeRun:
    """Turn one child's exit status, markers and stderr into a verdict for that mode."""
    markers = [line.split(" ", 1) for line in stdout.splitlines() if line.startswith("ZOO_GPU_")]
    kinds = {m[0]: (m[1] if len(m) > 1 else "") for m in markers}
    parsed = parse_delegate_log(stderr)
    created = CREATED in kinds

    if parsed.adapter_failure and not created:
        return _ModeRun("not_run", f"no Vulkan adapter: {parsed.adapter_failure}", log=stderr)
    if returncode < 0:
        sig = _signal_name(-returncode)
        if created:
            where = f"while running signature {kinds.get(RUN_START, '?')}"
            return _ModeRun("rejected", f"child crashed with {sig} {where} ({mode})", log=stderr)
        if parsed.adapter_created:
            return _ModeRun("rejected", f"child crashed with {sig} while creating the GPU model ({mode})", log=stderr)
        return _ModeRun("not_run", f"child crashed with {sig} before a GPU adapter was created ({mode})", log=stderr)
    if CREATE_FAILED in kinds:
        return _ModeRun("rejected", f"GPU-only creation failed ({mode})", log=stderr,
                        errors=[_loads(kinds[CREATE_FAILED])])
    if RUN_FAILED in kinds:
        return _ModeRun("rejected", f"created, but running failed ({mode})", log=stderr,
                        errors=[_loads(kinds[RUN_FAILED])])
    if returncode != 0 or not created:
        last = stderr.strip().splitlines()[-1:] or ["no output"]
        return _ModeRun("not_run", f"GPU check child failed (exit {returncode}, {mode}): {last[0]}", log=stderr)
    outputs = dict(np.load(out_dir / "outputs.npz"))
    index = json.loads((out_dir / "outputs.json").read_text())
    by_sig = {sig: {name: outputs[key] for name, key in named.items()} for sig, named in index.items()}
    return _ModeRun("accepted", outputs=by_sig, log=stderr)


def _loads(payload: str) -> str:
    try:
        return json.loads(payload)
    except json.JSONDecodeError:
        return payload


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def _combine(runs: dict[str, _ModeRun], reference: dict, env: dict) -> GpuCheck:
    log_text = "\n".join(f"===== {mode} =====\n{run.log}" for mode, run in runs.items())
    parsed = parse_delegate_log(log_text)
    check = GpuCheck(
        status="accepted",
        rejected_ops=parsed.rejected_ops,
        partitions=parsed.partitions,
        errors=_unique(parsed.errors + [e for run in runs.values() for e in run.errors]),
        warnings=parsed.warnings,
        adapter=parsed.adapter,
        log=_trim_log(log_text),
    )
    for mode in ("not_run", "rejected"):  # the worst verdict of any mode wins
        failed = [run for run in runs.values() if run.status == mode]
        if failed:
            check.status, check.reason = mode, failed[0].reason
            break
    if check.status == "rejected" and check.rejected_ops:
        ops = "; ".join(f"{o['op']}: {o['reason']}" for o in check.rejected_ops)
        check.reason += f": not supported by the GPU delegate: {ops}"
    elif check.status == "rejected" and check.errors:
        check.reason += f": {check.errors[0]}"
    if check.status == "not_run" and "adapter" in check.reason:
        icd = env.get("VK_ICD_FILENAMES", "")
        if icd and not Path(icd).is_file():
            check.reason += f" (VK_ICD_FILENAMES={icd} does not exist; {SETUP_HINT}?)"
    check.outputs = _compare(reference, {mode: run.outputs for mode, run in runs.items()})
    return check


def _compare(reference: dict, gpu: dict[str, dict]) -> dict[str, dict[str, OutputErrors]]:
    result = {}
    for sig, outputs in reference.items():
        result[sig] = {}
        for name, ref in outputs.items():
            errs = OutputErrors()
            for mode, by_sig in gpu.items():
                got = by_sig.get(sig, {}).get(name)
                if got is not None:
                    max_abs, rel, cos = _errors(ref, got)
                    setattr(errs, f"{mode}_max_abs", max_abs)
                    setattr(errs, f"{mode}_rel_err", rel)
                    setattr(errs, f"{mode}_cosine", cos)
            result[sig][name] = errs
    return result


def _errors(ref: np.ndarray, got: np.ndarray) -> tuple[float, float, float]:
    """max |got - ref|, that over max |ref|, and cosine similarity: the gate functions themselves
    (zoo.gates), so the GPU check and the gates cannot disagree on NaN, zeros or shapes."""
    from zoo import gates

    return gates.max_abs(got, ref), gates.rel_max_abs(got, ref), gates.cosine(got, ref)


# ---------------------------------------------------------------- availability probe


@functools.cache
def gpu_available() -> tuple[bool, str]:
    """Can a WebGPU adapter be created and run a one-op model? Asked once per process."""
    if vulkan_env() is None:
        return False, f"no Vulkan adapter: {SETUP_HINT} ({vulkan_dir()} missing)"
    with tempfile.TemporaryDirectory(prefix=_temp_prefix("gpu-probe")) as tmp:
        path = Path(tmp) / "relu.tflite"
        path.write_bytes(_relu_model())
        x = np.array([[-1.0, 0.5, -0.25, 2.0]], np.float32)
        check = gpu_check(path, {"serving_default": {"x": x}}, timeout_s=120)
    if check.status == "accepted":
        return True, f"adapter: {check.adapter or 'unknown'}"
    return False, check.reason


def _relu_model() -> bytes:
    """A one-op (RELU) .tflite built from the schema, so the probe needs neither torch nor a file."""
    import flatbuffers
    from ai_edge_litert import schema_py_generated as schema

    def tensor(name: bytes) -> schema.TensorT:
        t = schema.TensorT()
        t.name, t.shape, t.type, t.buffer = name, [1, 4], schema.TensorType.FLOAT32, 0
        return t

    def tensor_map(name: bytes, index: int) -> schema.TensorMapT:
        m = schema.TensorMapT()
        m.name, m.tensorIndex = name, index
        return m

    code = schema.OperatorCodeT()
    code.builtinCode = code.deprecatedBuiltinCode = schema.BuiltinOperator.RELU
    code.version = 1
    op = schema.OperatorT()
    op.opcodeIndex, op.inputs, op.outputs = 0, [0], [1]
    graph = schema.SubGraphT()
    graph.tensors, graph.inputs, graph.outputs, graph.operators = [tensor(b"x"), tensor(b"y")], [0], [1], [op]
    sig = schema.SignatureDefT()
    sig.signatureKey, sig.subgraphIndex = b"serving_default", 0
    sig.inputs, sig.outputs = [tensor_map(b"x", 0)], [tensor_map(b"y", 1)]
    model = schema.ModelT()
    model.version, model.operatorCodes, model.subgraphs = 3, [code], [graph]
    model.buffers, model.signatureDefs = [schema.BufferT()], [sig]  # buffer 0: the empty sentinel
    builder = flatbuffers.Builder(256)
    builder.Finish(model.Pack(builder), file_identifier=b"TFL3")
    return bytes(builder.Output())


# ---------------------------------------------------------------- child side


def _die_with_parent(parent_pid: int) -> None:
    """A SIGKILLed conversion must not leave its GPU check running: ask the kernel to SIGKILL this
    child when its parent dies (PR_SET_PDEATHSIG). Done here rather than in a preexec_fn, which is
    unsafe in a parent with threads (the stage RSS sampler); the getppid check closes the window
    between fork and this call."""
    import ctypes

    PR_SET_PDEATHSIG = 1
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):  # not Linux: the parent's timeout still bounds the child
        return
    if os.getppid() != parent_pid:  # the parent died before the request took effect
        os._exit(1)


def _pause_for_tests() -> None:
    """The fault-injection pause point "gpu_child" (tests/test_faults.py); a no-op otherwise."""
    if "gpu_child" not in os.environ.get("ZOO_TEST_PAUSE_AT", "").split(","):
        return
    sys.path.insert(0, str(REPO_ROOT))
    from zoo.bundle import pause_here_for_tests

    pause_here_for_tests("gpu_child")


def _child_main(model: str, inputs_npz: str, out_dir: str, enforce_f32: bool) -> int:
    """Runs in the child: create GPU-only, run every signature, save outputs, report by marker lines."""
    from ai_edge_litert.compiled_model import CompiledModel
    from ai_edge_litert.hardware_accelerator import HardwareAccelerator
    from ai_edge_litert.options import GpuOptions, Options

    arrays = np.load(inputs_npz)
    index = json.loads(Path(inputs_npz).with_suffix(".json").read_text())
    options = Options(hardware_accelerators=HardwareAccelerator.GPU, gpu_options=GpuOptions(enforce_f32=enforce_f32))
    try:
        compiled = CompiledModel.from_file(model, options=options)
    except Exception as exc:  # the delegate's reasons are on stderr; the exception says it failed
        _marker(CREATE_FAILED, json.dumps(f"{type(exc).__name__}: {exc}"))
        return 0
    _marker(CREATED)

    saved, out_index = {}, {}
    for sig, named in index.items():
        _marker(RUN_START, sig)
        try:
            outputs = _run_signature(compiled, sig, {name: arrays[key] for name, key in named.items()})
        except Exception as exc:
            _marker(RUN_FAILED, json.dumps(f"{sig}: {type(exc).__name__}: {exc}"))
            return 0
        out_index[sig] = {}
        for name, value in outputs.items():
            key = f"o{len(saved)}"
            saved[key] = value
            out_index[sig][name] = key
        _marker(RAN, sig)
    np.savez(Path(out_dir) / "outputs.npz", **saved)
    (Path(out_dir) / "outputs.json").write_text(json.dumps(out_index))
    return 0


def _run_signature(compiled, sig: str, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    in_buffers = {}
    for name in compiled.get_input_tensor_details(sig):
        buffer = compiled.create_input_buffer_by_name(sig, name)
        buffer.write(np.ascontiguousarray(inputs[name]))
        in_buffers[name] = buffer
    details = compiled.get_output_tensor_details(sig)
    out_buffers = {name: compiled.create_output_buffer_by_name(sig, name) for name in details}
    compiled.run_by_name(sig, in_buffers, out_buffers)
    outputs = {}
    for name, d in details.items():
        shape = tuple(d["shape"])
        outputs[name] = out_buffers[name].read(int(np.prod(shape)), np.dtype(d["dtype"])).reshape(shape)
    return outputs


class GpuRunner:
    """A GPU-only CompiledModel behind the runner interface sessions use (`run`, `input_details`), so a
    component's own session (e.g. an LLM's prefill + decode loop) can drive the GPU like the CPU."""

    def __init__(self, compiled):
        self.compiled = compiled

    def input_details(self, function: str) -> dict:
        return {name: {"shape": list(d["shape"]), "dtype": np.dtype(d["dtype"])}
                for name, d in self.compiled.get_input_tensor_details(function).items()}

    def run(self, function: str, inputs: dict[str, np.ndarray], states: dict | None = None) -> dict[str, np.ndarray]:
        return _run_signature(self.compiled, function, inputs)

    def close(self) -> None:
        pass


def _session_child_main(model: str, driver: str, payload_json: str, out_dir: str, enforce_f32: bool) -> int:
    """Runs in the child: create GPU-only, then `driver(GpuRunner, payload) -> {name: array}`."""
    import importlib

    from ai_edge_litert.compiled_model import CompiledModel
    from ai_edge_litert.hardware_accelerator import HardwareAccelerator
    from ai_edge_litert.options import GpuOptions, Options

    options = Options(hardware_accelerators=HardwareAccelerator.GPU, gpu_options=GpuOptions(enforce_f32=enforce_f32))
    try:
        compiled = CompiledModel.from_file(model, options=options)
    except Exception as exc:
        _marker(CREATE_FAILED, json.dumps(f"{type(exc).__name__}: {exc}"))
        return 0
    _marker(CREATED)
    module_name, _, function = driver.partition(":")
    run = getattr(importlib.import_module(module_name), function)
    _marker(RUN_START, driver)
    try:
        arrays = run(GpuRunner(compiled), json.loads(Path(payload_json).read_text()))
    except Exception as exc:
        _marker(RUN_FAILED, json.dumps(f"{driver}: {type(exc).__name__}: {exc}"))
        return 0
    np.savez(Path(out_dir) / "session.npz", **arrays)
    _marker(RAN, driver)
    return 0


def gpu_session_run(tflite_path: Path, driver: str, payload: dict, *, enforce_f32: bool = False,
                    timeout_s: float = 900, env: dict[str, str] | None = None) -> tuple[str, str, dict]:
    """Drive a .tflite GPU-only through `driver` ("module:function", called as driver(runner, payload) in
    a child process) — e.g. greedy generation on the GPU's fp16 path. Returns (status, reason, arrays):
    status "ran", "rejected" (creation or a call failed) or "not_run" (no adapter, timeout, crash)."""
    base_env = vulkan_env()
    if base_env is None and env is None:
        return "not_run", f"no Vulkan adapter: {SETUP_HINT} ({vulkan_dir()} missing)", {}
    child_env = {**os.environ, **(base_env or {}), **(env or {})}
    with tempfile.TemporaryDirectory(prefix=_temp_prefix("gpu")) as tmp:
        payload_path = Path(tmp) / "payload.json"
        payload_path.write_text(json.dumps(payload))
        cmd = [sys.executable, "-m", "zoo.targets.litert_gpu", "--session-child", str(Path(tflite_path).resolve()),
               driver, str(payload_path), tmp, "1" if enforce_f32 else "0", str(os.getpid())]
        try:
            proc = subprocess.run(cmd, env=child_env, cwd=REPO_ROOT, capture_output=True, text=True,
                                  errors="replace", timeout=timeout_s)
        except subprocess.TimeoutExpired:
            return "not_run", f"GPU session timed out after {timeout_s:.0f} s", {}
        markers = {line.split(" ", 1)[0]: line.partition(" ")[2] for line in proc.stdout.splitlines()
                   if line.startswith("ZOO_GPU_")}
        if RAN in markers and (Path(tmp) / "session.npz").is_file():
            with np.load(Path(tmp) / "session.npz") as data:
                return "ran", "", {k: data[k] for k in data.files}
        if CREATE_FAILED in markers or RUN_FAILED in markers:
            return "rejected", _loads(markers.get(RUN_FAILED) or markers.get(CREATE_FAILED) or '""'), {}
        tail = (proc.stderr or "").strip().splitlines()[-3:]
        return "not_run", f"GPU session child exited {proc.returncode}: {' | '.join(tail)}", {}


def _marker(kind: str, payload: str = "") -> None:
    print(f"{kind} {payload}".rstrip(), flush=True)


# ---------------------------------------------------------------- CLI


def random_inputs(tflite_path: Path, seed: int = 0) -> dict[str, dict[str, np.ndarray]]:
    """Random arrays matching every signature's input details (normal floats, small non-negative ints)."""
    from ai_edge_litert.interpreter import Interpreter

    rng = np.random.default_rng(seed)
    interpreter = Interpreter(model_path=str(tflite_path))
    inputs = {}
    for sig in interpreter.get_signature_list():
        inputs[sig] = {}
        for name, d in interpreter.get_signature_runner(sig).get_input_details().items():
            shape, dtype = tuple(d["shape"]), np.dtype(d["dtype"])
            if np.issubdtype(dtype, np.floating):
                value = rng.standard_normal(shape)
            elif dtype == np.bool_:
                value = rng.random(shape) < 0.5
            else:
                value = rng.integers(0, 8, shape)
            inputs[sig][name] = value.astype(dtype)
    return inputs


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--child"]:
        model, inputs_npz, out_dir, enforce, parent = argv[1:6]
        _die_with_parent(int(parent))
        _pause_for_tests()
        return _child_main(model, inputs_npz, out_dir, enforce == "1")
    if argv[:1] == ["--session-child"]:
        model, driver, payload, out_dir, enforce, parent = argv[1:7]
        _die_with_parent(int(parent))
        return _session_child_main(model, driver, payload, out_dir, enforce == "1")
    # Imported here, not at the top: the child (above) runs this file bare, with numpy and LiteRT only.
    from zoo.cli import returns_exit_code

    return returns_exit_code(_check_main)(argv)


def _check_main(argv: list[str]) -> int:
    from zoo.integrity import verify_artifact_in_bundle
    from zoo.targets.litert import require_tflite_file

    parser = argparse.ArgumentParser(prog="python -m zoo.targets.litert_gpu", description=__doc__.split("\n\n")[0])
    parser.add_argument("model", nargs="?", type=Path, help=".tflite to check on random inputs")
    parser.add_argument("--probe", action="store_true", help="only check that a GPU adapter can be created")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--timeout", type=float, default=300)
    args = parser.parse_args(argv)
    if args.probe:
        ok, why = gpu_available()
        print(json.dumps({"available": ok, "reason": why}))
        return 0 if ok else 2
    if args.model is None:
        parser.error("give a MODEL.tflite or --probe")
    require_tflite_file(args.model)  # a folder, a missing or a non-tflite file: one clear error, exit 2
    verify_artifact_in_bundle(args.model)  # inside a bundle: its manifest's sha256 first
    check = gpu_check(args.model, random_inputs(args.model, args.seed), timeout_s=args.timeout)
    print(json.dumps(check.to_dict(), indent=2))
    return {"accepted": 0, "rejected": 1}.get(check.status, 2)


if __name__ == "__main__":
    sys.exit(main())
