"""zoo doctor: find the known traps in a model's *exported* graph, name the rewrite that fixes each one.

    from zoo import doctor
    findings = doctor.diagnose(module, example_inputs, targets=("litert-gpu", "coreai"))
    result = doctor.fix(module, example_inputs, targets)       # graph-level fixes, source untouched
    doctor.prove(module, result.module, example_inputs, targets, workdir)   # convert, run, GPU check

The doctor lints what the converter sees, not source text: the module goes through `torch.export` and the
target's own decomposition table (coreai-torch's, litert-torch's pre-convert table), except for the ops a
rule watches — those are kept whole, because once decomposed they are an unrecognisable cloud of
gathers (bicubic upsampling becomes ~100 nodes). Every finding carries the user's source line, read from
the node's `stack_trace` metadata, and the fix: a rewrite id from `zoo.rewrites` or a sentence.

Rules are data (`RULES`): id, severity, targets, cause, fix and a detector over FX nodes. Severity:
  fatal  the target rejects it (the converter raises, or the GPU delegate refuses the op);
  silent it converts but computes wrong on some target;
  perf   correct but slow;  info  worth knowing.
Precision: the half-precision rules (norm overflow, long-K matmul) look at the dtype each node computes
in, so `precision="fp16"` exports the module cast the way the pipeline casts it (zoo.precision), and a
model that upcasts its norms to fp32 by itself (T5, the LLM) stays quiet.

CLI: `python -m zoo.doctor MODEL|pkg.mod:factory|PATH.tflite|PATH.aimodel [--target T] [--precision P]
[--ignore ID] [--fix [--prove]]`; `--rules-markdown` prints the rule table for the README
(scripts/doctor_rules_readme.py writes it there).
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import importlib
import re
import sys
import traceback
from pathlib import Path
from typing import Callable, Iterable, Sequence

import torch
from torch import fx, nn

from zoo.cli import returns_exit_code, run_script
from zoo.errors import ZooError

aten = torch.ops.aten

LITERT, LITERT_GPU, COREAI = "litert", "litert-gpu", "coreai"
ALL_TARGETS = (LITERT, LITERT_GPU, COREAI)
DEFAULT_TARGETS = (LITERT_GPU, COREAI)
SEVERITIES = ("fatal", "silent", "perf", "info")
HALF = (torch.float16, torch.bfloat16)

# A dot product longer than this accumulates visibly in fp16: the GPU's fp16 path gives ~1e-2 relative
# error on a 4096-wide projection (issue 13); 2048 keeps a margin.
LONG_K = 2048
# Ops emitted between a reshape's operands that change nothing about the data (export inserts them).
_PASS_THROUGH = (aten.clone.default, aten.contiguous.default, aten.alias.default)


# ---------------------------------------------------------------- rules and findings


@dataclasses.dataclass(frozen=True)
class Rule:
    id: str
    severity: str
    targets: tuple[str, ...]
    cause: str  # one line: why this breaks
    fix: str  # a rewrite id from zoo.rewrites, or a sentence
    # detect(node, ctx) -> a detail string when the node is the trap, else None.
    detect: Callable[[fx.Node, "Context"], str | None]
    # ATen ops the target would decompose but the detector needs to see whole.
    keep: tuple = ()

    def __post_init__(self):
        assert self.severity in SEVERITIES, self.severity
        assert set(self.targets) <= set(ALL_TARGETS), self.targets

    @property
    def fix_is_rewrite(self) -> bool:
        from zoo import rewrites

        return self.fix in rewrites.REWRITES


@dataclasses.dataclass(frozen=True)
class Finding:
    rule: str
    severity: str
    targets: tuple[str, ...]
    cause: str
    fix: str
    source: str  # "file:line: code" of the user's line, or "" when the graph carries none
    node: str = ""
    detail: str = ""

    def format(self) -> str:
        where = self.source or f"(graph node {self.node})"
        detail = f" [{self.detail}]" if self.detail else ""
        return (f"{self.severity:<6} {self.rule} ({', '.join(self.targets)}) at {where}\n"
                f"       {self.cause}{detail}\n       fix: {self.fix}")


@dataclasses.dataclass
class Context:
    target: str
    claimed: set  # nodes already explained by a pattern finding: reported once, not per op
    # nodes computed from the caller's inputs (not from weights or constants alone): a chain over
    # constants (a tril mask built from arange) is folded by the converter and never runs
    input_derived: frozenset = frozenset()

    # node -> max |value| it had on the example inputs, for the nodes a rule asks about (VALUE_WATCH)
    peaks: dict = dataclasses.field(default_factory=dict)

    def depends_on_input(self, node) -> bool:
        return node in self.input_derived


# ---------------------------------------------------------------- node helpers


def _val(node) -> torch.Tensor | None:
    v = node.meta.get("val") if isinstance(node, fx.Node) else None
    return v if isinstance(v, torch.Tensor) else None


def _rank(node) -> int:
    v = _val(node)
    return v.dim() if v is not None else -1


def _dtype(node):
    v = _val(node)
    return v.dtype if v is not None else None


def _is(node, *ops) -> bool:
    """True if `node` calls one of `ops` (OpOverloads or OpOverloadPackets)."""
    if not isinstance(node, fx.Node) or node.op != "call_function":
        return False
    target = node.target
    packet = getattr(target, "overloadpacket", None)
    return any(target is op or packet is op for op in ops)


def _skip_pass_through(node):
    while _is(node, *_PASS_THROUGH):
        node = node.args[0]
    return node


def _users_through_pass_through(node) -> list:
    out = []
    for user in node.users:
        out += _users_through_pass_through(user) if _is(user, *_PASS_THROUGH) else [user]
    return out


def _arg(node, index: int, name: str, default=None):
    if len(node.args) > index:
        return node.args[index]
    return node.kwargs.get(name, default)


# ---------------------------------------------------------------- detectors


def _op(*ops, detail: Callable | None = None):
    """A detector for a plain ATen op."""

    def detect(node, ctx):
        if _is(node, *ops):
            return detail(node) if detail else str(node.target)
        return None

    return detect


def _grid_sample_detail(node) -> str:
    x, grid = node.args[0], node.args[1]
    modes = {0: "bilinear", 1: "nearest", 2: "bicubic"}
    pads = {0: "zeros", 1: "border", 2: "reflection"}
    mode, pad = modes.get(node.args[2], "?"), pads.get(node.args[3], "?")
    return f"grid_sampler_2d mode={mode} padding={pad} x{tuple(_val(x).shape)} grid{tuple(_val(grid).shape)}"


def _detect_grid_sample(node, ctx):
    # export's own IR has the generic aten.grid_sampler; the targets' tables turn it into grid_sampler_2d
    if _is(node, aten.grid_sampler_2d) or (_is(node, aten.grid_sampler) and _rank(node.args[0]) == 4):
        return _grid_sample_detail(node)
    return None


def _detect_repeat_kv(node, ctx):
    """unsqueeze(d) -> expand (size 1 -> r at d) -> reshape merging d into d-1: transformers' repeat_kv."""
    if not _is(node, aten.expand):
        return None
    src = _skip_pass_through(node.args[0])
    if not _is(src, aten.unsqueeze):
        return None
    dim = src.args[1] % _rank(src)
    out_shape = _val(node).shape
    if dim == 0 or out_shape[dim] == 1:
        return None
    for user in _users_through_pass_through(node):
        if _is(user, aten.view, aten.reshape, aten._unsafe_view) and _rank(user) == _rank(node) - 1:
            merged = list(out_shape[: dim - 1]) + [out_shape[dim - 1] * out_shape[dim]] + list(out_shape[dim + 1:])
            if list(_val(user).shape) == merged:
                ctx.claimed.update({src, node, user, *node.users})
                return f"x[:, :, None].expand(...).reshape(...) repeats dim {dim - 1} x{out_shape[dim]} through rank {_rank(node)}"
    return None


_SHAPE_OPS = (aten.view, aten.reshape, aten._unsafe_view, aten.permute, aten.transpose, aten.expand,
              aten.unsqueeze, aten.squeeze, aten.clone)


def _detect_high_rank(node, ctx):
    if node in ctx.claimed or not _is(node, *_SHAPE_OPS) or _rank(node) <= 4:
        return None
    return f"{node.target.__name__ if hasattr(node.target, '__name__') else node.target} to rank {_rank(node)} {tuple(_val(node).shape)}"


def _is_const(value, number) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and float(value) == number


def _detect_clamp01(node, ctx):
    if _is(node, aten.hardtanh) and _is_const(_arg(node, 1, "min_val", -1.0), 0) and _is_const(_arg(node, 2, "max_val", 1.0), 1):
        return "hardtanh(0, 1)"
    if _is(node, aten.clamp) and _is_const(_arg(node, 1, "min"), 0) and _is_const(_arg(node, 2, "max"), 1):
        return "clamp(0, 1)"
    # clamp_max(relu(x) | clamp_min(x, 0), 1): the same op once the converter fuses it
    if _is(node, aten.clamp_max) and _is_const(node.args[1], 1):
        src = node.args[0]
        if _is(src, aten.relu) or (_is(src, aten.clamp_min) and _is_const(src.args[1], 0)):
            return "clamp_max(relu(x), 1)"
    return None


def _squared(node):
    """x if node is x*x or x**2, else None."""
    if _is(node, aten.pow) and _is_const(node.args[1], 2):
        return node.args[0]
    if _is(node, aten.mul) and len(node.args) == 2 and node.args[0] is node.args[1]:
        return node.args[0]
    return None


