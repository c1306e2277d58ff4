"""The training plot: loss and mAP per epoch from metrics.jsonl, as a PNG for the model card.

Drawn by the agent (never by the training child) with Pillow, which the image has anyway (torchvision and
libreyolo require it): two panels of lines with their points, a grid, the axes' numbers and a legend, no
plotting library (matplotlib was 76 MB of the image for this one picture). The plotted series ride in the
PNG itself (a ``Trainbox-Series`` text chunk), so anyone can check the picture against the run's numbers.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from PIL import Image, ImageDraw, ImageFont
from PIL.PngImagePlugin import PngInfo

from ..state import replace_atomically

SERIES_KEY = "Trainbox-Series"
LOSSES = ("train/loss", "train/box_loss", "train/cls_loss", "train/dfl_loss")
MAPS = ("metrics/mAP50", "metrics/mAP50-95")
SIZE = (1000, 400)
# matplotlib's default cycle, so the picture reads as it did; a series keeps its colour in its panel.
COLOURS = ((31, 119, 180), (255, 127, 14), (44, 160, 44), (214, 39, 40))
BACKGROUND = (255, 255, 255)
INK = (40, 40, 40)
GRID = (228, 228, 228)
_TOP, _BOTTOM, _LEFT, _RIGHT = 44, 48, 62, 16  # a panel's margins: title, epoch numbers, value numbers


def read_rows(path: Path) -> list[dict[str, Any]]:
    """metrics.jsonl rows by epoch; a resumed run may repeat an epoch: the later row wins."""
    rows: dict[int, dict[str, Any]] = {}
    try:
        text = path.read_text()
    except OSError:
        return []
    for line in text.splitlines():
        try:
            row = json.loads(line)
        except ValueError:
            continue  # a line being appended right now
        if isinstance(row, dict) and isinstance(row.get("epoch"), int):
            rows[row["epoch"]] = row
    return [rows[epoch] for epoch in sorted(rows)]


def series(rows: list[dict[str, Any]]) -> dict[str, list[list[float]]]:
    """``name → [[epoch, value], …]`` for every loss and mAP column that has finite numbers."""
    found: dict[str, list[list[float]]] = {}
    for name in LOSSES + MAPS:
        points = [
            [row["epoch"], float(row[name])]
            for row in rows
            if isinstance(row.get(name), int | float) and math.isfinite(row[name])
        ]
        if points:
            found[name] = points
    return found


@dataclass(frozen=True)
class Panel:
    """One panel's plotting area (pixels) and the data range it shows."""

    box: tuple[int, int, int, int]  # left, top, right, bottom
    xs: tuple[float, float]
    ys: tuple[float, float]
    x_ticks: tuple[float, ...]
    y_ticks: tuple[float, ...]

    def point(self, x: float, y: float) -> tuple[float, float]:
        left, top, right, bottom = self.box
        px = left + (x - self.xs[0]) / (self.xs[1] - self.xs[0]) * (right - left)
        py = bottom - (y - self.ys[0]) / (self.ys[1] - self.ys[0]) * (bottom - top)
        return px, py


