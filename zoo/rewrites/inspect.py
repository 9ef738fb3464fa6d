"""Convert a module to .tflite and read back what the converter emitted.

The tests of every rewrite assert on the *artifact*, not on the torch graph: which builtin ops the
.tflite holds, the largest tensor rank in it, and the shapes each op sees. We read the flatbuffer with
the schema that ai-edge-litert ships (`schema_py_generated`), so nothing here depends on the private
`Interpreter._get_ops_details()` and op versions (e.g. TRANSPOSE_CONV v3) are visible too.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import os
from functools import lru_cache
from pathlib import Path
from typing import Iterator, Sequence

import numpy as np
import torch


@dataclasses.dataclass(frozen=True)
class OpInfo:
    """One operator of a subgraph, as the GPU delegate will see it."""

    name: str  # builtin name, e.g. "BROADCAST_TO", or the custom code
    version: int
    inputs: tuple[tuple[int, ...], ...]  # shapes of the input tensors, in operand order
    outputs: tuple[tuple[int, ...], ...]
    const_inputs: tuple[bool, ...]  # True where the operand is a constant baked into the file
    input_ids: tuple[int, ...]
    output_ids: tuple[int, ...]


@dataclasses.dataclass(frozen=True)
class TfliteGraph:
    """One subgraph (one signature of a multi-signature file)."""

    name: str
    ops: tuple[OpInfo, ...]
    tensor_shapes: tuple[tuple[int, ...], ...]
    tensor_names: tuple[str, ...]
    graph_inputs: tuple[int, ...]
    graph_outputs: tuple[int, ...]


@lru_cache(maxsize=1)
def _builtin_names() -> dict[int, str]:
    from ai_edge_litert import schema_py_generated as schema

    return {v: k for k, v in vars(schema.BuiltinOperator).items() if not k.startswith("_")}


def read_graphs(path: str | Path) -> tuple[TfliteGraph, ...]:
    """Parse every subgraph of the .tflite flatbuffer: ops in execution order, shapes, constants.

    Every subgraph, because the interpreter's own `_get_ops_details()` sees only the first one: a
    rank-5 tensor in a model's second signature (an LLM's `decode`) must not hide. The file is
    memory-mapped, so a 500 MB model's weights are never copied.
    """
    import mmap

    from ai_edge_litert import schema_py_generated as schema

    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
        model = schema.Model.GetRootAs(buf, 0)
        return tuple(_read_subgraph(model, model.Subgraphs(i)) for i in range(model.SubgraphsLength()))


def read_graph(path: str | Path, subgraph: int = 0) -> TfliteGraph:
    return read_graphs(path)[subgraph]


def _read_subgraph(model, sg) -> TfliteGraph:
    names = _builtin_names()

    def shape(t: int) -> tuple[int, ...]:
        return tuple(int(d) for d in sg.Tensors(t).ShapeAsNumpy()) if sg.Tensors(t).ShapeLength() else ()

    def is_const(t: int) -> bool:
        b = model.Buffers(sg.Tensors(t).Buffer())
        # Offset > 1 is how large models store buffers outside the flatbuffer proper.
        return b is not None and (b.DataLength() > 0 or b.Offset() > 1)

    ops = []
    for i in range(sg.OperatorsLength()):
        op = sg.Operators(i)
        code = model.OperatorCodes(op.OpcodeIndex())
        # The builtin code moved to a 32-bit field; the deprecated 8-bit one saturates at 127.
        builtin = max(code.BuiltinCode(), code.DeprecatedBuiltinCode())
        name = names.get(builtin, str(builtin))
        if name == "CUSTOM" and code.CustomCode():
            name = code.CustomCode().decode()
        ins = tuple(int(t) for t in op.InputsAsNumpy() if t >= 0) if op.InputsLength() else ()
        outs = tuple(int(t) for t in op.OutputsAsNumpy()) if op.OutputsLength() else ()
        ops.append(
            OpInfo(
                name=name,
                version=code.Version(),
                inputs=tuple(shape(t) for t in ins),
                outputs=tuple(shape(t) for t in outs),
                const_inputs=tuple(is_const(t) for t in ins),
                input_ids=ins,
                output_ids=outs,
            )
        )
    return TfliteGraph(
        name=(sg.Name() or b"").decode(),
        ops=tuple(ops),
        tensor_shapes=tuple(shape(t) for t in range(sg.TensorsLength())),
        tensor_names=tuple((sg.Tensors(t).Name() or b"").decode() for t in range(sg.TensorsLength())),
        graph_inputs=tuple(int(t) for t in sg.InputsAsNumpy()) if sg.InputsLength() else (),
        graph_outputs=tuple(int(t) for t in sg.OutputsAsNumpy()) if sg.OutputsLength() else (),
    )


def all_ops(path: str | Path) -> list[OpInfo]:
    """Every operator of every subgraph."""
    return [op for g in read_graphs(path) for op in g.ops]


def ops_in_tflite(path: str | Path) -> list[str]:
    """Builtin op names of every subgraph, in execution order (duplicates kept)."""
    return [op.name for op in all_ops(path)]


def max_tensor_rank(path: str | Path) -> int:
    """Largest rank of any tensor in any subgraph (the GPU delegate stops at 4)."""
    return max((len(s) for g in read_graphs(path) for s in g.tensor_shapes), default=0)


def ops_named(path: str | Path, name: str) -> list[OpInfo]:
    return [op for op in all_ops(path) if op.name == name]


def op_report(path: str | Path) -> dict:
    """Op histogram, tensor-rank histogram, the highest-rank tensor and the subgraph names: the
    summary a bundle's checks and tests assert on (all subgraphs)."""
    graphs = read_graphs(path)
    ops = collections.Counter(op.name for g in graphs for op in g.ops)
    ranks = collections.Counter(len(s) for g in graphs for s in g.tensor_shapes)
    worst = max(((len(s), g.name, g.tensor_names[i], list(s)) for g in graphs for i, s in enumerate(g.tensor_shapes)),
                key=lambda row: row[0], default=None)
    return {
        "ops": dict(sorted(ops.items())),
        "tensor_ranks": dict(sorted(ranks.items())),
        "max_rank": worst[0] if worst else 0,
        "max_rank_tensor": dict(zip(("rank", "subgraph", "name", "shape"), worst)) if worst else None,
        "subgraphs": [g.name for g in graphs],
    }