def _is_prescaled(x, depth: int = 4) -> bool:
    """x = y / max|y| (optionally centred after): the overflow-free form of zoo.rewrites.norms
    (adaptive_normalize) and the LLM's ScaledRMSNorm, where no intermediate exceeds 1."""
    if _is(x, aten.sub):  # centred: xs - mean(xs)
        x = x.args[0]
    if not _is(x, aten.div, aten.mul) or not isinstance(x.args[1], fx.Node):
        return False
    frontier = [x.args[1]]
    for _ in range(depth):  # the divisor is clamp(amax(abs(y)), 1) or a reciprocal of it
        if any(_is(n, aten.amax, aten.max) for n in frontier):
            return True
        frontier = [a for n in frontier if isinstance(n, fx.Node) for a in n.args if isinstance(a, fx.Node)]
    return False


def _detect_half_norm(node, ctx):
    """rsqrt/sqrt of mean(x²) computed in half precision: x² overflows past |x| ~ 256 (fp16 max 65504)."""
    if not _is(node, aten.rsqrt, aten.sqrt):
        return None
    src = node.args[0]
    if _is(src, aten.add):  # + eps
        src = next((a for a in src.args if isinstance(a, fx.Node)), None)
    if not _is(src, aten.mean, aten.sum, aten.var):
        return None
    if _is(src, aten.var):
        x = src.args[0]
    else:
        x = _squared(src.args[0])
    if x is None or _dtype(x) not in HALF or _is_prescaled(x):
        return None
    return f"mean of x² in {str(_dtype(x)).replace('torch.', '')} over {tuple(_val(x).shape)}"


def _detect_layer_norm_half(node, ctx):
    if _is(node, aten.layer_norm, aten.native_layer_norm, aten.group_norm, aten.native_group_norm,
           aten.instance_norm) and _dtype(node.args[0]) in HALF:
        return f"{node.target} in {str(_dtype(node.args[0])).replace('torch.', '')}"
    return None


_MATMULS = (aten.mm, aten.bmm, aten.matmul, aten.addmm, aten.linear, aten.baddbmm)


def _contraction(node):
    """(left operand, K) of a matmul-family node: the length each dot product accumulates over."""
    a = node.args[1] if _is(node, aten.addmm, aten.baddbmm) else node.args[0]
    return a, (_val(a).shape[-1] if _rank(a) >= 1 else 0)


def _detect_long_k(node, ctx):
    if not _is(node, *_MATMULS):
        return None
    a, k = _contraction(node)
    if _dtype(a) not in HALF:
        return None
    return f"K={k} accumulated in {str(_dtype(a)).replace('torch.', '')}" if k >= LONG_K else None


# A plain reduction over at least this many values in half precision: the seed reports the accumulator
# overflowing on phones (a mean of 4096 values of 200 sums to 819200 > 65504); lavapipe kept it exact
# (toolchain.md §4), so the rule follows the seed and the norms' own threshold (zoo.rewrites.norms).
LONG_REDUCTION = 4096
_REDUCTIONS = (aten.mean, aten.sum)


def _reduced_count(node) -> int:
    shape = _val(node.args[0]).shape
    dims = _arg(node, 1, "dim", None)
    if not dims:
        return shape.numel()
    dims = [dims] if isinstance(dims, int) else dims
    n = 1
    for d in dims:
        n *= shape[d % len(shape)]
    return n


def _detect_long_half_reduction(node, ctx):
    """mean/sum over >= LONG_REDUCTION values computed in half precision. A mean of x² is the norm
    rules' business (half-rms-norm), not this one's."""
    if not _is(node, *_REDUCTIONS) or _dtype(node.args[0]) not in HALF or _squared(node.args[0]) is not None:
        return None
    n = _reduced_count(node)
    if n < LONG_REDUCTION:
        return None
    return f"{node.target.overloadpacket.__name__} over {n} values in {str(_dtype(node.args[0])).replace('torch.', '')}"


# fp16 spaces values 2**(e-10) apart: at |x| = 64 the angle itself is only known to 1/32 rad, past 256 to
# 1/8 rad (sin(1000) in fp16 is sin(1000 +- 0.25)). Rotary/sinusoidal angles (position x frequency) reach
# thousands.
TRIG_MAX_ARG = 64.0
_TRIG = (aten.sin, aten.cos)


def _detect_half_trig(node, ctx):
    """sin/cos computed in half precision of an argument that reached |x| > TRIG_MAX_ARG on the example
    inputs (the peak is measured on the exported graph, so a constant table counts as much as a runtime
    angle)."""
    if not _is(node, *_TRIG) or _dtype(node.args[0]) not in HALF:
        return None
    peak = ctx.peaks.get(node.args[0])
    if peak is None or peak <= TRIG_MAX_ARG:
        return None
    return f"{node.target.overloadpacket.__name__} of |x| up to {peak:.4g} in {str(_dtype(node.args[0])).replace('torch.', '')}"


def watched_peaks(ep, example_inputs: tuple, kwargs: dict | None) -> dict:
    """max |value| of every sin/cos argument on the example inputs, from one run of the exported graph
    (only when the graph has half-precision sin/cos: no cost otherwise). Empty if the run fails: a lint
    that cannot measure stays quiet rather than guess."""
    watched = {n.args[0] for n in ep.graph.nodes if _is(n, *_TRIG) and _dtype(n.args[0]) in HALF}
    if not watched:
        return {}
    user = iter(torch.utils._pytree.tree_leaves((tuple(example_inputs), dict(kwargs or {}))))
    tensors = {**ep.state_dict, **ep.constants}
    try:
        args = [next(user) if spec.kind.name == "USER_INPUT" else tensors[spec.target]
                for spec in ep.graph_signature.input_specs]
        peaks = {}

        class Recorder(fx.Interpreter):
            def run_node(self, node):
                out = super().run_node(node)
                if node in watched and isinstance(out, torch.Tensor):
                    peaks[node] = float(out.detach().float().abs().max())
                return out

        with torch.no_grad():
            Recorder(ep.graph_module).run(*args)
        return peaks
    except Exception:  # noqa: BLE001 — see docstring
        return {}


_COMPARISONS = (aten.lt, aten.le, aten.gt, aten.ge, aten.eq, aten.ne)
_LOGICAL = (aten.logical_and, aten.logical_or, aten.bitwise_and, aten.bitwise_or, aten.mul, aten.__and__, aten.__or__)


def _detect_int64_chain(node, ctx):
    """A bool combination of comparisons made on int64 tensors (the seed's buffer-clobbering chain)."""
    if not _is(node, *_LOGICAL) or _dtype(node) is not torch.bool:
        return None
    ints = [a for a in node.args
            if _is(a, *_COMPARISONS) and _dtype(a.args[0]) is torch.int64 and ctx.depends_on_input(a)]
    return f"{len(ints)} int64 comparison(s) combined with {node.target}" if ints else None


def _detect_complex(node, ctx):
    if _is(node, aten.view_as_complex, aten.view_as_real, aten.polar, aten.complex, aten._fft_r2c, aten._fft_c2r,
           aten._fft_c2c):
        return str(node.target)
    return None


_BINARY = (aten.add, aten.sub, aten.mul, aten.div)


def _const_batch_operands(node, ctx):
    """(runtime, constant) operands of an elementwise op whose constant has the same full shape, rank 2-3,
    and a leading axis > 1 — the layout the LiteRT GPU delegate computes wrong; else None."""
    if not _is(node, *_BINARY) or len(node.args) < 2 or not all(isinstance(a, fx.Node) for a in node.args[:2]):
        return None
    a, b = node.args[:2]
    va, vb = _val(a), _val(b)
    if va is None or vb is None or va.shape != vb.shape or not 2 <= va.dim() <= 3 or va.shape[0] <= 1:
        return None
    if not va.is_floating_point() or not vb.is_floating_point():
        return None
    runtime = [ctx.depends_on_input(a), ctx.depends_on_input(b)]
    return (a, b) if runtime == [True, False] else (b, a) if runtime == [False, True] else None


def _detect_const_batch(node, ctx):
    if _const_batch_operands(node, ctx) is None:
        return None
    return f"{node.target.overloadpacket.__name__} of a runtime {tuple(_val(node).shape)} and a constant of that shape"


def _detect_softmax_len1(node, ctx):
    if _is(node, aten._softmax, aten.softmax):
        shape = _val(node.args[0]).shape
        if shape and shape[node.args[1] % len(shape)] == 1:
            return f"softmax over a dim of size 1 {tuple(shape)}"
    return None


def _detect_causal_mismatch(node, ctx):
    if not _is(node, aten.scaled_dot_product_attention) or not _arg(node, 5, "is_causal", False):
        return None
    q, k = _val(node.args[0]).shape, _val(node.args[1]).shape
    return f"q_len {q[-2]} != k_len {k[-2]}" if q[-2] != k[-2] else None


def _coreai_support():
    """What the installed coreai-torch lowers, read at run time (never a hard-coded list): its resolver
    table, plus what it strips or decomposes itself (composites, assertions, its decomposition table)."""
    global _COREAI_SUPPORT
    if _COREAI_SUPPORT is None:
        import coreai_torch
        from coreai_torch._aten_to_core import _aten_to_core_resolver
        from coreai_torch._decomp import _COMPOSITE_OPS

        handled = {str(op) for op in _COMPOSITE_OPS} | {str(op) for op in coreai_torch.get_decomp_table()}
        handled |= {str(op) for op in torch.export.default_decompositions()}
        handled |= {str(op) for op in (aten._assert_async.msg, aten._assert_scalar.default,
                                       aten.sym_constrain_range_for_size.default, aten.sym_constrain_range.default,
                                       aten._assert_tensor_metadata.default)}
        _COREAI_SUPPORT = (frozenset(_aten_to_core_resolver), frozenset(handled))
    return _COREAI_SUPPORT


_COREAI_SUPPORT = None


def _detect_coreai_unsupported(node, ctx):
    name = str(node.target)
    if ctx.target != COREAI or node in ctx.claimed or not name.startswith("aten."):
        return None
    lowered, handled = _coreai_support()
    if name in handled or name[len("aten."):] in lowered:
        return None
    return f"{name} has no lowering in the installed coreai-torch"