def panels(data: dict[str, list[list[float]]]) -> tuple[Panel, Panel]:
    """The loss panel (left) and the mAP panel (right, from 0), laid out for ``data``."""
    epochs = [point[0] for points in data.values() for point in points]
    x_ticks = _ticks(min(epochs), max(epochs), integer=True)
    width, height = SIZE
    found = []
    for index, names in enumerate((LOSSES, MAPS)):
        values = [point[1] for name in names for point in data.get(name, [])] or [0.0, 1.0]
        low = 0.0 if names is MAPS else min(values)
        y_ticks = _ticks(low, max(values), integer=False)
        box = (index * width // 2 + _LEFT, _TOP, (index + 1) * width // 2 - _RIGHT, height - _BOTTOM)
        found.append(Panel(box, (x_ticks[0], x_ticks[-1]), (y_ticks[0], y_ticks[-1]), x_ticks, y_ticks))
    return found[0], found[1]


def draw(rows: list[dict[str, Any]], target: Path, title: str) -> bool:
    """Write the plot to ``target`` atomically; False when there is nothing to plot."""
    data = series(rows)
    if not data:
        return False
    image = Image.new("RGB", SIZE, BACKGROUND)
    canvas = ImageDraw.Draw(image)
    small, large = _font(12), _font(14)
    canvas.text((SIZE[0] / 2, 6), title, fill=INK, font=large, anchor="ma")
    for panel, names, label in zip(panels(data), (LOSSES, MAPS), ("loss", "mAP"), strict=True):
        _axes(canvas, panel, label, small)
        shown = [(name, colour) for name, colour in zip(names, COLOURS, strict=False) if name in data]
        for name, colour in shown:
            points = [panel.point(x, y) for x, y in data[name]]
            if len(points) > 1:
                canvas.line(points, fill=colour, width=2, joint="curve")
            for px, py in points:
                canvas.ellipse((px - 3, py - 3, px + 3, py + 3), fill=colour)
        drawn = [panel.point(x, y) for name, _ in shown for x, y in data[name]]
        _legend(canvas, panel, [(name.split("/", 1)[1], colour) for name, colour in shown], drawn, small)
    info = PngInfo()
    info.add_text(SERIES_KEY, json.dumps(data, separators=(",", ":")))
    replace_atomically(target, lambda handle: image.save(handle, format="PNG", pnginfo=info))
    return True


def _axes(canvas: ImageDraw.ImageDraw, panel: Panel, label: str, font: ImageFont.ImageFont | Any) -> None:
    left, top, right, bottom = panel.box
    for x in panel.x_ticks:
        px, _ = panel.point(x, panel.ys[0])
        canvas.line((px, top, px, bottom), fill=GRID)
        canvas.text((px, bottom + 5), _number(x), fill=INK, font=font, anchor="ma")
    for y in panel.y_ticks:
        _, py = panel.point(panel.xs[0], y)
        canvas.line((left, py, right, py), fill=GRID)
        canvas.text((left - 6, py), _number(y), fill=INK, font=font, anchor="rm")
    canvas.rectangle(panel.box, outline=INK)
    canvas.text(((left + right) / 2, bottom + 24), "epoch", fill=INK, font=font, anchor="ma")
    canvas.text((left, top - 6), label, fill=INK, font=font, anchor="ld")


def _legend(
    canvas: ImageDraw.ImageDraw,
    panel: Panel,
    entries: list[tuple[str, tuple[int, int, int]]],
    points: list[tuple[float, float]],
    font: Any,
) -> None:
    """The series' names in the panel's corner that hides the fewest points (as matplotlib's ``best``)."""
    if not entries:
        return
    width = max(canvas.textlength(name, font=font) for name, _ in entries) + 36
    height = 8 + 16 * len(entries)
    left, top, right, bottom = panel.box
    corners = [(right - 8 - width, top + 8), (right - 8 - width, bottom - 8 - height)]
    corners += [(left + 8, top + 8), (left + 8, bottom - 8 - height)]

    def hidden(corner: tuple[float, float]) -> int:
        x, y = corner
        return sum(x - 4 <= px <= x + width + 4 and y - 4 <= py <= y + height + 4 for px, py in points)

    x, y = min(corners, key=hidden)  # the first of the least covered: top right when all are free
    canvas.rectangle((x, y, x + width, y + height), fill=BACKGROUND, outline=GRID)
    for index, (name, colour) in enumerate(entries):
        middle = y + 12 + 16 * index
        canvas.line((x + 6, middle, x + 24, middle), fill=colour, width=2)
        canvas.text((x + 30, middle), name, fill=INK, font=font, anchor="lm")


def _ticks(low: float, high: float, *, integer: bool) -> tuple[float, ...]:
    """About five round numbers (1, 2 or 5 × 10ⁿ apart) spanning ``low``..``high``; epochs by whole steps."""
    if high - low < 1e-12:
        low, high = (low - 1, high + 1) if integer else (low - abs(low) * 0.1 - 0.05, high + abs(high) * 0.1 + 0.05)
    rough = (high - low) / 5
    magnitude = 10 ** math.floor(math.log10(rough))
    step = next(m * magnitude for m in (1, 2, 5, 10) if m * magnitude >= rough)
    step = max(step, 1.0) if integer else step
    first = math.floor(low / step + 1e-9) * step
    count = math.ceil((high - first) / step - 1e-9)
    return tuple(round(first + i * step, 12) for i in range(count + 1))


def _number(value: float) -> str:
    return f"{value:g}"


def _font(size: int) -> Any:
    """Pillow's own scalable font (its FreeType build has it inside, no font files needed); else its bitmap."""
    try:
        return ImageFont.load_default(size)
    except (ImportError, OSError):
        return ImageFont.load_default()