# --- detectors: each returns human-readable findings, [] when the file is clean ---------------------
# They are what the rewrite registry's `detect` fields point at, and `gpu_lint` runs all of them.


def _fmt(op: OpInfo) -> str:
    return f"{op.name}{list(op.inputs)}->{list(op.outputs)}"


def find_ops(path: str | Path, *names: str) -> list[str]:
    """Ops the GPU delegate rejects by name (BROADCAST_TO, GATHER_ND, RELU_0_TO_1, ...)."""
    return [_fmt(op) for op in all_ops(path) if op.name in names]


def find_rank_over(path: str | Path, limit: int = 4) -> list[str]:
    """Tensors of rank > 4: the delegate fails with "bad input dims size: 6" and the like."""
    return [
        f"{op.name} with a rank-{len(s)} tensor {s}" for op in all_ops(path) for s in op.inputs + op.outputs if len(s) > limit
    ]


def find_broadcast_bmm(path: str | Path) -> list[str]:
    """BATCH_MATMUL whose operands' batch dims differ: accepted by the GPU but wrong even in fp32."""
    found = []
    for op in all_ops(path):
        if op.name == "BATCH_MATMUL" and len(op.inputs) == 2:
            a, b = (s[:-2] for s in op.inputs)
            if a != b:
                found.append(f"broadcast {_fmt(op)}")
    return found


def find_broadcast_add_after_bmm(path: str | Path) -> list[str]:
    """ADD of a BATCH_MATMUL result and a runtime tensor broadcast on the head axis (the mask idiom).

    Silently wrong on older runtimes (LiteRT#8593; token 0 right, every later token wrong).
    """
    found = []
    for g in read_graphs(path):
        found += _broadcast_adds_after_bmm(g)
    return found


def _broadcast_adds_after_bmm(g: TfliteGraph) -> list[str]:
    made_by = {t: op.name for op in g.ops for t in op.output_ids}
    found = []
    for op in g.ops:
        if op.name != "ADD" or len(op.inputs) != 2:
            continue
        from_bmm = [made_by.get(t) == "BATCH_MATMUL" for t in op.input_ids]
        if any(from_bmm) and op.inputs[0] != op.inputs[1] and not all(op.const_inputs):
            if _numel(op.inputs[0]) != _numel(op.inputs[1]):
                found.append(f"head-broadcast {_fmt(op)} after BATCH_MATMUL")
    return found


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def find_identical_inputs(path: str | Path, names: Sequence[str] = ("DIV",)) -> list[str]:
    """Binary ops whose two operands are the same tensor: "No support of few identical inputs".

    Measured for DIV (y / y). Not flagged for MUL: every x*x / x.pow(2) / torch.square lowers to
    MUL(t, t), nn.RMSNorm included, and GQA blocks with it were accepted.
    """
    return [
        f"{_fmt(op)} with identical inputs"
        for op in all_ops(path)
        if op.name in names and len(op.input_ids) == 2 and op.input_ids[0] == op.input_ids[1]
    ]