def _remainder_detail(node):
    return f"{node.target}"


RULES: list[Rule] = [
    Rule("grid-sample", "fatal", (LITERT_GPU, COREAI),
         "F.grid_sample: Core AI has no grid_sampler_2d; LiteRT lowers it to GATHER_ND + rank-5 BROADCAST_TO, "
         "which the GPU delegate rejects", "grid_sample_tent",
         _detect_grid_sample, keep=(aten.grid_sampler_2d,)),
    Rule("bicubic-upsample", "fatal", (LITERT_GPU,),
         "F.interpolate(mode='bicubic') decomposes into GATHER_ND + BROADCAST_TO, rejected by the GPU delegate",
         "bicubic_matmul", _op(aten.upsample_bicubic2d), keep=(aten.upsample_bicubic2d, aten._upsample_bicubic2d_aa)),
    Rule("repeat-kv-expand", "fatal", (LITERT_GPU,),
         "repeat_kv idiom (unsqueeze -> expand -> reshape) lowers to a rank-5 BROADCAST_TO the GPU delegate rejects",
         "gqa_repeat_kv_slice_concat", _detect_repeat_kv),
    Rule("rank-above-4", "fatal", (LITERT_GPU,),
         "a view/permute above rank 4: the LiteRT GPU delegate supports tensors of rank <= 4",
         "einops_rank4", _detect_high_rank),
    Rule("clamp-0-1", "fatal", (LITERT_GPU,),
         "hardtanh(0, 1) / clamp(0, 1) lowers to RELU_0_TO_1, rejected by the GPU delegate since LiteRT 2.1.5",
         "relu_0_to_1", _detect_clamp01, keep=(aten.hardtanh,)),
    Rule("half-rms-norm", "silent", (LITERT_GPU, COREAI),
         "a norm's mean(x²) computed in half precision overflows (inf) once |x| > ~256: zeros or NaN out",
         "safe_rmsnorm", _detect_half_norm),
    Rule("half-layer-norm", "silent", (LITERT_GPU, COREAI),
         "layer/group/instance norm in half precision: its variance overflows once |x| > ~256",
         "safe_layernorm", _detect_layer_norm_half,
         keep=(aten.layer_norm, aten.native_layer_norm, aten.group_norm, aten.native_group_norm)),
    Rule("long-k-half-matmul", "silent", (LITERT_GPU, COREAI),
         f"a matmul whose contraction is >= {LONG_K} long accumulates in half precision: on the software-Vulkan "
         "GPU 3.4e-3 relative error at K=4096, 5.3e-3 at 16384 (split: 1.9e-3, 1.3e-3; scripts/split_k_fp16_gpu.py)",
         "split K: zoo.rewrites.fp16.split_k_linear / split_k_matmul (automatic for linear, matmul, mm, bmm, "
         "addmm), or keep the projection in fp32 (fp32_linear_accumulation)", _detect_long_k),
    Rule("long-half-reduction", "silent", (LITERT_GPU, COREAI),
         f"a sum/mean over >= {LONG_REDUCTION} values in half precision: its accumulator passes fp16's 65504 "
         "(seed: phones; 4096 values of 200 sum to 819200)",
         "hierarchical_reduce (zoo.rewrites.norms): reduce in stages of 32 values", _detect_long_half_reduction),
    Rule("half-trig-large-arg", "silent", (LITERT_GPU, COREAI),
         f"sin/cos in half precision of an angle past |x| = {TRIG_MAX_ARG:g}: fp16 keeps the angle only to "
         "~1/32 rad there (1/8 rad past 256), so rotary/sinusoidal embeddings drift",
         "compute the angle and its sin/cos in fp32 (keep the table an fp32 buffer, or precompute cos/sin "
         "tables), then cast", _detect_half_trig),
    Rule("int64-compare-chain", "silent", (COREAI,),
         "bool chains of int64 comparisons clobber unrelated live buffers on the Core AI GPU",
         "build the mask in float arithmetic, e.g. 1 - (x - x.clamp(lo, hi)).abs().clamp(max=1) on x.float()",
         _detect_int64_chain),
    Rule("floor-on-gpu", "silent", (COREAI,),
         "floor/trunc/ceil lower to identity on the macOS GPU delegate",
         "torch.div(x * 2.0, 2.0, rounding_mode='floor') (the GPU-safe form)",
         _op(aten.floor, aten.trunc, aten.ceil), keep=(aten.floor_divide, aten.div.Tensor_mode, aten.div.Scalar_mode)),
    Rule("remainder-scalar", "fatal", (COREAI,),
         "aten.remainder.Scalar is not supported by coreai-torch (remainder.Tensor is)",
         "use x - torch.div(x, m, rounding_mode='floor') * m, or a tensor divisor",
         _op(aten.remainder.Scalar, aten.fmod, detail=_remainder_detail), keep=(aten.remainder.Scalar,)),
    Rule("complex-ops", "fatal", ALL_TARGETS,
         "complex tensors: litert-torch has no lowering for complex<f32> (FFT, view_as_complex, polar); "
         "coreai-torch 0.4.3 aborts the whole process on them (MLIR assertion 'only integers and floats have a "
         "bitwidth', tests/doctor_modules.py rope)",
         "stft_conv for torch.stft; complex RoPE by a constant table: complex_rotate_interleaved (automatic); "
         "otherwise rotate real pairs (x*cos + rotate_half(x)*sin)",
         _detect_complex),
    Rule("const-batch-elementwise", "silent", (LITERT_GPU,),
         "add/sub/mul/div of a runtime tensor and a same-shape constant [N, C] / [N, M, C] with N > 1: the "
         "GPU delegate accepts it and computes it wrong even in fp32", "elementwise_rank4 (zoo.rewrites.arith)",
         _detect_const_batch),
    Rule("softmax-len1", "fatal", (LITERT_GPU,),
         "softmax over a dim of size 1 lowers to a DIV with identical inputs, rejected by the GPU delegate",
         "softmax_len1", _detect_softmax_len1),
    Rule("causal-mask-qlen", "silent", ALL_TARGETS,
         "SDPA is_causal=True is upper-left aligned when q_len != k_len: wrong for decode with a cache",
         "pass an explicit lower-right mask: attn_mask=zoo.rewrites.attention.causal_mask_at(positions, k_len) "
         "(not automatic: it changes what the module computes, so no gate against the original could prove it)",
         _detect_causal_mismatch, keep=(aten.scaled_dot_product_attention,)),
    # Last: ops another rule explains (grid_sampler_2d, remainder.Scalar) are claimed by then.
    Rule("coreai-unsupported-op", "fatal", (COREAI,),
         "an ATen op the installed coreai-torch cannot lower (read from its resolver table at run time)",
         "express it with supported ops, or register a custom lowering (coreai_torch register_torch_lowering)",
         _detect_coreai_unsupported),
]
RULES_BY_ID = {rule.id: rule for rule in RULES}
assert len(RULES_BY_ID) == len(RULES), "duplicate rule id"


def check_rule_ids(ids: Iterable[str]) -> list[str]:
    ids = list(ids)
    unknown = [i for i in ids if i not in RULES_BY_ID]
    if unknown:
        raise ZooError(f"Unknown rule id(s) in --ignore: {', '.join(unknown)}.",
                       f"use ids from `python -m zoo.doctor --rules-markdown`: {', '.join(RULES_BY_ID)}.")
    return ids


def check_targets(targets: Sequence[str]) -> tuple[str, ...]:
    bad = [t for t in targets if t not in ALL_TARGETS]
    if bad:
        raise ZooError(f"Unknown target(s): {', '.join(bad)}.", f"use {', '.join(ALL_TARGETS)}.")
    return tuple(targets)


# ---------------------------------------------------------------- export, as each target sees it


def decomposition_table(target: str, keep: Iterable) -> dict:
    """The target's own decomposition table, minus the ops the rules need to see whole."""
    if target == COREAI:
        import coreai_torch

        table = dict(coreai_torch.get_decomp_table())
    else:
        from litert_torch.fx_infra import decomp

        table = dict(decomp.pre_convert_decomp())
    for op in keep:
        overloads = [getattr(op, name) for name in op.overloads()] if hasattr(op, "overloads") else [op]
        for overload in overloads:
            table.pop(overload, None)
    return table


def _kept_ops(rules: Sequence[Rule]) -> list:
    return [op for rule in rules for op in rule.keep]


def export_program(module: nn.Module, example_inputs: tuple, dynamic_shapes=None, kwargs: dict | None = None):
    """torch.export, non-strict, the way both targets call it. Raises ExportFailure with the user's line."""
    try:
        with torch.no_grad():
            return torch.export.export(_eval(module), tuple(example_inputs), kwargs=kwargs,
                                       dynamic_shapes=dynamic_shapes, strict=False)
    except Exception as exc:  # noqa: BLE001 — any export failure is a finding about the user's module
        raise ExportFailure(exc) from exc


def _eval(module: nn.Module) -> nn.Module:
    """eval mode; a module unlifted from an ExportedProgram (a fixed graph) refuses .eval() and is
    already frozen in the mode it was exported in."""
    try:
        return module.eval()
    except NotImplementedError:
        return module


class ExportFailure(Exception):
    def __init__(self, exc: BaseException):
        self.exc = exc
        super().__init__(str(exc))

    def finding(self) -> Finding:
        message = _first_line(self.exc)
        return Finding("export-failed", "fatal", ALL_TARGETS,
                       f"torch.export failed: {type(self.exc).__name__}: {message}",
                       "make forward traceable: static control flow, no .item()/.numpy() on traced tensors, "
                       "torch._check for data-dependent sizes", _user_frame(self.exc))


def _first_line(exc: BaseException) -> str:
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    return lines[0][:300] if lines else ""


