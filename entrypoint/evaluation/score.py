"""Per-class AP and the confusion matrix from libreyolo's COCO-format predictions and the split's YOLO labels.

libreyolo's validator reports the overall mAP only (``libreyolo val --json``); what it lacks is computed here, in
pure Python, the way pycocotools' COCOeval computes it (bbox, area "all", at most ``MAX_DETS`` detections per
image and class, IoU 0.50:0.95 in steps of 0.05, 101 recall points): the mean of the classes' AP is libreyolo's
mAP50-95. The confusion matrix matches boxes regardless of class (IoU ≥ ``MATRIX_IOU``, confidence ≥
``MATRIX_CONF``, best IoU first), as libreyolo's own plot does; precision and recall are read from it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

Box = tuple[float, float, float, float]  # x1, y1, x2, y2 in pixels

IOUS = tuple(round(0.5 + 0.05 * step, 2) for step in range(10))
RECALLS = tuple(step / 100 for step in range(101))
MAX_DETS = 100
MATRIX_IOU = 0.5
MATRIX_CONF = 0.25


@dataclass(frozen=True)
class Truth:
    cls: int
    box: Box


@dataclass(frozen=True)
class Guess:
    cls: int
    score: float
    box: Box


@dataclass(frozen=True)
class ClassScore:
    ap50_95: float | None  # None: no instance of the class in the split
    ap50: float | None
    instances: int


@dataclass(frozen=True)
class Scores:
    per_class: tuple[ClassScore, ...]
    matrix: tuple[tuple[int, ...], ...]  # [predicted][true], the last row and column: background
    precision: float
    recall: float

    @property
    def map50_95(self) -> float:
        return _mean([score.ap50_95 for score in self.per_class if score.ap50_95 is not None])

    @property
    def map50(self) -> float:
        return _mean([score.ap50 for score in self.per_class if score.ap50 is not None])


def iou(a: Box, b: Box) -> float:
    inter = max(0.0, min(a[2], b[2]) - max(a[0], b[0])) * max(0.0, min(a[3], b[3]) - max(a[1], b[1]))
    union = (a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - inter
    return inter / union if union > 0 else 0.0


def score(truths: Sequence[Sequence[Truth]], guesses: Sequence[Sequence[Guess]], classes: int) -> Scores:
    """``truths`` and ``guesses`` per image, in the same order."""
    if len(truths) != len(guesses):
        raise ValueError(f"{len(truths)} labelled images against {len(guesses)} predicted")
    per_class = tuple(_class_ap(truths, guesses, cls) for cls in range(classes))
    matrix = confusion(truths, guesses, classes)
    predicted = sum(sum(row) for row in matrix[:classes])
    true_positives = sum(matrix[cls][cls] for cls in range(classes))
    instances = sum(score.instances for score in per_class)
    return Scores(
        per_class=per_class,
        matrix=matrix,
        precision=true_positives / predicted if predicted else 0.0,
        recall=true_positives / instances if instances else 0.0,
    )


def _class_ap(truths: Sequence[Sequence[Truth]], guesses: Sequence[Sequence[Guess]], cls: int) -> ClassScore:
    instances = sum(1 for image in truths for truth in image if truth.cls == cls)
    # Per IoU threshold: every kept detection's (score, true positive), over all images.
    marked: list[list[tuple[float, bool]]] = [[] for _ in IOUS]
    for image_truths, image_guesses in zip(truths, guesses, strict=True):
        boxes = [truth.box for truth in image_truths if truth.cls == cls]
        mine = sorted((g for g in image_guesses if g.cls == cls), key=lambda g: -g.score)[:MAX_DETS]
        overlaps = [[iou(guess.box, box) for box in boxes] for guess in mine]
        for step, threshold in enumerate(IOUS):
            taken: set[int] = set()
            for guess, row in zip(mine, overlaps, strict=True):
                best, found = min(threshold, 1 - 1e-10), -1
                for index, overlap in enumerate(row):
                    if index not in taken and overlap >= best:
                        best, found = overlap, index
                if found >= 0:
                    taken.add(found)
                marked[step].append((guess.score, found >= 0))
    if instances == 0:
        return ClassScore(None, None, 0)
    aps = [_average_precision(rows, instances) for rows in marked]
    return ClassScore(ap50_95=_mean(aps), ap50=aps[0], instances=instances)


def _average_precision(rows: list[tuple[float, bool]], instances: int) -> float:
    """COCOeval's: precision made non-increasing, read at 101 recall points (0 past the last recall reached)."""
    rows = sorted(rows, key=lambda row: -row[0])  # stable, as COCOeval's mergesort
    precision: list[float] = []
    recall: list[float] = []
    hits = 0
    for count, (_, hit) in enumerate(rows, start=1):
        hits += hit
        precision.append(hits / count)
        recall.append(hits / instances)
    for index in range(len(precision) - 2, -1, -1):
        precision[index] = max(precision[index], precision[index + 1])
    total, position = 0.0, 0
    for point in RECALLS:
        while position < len(recall) and recall[position] < point:
            position += 1
        if position >= len(recall):
            break
        total += precision[position]
    return total / len(RECALLS)


def confusion(
    truths: Sequence[Sequence[Truth]], guesses: Sequence[Sequence[Guess]], classes: int
) -> tuple[tuple[int, ...], ...]:
    matrix = [[0] * (classes + 1) for _ in range(classes + 1)]
    for image_truths, image_guesses in zip(truths, guesses, strict=True):
        kept = [g for g in image_guesses if g.score >= MATRIX_CONF and 0 <= g.cls < classes]
        known = [t for t in image_truths if 0 <= t.cls < classes]
        pairs = sorted(
            ((iou(g.box, t.box), gi, ti) for gi, g in enumerate(kept) for ti, t in enumerate(known)),
            key=lambda pair: -pair[0],
        )
        used_guess: set[int] = set()
        used_truth: set[int] = set()
        for overlap, gi, ti in pairs:
            if overlap < MATRIX_IOU:
                break
            if gi in used_guess or ti in used_truth:
                continue
            used_guess.add(gi)
            used_truth.add(ti)
            matrix[kept[gi].cls][known[ti].cls] += 1
        for ti, truth in enumerate(known):
            if ti not in used_truth:
                matrix[classes][truth.cls] += 1  # missed: background predicted
        for gi, guess in enumerate(kept):
            if gi not in used_guess:
                matrix[guess.cls][classes] += 1  # a box where there is none
    return tuple(tuple(row) for row in matrix)


def _mean(values: Sequence[float]) -> float:
    return sum(values) / len(values) if values else 0.0
