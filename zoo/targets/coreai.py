"""Apple Core AI: torch.export → coreai-torch → (palettize) → .aimodel, run on the Linux CPU runtime.

Facts this file relies on (../shared/notes/toolchain.md §2): `to_coreai()` already optimizes (there is
no `optimize()` on 0.4.3); `save_asset` deletes its destination first, so it only ever writes into a
staging folder; on Linux an asset runs through `AIModelAsset.executable()`, and the model must stay
alive while its functions are used, or calls silently return garbage.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import dataclasses
import hashlib
import itertools
import os
import time
import warnings
from importlib.metadata import version
from pathlib import Path

import numpy as np
import torch

from zoo.errors import ZooError
from zoo.precision import Precision, cast_for_export
from zoo.targets.coreai_form import op_histogram, pretranspose_linears
from zoo.targets import TARGET_PRECISIONS, Entry

warnings.filterwarnings("ignore", message=".*validated with torch.*")

ARTIFACT = "model.aimodel"


def _coreai_torch():
    # Import order matters: coreai_torch must come before coreai's compiler dialects (circular import).
    import coreai_torch

    return coreai_torch


def export_entry(entry: Entry):
    coreai_torch = _coreai_torch()
    if hasattr(entry.module, "reset"):  # stateful modules: trace with deterministic (zeroed) buffers
        entry.module.reset()
    with torch.no_grad():
        ep = torch.export.export(entry.module.eval(), tuple(entry.inputs.values()),
                                 dynamic_shapes=entry.dynamic_shapes, strict=False)
    return ep.run_decompositions(coreai_torch.get_decomp_table())


def convert_programs(entries: list[Entry], exported: list):
    coreai_torch = _coreai_torch()
    converter = coreai_torch.TorchConverter()
    for entry, ep in zip(entries, exported):
        converter = converter.add_exported_program(
            exported_program=ep,
            input_names=list(entry.inputs),
            output_names=list(entry.output_names),
            state_names=list(entry.state_names),
            entrypoint_name=entry.name,
        )
    return converter.to_coreai()


# coreai-opt's fast k-means mode rounds each weight to 4 decimals in fp16 (np.round multiplies by 1e4
# first), so it is exact only while |w| * 1e4 stays below fp16's largest finite value, 65504.
FAST_ROUNDING_DECIMALS = 4
FAST_ROUNDING_LIMIT = 65504.0 / 10**FAST_ROUNDING_DECIMALS  # 6.5504


@dataclasses.dataclass
class PalettizationStats:
    """What one palettization did: distinct weights clustered, weights that reused an identical
    weight's table, and weights clustered on rounded values (the fast mode) vs exact."""

    clustered: int = 0
    shared: int = 0
    rounded: int = 0
    exact_too_large: int = 0
    skipped_over_budget: int = 0   # weights left unclustered once the time budget ran out

    def describe(self) -> str:
        return (f"{self.clustered} distinct weight(s) clustered ({self.rounded} on 4-decimal values, "
                f"{self.exact_too_large} exact as |w| > {FAST_ROUNDING_LIMIT:.4f}), "
                f"{self.shared} reused an identical weight's table")


