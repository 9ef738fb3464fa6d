"""Metric registry and gate evaluation: does the converted artifact match its reference?

Each metric is a plain function of (candidate, reference) arrays with a one-line explanation and a
direction, so a gate table reads like a sentence: "cosine 0.999998 >= 0.9999: pass". Thresholds live
in each model's config, per precision; `evaluate` turns them into results for the report.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Callable

import numpy as np


@dataclass(frozen=True)
class Metric:
    name: str
    fn: Callable[[np.ndarray, np.ndarray], float] | None
    higher_is_better: bool
    explains: str


def _as64(x) -> np.ndarray:
    return np.asarray(x, dtype=np.float64).ravel()


def cosine(candidate, reference) -> float:
    a, b = _as64(candidate), _as64(reference)
    denom = np.linalg.norm(a) * np.linalg.norm(b)
    if not np.all(np.isfinite(a)) or denom == 0.0:
        return float("nan")  # NaN never passes a gate
    return float(a @ b / denom)


def max_abs(candidate, reference) -> float:
    a, b = _as64(candidate), _as64(reference)
    return float(np.max(np.abs(a - b))) if np.all(np.isfinite(a)) else float("inf")


def rel_max_abs(candidate, reference) -> float:
    peak = float(np.max(np.abs(_as64(reference))))
    return max_abs(candidate, reference) / peak if peak > 0 else max_abs(candidate, reference)


def psnr(candidate, reference) -> float:
    a, b = _as64(candidate), _as64(reference)
    if not np.all(np.isfinite(a)):
        return float("-inf")
    mse = float(np.mean((a - b) ** 2))
    peak = float(b.max() - b.min())
    if mse == 0.0:
        return float("inf")
    return 10.0 * np.log10(peak**2 / mse) if peak > 0 else float("-inf")


METRICS: dict[str, Metric] = {
    m.name: m
    for m in (
        Metric("cosine", cosine, True, "cosine similarity of the flattened outputs; 1.0 means same direction"),
        Metric("psnr", psnr, True, "peak signal-to-noise ratio in dB, peak = reference max - min"),
        Metric("max_abs", max_abs, False, "largest absolute elementwise difference"),
        Metric("rel_max_abs", rel_max_abs, False, "largest absolute difference divided by max |reference|"),
        # Judged by the LiteRT GPU check (zoo/targets/litert_gpu.py), not computed from two arrays here:
        Metric("gpu_resident", None, True, "1 if the GPU delegate took every op GPU-only, 0 if not (NaN: not run)"),
        Metric("gpu_fp32_rel_err", None, False, "GPU (enforced fp32) vs CPU interpreter: max-abs / max |CPU|"),
        # Judged by greedy generation on the artifact (models/gqa_llm/generation.py):
        Metric("token_exact", None, True, "1 if the greedy tokens equal the reference's, or first differ at a "
                                          "knife-edge tie (reference top-2 margin < 0.1); else 0"),
        Metric("token_agreement", None, True, "fraction of generated tokens equal to the reference before the "
                                              "first divergence"),
        Metric("min_logits_cosine", None, True, "lowest per-step logits cosine vs the reference while both "
                                                "streams share the same context"),
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
            if metric not in METRICS or METRICS[metric].fn is None:
                raise KeyError(f"unknown gate metric '{metric}'; known: {', '.join(METRICS)}")
            if candidate is None or np.shape(candidate) != np.shape(reference):
                value = float("nan")
            else:
                value = METRICS[metric].fn(candidate, reference)
            results.append(GateResult(output, metric, value, float(threshold), check_value(metric, value, threshold)))
    return results


def gpu_gates(check: dict, precision: str, require_resident: list[str], fp32_rel_tol: float) -> list[GateResult]:
    """Gates from a GPU check, for precisions whose bundles must run on the GPU.

    Residency and fp32 agreement are both required: the delegate accepts some graphs it then computes
    wrongly even in fp32 (toolchain.md §3.2). A check that could not run is NaN, which never passes.
    """
    if precision not in require_resident:
        return []
    status = check["status"]
    resident = {"accepted": 1.0, "rejected": 0.0}.get(status, float("nan"))
    results = [GateResult("gpu", "gpu_resident", resident, 1.0, check_value("gpu_resident", resident, 1.0))]
    for signature, outputs in (check.get("outputs") or {}).items():
        for name, errors in outputs.items():
            err = errors.get("fp32_rel_err")
            value = float(err) if isinstance(err, (int, float)) or err in ("nan", "inf") else float("nan")
            results.append(GateResult(f"gpu:{signature}/{name}", "gpu_fp32_rel_err", value, fp32_rel_tol,
                                      check_value("gpu_fp32_rel_err", value, fp32_rel_tol)))
    return results


def all_passed(results: list[GateResult]) -> bool:
    return bool(results) and all(r.passed for r in results)


def as_dicts(results: list[GateResult]) -> list[dict]:
    return [asdict(r) for r in results]
