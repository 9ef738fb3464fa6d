"""Each metric and gate, with its negative control: a broken candidate must fail."""

import numpy as np
import pytest

from zoo import gates


@pytest.fixture
def reference():
    return {"y": np.random.default_rng(0).standard_normal((2, 64)).astype(np.float32)}


def test_identical_outputs_pass_every_metric(reference):
    results = gates.evaluate(reference, reference, {"cosine": 0.999999, "psnr": 100, "max_abs": 0.0, "rel_max_abs": 0.0})
    assert gates.all_passed(results), [r.describe() for r in results]


@pytest.mark.parametrize("metric,threshold", [("cosine", 0.999), ("psnr", 30.0), ("max_abs", 0.1), ("rel_max_abs", 0.05)])
def test_each_metric_fails_on_a_perturbed_output(reference, metric, threshold):
    noisy = {"y": reference["y"] + 0.5 * np.random.default_rng(1).standard_normal(reference["y"].shape).astype(np.float32)}
    assert gates.all_passed(gates.evaluate(reference, reference, {metric: threshold}))
    assert not gates.all_passed(gates.evaluate(noisy, reference, {metric: threshold}))


@pytest.mark.parametrize("metric,threshold", [("cosine", 0.0), ("psnr", -100.0), ("max_abs", 1e30), ("rel_max_abs", 1e30)])
def test_nan_never_passes_even_a_lax_threshold(reference, metric, threshold):
    broken = {"y": reference["y"].copy()}
    broken["y"][0, 0] = np.nan
    assert not gates.all_passed(gates.evaluate(broken, reference, {metric: threshold}))


def test_missing_or_misshapen_output_fails(reference):
    assert not gates.all_passed(gates.evaluate({}, reference, {"cosine": 0.0}))
    assert not gates.all_passed(gates.evaluate({"y": reference["y"][:1]}, reference, {"cosine": 0.0}))


def test_sign_flip_fails_cosine(reference):
    assert gates.cosine(-reference["y"], reference["y"]) == pytest.approx(-1.0)


def test_gate_needs_known_metric_and_a_threshold(reference):
    with pytest.raises(KeyError):
        gates.evaluate(reference, reference, {"nope": 1.0})
    with pytest.raises(ValueError):
        gates.evaluate(reference, reference, {})


def test_registry_explains_and_computes_every_metric():
    for metric in gates.METRICS.values():
        assert metric.explains and callable(metric.fn), metric.name  # no metric judged "elsewhere"


def test_runtime_text_gate_passes_only_identical_text():
    """litertlm_text_exact: a runtime's greedy text vs the expected tokens decoded; None (no text) fails."""
    ok = gates.evaluate({"p": " G, H, I"}, {"p": " G, H, I"}, {"litertlm_text_exact": 1.0})
    assert gates.all_passed(ok)
    for wrong in (" G, H, J", " G, H, I,", None):
        assert not gates.all_passed(gates.evaluate({"p": wrong}, {"p": " G, H, I"}, {"litertlm_text_exact": 1.0}))
    assert not gates.all_passed(gates.evaluate({}, {"p": " G"}, {"litertlm_text_exact": 1.0}))  # missing output


# ---------------------------------------------------------------- GPU gates


def policy(**kw):
    return gates.GpuPolicy(**{"require_resident": True, "fp32_rel_tol": 1e-3, "fp16_rel_tol": 0.05, **kw})


def check(status="accepted", fp32=1e-7, fp16=1e-3, fp16_cos=0.9999):
    return {"status": status, "outputs": {"main": {"y": {"fp32_rel_err": fp32, "fp16_rel_err": fp16,
                                                         "fp16_cosine": fp16_cos}}}}


def test_gpu_gates_fail_when_rejected_not_run_or_wrong():
    assert gates.all_passed(gates.gpu_gates(check(), "fp32", policy()))
    assert not gates.all_passed(gates.gpu_gates(check(fp32=0.6), "fp32", policy()))
    for status in ("rejected", "not_run"):
        assert not gates.all_passed(gates.gpu_gates({"status": status, "outputs": {}}, "fp32", policy()))
    assert not gates.all_passed(gates.gpu_gates(check(fp32="nan"), "fp32", policy()))
    assert gates.gpu_gates({"status": "rejected"}, "fp16", policy(require_resident=False)) == []


def test_gpu_fp16_run_decides_the_verdict():
    """Defect: a model whose fp16 GPU output was all zeros (cosine 0) got `accepted` and passed."""
    zeros = check(fp16=1.0, fp16_cos=0.0)
    assert not gates.all_passed(gates.gpu_gates(zeros, "fp32", policy()))
    # ... even where residency is not required: below the cosine floor or non-finite always fails
    assert not gates.all_passed(gates.gpu_gates(zeros, "int8", policy(require_resident=False)))
    assert not gates.all_passed(gates.gpu_gates(check(fp16="nan", fp16_cos="nan"), "fp32", policy()))
    # the model's fp16 tolerance is a gate of its own
    assert not gates.all_passed(gates.gpu_gates(check(fp16=0.2), "fp32", policy()))
    assert gates.all_passed(gates.gpu_gates(check(fp16=0.2), "fp32", policy(fp16_rel_tol=0.3)))
    # a model declared fp32-only on the GPU is not judged on fp16 (its status says so instead)
    assert gates.all_passed(gates.gpu_gates(zeros, "fp32", policy(fp32_only="overflows fp16")))