def palettize_int8(program, group_size: int = 32, kmeans_workers: int | None = None, fast_kmeans: str = "off",
                   progress=None, stats: PalettizationStats | None = None, budget_s: float | None = None,
                   kmeans_bins: int | None = None):
    """8-bit k-means palettization, one look-up table per group of 32 output channels.

    Weights whose leading axis is not a multiple of the group size are left in fp32 by coreai-opt
    (it says so on stdout); the summary's storage types show what was compressed.
    K-means runs per group (~0.15 s each here), spread over `kmeans_workers` processes (default: every
    core), and once per *distinct* weight: an LLM's prefill and decode functions each hold a copy of
    every weight, and identical copies reuse the first one's table (`_sharing_tables`).

    fast_kmeans: "off" (default) clusters exact fp16 values. "safe" clusters each weight on its values
    rounded to 4 decimals — exactly what coreai-opt's fast mode does — but only where that rounding cannot
    overflow fp16 (|w| < 6.5504); larger weights are clustered exact (config `int8_fast_kmeans`, see
    zoo/schema.py for why it is not the default). "all": coreai-opt's own fast mode on
    every weight, kept as the negative control: it rounds in fp16 (x * 1e4 first), so |w| > 6.5504
    becomes inf and the group's look-up table inf/NaN — SmolLM2's layer-27 gate/up (|w| up to 9.25)
    made every logit NaN. The non-finite table check below stays as the backstop either way.

    kmeans_bins (config `int8_kmeans_bins`): None runs coreai-opt's optimal 1-D k-means on every distinct value
    of a group, in its process pool. A number runs the same solver on at most that many density-spaced bins,
    then refines on every value (zoo/targets/coreai_kmeans.py), on threads — the stage's time falls by the
    ratio scripts/kmeans_binned_check.py measures, at a reconstruction error it reports beside it.

    budget_s (config `int8_time_budget_s`): once clustering has taken this long, the remaining weights are
    skipped (cheaply: coreai-opt leaves a weight it cannot palettize as it was) and the stage then fails
    with what was done — instead of a conversion that runs for an hour with no end in sight.
    """
    if fast_kmeans not in ("safe", "off", "all"):
        raise ValueError(f"fast_kmeans must be 'safe', 'off' or 'all', not {fast_kmeans!r}")
    kmeans_workers = kmeans_workers or os.cpu_count() or 1
    stats = stats if stats is not None else PalettizationStats()
    _coreai_torch()
    from coreai_opt.coreai_utils import CompressionGranularity, palettize_weights

    from zoo.targets.coreai_kmeans import keep_compiled_extensions_in_project

    keep_compiled_extensions_in_project()

    deadline = None if budget_s is None else time.monotonic() + float(budget_s)
    with _forkserver_start_method(), _sharing_tables(stats, fast_kmeans == "safe", deadline, kmeans_bins), \
            _counting_weights(progress):
        compressed = palettize_weights(
            program,
            None,
            n_bits=8,
            granularity=CompressionGranularity.PER_GROUPED_CHANNEL,
            group_size=group_size,
            num_kmeans_workers=kmeans_workers,
            enable_fast_kmeans_mode=fast_kmeans == "all",
        )
    if stats.skipped_over_budget:
        done = stats.clustered + stats.shared
        raise ZooError(
            f"8-bit palettization ran past its time budget of {budget_s:g} s: {done} weight(s) were palettized "
            f"({stats.clustered} clustered, {stats.shared} shared) and {stats.skipped_over_budget} were not.",
            "raise model.int8_time_budget_s (or set it to null), or give k-means more workers "
            "(model.int8_kmeans_workers); nothing was saved.",
        )
    bad = nonfinite_lookup_tables(compressed)
    if bad:
        raise ZooError(
            f"8-bit palettization produced non-finite look-up-table entries in {len(bad)} weight(s) "
            f"(first: {bad[0]}); the bundle would compute NaN.",
            "use int8_fast_kmeans=off (the default) or safe (rounding only where it cannot overflow fp16), or "
            "report the weight's value range: coreai-opt casts weights to fp16 before clustering.",
        )
    return compressed


@contextlib.contextmanager
def _sharing_tables(stats: PalettizationStats, round_when_safe: bool, deadline: float | None = None,
                    kmeans_bins: int | None = None):
    """Cluster each distinct weight once, round it first where that is safe, and cluster it binned when
    `kmeans_bins` is set (_binned_kmeans_compress).

    coreai-opt's per-weight work is `_blockwise_compress(weight_fp16, mode=..., nbits=..., block_sizes=...,
    ...)`, looked up as a module global at call time: wrapping it (for this call only) lets identical
    weights — same bytes, shape and compression arguments — share one result, and lets the 4-decimal
    rounding be decided per weight. If the private name moves in a later coreai-opt, palettization
    still runs, without the sharing (stats then stay at zero)."""
    try:
        from coreai_opt.coreai_utils.passes import weight_palettization as wp

        original = wp._blockwise_compress
    except (ImportError, AttributeError):
        yield
        return
    tables: dict[tuple, object] = {}

    def shared(weight, **kwargs):
        if deadline is not None and time.monotonic() > deadline:
            stats.skipped_over_budget += 1
            return None  # coreai-opt: "Cannot perform palettization ... Skipped this op."
        key = _table_key(weight, kwargs)
        if key in tables:
            stats.shared += 1
            return _fit_to_rank(tables[key], weight.shape)
        stats.clustered += 1
        if round_when_safe and weight.dtype == np.float16 and float(np.abs(weight).max(initial=0)) < FAST_ROUNDING_LIMIT:
            weight = np.round(weight, decimals=FAST_ROUNDING_DECIMALS)
            stats.rounded += 1
        elif round_when_safe:
            stats.exact_too_large += 1
        tables[key] = (original(weight, **kwargs) if kmeans_bins is None
                       else _binned_kmeans_compress(original, weight, kwargs, kmeans_bins))
        return tables[key]

    wp._blockwise_compress = shared
    try:
        yield
    finally:
        wp._blockwise_compress = original


