"""Metric registry and gate evaluation: does the converted artifact match its reference?

Each metric is a plain function of (candidate, reference) with a one-line explanation and a
direction, so a gate table reads like a sentence: "cosine 0.999998 >= 0.9999: pass". Thresholds live
in each model's config, per precision; `evaluate` turns them into results for the report.

Every metric has its function here, whatever it compares: arrays (cosine, PSNR, ...), greedy token
streams (token_exact, token_agreement, min_logits_cosine: anything with `prompt_ids`, `tokens` and
per-step `logits`, see zoo/generation.py), or a LiteRT GPU check (gpu_resident, gpu_checked; its
per-output errors are the array metrics applied to GPU vs CPU outputs). The one rule for all of them:
NaN anywhere fails its gate and shows as NaN — never skipped, never averaged away.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Callable

import numpy as np

KNIFE_EDGE_MARGIN = 0.1  # a reference top-2 logit margin below this is a tie any rounding may flip
GPU_FP16_COSINE_FLOOR = 0.99  # the GPU's fp16 run must at least point the same way, whatever the tolerance


@dataclass(frozen=True)
class Metric:
    name: str
    fn: Callable[[Any, Any], float]
    higher_is_better: bool
    explains: str
    compares: str = "arrays"  # arrays | token streams | sampler steps | sampler runs | runtime text | a GPU check


def _as64(x) -> np.ndarray:
    return np.asarray(x, dtype=np.float64).ravel()


def cosine(candidate, reference) -> float:
    """Cosine similarity (float64). One rule for every caller, the GPU check included: non-finite values
    on either side or a size mismatch give NaN (which never passes); two all-zero outputs are identical
    (1.0); an all-zero output against a non-zero one shares no direction (0.0)."""
    a, b = _as64(candidate), _as64(reference)
    if a.shape != b.shape or not (np.all(np.isfinite(a)) and np.all(np.isfinite(b))):
        return float("nan")
    norms = np.linalg.norm(a) * np.linalg.norm(b)
    if norms == 0.0:
        return 1.0 if not (a.any() or b.any()) else 0.0
    return float(a @ b / norms)


def max_abs(candidate, reference) -> float:
    """max |candidate - reference|; NaN when either side holds NaN or the sizes differ, inf for inf."""
    a, b = _as64(candidate), _as64(reference)
    if a.shape != b.shape:
        return float("nan")
    if a.size == 0:
        return 0.0
    diff = np.abs(a - b)
    return float("nan") if np.isnan(diff).any() else float(diff.max())


def rel_max_abs(candidate, reference) -> float:
    """max_abs over max |reference|; against an all-zero reference any difference is infinitely large."""
    error = max_abs(candidate, reference)
    ref = _as64(reference)
    peak = float(np.max(np.abs(ref))) if ref.size else 0.0
    if peak > 0 or np.isnan(error):
        return error / peak if peak > 0 else error
    return 0.0 if error == 0 else float("inf")


def psnr(candidate, reference) -> float:
    a, b = _as64(candidate), _as64(reference)
    if not np.all(np.isfinite(a)):
        return float("-inf")
    mse = float(np.mean((a - b) ** 2))
    peak = float(b.max() - b.min())
    if mse == 0.0:
        return float("inf")
    return 10.0 * np.log10(peak**2 / mse) if peak > 0 else float("-inf")


# ---------------------------------------------------------------- token streams (greedy generation)


def stream_is_finite(stream) -> bool:
    return all(np.all(np.isfinite(np.asarray(lg, dtype=np.float64))) for lg in stream.logits)


def first_divergence(candidate, reference) -> int | None:
    """Index of the first generated token that differs (a shorter stream differs where it ends)."""
    for i, (r, c) in enumerate(zip(reference.tokens, candidate.tokens)):
        if r != c:
            return i
    if len(candidate.tokens) != len(reference.tokens):
        return min(len(candidate.tokens), len(reference.tokens))
    return None


def top2_margin(logits) -> float:
    top2 = np.partition(np.asarray(logits, dtype=np.float64).ravel(), -2)[-2:]
    return float(top2[1] - top2[0])


def logits_cosines(candidate, reference) -> list[float]:
    """Per-step logits cosine while both streams have seen the same context (up to and including the
    first divergence)."""
    first = first_divergence(candidate, reference)
    shared = len(reference.logits) if first is None else first + 1
    return [cosine(c, r) for r, c in zip(reference.logits[:shared], candidate.logits)]


def nan_min(values) -> float:
    """min that NaN poisons (Python's min skips a NaN that is not first: min([0.9, nan, 0.5]) == 0.5)."""
    values = [float(v) for v in values]
    if not values or any(v != v for v in values):
        return float("nan")
    return min(values)


def nan_max(values) -> float:
    values = [float(v) for v in values]
    if not values or any(v != v for v in values):
        return float("nan")
    return max(values)


def token_exact(candidate, reference, knife_edge: float = KNIFE_EDGE_MARGIN) -> float:
    """1 if the greedy tokens are the reference's, or first differ where the reference's own top-2
    margin is below `knife_edge`; else 0. NaN if the candidate's logits are non-finite anywhere."""
    if not stream_is_finite(candidate):
        return float("nan")
    if candidate.prompt_ids != reference.prompt_ids or len(candidate.tokens) != len(reference.tokens):
        return 0.0
    first = first_divergence(candidate, reference)
    if first is None:
        return 1.0
    return 1.0 if top2_margin(reference.logits[first]) < knife_edge else 0.0


def token_agreement(candidate, reference) -> float:
    """Fraction of the reference's tokens generated identically before the first divergence. NaN if
    the candidate's logits are non-finite anywhere (a stream that goes NaN at token 12 is broken,
    whatever its first 12 tokens were)."""
    if not stream_is_finite(candidate):
        return float("nan")
    if candidate.prompt_ids != reference.prompt_ids:
        return 0.0
    first = first_divergence(candidate, reference)
    agreed = len(reference.tokens) if first is None else first
    return agreed / max(1, len(reference.tokens))


def min_logits_cosine(candidate, reference) -> float:
    """Lowest per-step logits cosine while the contexts are shared; NaN if any is NaN or the candidate
    is non-finite anywhere."""
    if not stream_is_finite(candidate):
        return float("nan")
    return nan_min(logits_cosines(candidate, reference))


# ---------------------------------------------------------------- sampler steps (per-step capture)


def min_step_cosine(candidate_steps, reference_steps) -> float:
    """Lowest per-step cosine of a sampler's network outputs, each step fed the reference pipeline's own
    captured inputs; NaN if any step is NaN, a step is missing or misshapen, or there are no steps."""
    if len(candidate_steps) != len(reference_steps) or not reference_steps:
        return float("nan")
    if any(np.shape(c) != np.shape(r) for c, r in zip(candidate_steps, reference_steps)):
        return float("nan")
    return nan_min(cosine(c, r) for c, r in zip(candidate_steps, reference_steps))


def min_channel_cosine(candidate, reference) -> float:
    """Lowest cosine over the channels (last axis) of two arrays, each channel taken over every other axis: a
    wrong channel among many (one of a DiT's 16 latent channels) barely moves the global cosine but shows here.
    NaN when a side is non-finite or the shapes differ."""
    a, b = np.asarray(candidate, dtype=np.float64), np.asarray(reference, dtype=np.float64)
    if a.shape != b.shape or a.ndim == 0:
        return float("nan")
    return nan_min(cosine(a[..., c], b[..., c]) for c in range(a.shape[-1]))


def min_step_channel_cosine(candidate_steps, reference_steps) -> float:
    """`min_channel_cosine` over every sampler step (teacher forcing); NaN as for `min_step_cosine`."""
    if len(candidate_steps) != len(reference_steps) or not reference_steps:
        return float("nan")
    return nan_min(min_channel_cosine(c, r) for c, r in zip(candidate_steps, reference_steps))


def max_step_rel_max_abs(candidate_steps, reference_steps) -> float:
    """Largest per-step max-abs / max |reference| over every sampler step; NaN if a step is missing or NaN."""
    if len(candidate_steps) != len(reference_steps) or not reference_steps:
        return float("nan")
    return nan_max(rel_max_abs(c, r) for c, r in zip(candidate_steps, reference_steps))


def text_exact(candidate, reference) -> float:
    """1 if two generated texts are identical, else 0. For runtimes that return text, not token ids
    (LiteRT-LM): the reference is the expected greedy tokens decoded by the same tokenizer, so any
    different token shows as different text. A missing text (None) is NaN, which fails."""
    if not isinstance(candidate, str) or not isinstance(reference, str):
        return float("nan")
    return 1.0 if candidate == reference else 0.0


# ---------------------------------------------------------------- colour statistics (RGB arrays [..., 3] in [0, 1])


def _rgb(x) -> np.ndarray:
    return np.asarray(x, dtype=np.float64).reshape(-1, 3)


def _ratio_deviation(candidate_stat: float, reference_stat: float) -> float:
    if not (np.isfinite(candidate_stat) and np.isfinite(reference_stat)) or reference_stat <= 0:
        return float("nan")
    return abs(candidate_stat / reference_stat - 1.0)


def rgb_std_deviation(candidate, reference) -> float:
    """|std(candidate RGB) / std(reference RGB) - 1| over every colour value: how far the converted output's
    colour spread moved (a quantised decoder that desaturates shrinks it while cosines stay near 1). NaN when
    either side is non-finite or the reference has no spread."""
    a, b = _rgb(candidate), _rgb(reference)
    if a.shape != b.shape:
        return float("nan")
    return _ratio_deviation(float(a.std()), float(b.std()))


def chroma(rgb) -> np.ndarray:
    """Per colour: max(R,G,B) - min(R,G,B) (HSV chroma), 0 for greys."""
    rgb = _rgb(rgb)
    return rgb.max(axis=1) - rgb.min(axis=1)


def chroma_deviation(candidate, reference) -> float:
    """|mean chroma(candidate) / mean chroma(reference) - 1|: saturation lost (or gained) by the conversion."""
    a, b = _rgb(candidate), _rgb(reference)
    if a.shape != b.shape:
        return float("nan")
    return _ratio_deviation(float(chroma(a).mean()), float(chroma(b).mean()))


# ---------------------------------------------------------------- LiteRT GPU check (zoo/targets/litert_gpu.py)


def gpu_resident(check: dict, _reference=None) -> float:
    """1 if the delegate took every op GPU-only, 0 if it refused, NaN if the check did not run."""
    return {"accepted": 1.0, "rejected": 0.0}.get(check.get("status"), float("nan"))


def gpu_checked(check: dict, _reference=None) -> float:
    """1 if the GPU check ran to a verdict (accepted or rejected), 0 if it could not run."""
    return 1.0 if check.get("status") in ("accepted", "rejected") else 0.0


# ---------------------------------------------------------------- detections (zoo/detection.py match report)


def detection_recall(report: dict, _reference=None) -> float:
    """Fraction of the reference's detections above the score threshold that found a same-class partner
    (IoU and score within tolerance). NaN when the reference has none: a gate that checks nothing must not
    pass — pick images, seed or threshold so the reference detects something."""
    required, matched = report.get("required", 0), report.get("matched", float("nan"))
    return float(matched) / required if required else float("nan")


def detection_worst_iou(report: dict, _reference=None) -> float:
    return float(report.get("worst_iou", float("nan")))


def detection_extras(report: dict, _reference=None) -> float:
    return float(report.get("extras", float("nan")))


def detection_worst_score_err(report: dict, _reference=None) -> float:
    return float(report.get("worst_score_err", float("nan")))


METRICS: dict[str, Metric] = {
    m.name: m
    for m in (
        Metric("cosine", cosine, True, "cosine similarity of the flattened outputs; 1.0 means same direction"),
        Metric("psnr", psnr, True, "peak signal-to-noise ratio in dB, peak = reference max - min"),
        Metric("max_abs", max_abs, False, "largest absolute elementwise difference"),
        Metric("rel_max_abs", rel_max_abs, False, "largest absolute difference divided by max |reference|"),
        Metric("token_exact", token_exact, True, "1 if the greedy tokens equal the reference's, or first differ at a "
               f"knife-edge tie (reference top-2 margin < {KNIFE_EDGE_MARGIN}); else 0", "token streams"),
        Metric("token_agreement", token_agreement, True, "fraction of generated tokens equal to the reference "
               "before the first divergence", "token streams"),
        Metric("min_logits_cosine", min_logits_cosine, True, "lowest per-step logits cosine vs the reference "
               "while both streams share the same context", "token streams"),
        Metric("min_step_cosine", min_step_cosine, True, "lowest cosine over every sampler step, the network fed "
               "the eager pipeline's captured inputs of that step; NaN if a step is missing", "sampler steps"),
        Metric("min_step_channel_cosine", min_step_channel_cosine, True, "lowest per-channel (last axis) cosine "
               "over every sampler step fed the eager run's captured inputs", "sampler steps"),
        Metric("max_step_rel_max_abs", max_step_rel_max_abs, False, "largest max-abs / max |reference| over every "
               "sampler step fed the eager run's captured inputs", "sampler steps"),
        Metric("free_run_cosine", cosine, True, "cosine of the sampler's final output with the network converted "
               "(every step through the artifact, no teacher forcing) vs the eager run's", "sampler runs"),
        Metric("free_run_rel_max_abs", rel_max_abs, False, "max-abs / max |reference| of that free-running final "
               "output", "sampler runs"),
        Metric("detection_recall", detection_recall, True, "fraction of reference detections above the score "
               "threshold matched by a same-class detection (IoU and score within tolerance); NaN if there are "
               "none", "detection sets"),
        Metric("detection_worst_iou", detection_worst_iou, True, "lowest IoU among matched detection pairs",
               "detection sets"),
        Metric("detection_extras", detection_extras, False, "candidate detections above the threshold with no "
               "reference partner", "detection sets"),
        Metric("detection_worst_score_err", detection_worst_score_err, False, "largest |score difference| among "
               "matched detection pairs", "detection sets"),
        Metric("litertlm_text_exact", text_exact, True, "1 if the LiteRT-LM runtime's greedy text (its own "
               "tokenizer and sampler, top-k 1) is the expected greedy tokens decoded, else 0", "runtime text"),
        Metric("rgb_std_deviation", rgb_std_deviation, False, "|std of the candidate's RGB values / the "
               "reference's - 1|: colour spread lost or gained (cosine barely sees a uniform desaturation)", "colours"),
        Metric("chroma_deviation", chroma_deviation, False, "|mean chroma (max-min of R,G,B) of the candidate / "
               "the reference's - 1|: saturation lost or gained", "colours"),
        Metric("gpu_resident", gpu_resident, True, "1 if the GPU delegate took every op GPU-only, 0 if not "
               "(NaN: not run)", "a GPU check"),
        Metric("gpu_checked", gpu_checked, True, "1 if the LiteRT GPU check ran to a verdict, 0 if it could not "
               "run (required under ZOO_REQUIRE_GPU_CHECK=1)", "a GPU check"),
        Metric("gpu_fp32_rel_err", rel_max_abs, False, "GPU (enforced fp32) vs CPU interpreter: max-abs / max |CPU|"),
        Metric("gpu_fp16_rel_err", rel_max_abs, False, "GPU computing in fp16 (the phone default) vs CPU "
               "interpreter: max-abs / max |CPU|"),
        Metric("gpu_fp16_cosine", cosine, True, "GPU computing in fp16 vs CPU interpreter: cosine; below "
               f"{GPU_FP16_COSINE_FLOOR} always fails"),
    )
}


@dataclass
class GateResult:
    output: str
    metric: str
    value: float
    threshold: float
    passed: bool

    def describe(self) -> str:
        op = ">=" if METRICS[self.metric].higher_is_better else "<="
        verdict = "pass" if self.passed else "FAIL"
        return f"{self.output}: {self.metric} {self.value:.7g} {op} {self.threshold:g}: {verdict}"


def check_value(metric: str, value: float, threshold: float) -> bool:
    """NaN fails whatever the direction (comparisons with NaN are False)."""
    if METRICS[metric].higher_is_better:
        return bool(value >= threshold)
    return bool(value <= threshold)


def measure(metric: str, candidate, reference) -> float:
    """One metric on one output; a missing or misshapen candidate is NaN (which fails)."""
    if candidate is None:
        return float("nan")
    if isinstance(reference, np.ndarray) and np.shape(candidate) != np.shape(reference):
        return float("nan")
    value = float(METRICS[metric].fn(candidate, reference))
    return value


def evaluate(
    candidates: dict[str, np.ndarray], references: dict[str, np.ndarray], thresholds: dict[str, float]
) -> list[GateResult]:
    """Apply every thresholded metric to every output. A missing output is a failed gate, not a skip."""
    if not thresholds:
        raise ValueError("a gate needs at least one threshold")
    results = []
    for output, reference in references.items():
        candidate = candidates.get(output)
        for metric, threshold in thresholds.items():
            if metric not in METRICS:
                raise KeyError(f"unknown gate metric '{metric}'; known: {', '.join(METRICS)}")
            value = measure(metric, candidate, reference)
            results.append(GateResult(output, metric, value, float(threshold), check_value(metric, value, threshold)))
    return results


def evaluate_slices(candidates: dict[str, np.ndarray], references: dict[str, np.ndarray],
                    slices: dict[str, dict[str, tuple[int, int]]], thresholds: dict[str, float]) -> list[GateResult]:
    """The array thresholds on named channel ranges of the last axis, one result per (output, slice, metric):
    an output that packs several quantities (a Gaussian decoder's positions, colours, scales...) is gated on
    each, so a wrong small slice cannot hide in the whole output's cosine. `slices`: output -> {name: (start,
    stop)}; a candidate with the wrong shape fails every slice (NaN)."""
    results = []
    for output, named in slices.items():
        reference, candidate = np.asarray(references[output]), candidates.get(output)
        if candidate is not None and np.shape(candidate) != reference.shape:
            candidate = None
        for name, (start, stop) in named.items():
            ref = reference[..., start:stop]
            cand = None if candidate is None else np.asarray(candidate)[..., start:stop]
            for metric, threshold in thresholds.items():
                if METRICS[metric].compares != "arrays":
                    continue
                value = measure(metric, cand, ref)
                results.append(GateResult(f"{output}[{name}]", metric, value, float(threshold),
                                          check_value(metric, value, threshold)))
    return results


def json_number(x) -> float:
    """A number from a GPU-check JSON field ("nan"/"inf" strings included); anything else is NaN."""
    if isinstance(x, (int, float)):
        return float(x)
    return float(x) if x in ("nan", "inf", "-inf") else float("nan")


def gpu_gates(check: dict, precision: str, policy: "GpuPolicy") -> list[GateResult]:
    """Gates from a LiteRT GPU check under a model's GPU policy for this precision.

    - `policy.require_resident`: the delegate must take every op, and every output must match the CPU
      in enforced fp32 (the delegate accepts some graphs it computes wrongly even in fp32, toolchain.md
      §3.2) *and* in fp16 — the GPU's default, what phones run — unless the model declares this
      precision fp32-only on the GPU (`policy.fp32_only`), which the bundle's status then says.
    - fp16, whenever it ran: non-finite output or cosine below GPU_FP16_COSINE_FLOOR fails, always.
    - `policy.require_check` (CI: ZOO_REQUIRE_GPU_CHECK=1): a check that could not run fails.
    A check that could not run is NaN, which never passes.
    """
    results = []
    if policy.require_check:
        value = gpu_checked(check)
        results.append(GateResult("gpu", "gpu_checked", value, 1.0, check_value("gpu_checked", value, 1.0)))
    outputs = [(f"gpu:{sig}/{name}", errors) for sig, outs in (check.get("outputs") or {}).items()
               for name, errors in outs.items()]
    if policy.require_resident:
        value = gpu_resident(check)
        results.append(GateResult("gpu", "gpu_resident", value, 1.0, check_value("gpu_resident", value, 1.0)))
        for label, errors in outputs:
            results.append(_threshold_gate(label, "gpu_fp32_rel_err", errors.get("fp32_rel_err"), policy.fp32_rel_tol))
    if check.get("status") != "accepted" or policy.fp32_only:
        return results
    for label, errors in outputs:
        floor = max(GPU_FP16_COSINE_FLOOR, policy.fp16_min_cosine or 0.0)
        results.append(_threshold_gate(label, "gpu_fp16_cosine", errors.get("fp16_cosine"), floor))
        if policy.require_resident and policy.fp16_rel_tol is not None:
            results.append(_threshold_gate(label, "gpu_fp16_rel_err", errors.get("fp16_rel_err"), policy.fp16_rel_tol))
    return results


def _threshold_gate(label: str, metric: str, raw, threshold: float) -> GateResult:
    value = json_number(raw)
    return GateResult(label, metric, value, float(threshold), check_value(metric, value, threshold))


@dataclass(frozen=True)
class GpuPolicy:
    """What a model asks of the LiteRT GPU delegate at one precision (from its config's `gpu:` block)."""

    check: bool = True
    require_resident: bool = False
    fp32_rel_tol: float = 1e-3
    fp16_rel_tol: float | None = None
    fp16_min_cosine: float | None = None
    fp32_only: str | None = None     # why this precision is only right with enforce_f32 (None: fp16 is gated)
    require_check: bool = False      # ZOO_REQUIRE_GPU_CHECK=1: a check that could not run fails


def worst(results: list[GateResult], metric: str) -> float:
    """Worst value of one metric over outputs/prompts/signatures; NaN if any is NaN."""
    values = [g.value for g in results if g.metric == metric]
    return nan_min(values) if METRICS[metric].higher_is_better else nan_max(values)


def all_passed(results: list[GateResult]) -> bool:
    return bool(results) and all(r.passed for r in results)


def as_dicts(results: list[GateResult]) -> list[dict]:
    return [asdict(r) for r in results]
