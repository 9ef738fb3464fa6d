"""The typed schema of a model's config (`models/<name>/config.yaml`), validated before any work.

Every model config is merged onto `ModelConfig` (or the model's own subclass, which adds the keys only
that model has, e.g. T5's `seq_len`): an unknown key, a wrong type or a missing required key is one
clear error naming the file and the key, and so is a precision that a target can build but that has no
gate (`check_semantics`). The merged config stays typed inside Hydra, so a command-line override of
the wrong type (`model.seq_len=abc`) is refused the same way.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Optional

from omegaconf import MISSING


class BundleStatus(StrEnum):
    PASSED = "passed"
    GATE_FAILED = "gate_failed"
    ERROR = "error"


class StageOutcome(StrEnum):
    RUNNING = "running"
    OK = "ok"
    SKIPPED = "skipped"
    FAILED = "failed"


@dataclass
class GpuSection:
    """The LiteRT GPU-delegate check (zoo/targets/litert_gpu.py) and what it must show, per precision."""

    check: bool = True
    timeout_s: float = 300.0   # both GPU runs together (software Vulkan); a real-size graph needs far longer
    require_resident: list[str] = field(default_factory=list)   # precisions that must run GPU-only
    fp32_rel_tol: dict[str, float] = field(default_factory=dict)  # enforced fp32 vs CPU, max-abs / max|CPU|
    fp16_rel_tol: dict[str, float] = field(default_factory=dict)  # fp16 compute (the phone default) vs CPU
    fp16_min_cosine: dict[str, float] = field(default_factory=dict)  # raises the fixed floor for a precision
    fp32_only: dict[str, str] = field(default_factory=dict)      # precision -> why fp16 compute is not gated
    # A generative model's own gate (token metrics) on greedy generation computed by the GPU in fp16;
    # empty: the model's `gates.fp16`.
    fp16_token_gate: dict[str, float] = field(default_factory=dict)
    # component -> keys of this block that differ for it (LTX-Video: its T5 is fp32-only on the GPU, its DiT not)
    components: dict[str, Any] = field(default_factory=dict)


@dataclass
class BenchTarget:
    """A performance target the bench checks on its own rows (the README's Targets table): the row's value of
    `measure` (a key of the row's measure, or convert_s / size_vs_fp32 / peak_rss_mb) against at_most or
    at_least. `missed_because`: why, when the run misses it (prose; figures belong in the tables)."""
    target: str = MISSING
    precision: str = MISSING
    measure: str = MISSING
    goal: str = MISSING             # what is wanted, in words (the table's first column)
    component: Optional[str] = None  # null: the model's first component
    at_most: Optional[float] = None
    at_least: Optional[float] = None
    missed_because: str = ""


@dataclass
class BenchSection:
    variant: Optional[str] = None   # architecture to bench (null: the config's variant)
    weights: Optional[str] = None   # weights to bench (null: the config's weights)
    repeats: int = 5
    targets: list[BenchTarget] = field(default_factory=list)


@dataclass
class TargetOptions:
    # fp16/bf16 Linears multiply in fp32 while their weights stay reduced (zoo/precision.py).
    fp32_linear_accumulation: bool = False


@dataclass
class CoreAIOptions(TargetOptions):
    # Linears stored as W^T (zoo/targets/coreai_form.py): no runtime transpose of a constant per call.
    pretranspose_linears: bool = True


@dataclass
class LiteRTOptions(TargetOptions):
    # int8 recipe (litert-quantizer): "dynamic" = int8 weights and int8 activations quantized per call by
    # the CPU kernels (dynamic range); "weight_only" = int8 weights dequantized to float, float compute.
    # (No blockwise int8: litert-quantizer leaves 8-bit blockwise weights fp32, scripts/litert_blockwise_check.py.)
    # weight_only is closer on the CPU (tiny T5 cos 0.99996 vs the dynamic default's gate 0.998) but the
    # GPU delegate cannot create it ("Shape mismatch {64,1,1,64} vs {1,1,64,64}" on a dequantized FC
    # weight; SIGSEGV with an int8 lookup table): `zoo convert model=t5 target=litert precision=int8
    # weights=tiny model.litert.int8_recipe=weight_only`. So "dynamic" stays the default; a model whose tokens
    # need it opts in (gqa-llm: agreement 1 vs 0.625 on the real SmolLM2, models/gqa_llm/config.yaml).
    int8_recipe: str = "dynamic"
    # litert-torch's lazy-constant conversion: "auto" turns it on when the module's weights exceed
    # `lightweight_above_gb` (measured on the 28-layer LTX-Video DiT: peak RSS 24 GB -> 10.4 GB, same ops and
    # numerics; small models keep the default path's constant folding).
    lightweight_conversion: str = "auto"      # auto | on | off
    lightweight_above_gb: float = 2.0


@dataclass
class ModelConfig:
    name: str = MISSING
    package: str = MISSING          # the Python package whose SPEC declares the components
    weights: str = MISSING          # default weights source: tiny | hub | random | embedded | local:PATH | url
    variant: Optional[str] = None
    seed: int = 0
    int8_kmeans_workers: Optional[int] = None  # Core AI int8: k-means processes (null: every core)
    # Core AI int8: "off" clusters exact fp16 weights; "safe" clusters 4-decimal rounded values where that
    # cannot overflow fp16 (coreai-opt's fast mode, per weight). Off by default: ~22% faster per weight
    # (scripts/kmeans_fast_mode_check.py: 8.2 s -> 6.4 s on SmolLM2's layer-27 gate_proj), but on the tiny
    # LLM it lowered the worst int8 logits cosine from 0.986 to 0.915 at the same weight reconstruction
    # error (`zoo convert model=gqa-llm target=coreai precision=int8 weights=tiny [model.int8_fast_kmeans=safe]`).
    int8_fast_kmeans: str = "off"
    # Core AI int8: the optimal 1-D k-means runs on at most this many density-spaced bins of each group's
    # distinct values, then Lloyd refines on all of them (zoo/targets/coreai_kmeans.py); null: on every
    # distinct value, as coreai-opt does (scripts/kmeans_binned_check.py measures time and error of both).
    int8_kmeans_bins: Optional[int] = 1024
    int8_time_budget_s: Optional[float] = None   # Core AI int8: fail the stage past this many seconds (null: none)
    int8_group_size: int = 32
    peak_rss_mb: Optional[int] = None          # expected peak RSS of one bundle (for launchers that pack by memory)
    variants: dict[str, Any] = field(default_factory=dict)
    # A checkpoint that ships as named weight files without config.json (part -> path inside the folder, e.g.
    # TripoSplat's diffusion_models/triposplat_fp16.safetensors): weights=local:FOLDER / hub load those files,
    # keys prefixed `part.`, and the architecture comes from the variant (zoo/weights.py load_named_files).
    checkpoint_files: dict[str, str] = field(default_factory=dict)
    # the same for parts a checkpoint may lack (TripoSplat's background remover: only photos without alpha need it):
    # loaded when the folder has the file, left out when not
    optional_checkpoint_files: dict[str, str] = field(default_factory=dict)
    default_precision: dict[str, str] = MISSING
    # component -> {target: precision}: a component whose default differs from the model's (LTX-Video's T5)
    component_precision: dict[str, Any] = field(default_factory=dict)
    # Nested dicts stay `Any` inside: OmegaConf 2.3 cannot merge into Dict[str, Dict[str, float]]
    # ("Value 'AnyNode' is not a supported primitive type"); check_semantics checks their values instead.
    refused_precisions: dict[str, Any] = field(default_factory=dict)   # target -> {precision: reason}
    gates: dict[str, Any] = MISSING                                     # precision -> {metric: threshold}
    # component -> {precision: {metric: threshold}}, merged over `gates` for that component's bundles (TripoSplat's
    # image encoders are gated on cosine and rel_max_abs; its DiT and decoders keep the model-wide thresholds)
    component_gates: dict[str, Any] = field(default_factory=dict)
    gpu: GpuSection = field(default_factory=GpuSection)
    bench: BenchSection = field(default_factory=BenchSection)
    coreai: CoreAIOptions = field(default_factory=CoreAIOptions)
    litert: LiteRTOptions = field(default_factory=LiteRTOptions)


def check_semantics(cfg, target_precisions: dict[str, tuple[str, ...]]) -> list[str]:
    """What the types cannot say. Returns one message per problem (empty: the config is sound).

    `target_precisions`: what each target can build, e.g. {"coreai": ("fp32", ...), ...}.
    """
    from zoo.gates import METRICS

    problems = []
    refused = cfg.refused_precisions or {}
    for target, precisions in target_precisions.items():
        default = (cfg.default_precision or {}).get(target)
        if default not in precisions:
            problems.append(f"default_precision.{target}: '{default}' is not one of {', '.join(precisions)}")
        for precision in precisions:
            if precision in (refused.get(target) or {}):
                continue
            if precision not in cfg.gates:
                problems.append(f"gates.{precision}: missing, but {target} builds {precision} for this model "
                                f"(add thresholds, or refuse it under refused_precisions.{target}.{precision})")
    for component, defaults in (cfg.get("component_precision") or {}).items():
        for target, precision in (defaults or {}).items():
            if precision not in target_precisions.get(target, ()):
                problems.append(f"component_precision.{component}.{target}: '{precision}' is not one of "
                                f"{', '.join(target_precisions.get(target, ()))}")
    gate_tables = {f"gates.{precision}": thresholds for precision, thresholds in cfg.gates.items()}
    for component, per_precision in (cfg.get("component_gates") or {}).items():
        for precision, thresholds in (per_precision or {}).items():
            if precision not in cfg.gates:
                problems.append(f"component_gates.{component}.{precision}: no gates.{precision} to refine")
            gate_tables[f"component_gates.{component}.{precision}"] = thresholds
    for key, thresholds in gate_tables.items():
        if not hasattr(thresholds, "items"):
            problems.append(f"{key}: must map metric names to thresholds, got {thresholds!r}")
            continue
        for metric, threshold in thresholds.items():
            if metric not in METRICS:
                problems.append(f"{key}.{metric}: unknown metric (known: {', '.join(METRICS)})")
            elif isinstance(threshold, bool) or not isinstance(threshold, (int, float)):
                problems.append(f"{key}.{metric}: threshold must be a number, got {threshold!r}")
    for target, refusals in refused.items():
        if not hasattr(refusals, "items") or not all(isinstance(v, str) for v in refusals.values()):
            problems.append(f"refused_precisions.{target}: must map precisions to the reason (a string)")
    gpu = cfg.gpu
    for metric in gpu.fp16_token_gate:
        if metric not in METRICS:
            problems.append(f"gpu.fp16_token_gate.{metric}: unknown metric (known: {', '.join(METRICS)})")
    for precision in gpu.require_resident:
        if precision not in gpu.fp32_rel_tol:
            problems.append(f"gpu.fp32_rel_tol.{precision}: missing for a precision in gpu.require_resident")
        if precision not in gpu.fp16_rel_tol and precision not in gpu.fp32_only:
            problems.append(f"gpu.fp16_rel_tol.{precision}: missing — give the fp16 GPU tolerance, or declare "
                            f"gpu.fp32_only.{precision}: <why the GPU is only right with enforced fp32>")
    if str(cfg.litert.get("lightweight_conversion", "auto")) not in ("auto", "on", "off", "True", "False"):
        problems.append(f"litert.lightweight_conversion: '{cfg.litert.lightweight_conversion}' is not one of auto, on, off")
    if cfg.litert.get("int8_recipe", "dynamic") not in ("dynamic", "weight_only"):
        problems.append(f"litert.int8_recipe: '{cfg.litert.int8_recipe}' is not one of dynamic, weight_only")
    for i, goal in enumerate(cfg.bench.get("targets") or []):
        if (goal.get("at_most") is None) == (goal.get("at_least") is None):
            problems.append(f"bench.targets[{i}]: give exactly one of at_most, at_least")
    bins = cfg.get("int8_kmeans_bins")
    if bins is not None and (not isinstance(bins, int) or isinstance(bins, bool) or bins < 256):
        problems.append(f"int8_kmeans_bins: {bins!r} must be an integer of at least 256 (the 8-bit table's "
                        "entries), or null for k-means on every distinct value")
    if cfg.get("int8_fast_kmeans", "off") not in ("off", "safe"):
        problems.append(f"int8_fast_kmeans: '{cfg.int8_fast_kmeans}' is not one of off, safe")
    if cfg.variant is not None and cfg.variants and cfg.variant not in cfg.variants:
        problems.append(f"variant: '{cfg.variant}' is not one of {', '.join(cfg.variants)}")
    return problems