def _leading_unit_dims(shape: tuple[int, ...], kwargs: dict) -> int:
    """How many leading size-1 axes a weight has that do not group anything (scalar palettization only)."""
    if kwargs.get("cluster_dim", 1) != 1:
        return 0
    lead = 0
    while lead < len(shape) - 1 and shape[lead] == 1 and lead != kwargs.get("channel_axis"):
        lead += 1
    return lead


def _table_key(weight: np.ndarray, kwargs: dict) -> tuple:
    """What makes two weights share one palettization: the same bytes, dtype and compression arguments, and the
    same shape once leading size-1 axes are dropped. An LLM's prefill holds a projection as [1, in, out] (batched
    matmul) and its decode as [in, out], grouped along the same out axis: the same groups, the same tables.
    SmolLM2: 361 weights clustered with the shape in the key (`make bench MODEL=gqa-llm TARGET=coreai`, the optimize
    line), 211 without (`... PRECISION=int8`); tests/test_palettization.py holds the tiny LLM to 15 and 14 reused."""
    lead = _leading_unit_dims(weight.shape, kwargs)
    canonical = {k: v for k, v in kwargs.items() if k != "num_kmeans_workers"}
    if lead:
        if canonical.get("channel_axis") is not None:
            canonical["channel_axis"] = canonical["channel_axis"] - lead
        if canonical.get("block_sizes") is not None:
            canonical["block_sizes"] = list(canonical["block_sizes"])[lead:]
    return (hashlib.blake2b(np.ascontiguousarray(weight).tobytes(), digest_size=16).digest(),
            tuple(weight.shape[lead:]), weight.dtype.str, repr(sorted(canonical.items())))


def _fit_to_rank(result, shape: tuple[int, ...]):
    """A shared palettization (coreai-opt's LutParams: indices shaped like the weight, a look-up table of the
    weight's rank + 2 axes) reshaped for a weight that differs only in leading size-1 axes."""
    if result is None or tuple(result.indices.shape) == tuple(shape):
        return result
    rank = len(shape) + 2
    lut_shape = tuple(result.lut.shape)
    lut_shape = lut_shape[len(lut_shape) - rank:] if len(lut_shape) > rank else (1,) * (rank - len(lut_shape)) + lut_shape
    return result._replace(indices=result.indices.reshape(shape), lut=result.lut.reshape(lut_shape))


def _binned_kmeans_compress(compress, weight, kwargs: dict, bins: int):
    """coreai-opt's `_blockwise_compress` with our binned k-means per group (zoo/targets/coreai_kmeans.py).

    Its "CUSTOM" mode hands each group to a function and lays the results out exactly as k-means would: one
    pass collects the groups (returning placeholders), the groups are clustered on threads, and a second
    pass hands back the results in the same order. Vector palettization (cluster_dim > 1) and other modes
    go to coreai-opt unchanged."""
    from zoo.targets.coreai_kmeans import palettize_groups

    if str(kwargs.get("mode", "")).upper() != "KMEANS" or kwargs.get("cluster_dim", 1) != 1:
        return compress(weight, **kwargs)
    nbits = int(kwargs["nbits"])
    groups: list[np.ndarray] = []

    def collect(group):
        groups.append(group)
        return np.zeros(1 << nbits, group.dtype), np.zeros(group.size, np.uint8)

    custom = {**kwargs, "mode": "CUSTOM"}
    if compress(weight, **custom, lut_function=collect) is None:
        return None  # coreai-opt could not group this weight (it says why); it stays unpalettized
    results = iter(palettize_groups(groups, nbits, bins, int(kwargs.get("num_kmeans_workers") or 1)))
    return compress(weight, **custom, lut_function=lambda group: next(results))


def nonfinite_lookup_tables(program) -> list[str]:
    """Every `lut_to_dense` whose look-up table holds inf or NaN, described by its output type.

    Reads the program's constants through coreai-opt's own accessor (there is no public one): this is
    the check that turns a silently NaN bundle into an error at the compression stage.
    """
    from coreai._compiler.ir import WalkResult
    from coreai_opt.coreai_utils._coreai_imports import _get_constant_value_as_np_array

    found = []

    def visit(op):
        table = list(op.operands)[1].owner if op.name == "coreai.lut_to_dense" else None
        if table is not None and table.name == "coreai.constant":
            lut = _get_constant_value_as_np_array(table)
            if lut.dtype.kind == "f" and not np.isfinite(lut).all():
                found.append(f"{op.result.type}: {int((~np.isfinite(lut)).sum())} non-finite entries")
        return WalkResult.ADVANCE

    program._module._mlir_module.operation.walk(visit)
    return found