def find_all_const_inputs(path: str | Path) -> list[str]:
    """Ops that only read constants: "Expected 1 const input tensor(s)" splits the partition."""
    return [f"{_fmt(op)} on constants only" for op in all_ops(path) if op.const_inputs and all(op.const_inputs)]


def find_fc_rank_drop(path: str | Path) -> list[str]:
    """FULLY_CONNECTED with a rank-2 output feeding ADD/MUL with a higher-rank constant.

    Accepted by the GPU delegate but wrong even in fp32 (row 0 right, the rest wrong). litert-torch
    emits the rank-2 form for `F.linear(x3d, W, b)` (FC v1, keep_num_dims=False).
    """
    return [finding for g in read_graphs(path) for finding in _fc_rank_drops(g)]


def _fc_rank_drops(g: TfliteGraph) -> list[str]:
    fc_out = {t: len(op.outputs[0]) for op in g.ops if op.name == "FULLY_CONNECTED" for t in op.output_ids}
    found = []
    for op in g.ops:
        if op.name not in ("ADD", "MUL") or len(op.inputs) != 2:
            continue
        for i, t in enumerate(op.input_ids):
            other = 1 - i
            if (
                t in fc_out
                and op.const_inputs[other]
                and len(op.inputs[other]) > fc_out[t]
                and _numel(op.inputs[other]) == _numel(op.inputs[i])
            ):
                found.append(f"rank-{fc_out[t]} FULLY_CONNECTED output into {_fmt(op)}")
    return found


def find_aliased_add_outputs(path: str | Path) -> list[str]:
    """Graph outputs made by ADD of two runtime tensors that another op also reads (LiteRT#8599)."""
    return [finding for g in read_graphs(path) for finding in _aliased_add_outputs(g)]


def _aliased_add_outputs(g: TfliteGraph) -> list[str]:
    made_by = {t: op for op in g.ops for t in op.output_ids}
    read = {t for op in g.ops for t in op.input_ids}
    found = []
    for t in g.graph_outputs:
        op = made_by.get(t)
        if op is not None and op.name == "ADD" and not any(op.const_inputs) and t in read:
            found.append(f"output tensor {t} is {_fmt(op)} and is also consumed")
    return found


def no_structural_finding(path: str | Path) -> list[str]:
    """For rewrites whose failure is numeric only: nothing to see in the op list."""
    return []


# Ops the seed reports the GPU delegate rejecting by name. SELECT/SELECT_V2 are accepted by the WebGPU
# checker today but were reported rejected on phones, so they stay on the list.
REJECTED_OPS = ("BROADCAST_TO", "GATHER_ND", "GATHER", "RELU_0_TO_1", "SELECT", "SELECT_V2", "STABLEHLO_COMPOSITE")


def gpu_lint(path: str | Path) -> list[str]:
    """Every structural GPU trap this library knows, on one .tflite."""
    return (
        find_ops(path, *REJECTED_OPS)
        + find_rank_over(path)
        + find_broadcast_bmm(path)
        + find_broadcast_add_after_bmm(path)
        + find_identical_inputs(path)
        + find_all_const_inputs(path)
        + find_fc_rank_drop(path)
    )


@contextlib.contextmanager
def quiet_converter() -> Iterator[None]:
    """litert-torch prints a progress tree for every conversion; tests convert dozens of modules."""
    old = os.environ.get("LITERT_TORCH_SHOW_PROGRESS")
    os.environ["LITERT_TORCH_SHOW_PROGRESS"] = "n"
    try:
        yield
    finally:
        if old is None:
            os.environ.pop("LITERT_TORCH_SHOW_PROGRESS", None)
        else:
            os.environ["LITERT_TORCH_SHOW_PROGRESS"] = old


def convert_to_tflite(module: torch.nn.Module, args: tuple, path: str | Path) -> Path:
    """`litert_torch.convert(module, args).export(path)`, quietly. Returns the path."""
    import litert_torch

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with quiet_converter():
        litert_torch.convert(module.eval(), tuple(args)).export(str(path))
    return path


def run_tflite_cpu(path: str | Path, args: Sequence[torch.Tensor | np.ndarray]) -> list[np.ndarray]:
    """Run the default signature on the CPU interpreter; inputs in the module's positional order.

    Signature input names sort lexicographically (args_10 < args_2), so feed by name, not position.
    """
    from ai_edge_litert.interpreter import Interpreter

    interp = Interpreter(model_path=str(path))
    runner = interp.get_signature_runner()
    feeds = {
        f"args_{i}": np.asarray(a.detach().numpy() if isinstance(a, torch.Tensor) else a) for i, a in enumerate(args)
    }
    out = runner(**feeds)
    return [out[k] for k in sorted(out, key=lambda k: int(k.rsplit("_", 1)[-1]))]
