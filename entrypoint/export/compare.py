"""Whether an export detects what the ``.pt`` detects: the check every export passes before it is published.

Both are run on the same validation images at a low confidence floor. Each image's ``TOP`` most confident
detections of one side must be found in the other's (same class, IoU ≥ ``MIN_IOU``, confidence within
``SCORE_SLACK``), both ways, for at least ``MIN_MATCHED`` of them. An FP16 engine moves boxes by a fraction
of a pixel and scores by a few thousandths, and may swap near-equal boxes at NMS: it passes. A broken export
(wrong preprocessing, wrong output decoding, weights lost) moves nearly every box or finds nothing: it fails.
Pure: the detections come from the child that ran them (export/verify.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

# One detection: class, confidence, x1, y1, x2, y2 (pixels of the original image).
Detection = tuple[int, float, float, float, float, float]

TOP = 20
MIN_IOU = 0.7
SCORE_SLACK = 0.05
MIN_MATCHED = 0.9
CONF_FLOOR = 0.0  # both sides keep every box NMS keeps: a near-tie at the top-20 edge still finds its twin,
# and a barely trained model (scores ~1e-5) is still compared


@dataclass(frozen=True)
class Verdict:
    checked: int  # detections looked for, both ways
    matched: int
    images: int

    @property
    def passed(self) -> bool:
        return self.checked > 0 and self.matched >= MIN_MATCHED * self.checked

    def describe(self) -> str:
        if self.checked == 0:
            return f"no detection on {self.images} validation image(s) from either side: nothing to compare"
        return (
            f"{self.matched}/{self.checked} of the top detections on {self.images} validation image(s)"
            f" matched (IoU ≥ {MIN_IOU}, confidence ± {SCORE_SLACK})"
        )


def iou(a: Detection, b: Detection) -> float:
    width = max(0.0, min(a[4], b[4]) - max(a[2], b[2]))
    height = max(0.0, min(a[5], b[5]) - max(a[3], b[3]))
    inter = width * height
    union = (a[4] - a[2]) * (a[5] - a[3]) + (b[4] - b[2]) * (b[5] - b[3]) - inter
    return inter / union if union > 0 else 0.0


def _twin(wanted: Detection, pool: Sequence[Detection]) -> bool:
    return any(
        other[0] == wanted[0] and abs(other[1] - wanted[1]) <= SCORE_SLACK and iou(wanted, other) >= MIN_IOU
        for other in pool
    )


def _found(side: Sequence[Detection], other: Sequence[Detection]) -> tuple[int, int]:
    top = sorted(side, key=lambda det: det[1], reverse=True)[:TOP]
    return len(top), sum(_twin(det, other) for det in top)


def compare(reference: Sequence[Sequence[Detection]], candidate: Sequence[Sequence[Detection]]) -> Verdict:
    """``reference`` (the .pt) and ``candidate`` (the export): per image, the detections at ``CONF_FLOOR``."""
    if len(reference) != len(candidate):
        raise ValueError(f"{len(reference)} reference images against {len(candidate)} checked")
    checked = matched = 0
    for ours, theirs in zip(reference, candidate, strict=True):
        for side, other in ((ours, theirs), (theirs, ours)):
            looked, found = _found(side, other)
            checked, matched = checked + looked, matched + found
    return Verdict(checked, matched, len(reference))
