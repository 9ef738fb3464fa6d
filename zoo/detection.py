"""Object detections on the host: decoding a detector's raw outputs, and matching two sets of detections.

Shared by every detector and by both sides of a gate: the reference module's outputs and the saved
artifact's outputs go through the same `decode_detections`, so a gate compares detections, not two
different post-processings. `match_detections` is the set-based comparison the detection gate metrics
in zoo/gates.py read (`detection_recall`, `detection_worst_iou`, `detection_extras`,
`detection_worst_score_err`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Detections:
    boxes: np.ndarray    # [N, 4] xyxy in pixels of the original image
    scores: np.ndarray   # [N]
    labels: np.ndarray   # [N] int

    def above(self, threshold: float) -> "Detections":
        keep = self.scores > threshold
        return Detections(self.boxes[keep], self.scores[keep], self.labels[keep])

    def __len__(self) -> int:
        return len(self.scores)

    def as_dicts(self) -> list[dict]:
        return [{"box": [round(float(v), 2) for v in b], "score": round(float(s), 4), "label": int(c)}
                for b, s, c in zip(self.boxes, self.scores, self.labels)]


def sigmoid(x: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-x))


def cxcywh_to_xyxy(boxes: np.ndarray) -> np.ndarray:
    cx, cy, w, h = np.moveaxis(boxes, -1, 0)
    return np.stack([cx - 0.5 * w, cy - 0.5 * h, cx + 0.5 * w, cy + 0.5 * h], -1)


def decode_detections(boxes_cxcywh: np.ndarray, logits: np.ndarray, image_hw: tuple[int, int],
                      num_select: int = 300) -> Detections:
    """DETR-style post-processing for one image (upstream rfdetr PostProcess): sigmoid scores over every
    (query, class) pair, the `num_select` best (descending score, ties by ascending flat index), boxes from
    normalised cxcywh to pixel xyxy clamped to the image. boxes [Q, 4] or [1, Q, 4]; logits [Q, C] or [1, Q, C]."""
    boxes_cxcywh = np.asarray(boxes_cxcywh, dtype=np.float64).reshape(-1, 4)
    logits = np.asarray(logits, dtype=np.float64)
    classes = logits.shape[-1]
    scores = sigmoid(logits.reshape(-1, classes)).ravel()
    order = np.argsort(-scores, kind="stable")[: min(num_select, scores.size)]
    queries, labels = order // classes, order % classes
    height, width = image_hw
    scale = np.array([width, height, width, height], dtype=np.float64)
    boxes = np.clip(cxcywh_to_xyxy(boxes_cxcywh[queries]) * scale, 0.0, scale)
    return Detections(boxes, scores[order], labels.astype(np.int64))


def box_iou(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """[N, 4] × [M, 4] xyxy → [N, M] intersection over union (0 where both boxes are empty)."""
    a, b = np.asarray(a, dtype=np.float64).reshape(-1, 4), np.asarray(b, dtype=np.float64).reshape(-1, 4)
    lt = np.maximum(a[:, None, :2], b[None, :, :2])
    rb = np.minimum(a[:, None, 2:], b[None, :, 2:])
    inter = np.prod(np.clip(rb - lt, 0.0, None), -1)
    area = lambda x: np.prod(np.clip(x[:, 2:] - x[:, :2], 0.0, None), -1)  # noqa: E731
    union = area(a)[:, None] + area(b)[None, :] - inter
    return np.where(union > 0, inter / np.where(union > 0, union, 1.0), 0.0)


def capped_floor(detections: Detections, num_select: int | None) -> float:
    """The lowest kept score when decoding stopped at `num_select` (else -inf): past the cap, a detection was
    dropped for its rank, not its score, so near the cap rank — like near the threshold — rounding decides."""
    if num_select is None or len(detections) < num_select:
        return float("-inf")
    return float(detections.scores.min())


def match_detections(candidate: Detections, reference: Detections, score_threshold: float, iou_min: float,
                     score_tol: float, num_select: int | None = None) -> dict:
    """Set-based comparison. Every reference detection scoring above `score_threshold` needs a partner in the
    candidate: same class, IoU ≥ `iou_min`, |score difference| ≤ `score_tol` (greedy, highest reference score
    first, each candidate used once). Candidates may score down to `score_threshold - score_tol` and still
    partner (a detection on the threshold is not a miss because rounding moved it across). A candidate above
    `score_threshold` with no partner among the reference detections above `score_threshold - score_tol` is an
    extra. A non-finite candidate score or box makes the whole report NaN.

    `num_select`: the cap the detections were decoded with. Where a set filled it, its lowest kept score is a
    second boundary: reference detections within `score_tol` of the reference's floor are not required, and
    candidates within `score_tol` of the candidate's floor are not extras (with random weights the top 300 of
    Q×C scores are all tail values packed within 1e-4 of each other; trained detectors rarely fill the cap
    above the threshold).

    Returns {required, matched, misses, extras, worst_iou, worst_score_err, effective_threshold, pairs}.
    """
    if not (np.all(np.isfinite(candidate.scores)) and np.all(np.isfinite(candidate.boxes))):
        nan = float("nan")
        return {"required": len(reference.above(score_threshold)), "matched": nan, "misses": nan, "extras": nan,
                "worst_iou": nan, "worst_score_err": nan, "pairs": []}
    required_above = max(score_threshold, capped_floor(reference, num_select) + score_tol)
    extra_above = max(score_threshold, capped_floor(candidate, num_select) + score_tol)
    required = reference.above(required_above)
    pool = candidate.above(score_threshold - score_tol)
    used = np.zeros(len(pool), dtype=bool)
    ious = box_iou(required.boxes, pool.boxes)
    pairs, misses = [], 0
    for i in np.argsort(-required.scores, kind="stable"):
        eligible = (~used) & (pool.labels == required.labels[i]) \
            & (np.abs(pool.scores - required.scores[i]) <= score_tol) & (ious[i] >= iou_min)
        if not eligible.any():
            misses += 1
            continue
        j = int(np.argmax(np.where(eligible, ious[i], -1.0)))
        used[j] = True
        pairs.append((int(i), j, float(ious[i, j]), float(abs(pool.scores[j] - required.scores[i]))))
    partners = reference.above(score_threshold - score_tol)
    extras = 0
    for j in np.flatnonzero((pool.scores > extra_above) & ~used):
        same = (partners.labels == pool.labels[j]) & (np.abs(partners.scores - pool.scores[j]) <= score_tol)
        if not (same & (box_iou(pool.boxes[j], partners.boxes)[0] >= iou_min)).any():
            extras += 1
    return {
        "required": len(required), "matched": len(pairs), "misses": misses, "extras": extras,
        "worst_iou": min((p[2] for p in pairs), default=float("nan")),
        "worst_score_err": max((p[3] for p in pairs), default=float("nan")),
        "effective_threshold": required_above, "pairs": pairs,
    }


def merge_reports(reports: list[dict]) -> dict:
    """One report over several images: counts add up, worst values are the worst over the images that had
    pairs. Any NaN count (a non-finite candidate) makes the merged report NaN."""
    broken = any(r["matched"] != r["matched"] for r in reports)
    nan = float("nan")
    total = lambda key: nan if broken else sum(r[key] for r in reports)  # noqa: E731
    paired = [r for r in reports if not broken and r["matched"] > 0]
    return {"required": sum(r["required"] for r in reports), "matched": total("matched"),
            "misses": total("misses"), "extras": total("extras"),
            "worst_iou": min((r["worst_iou"] for r in paired), default=nan),
            "worst_score_err": max((r["worst_score_err"] for r in paired), default=nan),
            "images": len(reports)}