@contextlib.contextmanager
def _counting_weights(progress):
    """Report each weight as coreai-opt finishes clustering it: progress(done, total).

    coreai-opt has no progress callback; its per-weight work is `_blockwise_compress`, looked up as a
    module global at call time, so wrapping that global (for this call only) counts weights exactly.
    The total is the number of constants it will consider (`_should_compress_op`). If either private
    name moves in a later coreai-opt, progress degrades to elapsed time only — never an error.
    """
    if progress is None:
        yield
        return
    try:
        from coreai_opt.coreai_utils.passes import weight_palettization as wp

        original = wp._blockwise_compress
    except (ImportError, AttributeError):
        yield
        return
    done = [0]

    def counted(*args, **kwargs):
        try:
            return original(*args, **kwargs)
        finally:
            done[0] += 1
            progress(done[0], None)

    wp._blockwise_compress = counted
    try:
        yield
    finally:
        wp._blockwise_compress = original


def count_weight_constants(program) -> int | None:
    """How many weights the palettizer will cluster (the progress total), asked with coreai-opt's own
    selection rule (`_should_compress_op`, default threshold 1024 elements), or None if it moved."""
    try:
        from coreai._compiler.ir import WalkResult
        from coreai_opt.coreai_utils._utils.graph_utils import _should_compress_op
        from coreai_opt.coreai_utils.passes import _OPS_WEIGHT_NEED_COMPRESSION
    except ImportError:
        return None
    count = [0]

    def visit(op):
        if _should_compress_op(op, 1024, _OPS_WEIGHT_NEED_COMPRESSION):
            count[0] += 1
        return WalkResult.ADVANCE

    try:
        program._module._mlir_module.operation.walk(visit)
    except Exception:  # a private layout that moved: no total, elapsed time still shows
        return None
    return count[0] or None


@contextlib.contextmanager
def _forkserver_start_method():
    """coreai-opt makes its k-means pool with multiprocessing's default start method, `fork` on Linux.
    Forked from a process that already runs threads (torch's, our RSS sampler) the workers deadlocked
    on a lock at start (measured: gqa-llm tiny hung for 10 min). `forkserver` starts them from a
    clean single-threaded server instead. The default is restored afterwards (the pool, made once
    and cached by coreai-opt, keeps its start method)."""
    import multiprocessing

    previous = multiprocessing.get_start_method(allow_none=True)
    multiprocessing.set_start_method("forkserver", force=True)
    try:
        yield
    finally:
        multiprocessing.set_start_method(previous, force=True)