def _user_frame(exc: BaseException) -> str:
    """The innermost traceback frame outside torch and the doctor: the user's line that failed."""
    frames = traceback.extract_tb(exc.__traceback__)
    for text in (str(exc),):  # torch often puts the user frame into the message (guards on data)
        m = re.search(r'File "([^"]+)", line (\d+)', text)
        if m and "/torch/" not in m.group(1):
            return f"{m.group(1)}:{m.group(2)}"
    for frame in reversed(frames):
        if not _is_library_file(frame.filename):
            return f"{frame.filename}:{frame.lineno}: {(frame.line or '').strip()}"
    return ""


def _is_library_file(filename: str) -> bool:
    # "<eval_with_key>": the generated code of a GraphModule (a graph fixed by `fix`), never the user's
    return any(part in filename for part in ("/torch/", "/site-packages/", "zoo/doctor.py", "zoo/precision.py",
                                             "<frozen", "<eval_with_key"))


def source_line(node: fx.Node) -> str:
    """The user's line from the node's stack trace: the innermost frame that is not torch itself."""
    trace = node.meta.get("stack_trace") or ""
    frames = re.findall(r'File "([^"]+)", line (\d+), in \S+\n\s*(.*)', trace)
    for filename, line, code in reversed(frames):
        if not _is_library_file(filename):
            return f"{filename}:{line}: {code.strip()}"
    return ""


# ---------------------------------------------------------------- diagnose


def input_derived(graph: fx.Graph, user_inputs: Iterable[str]) -> frozenset:
    """One pass in topological order (fx graphs are stored that way): no recursion on deep graphs."""
    names, derived = set(user_inputs), set()
    for node in graph.nodes:
        if (node.op == "placeholder" and node.name in names) or any(a in derived for a in node.all_input_nodes):
            derived.add(node)
    return frozenset(derived)


def lint_graph(graph: fx.Graph, target: str, rules: Sequence[Rule], user_inputs: Iterable[str] = (),
               peaks: dict | None = None) -> list[Finding]:
    ctx = Context(target, set(), input_derived(graph, user_inputs), peaks or {})
    findings = []
    for rule in rules:  # pattern rules first (list order): they claim the nodes they explain
        if target not in rule.targets:
            continue
        for node in graph.nodes:
            if node.op != "call_function":
                continue
            detail = rule.detect(node, ctx)
            if detail:
                ctx.claimed.add(node)  # explained: later catch-all rules skip it
                findings.append(Finding(rule.id, rule.severity, (target,), rule.cause, rule.fix,
                                        source_line(node), node.name, detail))
    return findings


def exported_graph(module, example_inputs, target: str, rules: Sequence[Rule], dynamic_shapes=None, kwargs=None):
    ep = export_program(module, example_inputs, dynamic_shapes, kwargs)
    return ep.run_decompositions(decomposition_table(target, _kept_ops(rules)))


def diagnose(module: nn.Module, example_inputs: Sequence, targets: Sequence[str] = DEFAULT_TARGETS, *,
             precision: str = "fp32", ignore: Iterable[str] = (), dynamic_shapes=None,
             kwargs: dict | None = None) -> list[Finding]:
    """Lint `module` as each target's converter sees it; one Finding per trap and source line, merged
    across targets. `precision` fp16/bf16 lints the module cast to that compute dtype (fp32 I/O)."""
    targets = check_targets(targets)
    ignored = set(check_rule_ids(ignore))
    rules = [r for r in RULES if r.id not in ignored]
    module, example_inputs = cast_for_precision(module, tuple(example_inputs), precision)
    findings: list[Finding] = []
    graphs: dict[str, object] = {}  # litert and litert-gpu share litert-torch's table: export once
    for target in targets:
        table_key = COREAI if target == COREAI else LITERT
        try:
            if table_key not in graphs:
                graphs[table_key] = exported_graph(module, example_inputs, target, rules, dynamic_shapes, kwargs)
        except ExportFailure as failure:
            return [failure.finding()]
        ep = graphs[table_key]
        if (table_key, "peaks") not in graphs:
            graphs[(table_key, "peaks")] = watched_peaks(ep, example_inputs, kwargs)
        findings += lint_graph(ep.graph, target, rules, ep.graph_signature.user_inputs, graphs[(table_key, "peaks")])
    return merge_targets(findings)


def cast_for_precision(module: nn.Module, example_inputs: tuple, precision: str):
    """The module as the pipeline exports it at `precision` (zoo.precision.cast_for_export: half compute,
    fp32 I/O)."""
    from zoo.precision import PRECISIONS, cast_for_export

    if precision not in PRECISIONS:
        raise ZooError(f"Unknown precision '{precision}'.", f"use one of {', '.join(PRECISIONS)}.")
    dtype = PRECISIONS[precision].dtype
    if dtype == torch.float32:
        return module, example_inputs
    return cast_for_export(copy.deepcopy(module), dtype), example_inputs


def merge_targets(findings: list[Finding]) -> list[Finding]:
    """One finding per rule and source line: the same trap seen by two targets, or a line that emits several
    offending nodes (a reshape then a permute to rank 5), is reported once, naming every target."""
    merged: dict[tuple, Finding] = {}
    for f in findings:
        key = (f.rule, f.source or f.node)
        if key in merged:
            old = merged[key]
            merged[key] = dataclasses.replace(old, targets=tuple(dict.fromkeys(old.targets + f.targets)))
        else:
            merged[key] = f
    return list(merged.values())


# ---------------------------------------------------------------- graph-level fixes
#
# A fix reaches a third-party forward without editing it. Each op-level fix is a decomposition of one
# ATen overload (same signature) into the library's implementation (zoo.rewrites), so the models and the
# doctor share one version; pattern fixes are torch.fx rewrites. Both are applied as node replacements in
# the exported graph rather than through `ExportedProgram.run_decompositions`: the library builds its
# constant matrices in numpy (`const_like`), and run_decompositions cannot lift tensors created inside a
# decomposition ("Constant tensor lifted_tensor_0 is not in the constants dictionary"). Re-exporting the
# fixed GraphModule traces the library call and lifts those constants properly.


def _decomp_grid_sampler_2d(x, grid, interpolation_mode, padding_mode, align_corners):
    from zoo.rewrites.resampling import grid_sample_bilinear

    return grid_sample_bilinear(x, grid, align_corners, ("zeros", "border")[padding_mode])


def _bicubic_size(x, output_size, scale_factors):
    if output_size is not None:
        return tuple(int(s) for s in output_size), None
    h, w = x.shape[-2:]
    return (int(h * scale_factors[0]), int(w * scale_factors[1])), tuple(float(f) for f in scale_factors)


def _decomp_bicubic_vec(x, output_size, align_corners, scale_factors):
    from zoo.rewrites.resampling import resize_bicubic

    size, scales = _bicubic_size(x, output_size, scale_factors)
    return resize_bicubic(x, size, align_corners, scales)


def _decomp_bicubic(x, output_size, align_corners, scales_h=None, scales_w=None):
    from zoo.rewrites.resampling import resize_bicubic

    scales = None if scales_h is None or scales_w is None else (1.0 / scales_h, 1.0 / scales_w)
    return resize_bicubic(x, tuple(int(s) for s in output_size), align_corners, scales)


def _decomp_hardtanh(x, min_val=-1.0, max_val=1.0):
    from zoo.rewrites.activations import clamp01

    return clamp01(x)  # applied only where the clamp-0-1 detector matched: bounds are (0, 1)


def _decomp_clamp(x, min=None, max=None):  # noqa: A002 — ATen's argument names
    from zoo.rewrites.activations import clamp01

    return clamp01(x)


def _decomp_floor(x):
    from zoo.rewrites.arith import floor_gpu_safe

    return floor_gpu_safe(x)


def _decomp_remainder_scalar(x, other):
    return x - torch.div(x, other, rounding_mode="floor") * other


def _decomp_softmax(x, dim, *_):
    from zoo.rewrites.arith import softmax_safe

    return softmax_safe(x, dim)


def _decomp_layer_norm(x, normalized_shape, weight=None, bias=None, eps=1e-5, *_):
    from zoo.rewrites.norms import adaptive_normalize

    y = adaptive_normalize(x, tuple(range(-len(normalized_shape), 0)), eps, center=True)
    y = y if weight is None else y * weight
    return y if bias is None else y + bias


def _decomp_linear(x, weight, bias=None):
    from zoo.rewrites.fp16 import split_k_linear

    return split_k_linear(x, weight, bias)


def _decomp_mean(x, dim=None, keepdim=False, *, dtype=None):
    from zoo.rewrites.norms import hierarchical_reduce

    out = hierarchical_reduce(x, dim, keepdim, "mean")
    return out if dtype is None else out.to(dtype)


def _decomp_sum(x, dim=None, keepdim=False, *, dtype=None):
    from zoo.rewrites.norms import hierarchical_reduce

    out = hierarchical_reduce(x, dim, keepdim, "sum")
    return out if dtype is None else out.to(dtype)


def _decomp_matmul(a, b):
    from zoo.rewrites.fp16 import split_k_matmul

    return split_k_matmul(a, b)


def _decomp_addmm(bias, a, b, *, beta=1, alpha=1):
    from zoo.rewrites.fp16 import split_k_matmul

    out = split_k_matmul(a, b)
    out = out if alpha == 1 else out * alpha
    return out + (bias if beta == 1 else bias * beta)


