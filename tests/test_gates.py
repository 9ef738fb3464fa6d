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


def test_registry_explains_every_metric():
    for metric in gates.METRICS.values():
        assert metric.explains
        if metric.fn is None:  # judged by a dedicated check (GPU, generation): never as an array metric
            with pytest.raises(KeyError):
                gates.evaluate({"y": np.zeros(1)}, {"y": np.zeros(1)}, {metric.name: 1.0})


def test_gpu_gates_fail_when_rejected_not_run_or_wrong():
    accepted = {"status": "accepted", "outputs": {"main": {"y": {"fp32_rel_err": 1e-7}}}}
    assert gates.all_passed(gates.gpu_gates(accepted, "fp32", ["fp32"], 1e-3))
    wrong = {"status": "accepted", "outputs": {"main": {"y": {"fp32_rel_err": 0.6}}}}
    assert not gates.all_passed(gates.gpu_gates(wrong, "fp32", ["fp32"], 1e-3))
    for status in ("rejected", "not_run"):
        assert not gates.all_passed(gates.gpu_gates({"status": status, "outputs": {}}, "fp32", ["fp32"], 1e-3))
    nan = {"status": "accepted", "outputs": {"main": {"y": {"fp32_rel_err": "nan"}}}}
    assert not gates.all_passed(gates.gpu_gates(nan, "fp32", ["fp32"], 1e-3))
    assert gates.gpu_gates({"status": "rejected"}, "fp16", ["fp32"], 1e-3) == []  # not required at fp16
