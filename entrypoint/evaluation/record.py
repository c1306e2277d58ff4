"""``eval.json``: what every shipped file scored, on which split; the judgement of an export against the ``.pt``;
the one table a person reads (the log, ``trainbox eval``).

``{"split": "test"|"val", "dataset_revision", "files": {"<path in repo>": {"map50_95", "map50", "precision",
"recall", "ms_per_image", "device", "per_class": {"<name>": {"ap50_95", "ap50", "instances"}},
"confusion_matrix": {"labels": [...], "matrix": [[...]]}}}}``. The values are fractions (0-1), rounded to 4
places; the matrix is ``[predicted][true]``, its last label ``background``. An export's record also holds
``raw_outputs``: its raw outputs against best.pt's (parity.py).
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

from . import parity
from .score import MATRIX_CONF, MATRIX_IOU, Scores
from .split import FALLBACK_WORDS

EVAL_FILE = "eval.json"
BACKGROUND = "background"
# An export scores like the .pt within these mAP50-95 points (a point: 0.01): FP32 runtimes compute the same
# network to rounding; a TensorRT engine is built FP16 (--half), which moves scores by a few thousandths.
TOLERANCE = {"tensorrt": 0.01}
DEFAULT_TOLERANCE = 0.005
KEYS = ("map50_95", "map50", "precision", "recall", "ms_per_image", "device", "per_class", "confusion_matrix")


def file_record(
    map50_95: float, map50: float, scores: Scores, names: tuple[str, ...], ms_per_image: float | None, device: str
) -> dict[str, Any]:
    """One file's scores. mAP50-95 and mAP50 are libreyolo's own; per class and the matrix are ``score``'s."""
    labels = [*names, BACKGROUND]
    return {
        "map50_95": _round(map50_95),
        "map50": _round(map50),
        "precision": _round(scores.precision),
        "recall": _round(scores.recall),
        "ms_per_image": round(ms_per_image, 2) if ms_per_image is not None else None,
        "device": device,
        "per_class": {
            name: {"ap50_95": _round(score.ap50_95), "ap50": _round(score.ap50), "instances": score.instances}
            for name, score in zip(names, scores.per_class, strict=True)
        },
        "confusion_matrix": {"labels": labels, "matrix": [list(row) for row in scores.matrix]},
    }


def document(split: str, revision: str | None, files: dict[str, dict[str, Any]]) -> dict[str, Any]:
    return {"split": split, "dataset_revision": revision, "files": files}


def write(run_dir: Path, evaluation: dict[str, Any]) -> Path:
    path = run_dir / EVAL_FILE
    tmp = path.with_name(f".{EVAL_FILE}.tmp")
    tmp.write_text(json.dumps(evaluation, indent=2) + "\n", encoding="utf-8")
    os.replace(tmp, path)
    return path


def read(path: Path) -> dict[str, Any] | None:
    try:
        found = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return found if valid(found) else None


def valid(evaluation: Any) -> bool:
    if not isinstance(evaluation, dict) or evaluation.get("split") not in ("test", "val"):
        return False
    files = evaluation.get("files")
    return isinstance(files, dict) and all(isinstance(v, dict) and set(KEYS) <= set(v) for v in files.values())


def split_words(split: str | None) -> str:
    return "test split" if split == "test" else FALLBACK_WORDS


def tolerance(fmt: str) -> float:
    return TOLERANCE.get(fmt, DEFAULT_TOLERANCE)


def judge(
    reference: dict[str, Any], candidate: dict[str, Any], fmt: str, raw: dict[str, Any] | None = None
) -> str | None:
    """None when the export scores like the .pt (|Δ mAP50-95| within the format's tolerance) and, when ``raw`` is
    given (parity.py's record), its raw outputs are within theirs; else why not, with both numbers."""
    ours, theirs = float(reference["map50_95"]), float(candidate["map50_95"])
    allowed = tolerance(fmt)
    scored = abs(ours - theirs) <= allowed + 1e-9
    same = raw is None or bool(raw.get("within"))
    if scored and same:
        return None
    words = (
        f"mAP50-95 {_points(theirs)} against best.pt's {_points(ours)} on the same split"
        f" (Δ {_points(theirs - ours)} points, allowed ± {_points(allowed)}){'' if scored else ', outside'}"
    )
    return words if raw is None else f"{words}; {parity.words(raw)}{'' if same else ', outside'}"


def table(evaluation: dict[str, Any], sizes: dict[str, int] | None = None) -> list[str]:
    """The files' scores, one row each, then best.pt's (else the first file's) classes, worst first."""
    files: dict[str, dict[str, Any]] = evaluation.get("files") or {}
    lines = [f"scored on the {split_words(evaluation.get('split'))}"]
    header = f"{'file':<36} {'mAP50-95':>8} {'mAP50':>7} {'P':>6} {'R':>6} {'ms/img':>8}  device"
    lines += [header + ("      size" if sizes else "")]
    for name, record in files.items():
        row = (
            f"{name:<36} {_pct(record['map50_95']):>8} {_pct(record['map50']):>7} {_pct(record['precision']):>6}"
            f" {_pct(record['recall']):>6} {_ms(record['ms_per_image']):>8}  {record['device']}"
        )
        lines.append(row + (f"  {sizes[name] / 1e6:6.1f} MB" if sizes and name in sizes else ""))
    main = next((record for name, record in files.items() if name.endswith(".pt")), None)
    main = main or next(iter(files.values()), None)
    if main:
        lines.append(f"{'class':<24} {'AP50-95':>8} {'AP50':>7} {'instances':>9}")
        for name, score in worst_first(main["per_class"]):
            lines.append(f"{name:<24} {_pct(score['ap50_95']):>8} {_pct(score['ap50']):>7} {score['instances']:>9}")
    return lines


def worst_first(per_class: dict[str, dict[str, Any]]) -> list[tuple[str, dict[str, Any]]]:
    """Classes by AP50-95, lowest first; a class with no instance in the split last."""
    return sorted(
        per_class.items(),
        key=lambda item: (item[1]["ap50_95"] is None, item[1]["ap50_95"] or 0.0, item[0]),
    )


def matrix_words() -> str:
    return f"boxes matched regardless of class at IoU ≥ {MATRIX_IOU}, confidence ≥ {MATRIX_CONF}"


def _round(value: float | None) -> float | None:
    return None if value is None or not math.isfinite(value) else round(value, 4)


def _points(value: float) -> str:
    return f"{value * 100:.2f}"


def _pct(value: Any) -> str:
    return "—" if not isinstance(value, int | float) else f"{value * 100:.1f}"


def _ms(value: Any) -> str:
    return "—" if not isinstance(value, int | float) else f"{value:.1f}"