# rule id -> {ATen overload: decomposition}
FIX_DECOMPOSITIONS = {
    "grid-sample": {aten.grid_sampler_2d.default: _decomp_grid_sampler_2d,
                    aten.grid_sampler.default: _decomp_grid_sampler_2d},
    "bicubic-upsample": {aten.upsample_bicubic2d.vec: _decomp_bicubic_vec,
                         aten.upsample_bicubic2d.default: _decomp_bicubic},
    "clamp-0-1": {aten.hardtanh.default: _decomp_hardtanh, aten.clamp.default: _decomp_clamp},
    "floor-on-gpu": {aten.floor.default: _decomp_floor},
    "remainder-scalar": {aten.remainder.Scalar: _decomp_remainder_scalar},
    "softmax-len1": {aten._softmax.default: _decomp_softmax, aten.softmax.int: _decomp_softmax},
    "half-layer-norm": {aten.layer_norm.default: _decomp_layer_norm},
    "long-half-reduction": {aten.mean.dim: _decomp_mean, aten.mean.default: _decomp_mean,
                            aten.sum.dim_IntList: _decomp_sum, aten.sum.default: _decomp_sum},
    "long-k-half-matmul": {aten.linear.default: _decomp_linear, aten.matmul.default: _decomp_matmul,
                           aten.mm.default: _decomp_matmul, aten.bmm.default: _decomp_matmul,
                           aten.addmm.default: _decomp_addmm},
}
# Where a decomposition exists only for some arguments: grid_sample's clean form is bilinear with
# zeros/border padding; other modes stay (and stay reported).
FIX_GUARDS = {aten.grid_sampler_2d.default: lambda node: node.args[2] == 0 and node.args[3] in (0, 1),
              aten.grid_sampler.default: lambda node: node.args[2] == 0 and node.args[3] in (0, 1)}


# The half-precision rules fire on half dtypes, but the fix is made on the fp32 graph (the module the
# user keeps): match those by shape alone.
FIX_MATCH = {
    "long-k-half-matmul": lambda node, ctx: _is(node, *_MATMULS) and _contraction(node)[1] >= LONG_K,
    "half-layer-norm": lambda node, ctx: _is(node, aten.layer_norm),
    "long-half-reduction": lambda node, ctx: (_is(node, *_REDUCTIONS) and _dtype(node.args[0]) == torch.float32
                                              and _squared(node.args[0]) is None
                                              and _reduced_count(node) >= LONG_REDUCTION),
}


def _fx_decompose(gm: fx.GraphModule, rule: Rule, table: dict) -> int:
    """Replace each node the rule's detector flags by a call of its decomposition (same arguments)."""
    ctx, count = Context("", set()), 0
    match = FIX_MATCH.get(rule.id, rule.detect)
    for node in list(gm.graph.nodes):
        fn = table.get(node.target) if node.op == "call_function" else None
        if fn is None or not match(node, ctx) or not FIX_GUARDS.get(node.target, lambda n: True)(node):
            continue
        with gm.graph.inserting_before(node):
            new = gm.graph.call_function(fn, node.args, node.kwargs)
        new.meta = dict(node.meta)
        node.replace_all_uses_with(new)
        count += 1
    return count


def repeat_interleave_slices(x: torch.Tensor, dim: int, times: int) -> torch.Tensor:
    """x.repeat_interleave(times, dim) as SLICE + CONCATENATION (zoo.rewrites.attention's
    repeat_kv_slice_concat for any axis): no BROADCAST_TO, no rank-5 tensor."""
    from zoo.rewrites.attention import repeat_kv_slice_concat

    if dim == 1:
        return repeat_kv_slice_concat(x, times)
    return torch.cat([x.narrow(dim, i, 1) for i in range(x.shape[dim]) for _ in range(times)], dim=dim)


def _fx_repeat_kv(gm: fx.GraphModule) -> int:
    """unsqueeze -> expand -> reshape  =>  repeat_interleave_slices(x, dim - 1, r)."""
    ctx, count = Context("", set()), 0
    for node in list(gm.graph.nodes):
        if node.op != "call_function" or not _detect_repeat_kv(node, ctx):
            continue
        src = _skip_pass_through(node.args[0])
        dim = src.args[1] % _rank(src)
        times = _val(node).shape[dim]
        view = next(u for u in _users_through_pass_through(node)
                    if _is(u, aten.view, aten.reshape, aten._unsafe_view) and _rank(u) == _rank(node) - 1)
        with gm.graph.inserting_before(view):
            new = gm.graph.call_function(repeat_interleave_slices, (src.args[0], dim - 1, times))
        new.meta = dict(view.meta)
        view.replace_all_uses_with(new)
        count += 1
    return count


def _fx_rms_norm(gm: fx.GraphModule) -> int:
    """x * rsqrt(mean(x², dims) + eps)  =>  zoo.rewrites.norms.adaptive_normalize(x, dims, eps)."""
    from zoo.rewrites.norms import adaptive_normalize

    count = 0
    for node in list(gm.graph.nodes):
        match = _match_rms(node)
        if match is None:
            continue
        x, dims, eps = match
        with gm.graph.inserting_before(node):
            new = gm.graph.call_function(adaptive_normalize, (x, dims, eps), {"center": False})
        new.meta = dict(node.meta)
        node.replace_all_uses_with(new)
        count += 1
    return count


def _match_rms(node):
    """(x, dims, eps) if node is x * rsqrt(mean(x*x | x**2, dims, keepdim=True) + eps), else None."""
    if not _is(node, aten.mul) or len(node.args) != 2:
        return None
    for x, r in (node.args, node.args[::-1]):
        if not _is(r, aten.rsqrt) or not _is(r.args[0], aten.add):
            continue
        mean, eps = r.args[0].args
        if not _is(mean, aten.mean) or not isinstance(eps, (int, float)) or _squared(mean.args[0]) is not x:
            continue
        if not _arg(mean, 2, "keepdim", False):
            continue
        return x, tuple(mean.args[1]), float(eps)
    return None


def float_compare(op: str, a, b) -> torch.Tensor:
    """A 0/1 float mask for `a op b` on integer values, by arithmetic only (the seed's fix for int64
    comparison chains): exact while |a - b| < 2**24. The clamps are zoo.rewrites' clamp01, not
    clamp(0, 1): that one lowers to RELU_0_TO_1, which the LiteRT GPU delegate rejects."""
    from zoo.rewrites.activations import clamp01

    d = (a.float() if isinstance(a, torch.Tensor) else float(a)) - (b.float() if isinstance(b, torch.Tensor) else float(b))
    if op == "gt":
        return clamp01(d)
    if op == "ge":
        return clamp01(d + 1.0)
    if op == "lt":
        return clamp01(-d)
    if op == "le":
        return clamp01(1.0 - d)
    ne = clamp01(torch.abs(d))
    return ne if op == "ne" else 1.0 - ne


def float_mask_chain(combine: str, masks: Sequence[torch.Tensor]) -> torch.Tensor:
    """and: product, or: max of 0/1 float masks; back to bool by one float comparison at the end."""
    out = masks[0]
    for m in masks[1:]:
        out = out * m if combine == "and" else torch.maximum(out, m)
    return out > 0.5


_COMBINE = {"logical_and": "and", "bitwise_and": "and", "__and__": "and", "mul": "and",
            "logical_or": "or", "bitwise_or": "or", "__or__": "or"}


def _fx_int64_chain(gm: fx.GraphModule) -> int:
    """(i > a) & (i < b) on int64  =>  float_mask_chain("and", [float_compare("gt", i, a), ...])."""
    derived = input_derived(gm.graph, [n.name for n in gm.graph.nodes if n.op == "placeholder"])
    ctx, count = Context("", set(), derived), 0
    for node in list(gm.graph.nodes):
        if node.op != "call_function" or not _detect_int64_chain(node, ctx):
            continue
        if not all(_is(a, *_COMPARISONS) for a in node.args):
            continue  # a comparison combined with some other bool: leave it reported
        with gm.graph.inserting_before(node):
            masks = [gm.graph.call_function(float_compare, (a.target.overloadpacket.__name__, *a.args[:2]))
                     for a in node.args]
            new = gm.graph.call_function(float_mask_chain, (_COMBINE[node.target.overloadpacket.__name__], masks))
        new.meta = dict(node.meta)
        node.replace_all_uses_with(new)
        count += 1
    return count


_VIEWS = (aten.view, aten.reshape, aten._unsafe_view)


def _fx_rank_above_4(gm: fx.GraphModule) -> int:
    """view(x, shape) -> permute(perm) -> view(out) through rank > 4, with x and out at rank <= 4
    =>  zoo.rewrites.reshapes.permute_rank4(x, shape, perm, out): the same element order, rank <= 4."""
    from zoo.rewrites.reshapes import permute_rank4

    count = 0
    for node in list(gm.graph.nodes):
        if not _is(node, *_VIEWS) or _rank(node) > 4:
            continue
        permute = _skip_pass_through(node.args[0])
        if not _is(permute, aten.permute) or _rank(permute) <= 4:
            continue
        first = _skip_pass_through(permute.args[0])
        if not _is(first, *_VIEWS) or _rank(first.args[0]) > 4:
            continue
        shape, perm = tuple(_val(first).shape), tuple(permute.args[1])
        with gm.graph.inserting_before(node):
            new = gm.graph.call_function(permute_rank4, (first.args[0], shape, perm, tuple(_val(node).shape)))
        new.meta = dict(node.meta)
        node.replace_all_uses_with(new)
        count += 1
    return count


def _constant_value(gm: fx.GraphModule, node, memo: dict):
    """The value of a node computed from weights and constants only (get_attr and pure calls), in fp32."""
    if not isinstance(node, fx.Node):
        return node
    if node not in memo:
        if node.op == "get_attr":
            value = gm
            for part in node.target.split("."):
                value = getattr(value, part)
        else:
            args = torch.utils._pytree.tree_map(lambda a: _constant_value(gm, a, memo), (node.args, node.kwargs))
            value = node.target(*args[0], **args[1])
        memo[node] = value
    return memo[node]