class CoreAITarget:
    name = "coreai"
    artifact = ARTIFACT
    precisions = TARGET_PRECISIONS["coreai"]
    precision_notes: dict[str, str] = {}

    export_skip_reason = None
    has_op_profiler = True  # coreai.runtime.Profiler: RuntimeOpProfile, `open(path, profile=True)`
    compression_skipped = ("no compression pass at this precision (graph optimization always runs inside "
                           "to_coreai on coreai-torch 0.4.3)")

    def prepare(self, module, precision: Precision, options: dict | None = None):
        """fp16/bf16 compute in that dtype on Core AI (the CPU runtime does not upcast).

        `options.fp32_linear_accumulation`: keep Linear weights in the reduced dtype but multiply in fp32
        (see zoo.precision.Fp32AccumulateLinear for the measurement behind it).
        `options.pretranspose_linears` (default on): Linears stored as W^T, so the runtime multiplies
        instead of transposing a constant on every call (zoo/targets/coreai_form.py).
        """
        options = options or {}
        module = cast_for_export(module, precision.dtype, bool(options.get("fp32_linear_accumulation", False)))
        if options.get("pretranspose_linears", True):  # the runtime's fast form (zoo/targets/coreai_form.py)
            module, _ = pretranspose_linears(module)
        return module

    def conversion_note(self, program) -> str:
        """The op counts the graph form pass exists to change, for the convert stage's line in the report."""
        counts = op_histogram(program)
        total = sum(n for op, n in counts.items() if op not in ("module", "graph", "output", "constant"))
        return (f"{total} ops: transpose {counts.get('transpose', 0)}, "
                f"broadcasting_batch_matmul {counts.get('broadcasting_batch_matmul', 0)}, "
                f"batch_matmul {counts.get('batch_matmul', 0)}")

    def export(self, entries: list[Entry]):
        return [export_entry(e) for e in entries]

    def convert(self, entries: list[Entry], exported, scratch: Path, **_):
        return convert_programs(entries, exported)

    def compress(self, program, precision: Precision, scratch: Path, int8_group_size: int = 32,
                 int8_kmeans_workers: int | None = None, int8_fast_kmeans: str = "off",
                 int8_time_budget_s: float | None = None, int8_kmeans_bins: int | None = None, progress=None, **_):
        """Returns (program, note); note None means the stage had nothing to do. `progress(done, total)`
        hears of each weight palettized."""
        if precision.name == "int8":
            workers = int8_kmeans_workers or os.cpu_count() or 1
            total = count_weight_constants(program) if progress else None
            report = (lambda done, _: progress(done, total)) if progress else None
            stats = PalettizationStats()
            compressed = palettize_int8(program, int8_group_size, workers, int8_fast_kmeans, progress=report,
                                        stats=stats, budget_s=int8_time_budget_s, kmeans_bins=int8_kmeans_bins)
            solver = ("optimal k-means on every distinct value" if int8_kmeans_bins is None
                      else f"optimal k-means on {int8_kmeans_bins} bins + Lloyd refinement")
            return (compressed, f"8-bit palettization, per grouped channel, group {int8_group_size}, {solver}, "
                                f"{workers} k-means worker(s); {stats.describe()}")
        return program, None

    def save(self, program, dest: Path, metadata: dict) -> Path:
        _coreai_torch()
        import coreai.runtime as rt

        md = rt.AIModelAssetMetadata()
        md.author = metadata.get("author", "zoo")
        md.license = metadata.get("license", "")
        md.model_description = metadata.get("description", "")
        path = dest / ARTIFACT
        program.save_asset(path, md)
        return path

    def describe_bundle(self, bundle_dir: Path, facts: "BundleFacts") -> None:
        """The root metadata.json in Apple's schema (zoo/targets/coreai_bundle.py), written into the staging
        folder after the asset and extra files, so the manifest hashes it like every other file."""
        from zoo.targets.coreai_bundle import write_bundle_metadata

        write_bundle_metadata(bundle_dir, facts)

    def open(self, path: Path, profile: bool = False) -> "CoreAIRunner":
        """profile=True: every function reports its per-op times to the runtime's profiler
        (`runner.op_profile()`); it adds a Python callback per op, so never on a timed run."""
        return CoreAIRunner(path, profile=profile)

    def doctor_targets(self, cfg) -> list[str]:
        """Which zoo.doctor rule targets apply to graphs converted here."""
        return ["coreai"]

    def post_save_checks(self, path: Path, entry_inputs: dict, cfg, precision: Precision, details: dict,
                         log, evidence: dict | None = None) -> tuple[list, str]:
        """Nothing beyond the verify stage: the Core AI CPU runtime is the only one here."""
        return [], ""

    def summary(self, path: Path) -> str:
        _coreai_torch()
        from coreai.authoring import AIModelAsset

        return str(AIModelAsset.load(path).summary())

    @staticmethod
    def versions() -> dict[str, str]:
        return {p: version(p) for p in ("coreai-core", "coreai-torch", "coreai-opt", "torch")}


