"""The card's evaluation: each shipped file's score on the held-out split (eval.json), its speed and size; best.pt's
classes, worst first; the confusion matrix as a PNG drawn with Pillow, like the training plot (plot.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from PIL import Image, ImageDraw, ImageFont

from ..evaluation import parity, record
from ..libreyolo import BEST_CHECKPOINT
from ..log import logger
from ..state import replace_atomically
from .plot import BACKGROUND, INK

MATRIX_FILE = "confusion_matrix.png"
_CELL, _MARGIN = 48, 150
_SIZES = "sizes"  # added to eval.json's record on the card's side only: each file's bytes


def gather(run_dir: Path) -> dict[str, Any] | None:
    """eval.json with each file's size, and its confusion matrix drawn beside it; None before the evaluation."""
    evaluation = record.read(run_dir / record.EVAL_FILE)
    if evaluation is None:
        return None
    sizes: dict[str, int] = {}
    for name in evaluation["files"]:
        path = run_dir / name
        if path.is_file():
            sizes[name] = path.stat().st_size
        elif path.is_dir():
            sizes[name] = sum(part.stat().st_size for part in path.rglob("*") if part.is_file())
    main = evaluation["files"].get(BEST_CHECKPOINT)
    if main is not None:
        title = f"best.pt on the {record.split_words(evaluation['split'])}"
        try:
            draw(main["confusion_matrix"], run_dir / MATRIX_FILE, title)
        except (OSError, ValueError, KeyError, TypeError, IndexError) as error:  # a picture never costs the card
            logger.warning("confusion matrix: not drawn: %s", error)
    return evaluation | {_SIZES: sizes}


def headline(evaluation: dict[str, Any] | None) -> tuple[float, float, str] | None:
    """best.pt's mAP50-95 and mAP50, and the split they are from."""
    main = (evaluation or {}).get("files", {}).get(BEST_CHECKPOINT)
    if not isinstance(main, dict):
        return None
    return float(main["map50_95"]), float(main["map50"]), str((evaluation or {}).get("split"))


def section(evaluation: dict[str, Any] | None, run_dir_has_matrix: bool = True) -> list[str]:
    if not evaluation:
        return []
    sizes: dict[str, int] = evaluation.get(_SIZES) or {}
    lines = ["### Evaluation", "", f"Scored on the {record.split_words(evaluation.get('split'))}.", ""]
    lines += ["| file | mAP50-95 | mAP50 | precision | recall | ms/image | device | size | raw outputs vs best.pt |"]
    lines += ["|---|---:|---:|---:|---:|---:|---|---:|---|"]
    for name, found in evaluation["files"].items():
        size = f"{sizes[name] / 1e6:.1f} MB" if name in sizes else "—"
        lines.append(
            f"| `{name}` | {_pct(found['map50_95'])} | {_pct(found['map50'])} | {_pct(found['precision'])}"
            f" | {_pct(found['recall'])} | {_ms(found['ms_per_image'])} | {found['device']} | {size}"
            f" | {_raw(name, found.get('raw_outputs'))} |"
        )
    lines += ["", f"Precision and recall: {record.matrix_words()}."]
    if any(parity.valid(found.get("raw_outputs")) for found in evaluation["files"].values()):
        lines += [
            f"Raw outputs: each export and best.pt on the same preprocessed input (the first {parity.IMAGES}"
            " images of the split), before NMS; the largest elementwise difference, and the tolerance"
            " |Δ| ≤ atol + rtol·|best.pt| it passed."
        ]
    lines += [""]
    main = evaluation["files"].get(BEST_CHECKPOINT) or next(iter(evaluation["files"].values()), None)
    if main:
        lines += ["| class (worst first) | AP50-95 | AP50 | instances |", "|---|---:|---:|---:|"]
        for name, found in record.worst_first(main["per_class"]):
            lines.append(f"| {name} | {_pct(found['ap50_95'])} | {_pct(found['ap50'])} | {found['instances']} |")
        lines.append("")
    if BEST_CHECKPOINT in evaluation["files"] and run_dir_has_matrix:
        lines += [f"![Confusion matrix of best.pt]({MATRIX_FILE})", ""]
    return lines


def draw(matrix: dict[str, Any], target: Path, title: str) -> None:
    """Rows: predicted, columns: true; each cell shaded by its share of the true column's count."""
    labels: list[str] = list(matrix["labels"])
    cells: list[list[int]] = matrix["matrix"]
    count = len(labels)
    side = _MARGIN + count * _CELL + 20
    image = Image.new("RGB", (side, side + 30), BACKGROUND)
    canvas = ImageDraw.Draw(image)
    font = ImageFont.load_default(size=13)
    canvas.text((10, 8), title, fill=INK, font=font)
    canvas.text((_MARGIN, _MARGIN - 40), "true", fill=INK, font=font)
    canvas.text((10, _MARGIN + 30 - 20), "predicted", fill=INK, font=font)
    totals = [sum(row[column] for row in cells) for column in range(count)]
    top = _MARGIN + 30
    for index, label in enumerate(labels):
        canvas.text((_MARGIN + index * _CELL + 4, top - 18), label[:6], fill=INK, font=font)
        canvas.text((10, top + index * _CELL + _CELL // 2 - 7), label[:18], fill=INK, font=font)
    for row in range(count):
        for column in range(count):
            value = cells[row][column]
            share = value / totals[column] if totals[column] else 0.0
            shade = int(255 - 200 * share)
            x, y = _MARGIN + column * _CELL, top + row * _CELL
            canvas.rectangle((x, y, x + _CELL - 2, y + _CELL - 2), fill=(shade, shade, 255), outline=(200, 200, 200))
            canvas.text((x + 6, y + _CELL // 2 - 7), str(value), fill=INK if share < 0.6 else BACKGROUND, font=font)
    replace_atomically(target, lambda tmp: image.save(tmp, format="PNG"))


def _raw(name: str, raw: Any) -> str:
    if name == BEST_CHECKPOINT:
        return "the reference"
    if not parity.valid(raw):
        return "—"
    return f"max Δ {raw['max_abs_diff']:.2g} (atol {raw['atol']:g}, rtol {raw['rtol']:g})"


def _pct(value: Any) -> str:
    return "—" if not isinstance(value, int | float) else f"{value * 100:.1f}"


def _ms(value: Any) -> str:
    return "—" if not isinstance(value, int | float) else f"{value:.1f}"


def scored_text(data: dict[str, Any]) -> str | None:
    """``mAP50-95 0.412 · mAP50 0.634 on the test split``: best.pt's evaluation, from trainbox.json's record."""
    found = data.get("evaluation")
    if not isinstance(found, dict):
        return None
    best = found.get("best")
    if not isinstance(best, dict) or not isinstance(best.get("map50_95"), int | float):
        return None
    mAP50 = best.get("map50")
    tail = f" · mAP50 {mAP50:.3f}" if isinstance(mAP50, int | float) else ""
    return f"mAP50-95 {best['map50_95']:.3f}{tail} on the {record.split_words(found.get('split'))}"