def _fx_fold_constant_trig(gm: fx.GraphModule) -> int:
    """sin/cos of an angle computed from weights/constants only (a rotary or sinusoidal table)  =>  the
    table itself, computed once in fp32 and stored as a buffer: cast to half later, its values lie in
    [-1, 1] where fp16 is fine, instead of the angle (up to thousands) being rounded first. Bit-exact in
    fp32 (the same computation, done ahead). Runtime angles (from the inputs) stay reported."""
    derived = input_derived(gm.graph, [n.name for n in gm.graph.nodes if n.op == "placeholder"])
    count, memo = 0, {}
    for node in list(gm.graph.nodes):
        if not _is(node, *_TRIG) or node in derived:
            continue
        with torch.no_grad():
            value = _constant_value(gm, node, memo).detach().clone()
        name = f"zoo_folded_{node.name}"
        gm.register_buffer(name, value)
        with gm.graph.inserting_before(node):
            new = gm.graph.get_attr(name)
        new.meta = {**node.meta, "val": node.meta.get("val")}
        node.replace_all_uses_with(new)
        count += 1
    return count


def _complex_rope_match(node):
    """(x, freqs node) if node is flatten(view_as_real(view_as_complex(reshape(x, [..., D/2, 2])) * freqs))
    back to x's own shape, freqs computed from constants only; else None."""
    if not _is(node, aten.flatten) or _rank(node) < 1:
        return None
    real = node.args[0]
    if not _is(real, aten.view_as_real) or not _is(real.args[0], aten.mul):
        return None
    for c, freqs in (real.args[0].args, real.args[0].args[::-1]):
        if _is(c, aten.view_as_complex) and isinstance(freqs, fx.Node):
            x = _skip_pass_through(c.args[0])
            x = x.args[0] if _is(x, *_VIEWS) else None
            if x is not None and _val(x) is not None and tuple(_val(x).shape) == tuple(_val(node).shape):
                return x, freqs
    return None


def _fx_complex_rope(gm: fx.GraphModule) -> int:
    """Complex RoPE  =>  zoo.rewrites.spectral.complex_rotate_interleaved with the constant freqs table
    split into real cos/sin tables (computed once, stored as buffers): no complex tensor left. Runtime
    complex factors (from the inputs) stay reported."""
    from zoo.rewrites.spectral import complex_rotate_interleaved, interleaved_tables, pair_rotation

    derived = input_derived(gm.graph, [n.name for n in gm.graph.nodes if n.op == "placeholder"])
    count, memo = 0, {}
    for node in list(gm.graph.nodes):
        match = _complex_rope_match(node)
        if match is None or match[1] in derived:
            continue
        x, freqs = match
        with torch.no_grad():
            cos_table, sin_table = interleaved_tables(_constant_value(gm, freqs, memo))
        names = [f"zoo_rope_{node.name}_{part}" for part in ("cos", "sin", "rotation")]
        for name, value in zip(names, (cos_table, sin_table, pair_rotation(_val(node).shape[-1]))):
            gm.register_buffer(name, value)
        with gm.graph.inserting_before(node):
            tables = [gm.graph.get_attr(name) for name in names]
            new = gm.graph.call_function(complex_rotate_interleaved, (x, *tables))
        new.meta = dict(node.meta)
        node.replace_all_uses_with(new)
        count += 1
    return count


def _fx_const_batch(gm: fx.GraphModule) -> int:
    """runtime op constant (same shape [N, C] / [N, M, C])  =>  elementwise_rank4: computed at
    [1, N*M, 1, C], the layout the GPU delegate gets right."""
    from zoo.rewrites.arith import elementwise_rank4

    derived = input_derived(gm.graph, [n.name for n in gm.graph.nodes if n.op == "placeholder"])
    ctx, count = Context("", set(), derived), 0
    for node in list(gm.graph.nodes):
        if node.op != "call_function" or len(node.args) > 2 or node.kwargs or _const_batch_operands(node, ctx) is None:
            continue  # add(a, b, alpha=...) keeps its own form
        with gm.graph.inserting_before(node):
            new = gm.graph.call_function(elementwise_rank4, (node.target.overloadpacket.__name__, *node.args))
        new.meta = dict(node.meta)
        node.replace_all_uses_with(new)
        count += 1
    return count


# rule id -> fx rewrite on the exported graph (returns how many places it changed)
FIX_PATTERNS = {"repeat-kv-expand": _fx_repeat_kv, "half-rms-norm": _fx_rms_norm,
                "int64-compare-chain": _fx_int64_chain, "rank-above-4": _fx_rank_above_4,
                "half-trig-large-arg": _fx_fold_constant_trig, "complex-ops": _fx_complex_rope,
                "const-batch-elementwise": _fx_const_batch}
FIXABLE = tuple(FIX_DECOMPOSITIONS) + tuple(FIX_PATTERNS)


def _drop_unused_tensors(gm: fx.GraphModule) -> None:
    """Remove the buffers/parameters a fix left unreferenced (e.g. a complex freqs table replaced by real
    tables): export lifts every registered tensor, and a converter refuses a complex one even unused."""
    used = {n.target for n in gm.graph.nodes if n.op == "get_attr"}
    for name, _ in [*gm.named_buffers(), *gm.named_parameters()]:
        if name in used:
            continue
        owner_path, _, attr = name.rpartition(".")
        owner = gm.get_submodule(owner_path) if owner_path else gm
        owner._buffers.pop(attr, None)
        owner._parameters.pop(attr, None)


@dataclasses.dataclass
class FixResult:
    module: nn.Module  # the fixed graph, a torch.fx.GraphModule callable like the original
    applied: dict[str, int]  # rule id -> places changed
    before: list[Finding]
    after: list[Finding]  # re-lint of the fixed module: what no automatic fix covers


def fix(module: nn.Module, example_inputs: Sequence, targets: Sequence[str] = DEFAULT_TARGETS, *,
        precision: str = "fp32", only: Iterable[str] | None = None) -> FixResult:
    """Apply every automatic fix for the findings on `targets`, then re-lint. The original is untouched."""
    example_inputs = tuple(example_inputs)
    before = diagnose(module, example_inputs, targets, precision=precision)
    wanted = {f.rule for f in before if f.rule in FIXABLE and (only is None or f.rule in set(only))}
    gm = export_program(module, example_inputs).module()
    # ExportedProgram.module() makes .train()/.eval() raise; the graph is frozen in eval mode already, and
    # the converters (and nn.Module.eval() of a wrapper) call .eval(): restore the plain methods.
    del gm.train, gm.eval
    applied = {}
    for rule in sorted(wanted & set(FIX_DECOMPOSITIONS)):
        applied[rule] = _fx_decompose(gm, RULES_BY_ID[rule], FIX_DECOMPOSITIONS[rule])
    for rule in sorted(wanted & set(FIX_PATTERNS)):
        applied[rule] = FIX_PATTERNS[rule](gm)
    gm.graph.eliminate_dead_code()
    _drop_unused_tensors(gm)
    gm.recompile()
    after = diagnose(gm, example_inputs, targets, precision=precision)
    return FixResult(gm, applied, before, after)


# ---------------------------------------------------------------- a fix proves itself


@dataclasses.dataclass
class Proof:
    """One target's evidence for a fixed module, compared with the *original* module on the same inputs."""

    target: str
    converted: bool
    error: str = ""  # the converter's or runtime's failure, if any
    max_abs_error: float | None = None  # artifact (CPU runtime) vs original torch outputs
    lint: list[str] = dataclasses.field(default_factory=list)  # structural GPU traps left in the .tflite
    gpu: dict | None = None  # litert-gpu: {"status", "fp32_rel_err", "fp16_rel_err"} from the GPU check
    before_gpu: str | None = None  # the original module's GPU verdict, for the before/after line

    def ok(self, tol: float) -> bool:
        ok = self.converted and self.max_abs_error is not None and self.max_abs_error <= tol and not self.lint
        if self.gpu is not None:
            ok = ok and self.gpu["status"] == "accepted" and (self.gpu["fp32_rel_err"] or 0.0) <= tol and self.fp16_ok()
        return ok

    def fp16_ok(self) -> bool:
        """The GPU's default fp16 compute within zoo.divergence.FP16_TOLERANCE of its CPU (when it ran)."""
        from zoo.divergence import FP16_TOLERANCE

        if self.gpu is None or self.gpu["status"] != "accepted":
            return True
        value = self.gpu["fp16_rel_err"]
        return value is not None and float(value) <= FP16_TOLERANCE  # NaN fails

    def format(self) -> str:
        if not self.converted:
            return f"prove  {self.target}: did not convert: {self.error}"
        line = f"prove  {self.target}: max |artifact - original| {self.max_abs_error:.3g}"
        if self.lint:
            line += f"; GPU traps left: {'; '.join(self.lint[:3])}"
        if self.gpu is not None:
            line += (f"; GPU {self.gpu['status']} (before: {self.before_gpu or 'n/a'}), "
                     f"fp32 rel {self.gpu['fp32_rel_err']}, fp16 rel {self.gpu['fp16_rel_err']}")
        return line


def _torch_outputs(module, inputs) -> list:
    with torch.no_grad():
        return [o.detach().float().numpy() for o in torch.utils._pytree.tree_leaves(module(*inputs))]


def _max_error(got, want) -> float:
    import numpy as np

    return max(float(np.abs(np.asarray(g, dtype=np.float64) - w).max()) for g, w in zip(got, want))


def prove(original: nn.Module, fixed: nn.Module, inputs: Sequence, targets: Sequence[str], workdir: Path,
          gpu: bool = True) -> list[Proof]:
    """Convert `fixed` for each target, run the artifact, compare with `original`; on litert-gpu also run
    the GPU check (fp32 and fp16 compute) on the fixed and the original file."""
    inputs, workdir = tuple(inputs), Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    reference = _torch_outputs(original, inputs)
    proofs = []
    if LITERT in targets or LITERT_GPU in targets:
        proofs += _prove_litert(original, fixed, inputs, reference, targets, workdir, gpu)
    if COREAI in targets:
        proofs.append(_prove_coreai(fixed, inputs, reference, workdir))
    return proofs