class RuntimeOpProfile:
    """Where a Core AI function spends its time, from the runtime's own profiler (`coreai.runtime.Profiler`).

    The runtime reports an interval per executed op ("call.coreai.<op>", "call.coreai.decomposable.<op>",
    nanosecond timestamps) inside one "Function Execute" interval per call; this sums them per op name.
    tests/test_coreai_profile.py checks on a Linear stack that the op intervals account for the execute
    interval, and that an untransposed weight shows up as `transpose` time the graph-form pass removes."""

    OP_PREFIX = "call.coreai."

    def __init__(self, rt):
        self.calls: collections.Counter = collections.Counter()
        self.op_ns: collections.Counter = collections.Counter()
        self.execute_ns = 0
        self.executions = 0
        self._open: dict[int, tuple[str, int]] = {}
        self._ids = itertools.count()
        self.profiler = rt.Profiler(on_log_event_begin=self._begin, on_log_event_end=self._end)

    def _begin(self, event) -> int:
        key = next(self._ids)
        self._open[key] = (event.event_id, event.timestamp)
        return key

    def _end(self, event, key: int) -> None:
        name, start = self._open.pop(key, ("", event.timestamp))
        if name.startswith(self.OP_PREFIX):
            op = name[len(self.OP_PREFIX):].removeprefix("decomposable.")
            self.calls[op] += 1
            self.op_ns[op] += event.timestamp - start
        elif name == "Function Execute":
            self.execute_ns += event.timestamp - start
            self.executions += 1

    def reset(self) -> None:
        self.calls.clear()
        self.op_ns.clear()
        self.execute_ns = self.executions = 0

    def table(self, top: int | None = None) -> dict:
        """{"executions", "execute_ms", "ops": [{op, calls, ms, share}] by time, share of all op time}."""
        total = sum(self.op_ns.values()) or 1
        ops = [{"op": op, "calls": self.calls[op], "ms": round(ns / 1e6, 3), "share": round(ns / total, 4)}
               for op, ns in self.op_ns.most_common(top)]
        return {"executions": self.executions, "execute_ms": round(self.execute_ns / 1e6, 3), "ops": ops}


class CoreAIRunner:
    """Keeps one `AIModel` alive (an open `executable()` context) for as long as the runner lives."""

    def __init__(self, path: Path, verify: bool = True, profile: bool = False):
        if verify:  # before the runtime parses it: a truncated .aimodel aborts the process (SIGABRT)
            from zoo.integrity import verify_artifact_in_bundle

            verify_artifact_in_bundle(Path(path))
        _coreai_torch()
        import coreai.runtime as rt
        from coreai.authoring import AIModelAsset

        self._rt = rt
        self._loop = asyncio.new_event_loop()
        self._stack = contextlib.AsyncExitStack()
        asset = AIModelAsset.load(Path(path))
        self._model = self._loop.run_until_complete(self._stack.enter_async_context(asset.executable()))
        self.function_names = list(self._model.function_names)
        self._profiles = {name: RuntimeOpProfile(rt) for name in self.function_names} if profile else {}
        self._functions = {name: (self._model.load_function(name, profiler=self._profiles[name].profiler)
                                  if profile else self._model.load_function(name))
                           for name in self.function_names}

    def op_profile(self, top: int | None = None) -> dict[str, dict]:
        """Per function that ran since the last reset: RuntimeOpProfile.table (needs profile=True)."""
        return {name: p.table(top) for name, p in self._profiles.items() if p.executions}

    def reset_profile(self) -> None:
        for p in self._profiles.values():
            p.reset()

    def state_specs(self, function: str) -> dict[str, tuple[tuple[int, ...], np.dtype]]:
        """Shape and dtype of each state a function declares, read from the bundle itself."""
        desc = self._functions[function].desc
        return {n: (tuple(desc.state_descriptor(n).shape), np.dtype(desc.state_descriptor(n).dtype))
                for n in desc.state_names}

    def input_specs(self, function: str) -> dict[str, tuple[tuple[int, ...], np.dtype]]:
        """Shape and dtype of each graph input, read from the bundle (checked by zoo.sessions.check_inputs).
        A dynamic dimension reads as -1 or None and matches any size."""
        desc = self._functions[function].desc
        return {n: (tuple(desc.input_descriptor(n).shape), np.dtype(desc.input_descriptor(n).dtype))
                for n in desc.input_names}

    def new_state(self, array: np.ndarray):
        """A state buffer (e.g. a KV cache) the runtime updates in place across calls."""
        return self._rt.NDArray(np.ascontiguousarray(array))

    def run(self, function: str, inputs: dict[str, np.ndarray], states: dict | None = None) -> dict[str, np.ndarray]:
        feeds = {k: self._rt.NDArray(np.ascontiguousarray(v)) for k, v in inputs.items()}
        call = self._functions[function](feeds, states) if states else self._functions[function](feeds)
        outputs = self._loop.run_until_complete(call)
        return {k: np.array(v.numpy()) for k, v in outputs.items()}

    def close(self):
        """Release the runtime objects in order: functions, then the executable, then the loop. (This
        alone does not stop the runtime's worker threads from touching Python at interpreter shutdown:
        processes end through zoo.cli.end_process for that.)"""
        if self._loop.is_closed():
            return
        self._functions.clear()
        self._profiles.clear()
        self._loop.run_until_complete(self._stack.aclose())
        self._model = None
        self._loop.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
