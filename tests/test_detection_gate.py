"""The set-based detection gate (zoo/detection.py + the detection_* metrics in zoo/gates.py): decoding like
upstream rfdetr's PostProcess, matching as sets, and negative controls that must fail."""

from __future__ import annotations

import numpy as np
import pytest

from zoo import gates
from zoo.detection import Detections, box_iou, decode_detections, match_detections, merge_reports

SETTINGS = dict(score_threshold=0.5, iou_min=0.75, score_tol=0.02)


def detections(boxes, scores, labels) -> Detections:
    return Detections(np.asarray(boxes, float), np.asarray(scores, float), np.asarray(labels, int))


REFERENCE = detections([[10, 10, 50, 50], [60, 60, 100, 120], [0, 0, 5, 5]], [0.9, 0.7, 0.3], [1, 2, 1])


def gate_values(report: dict) -> dict:
    return {m: gates.METRICS[m].fn(report) for m in
            ("detection_recall", "detection_worst_iou", "detection_extras", "detection_worst_score_err")}


def test_identical_sets_pass_with_perfect_values():
    values = gate_values(match_detections(REFERENCE, REFERENCE, **SETTINGS))
    assert values == {"detection_recall": 1.0, "detection_worst_iou": 1.0, "detection_extras": 0.0,
                      "detection_worst_score_err": 0.0}


def test_order_does_not_matter_and_threshold_straddlers_are_not_misses():
    """A set gate: permuted candidates match; a reference detection at 0.505 whose partner scores 0.495 is
    matched (rounding moved it across the threshold), not a miss plus an extra."""
    reference = detections([[10, 10, 50, 50], [60, 60, 100, 120]], [0.505, 0.9], [1, 2])
    candidate = detections([[60, 60, 100, 120], [10, 10, 50, 50]], [0.9, 0.495], [2, 1])
    report = match_detections(candidate, reference, **SETTINGS)
    assert report["matched"] == 2 and report["misses"] == 0 and report["extras"] == 0


@pytest.mark.parametrize("broken, failing_metric", [
    (detections([[10, 10, 50, 50], [60, 60, 100, 120]], [0.9, 0.7], [1, 3]), "detection_recall"),      # wrong class
    (detections([[20, 20, 60, 60], [60, 60, 100, 120]], [0.9, 0.7], [1, 2]), "detection_recall"),      # box moved
    (detections([[10, 10, 50, 50], [60, 60, 100, 120]], [0.9, 0.6], [1, 2]), "detection_recall"),      # score off
    (detections([[10, 10, 50, 50], [60, 60, 100, 120], [200, 200, 220, 230]], [0.9, 0.7, 0.8], [1, 2, 4]),
     "detection_extras"),                                                                               # extra box
    (detections([[10, 10, 50, np.nan], [60, 60, 100, 120]], [0.9, 0.7], [1, 2]), "detection_recall"),  # NaN
])
def test_negative_controls_fail_their_gate(broken, failing_metric):
    thresholds = {"detection_recall": 1.0, "detection_extras": 0.0, "detection_worst_iou": 0.99}
    values = gate_values(match_detections(broken, REFERENCE, **SETTINGS))
    assert not gates.check_value(failing_metric, values[failing_metric], thresholds[failing_metric])


def test_a_gate_with_nothing_to_compare_does_not_pass():
    empty = detections(np.zeros((0, 4)), [], [])
    value = gates.detection_recall(match_detections(REFERENCE, empty, **SETTINGS))
    assert value != value and not gates.check_value("detection_recall", value, 1.0)


def test_merge_keeps_worst_over_images_and_poisons_on_nan():
    good = match_detections(REFERENCE, REFERENCE, **SETTINGS)
    shifted = detections([[11, 10, 51, 50], [60, 60, 100, 120]], [0.9, 0.7], [1, 2])
    slightly = match_detections(shifted, REFERENCE, **SETTINGS)
    merged = merge_reports([good, slightly])
    assert merged["required"] == 4 and merged["matched"] == 4 and merged["worst_iou"] == slightly["worst_iou"] < 1
    nan = match_detections(detections([[0, 0, np.nan, 1]], [0.9], [1]), REFERENCE, **SETTINGS)
    assert merge_reports([good, nan])["matched"] != merge_reports([good, nan])["matched"]


def test_decode_is_upstreams_postprocess():
    """sigmoid over (query, class), best first with ties by flat index, cxcywh → pixel xyxy clamped."""
    boxes = np.array([[0.5, 0.5, 0.2, 0.4], [0.95, 0.1, 0.3, 0.3]])
    logits = np.array([[0.0, 2.0], [3.0, 0.0]])
    out = decode_detections(boxes, logits, image_hw=(100, 200), num_select=3)
    assert out.labels.tolist() == [0, 1, 0] and out.scores[0] == pytest.approx(1 / (1 + np.exp(-3.0)))
    assert out.boxes[0].tolist() == pytest.approx([160.0, 0.0, 200.0, 25.0])   # clamped to the image
    assert out.boxes[1].tolist() == pytest.approx([80.0, 30.0, 120.0, 70.0])


def test_box_iou():
    assert box_iou([[0, 0, 2, 2]], [[1, 1, 3, 3], [0, 0, 2, 2], [5, 5, 6, 6]])[0].tolist() == \
        pytest.approx([1 / 7, 1.0, 0.0])


def test_a_full_cap_is_a_boundary_like_the_threshold():
    """Decoded with num_select=3 and all three above the threshold: the reference's 3rd (score 0.80, at its
    floor) may be replaced by a near-tied 4th in the candidate without a miss or an extra — but a confident
    detection well above the floor still must match."""
    reference = detections([[0, 0, 10, 10], [20, 20, 30, 30], [40, 40, 50, 50]], [0.95, 0.90, 0.80], [1, 1, 1])
    swapped = detections([[0, 0, 10, 10], [20, 20, 30, 30], [60, 60, 70, 70]], [0.95, 0.90, 0.805], [1, 1, 1])
    report = match_detections(swapped, reference, **SETTINGS, num_select=3)
    assert report["misses"] == 0 and report["extras"] == 0 and report["required"] == 2
    broken = detections([[0, 0, 10, 10], [25, 25, 35, 35], [60, 60, 70, 70]], [0.95, 0.90, 0.805], [1, 1, 1])
    assert match_detections(broken, reference, **SETTINGS, num_select=3)["misses"] == 1
    assert match_detections(swapped, reference, **SETTINGS)["misses"] == 1   # without the cap rule: a miss