def _prove_litert(original, fixed, inputs, reference, targets, workdir, gpu) -> list[Proof]:
    from zoo.rewrites import inspect as tfl
    from zoo.rewrites.evidence import gpu_inputs, worst

    try:
        path = tfl.convert_to_tflite(fixed, inputs, workdir / "fixed.tflite")
        error = _max_error(tfl.run_tflite_cpu(path, inputs), reference)
    except Exception as exc:  # noqa: BLE001 — a converter failure is the proof's result, reported
        return [Proof(t, False, f"{type(exc).__name__}: {_first_line(exc)}") for t in targets if t != COREAI]
    proofs = [Proof(LITERT, True, max_abs_error=error)] if LITERT in targets else []
    if LITERT_GPU in targets:
        proof = Proof(LITERT_GPU, True, max_abs_error=error, lint=tfl.gpu_lint(path))
        if gpu:
            from zoo.targets.litert_gpu import gpu_check

            check = gpu_check(path, gpu_inputs(inputs))
            proof.gpu = {"status": check.status, "fp32_rel_err": worst(check, "fp32_rel_err"),
                         "fp16_rel_err": worst(check, "fp16_rel_err")}
            proof.before_gpu = _original_gpu_verdict(original, inputs, workdir)
        proofs.append(proof)
    return proofs


def _original_gpu_verdict(original, inputs, workdir) -> str:
    from zoo.rewrites import inspect as tfl
    from zoo.rewrites.evidence import gpu_inputs
    from zoo.targets.litert_gpu import gpu_check

    try:
        path = tfl.convert_to_tflite(original, inputs, workdir / "original.tflite")
    except Exception as exc:  # noqa: BLE001
        return f"did not convert ({type(exc).__name__})"
    check = gpu_check(path, gpu_inputs(inputs))
    ops = ", ".join(sorted({r.get("op", "?") for r in check.rejected_ops}))
    return f"{check.status}{f' ({ops})' if ops else ''}"


def _prove_coreai(fixed, inputs, reference, workdir) -> Proof:
    from zoo.targets import Entry
    from zoo.targets.coreai import CoreAIRunner, convert_programs

    names = {f"x{i}": t for i, t in enumerate(inputs)}
    entry = Entry("main", fixed, names, [f"y{i}" for i in range(len(reference))])
    try:
        ep = export_program(fixed, inputs).run_decompositions(decomposition_table(COREAI, ()))
        program = convert_programs([entry], [ep])
        import coreai.runtime as rt

        path = workdir / "fixed.aimodel"
        program.save_asset(path, rt.AIModelAssetMetadata())
        runner = CoreAIRunner(path, verify=False)
        out = runner.run("main", {k: v.numpy() for k, v in names.items()})
        error = _max_error([out[n] for n in entry.output_names], reference)
    except Exception as exc:  # noqa: BLE001 — a converter failure is the proof's result, reported
        return Proof(COREAI, False, f"{type(exc).__name__}: {_first_line(exc)}")
    return Proof(COREAI, True, max_abs_error=error)


# ---------------------------------------------------------------- zoo models, factories, files


def model_entries(name: str, target: str, precision: str = "fp32"):
    """The graphs the pipeline would export for a zoo model's components on `target` (tiny weights): the
    same prepare (precision cast) and entries hooks as zoo.pipeline."""
    from zoo import weights
    from zoo.precision import PRECISIONS
    from zoo.registry import get_spec, load_model_config
    from zoo.targets import Entry, get_target

    cfg = load_model_config(name)
    spec = get_spec(cfg)
    checkpoint = weights.resolve(cfg, "tiny", spec.tiny_dir, spec.random_checkpoint, spec.embedded)
    pipeline_target = get_target(COREAI if target == COREAI else LITERT)
    for component in spec.components:
        module = component.build(checkpoint, cfg)
        prepared = pipeline_target.prepare(module, PRECISIONS[precision], cfg.get(pipeline_target.name))
        inputs = component.example_inputs(checkpoint, cfg)
        if component.entries is not None:
            yield from component.entries(prepared, inputs, pipeline_target.name, cfg)
        else:
            yield Entry("main", prepared, dict(inputs), list(component.output_names))


def diagnose_model(name: str, targets: Sequence[str] = DEFAULT_TARGETS, *, precision: str = "fp32",
                   ignore: Iterable[str] = ()) -> list[Finding]:
    findings = []
    for target in check_targets(targets):
        findings += diagnose_entries(list(model_entries(name, target, precision)), target, ignore)
    return merge_targets(findings)


def diagnose_entries(entries, target: str, ignore: Iterable[str] = ()) -> list[Finding]:
    """Lint the pipeline's entries (zoo.targets.Entry) for one doctor target, exported the way that
    target's converter exports them."""
    from zoo.targets import NamedIO

    findings = []
    for entry in entries:
        if hasattr(entry.module, "reset"):  # stateful: trace with zeroed buffers, as the targets do
            entry.module.reset()
        if target == COREAI:
            findings += diagnose(entry.module, tuple(entry.inputs.values()), (target,), ignore=ignore,
                                 dynamic_shapes=entry.dynamic_shapes)
        else:  # litert-torch exports NamedIO(module) with keyword inputs (zoo.targets.litert)
            named = NamedIO(entry.module, list(entry.inputs), entry.output_names)
            findings += diagnose(named, (), (target,), ignore=ignore, kwargs=dict(entry.inputs))
    return merge_targets(findings)


def pipeline_note(findings: list[Finding]) -> str:
    """One line for the pipeline's report: each finding's rule, severity and source line."""
    items = [f"{f.rule} ({f.severity}, {Path(f.source.split(':')[0]).name}:{f.source.split(':')[1]})"
             if f.source.count(":") >= 1 and f.source.split(":")[1].isdigit() else f"{f.rule} ({f.severity})"
             for f in findings]
    return f"{len(findings)} finding(s): {'; '.join(items)} (zoo doctor names the fixes)"


def load_factory(spec: str):
    """`pkg.mod:factory` -> (module, example_inputs) from calling the factory."""
    mod_name, _, attr = spec.partition(":")
    if "" not in sys.path and str(Path.cwd()) not in sys.path:
        sys.path.insert(0, str(Path.cwd()))  # as `python -m` does: the `zoo` console script does not
    try:
        mod = importlib.import_module(mod_name)
    except ImportError as exc:
        raise ZooError(f"Cannot import '{mod_name}' for the factory '{spec}' ({exc}).",
                       "pass pkg.mod:factory with pkg.mod importable from here (check PYTHONPATH).") from None
    factory = getattr(mod, attr, None)
    if not callable(factory):
        raise ZooError(f"'{mod_name}' has no callable '{attr}'.",
                       "name a function that returns (module, example_inputs), e.g. mypkg.models:build.")
    made = factory()
    if not (isinstance(made, tuple) and len(made) == 2 and isinstance(made[0], nn.Module)):
        raise ZooError(f"The factory '{spec}' returned {type(made).__name__}, not (module, example_inputs).",
                       "return a tuple (nn.Module, tuple of example input tensors).")
    module, inputs = made
    return module, tuple(inputs) if isinstance(inputs, (tuple, list)) else (inputs,)


# ---------------------------------------------------------------- README table


README_BEGIN = "<!-- doctor-rules:begin (generated by scripts/doctor_rules_readme.py) -->"
README_END = "<!-- doctor-rules:end -->"


def rules_markdown() -> str:
    lines = ["| rule | severity | targets | cause | fix | `--fix` |", "|---|---|---|---|---|---|"]
    for rule in RULES:
        fix = f"rewrite `{rule.fix}`" if rule.fix_is_rewrite else rule.fix
        auto = "yes" if rule.id in FIXABLE else "no"
        cells = [f"`{rule.id}`", rule.severity, ", ".join(rule.targets), rule.cause, fix, auto]
        lines.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    return "\n".join(lines)


# ---------------------------------------------------------------- a saved .tflite


def _tflite_checks():
    """(id, severity, cause, fix, detector): the structural GPU traps readable from a converted file,
    one per family, so a finding names one fix instead of every rewrite whose detector matches."""
    from zoo.rewrites import inspect as tfl

    return [
        ("tflite-rank-above-4", "fatal", "a tensor above rank 4", "einops_rank4", tfl.find_rank_over),
        ("tflite-broadcast-bmm", "silent", "BATCH_MATMUL broadcast on a batch axis: wrong on the GPU",
         "bmm_pre_expand", tfl.find_broadcast_bmm),
        ("tflite-broadcast-add-after-bmm", "silent", "ADD of a BATCH_MATMUL result and a head-broadcast mask",
         "mask_pre_expand", tfl.find_broadcast_add_after_bmm),
        ("tflite-identical-inputs", "fatal", "DIV with identical inputs (softmax over a length-1 axis)",
         "softmax_len1", tfl.find_identical_inputs),
        ("tflite-fc-rank-drop", "silent", "rank-2 FULLY_CONNECTED output feeding a rank-3 constant op",
         "fc_rank3_constant", tfl.find_fc_rank_drop),
    ]


# What a rejected op in a converted file usually comes from, and the rewrite that removes it.
REJECTED_OP_FIXES = {
    "RELU_0_TO_1": "relu_0_to_1",
    "BROADCAST_TO": "gqa_repeat_kv_slice_concat (repeat_kv), bicubic_matmul or grid_sample_tent",
    "GATHER_ND": "grid_sample_tent, bicubic_matmul or edge_pad",
    "GATHER": "an embedding/index lookup: keep it on the CPU or express it as a one-hot matmul",
    "SELECT": "select_to_arith",
    "SELECT_V2": "select_to_arith",
    "STABLEHLO_COMPOSITE": "an op litert-torch could not lower to a builtin: lint the source module",
}