def test_gpu_check_that_did_not_run_fails_when_required():
    not_run = {"status": "not_run", "reason": "no adapter", "outputs": {}}
    lax = policy(require_resident=False)
    assert gates.gpu_gates(not_run, "fp16", lax) == []  # visible in the status note, not a gate...
    required = gates.gpu_gates(not_run, "fp16", gates.GpuPolicy(require_check=True))
    assert required and not gates.all_passed(required)  # ...unless CI requires the check (ZOO_REQUIRE_GPU_CHECK=1)
    assert gates.all_passed(gates.gpu_gates(check(), "fp16", gates.GpuPolicy(require_check=True)))


# ---------------------------------------------------------------- token streams


class Stream:
    def __init__(self, tokens, logits, prompt=(1, 2)):
        self.prompt_ids, self.tokens, self.logits = list(prompt), list(tokens), list(logits)


def onehot_logits(tokens, margin=1.0):
    out = []
    for t in tokens:
        lg = np.zeros(8, np.float32)
        lg[t], lg[(t + 1) % 8] = 1.0 + margin, 1.0
        out.append(lg)
    return out


@pytest.fixture
def reference_stream():
    tokens = [3, 4, 5, 6, 7, 0, 1, 2] * 2
    return Stream(tokens, onehot_logits(tokens))


def token_gates(candidate, reference, thresholds):
    return gates.evaluate({"p": candidate}, {"p": reference}, thresholds)


def test_token_metrics_pass_an_identical_stream(reference_stream):
    thresholds = {"token_exact": 1.0, "token_agreement": 1.0, "min_logits_cosine": 0.9999}
    assert gates.all_passed(token_gates(reference_stream, reference_stream, thresholds))


def test_token_metrics_fail_a_diverging_stream(reference_stream):
    tokens = reference_stream.tokens[:4] + [(t + 3) % 8 for t in reference_stream.tokens[4:]]
    wrong = Stream(tokens, onehot_logits(tokens))
    for metric, threshold in (("token_exact", 1.0), ("token_agreement", 0.5), ("min_logits_cosine", 0.999)):
        assert gates.all_passed(token_gates(reference_stream, reference_stream, {metric: threshold}))
        assert not gates.all_passed(token_gates(wrong, reference_stream, {metric: threshold})), metric


def test_nan_from_token_12_fails_every_token_metric(reference_stream):
    """Defect: a bundle NaN from token 12 had agreement 0.75 and min cosine of the finite steps (Python's
    min skips a NaN that is not first), so it passed the int8/bf16/fp16 gates."""
    logits = [lg.copy() for lg in reference_stream.logits]
    for lg in logits[12:]:
        lg[:] = np.nan
    tokens = reference_stream.tokens[:12] + [0] * 4  # argmax of NaN logits
    broken = Stream(tokens, logits)
    for metric in ("token_exact", "token_agreement", "min_logits_cosine"):
        [result] = token_gates(broken, reference_stream, {metric: 0.0})  # even the laxest threshold
        assert result.value != result.value and not result.passed, (metric, result)
    assert min([0.999, float("nan"), 0.5]) == 0.5 and gates.nan_min([0.999, float("nan"), 0.5]) != gates.nan_min([0.5])


def test_worst_shows_nan():
    results = [gates.GateResult("a", "cosine", 0.999, 0.9, True), gates.GateResult("b", "cosine", float("nan"), 0.9, False)]
    assert gates.worst(results, "cosine") != gates.worst(results, "cosine")
    from zoo.console import worst_per_metric

    assert "nan" in worst_per_metric(results)[0]


def test_one_rule_for_zeros_nan_and_shapes_in_every_array_metric():
    """The GPU check (litert_gpu._errors) and the gates once disagreed: two all-zero outputs were cosine 1
    there and NaN here. Now both are the gate functions; each edge case below has one answer."""
    from zoo.targets.litert_gpu import _errors

    zeros, ones = np.zeros(4), np.ones(4)
    assert gates.cosine(zeros, zeros) == 1.0 and gates.rel_max_abs(zeros, zeros) == 0.0
    assert gates.cosine(zeros, ones) == 0.0 and gates.cosine(ones, zeros) == 0.0
    assert gates.rel_max_abs(ones, zeros) == float("inf")
    for bad in (np.array([1.0, np.nan, 1.0, 1.0]),):
        assert np.isnan(gates.cosine(bad, ones)) and np.isnan(gates.cosine(ones, bad))  # NaN on either side
        assert np.isnan(gates.max_abs(bad, ones)) and np.isnan(gates.rel_max_abs(bad, ones))
    assert np.isnan(gates.cosine(np.ones(3), ones)) and np.isnan(gates.max_abs(np.ones(3), ones))
    for ref, got in ((zeros, zeros), (ones, zeros), (ones, np.array([1.0, np.nan, 1.0, 1.0])), (ones, ones * 2)):
        expected = (gates.max_abs(got, ref), gates.rel_max_abs(got, ref), gates.cosine(got, ref))
        assert np.array_equal(np.array(_errors(ref, got)), np.array(expected), equal_nan=True)


def test_gpu_fp16_token_gate_is_never_stricter_than_the_precisions_own():
    from zoo.targets.litert import no_stricter_than

    gpu = {"token_agreement": 0.75, "min_logits_cosine": 0.99}
    assert no_stricter_than(gpu, {"token_agreement": 0.5, "min_logits_cosine": 0.9}) == \
        {"token_agreement": 0.5, "min_logits_cosine": 0.9}                                      # int8: its own
    assert no_stricter_than(gpu, {"token_exact": 1, "min_logits_cosine": 0.9999}) == gpu      # fp32: unchanged
