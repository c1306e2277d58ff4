"""The training plot: loss and mAP per epoch from metrics.jsonl, as a PNG for the model card.

Drawn by the agent (never by the training child) with matplotlib's Agg canvas and no pyplot, so
nothing global or interactive is touched and a drawing thread needs no display. The plotted
series ride in the PNG itself (a ``Trainbox-Series`` text chunk), so anyone can check the
picture against the run's numbers.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ..state import replace_atomically

SERIES_KEY = "Trainbox-Series"
LOSSES = ("train/loss", "train/box_loss", "train/cls_loss", "train/dfl_loss")
MAPS = ("metrics/mAP50", "metrics/mAP50-95")


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
    """``name → [[epoch, value], …]`` for every loss and mAP column that has numbers."""
    found: dict[str, list[list[float]]] = {}
    for name in LOSSES + MAPS:
        points = [[row["epoch"], float(row[name])] for row in rows if isinstance(row.get(name), int | float)]
        if points:
            found[name] = points
    return found


def available() -> bool:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return False
    return True


def draw(rows: list[dict[str, Any]], target: Path, title: str) -> bool:
    """Write the plot to ``target`` atomically; False when there is nothing to plot or no matplotlib."""
    data = series(rows)
    if not data:
        return False
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError:
        return False
    figure = Figure(figsize=(10, 4), dpi=100, layout="constrained")
    FigureCanvasAgg(figure)
    loss_axes, map_axes = figure.subplots(1, 2)
    for axes, names, label in ((loss_axes, LOSSES, "loss"), (map_axes, MAPS, "mAP")):
        for name in names:
            if name in data:
                epochs, values = zip(*data[name], strict=True)
                axes.plot(epochs, values, marker="o", markersize=3, label=name.split("/", 1)[1])
        axes.set_xlabel("epoch")
        axes.set_ylabel(label)
        axes.grid(alpha=0.3)
        if axes.lines:
            axes.legend(fontsize=8)
        axes.xaxis.get_major_locator().set_params(integer=True)
    map_axes.set_ylim(bottom=0)
    figure.suptitle(title, fontsize=10)
    embedded = {SERIES_KEY: json.dumps(data, separators=(",", ":"))}
    replace_atomically(target, lambda handle: figure.savefig(handle, format="png", metadata=embedded))
    return True