def _rejected_op_findings(path: Path) -> list[Finding]:
    from zoo.rewrites import inspect as tfl

    by_name: dict[str, list[str]] = {}
    for op in tfl.all_ops(path):
        if op.name in REJECTED_OP_FIXES:
            by_name.setdefault(op.name, []).append(f"{op.name}{list(op.inputs)}->{list(op.outputs)}")
    return [Finding("tflite-rejected-op", "fatal", (LITERT_GPU,), f"{name} is rejected by the LiteRT GPU delegate",
                    REJECTED_OP_FIXES[name], str(path), detail=f"{len(hits)}x, e.g. {hits[0]}")
            for name, hits in by_name.items()]


def diagnose_tflite(path: Path, ignore: Iterable[str] = ()) -> list[Finding]:
    """Structural GPU traps of a converted file; lint the source module to get the line."""
    from zoo.targets.litert import require_tflite_file

    path = Path(path)
    require_tflite_file(path)
    ignored = set(ignore)
    findings = [] if "tflite-rejected-op" in ignored else _rejected_op_findings(path)
    for rule_id, severity, cause, fix, detect in _tflite_checks():
        if rule_id in ignored:
            continue
        hits = detect(path)
        if hits:  # one finding per family; the first few ops as the detail
            more = f" (+{len(hits) - 3} more)" if len(hits) > 3 else ""
            findings.append(Finding(rule_id, severity, (LITERT_GPU,), cause, fix, str(path),
                                    detail="; ".join(hits[:3]) + more))
    return findings


def describe_aimodel(path: Path) -> str:
    """A saved Core AI asset: functions, inputs/outputs/states with shapes, storage types and its op
    histogram, as the runtime reads them (AIModelAsset.summary). The graph traps are the source module's:
    lint that (`zoo doctor pkg.mod:factory --target coreai`)."""
    from zoo.targets.coreai import CoreAITarget

    if not path.exists():
        raise FileNotFoundError(2, "No such file or directory", str(path))
    if not (path / "main.mlirb").is_file() and not any(path.glob("*.mlirb")):
        raise ZooError(f"{path} is not a Core AI asset (no .mlirb program inside).",
                       "pass the .aimodel folder written by `zoo convert ... target=coreai`.")
    return CoreAITarget().summary(path)


# ---------------------------------------------------------------- command line


def classify_subject(subject: str) -> str:
    """'model' (a zoo model name), 'factory' (pkg.mod:factory), 'tflite' or 'aimodel' (a saved artifact)."""
    from zoo.registry import model_names

    if subject in model_names():
        return "model"
    path = Path(subject)
    if path.suffix == ".aimodel":
        return "aimodel"
    if path.suffix == ".tflite" or path.exists():
        if path.suffix != ".tflite":
            raise ZooError(f"{subject} is not a model the doctor can read (a .tflite file, a zoo model name or "
                           "pkg.mod:factory).", "pass a .tflite, one of: " + ", ".join(model_names())
                           + ", or pkg.mod:factory returning (module, example_inputs).")
        return "tflite"
    if ":" in subject:
        return "factory"
    raise ZooError(f"'{subject}' is neither a zoo model, a file, nor pkg.mod:factory.",
                   f"pass one of {', '.join(model_names())}, a .tflite path, or pkg.mod:factory.")


def parse_args(argv):
    parser = argparse.ArgumentParser(prog="zoo doctor", description=__doc__.split("\n\n")[0])
    parser.add_argument("subject", nargs="?", help="a zoo model name, pkg.mod:factory, or PATH.tflite")
    parser.add_argument("--target", action="append", choices=ALL_TARGETS,
                        help=f"repeatable; default {' '.join(DEFAULT_TARGETS)}")
    parser.add_argument("--precision", default="fp32", help="compute precision to lint for: fp32, fp16, bf16")
    parser.add_argument("--ignore", action="append", default=[], help="a rule id to skip (repeatable)")
    parser.add_argument("--rules-markdown", action="store_true", help="print the rule table (README) and exit")
    parser.add_argument("--fix", action="store_true", help="apply the graph-level fixes and re-lint (factories)")
    parser.add_argument("--prove", action="store_true",
                        help="with --fix: convert the fixed graph for each target, run it (and the LiteRT GPU check) "
                             "and compare with the original module")
    parser.add_argument("--workdir", default=None, help="where --prove writes its artifacts (default: a temp dir)")
    args = parser.parse_args(argv)
    if not args.rules_markdown and not args.subject:
        parser.error("a subject is required (a zoo model, pkg.mod:factory or PATH.tflite)")
    return args


@returns_exit_code
def main(argv: list[str] | None = None) -> int:
    """Exit 0: no finding; 1: findings; 2: bad input (through zoo.cli's boundary)."""
    args = parse_args(sys.argv[1:] if argv is None else argv)
    if args.rules_markdown:
        print(rules_markdown())
        return 0
    targets = tuple(args.target or DEFAULT_TARGETS)
    kind = classify_subject(args.subject)
    tflite_ids = {"tflite-rejected-op"} | {check[0] for check in _tflite_checks()}
    check_rule_ids([i for i in args.ignore if i not in tflite_ids])
    if kind == "aimodel":
        print(describe_aimodel(Path(args.subject)))
        return 0
    if kind == "tflite":
        findings = diagnose_tflite(Path(args.subject), args.ignore)
    elif kind == "model":
        findings = diagnose_model(args.subject, targets, precision=args.precision, ignore=args.ignore)
    else:
        module, inputs = load_factory(args.subject)
        findings = diagnose(module, inputs, targets, precision=args.precision, ignore=args.ignore)
        if args.fix or args.prove:
            findings, proven = report_fix(module, inputs, targets, args.precision, args.prove, args.workdir,
                                         args.ignore)
            code = print_findings(args.subject, findings)
            return code if proven else 1
    return print_findings(args.subject, findings)


def max_abs_difference(a, b) -> float:
    flat_a, flat_b = torch.utils._pytree.tree_leaves(a), torch.utils._pytree.tree_leaves(b)
    return max((float((x.float() - y.float()).abs().max()) for x, y in zip(flat_a, flat_b) if x.numel()), default=0.0)


def print_findings(subject: str, findings: list[Finding]) -> int:
    for finding in findings:
        print(finding.format())
    counts = {s: sum(f.severity == s for f in findings) for s in SEVERITIES}
    summary = ", ".join(f"{n} {s}" for s, n in counts.items() if n) or "no findings"
    print(f"{subject}: {summary}")
    return 1 if findings else 0


PROVE_TOLERANCE = 1e-4  # artifact vs original, relative to max(1, max|output|): the "approximate" class


def report_fix(module, inputs, targets, precision, prove_it: bool = False, workdir=None, ignore=()):
    """--fix: apply the graph-level fixes, show what changed and how far outputs moved, and where fp16 first
    goes wrong if it does; --prove: convert and check each target. Returns (findings left, all proven)."""
    import tempfile

    result = fix(module, inputs, targets, precision=precision, only=[r for r in FIXABLE if r not in set(ignore)])
    with torch.no_grad():
        reference = module(*inputs)
        diff = max_abs_difference(reference, result.module(*inputs))
    for rule, count in sorted(result.applied.items()):
        print(f"fixed  {rule}: {count} place(s)")
    print(f"fixed graph vs original: max |diff| {diff:.3g}")
    fp16_ok = report_fp16(module, result.module, inputs, targets, precision)
    if not prove_it:
        return result.after, fp16_ok
    scale = max([1.0] + [float(t.abs().max()) for t in torch.utils._pytree.tree_leaves(reference) if t.numel()])
    with tempfile.TemporaryDirectory(prefix="zoo-doctor-") as tmp:
        proofs = prove(module, result.module, inputs, targets, Path(workdir or tmp))
        for proof in proofs:
            print(proof.format())
            if proof.gpu and not proof.fp16_ok():  # the device's own fp16 numbers: where do they start to go?
                _print_divergence(result.module, inputs, mode="gpu", workdir=Path(workdir or tmp) / "taps")
    return result.after, fp16_ok and all(p.ok(PROVE_TOLERANCE * scale) for p in proofs)


def report_fp16(original, fixed, inputs, targets, precision) -> bool:
    """Where half precision matters (a half `precision`, or the LiteRT GPU, which computes in fp16 by
    default): the fixed graph cast to fp16 (torch on the CPU) vs the original in fp32; when it is off, the
    first intermediate that diverges. Returns whether it is within zoo.divergence.FP16_TOLERANCE."""
    from zoo.divergence import FP16_TOLERANCE, relative_errors
    from zoo.precision import cast_for_export

    if precision == "fp32" and LITERT_GPU not in targets:
        return True
    dtype = torch.bfloat16 if precision == "bf16" else torch.float16
    with torch.no_grad():
        want = [t.float().numpy() for t in torch.utils._pytree.tree_leaves(original(*inputs))]
        got = [t.float().numpy() for t in torch.utils._pytree.tree_leaves(
            cast_for_export(copy.deepcopy(fixed), dtype)(*inputs))]
    error = max(relative_errors(got, want), default=0.0)
    ok = error <= FP16_TOLERANCE
    print(f"fp16 (torch, CPU) vs original: rel err {error:.3g} ({'within' if ok else 'above'} {FP16_TOLERANCE:g})")
    if not ok:
        _print_divergence(fixed, inputs, mode="emulate")
    return ok


def _print_divergence(module, inputs, mode: str, workdir: Path | None = None) -> None:
    from zoo.divergence import first_divergence

    try:
        found = first_divergence(module, inputs, mode=mode, workdir=workdir)
    except ExportFailure as failure:
        print(f"locate fp16: the graph does not export ({_first_line(failure.exc)})")
        return
    print(f"locate {'(GPU) ' if mode == 'gpu' else ''}" + (found.format() if found else
          "no intermediate exceeds the fp16 tolerance on its own: the error accumulates across ops"))


if __name__ == "__main__":
    run_script(main)
