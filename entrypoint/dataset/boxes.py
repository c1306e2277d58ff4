"""Boxes from COCO JSON and parquet to YOLO label rows, and the check that the format read was the right one.

A box written in one format and read in another mostly lands outside its image (xywh read as xyxy gives
negative widths; pixels read as normalised, or the reverse, land far off): ``BoxTally`` counts such boxes,
and a dataset where more than ``OUTSIDE_SHARE`` of them are outside is refused, naming the setting.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import BoxesOutsideError
from ..parsing import BoxFormat

# A box may stick out of its image by this fraction of the image's side (rounding, annotation tools).
TOLERANCE = 0.02
# More than this share of boxes outside their image: the format is wrong, not a few sloppy boxes.
OUTSIDE_SHARE = 0.05


def to_cxcywh_normalised(box: list[float], fmt: BoxFormat, width: float, height: float) -> tuple[float, ...]:
    """``box`` in ``fmt`` → (cx, cy, w, h) normalised to the image (may lie outside 0-1: see ``inside``)."""
    a, b, c, d = (float(value) for value in box[:4])
    if fmt.normalised:
        a, c = a * width, c * width
        b, d = b * height, d * height
    base = fmt.value.removesuffix("n")
    if base == "xywh":
        cx, cy, w, h = a + c / 2, b + d / 2, c, d
    elif base == "xyxy":
        cx, cy, w, h = (a + c) / 2, (b + d) / 2, c - a, d - b
    else:
        cx, cy, w, h = a, b, c, d
    return cx / width, cy / height, w / width, h / height


def inside(cx: float, cy: float, w: float, h: float) -> bool:
    """A normalised box with a positive size, within its image (give or take ``TOLERANCE``)."""
    low, high = -TOLERANCE, 1 + TOLERANCE
    return w > 0 and h > 0 and cx - w / 2 >= low and cy - h / 2 >= low and cx + w / 2 <= high and cy + h / 2 <= high


def clipped(cx: float, cy: float, w: float, h: float) -> tuple[float, float, float, float]:
    """The box cut to the image (what is left of one that sticks out a little)."""
    x1, y1 = max(0.0, cx - w / 2), max(0.0, cy - h / 2)
    x2, y2 = min(1.0, cx + w / 2), min(1.0, cy + h / 2)
    return (x1 + x2) / 2, (y1 + y2) / 2, x2 - x1, y2 - y1


@dataclass
class BoxTally:
    """Boxes seen and those outside their image, with the first outside one for the message."""

    boxes: int = 0
    outside: int = 0
    example: str | None = None

    def add(self, label: int, box: tuple[float, float, float, float], where: str) -> str | None:
        """The YOLO row of a box inside its image; None (counted) for one outside."""
        self.boxes += 1
        kept = clipped(*box)
        if not inside(*box) or kept[2] <= 0 or kept[3] <= 0:  # outside, or nothing left of it once cut
            self.outside += 1
            if self.example is None:
                self.example = where
            return None
        return f"{label} " + " ".join(f"{value:.6f}" for value in kept)

    def refuse_if_wrong(self, source: str, fix: str) -> None:
        if self.boxes and self.outside > OUTSIDE_SHARE * self.boxes:
            raise BoxesOutsideError(
                f"{self.outside} of {self.boxes} boxes in {source} fall outside their image (first: {self.example})",
                fix,
            )
