"""Which split scores the model, and its ground truth, read from the data.yaml libreyolo gets.

The held-out ``test:`` split when the dataset names one (docs/datasets.md says how each form names it); else
``val:``, which also picked ``best.pt``, and every place that shows the numbers says so. The images are listed
as libreyolo's validator lists them (a folder: its images sorted, not its subfolders; a list file: in its
order), so a prediction's ``image_id`` is an index into them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from PIL import Image

from ..errors import EvalSplitMissingError, HeldOutClassesError, HeldOutUnlabelledError
from .score import Truth

SPLITS = ("test", "val")
FALLBACK_WORDS = "validation split (also used to pick best.pt)"
_IMAGES = (".jpg", ".jpeg", ".png", ".bmp", ".webp", ".tiff", ".tif", ".gif")


@dataclass(frozen=True)
class Split:
    name: str  # test or val
    images: tuple[Path, ...]
    names: tuple[str, ...]

    @property
    def words(self) -> str:
        return "test split" if self.name == "test" else FALLBACK_WORDS


def read_yaml(data_yaml: Path) -> dict[str, Any]:
    config = yaml.safe_load(data_yaml.read_text()) or {}
    if not isinstance(config, dict):
        raise EvalSplitMissingError(f"{data_yaml} is not a YAML mapping", "point at the dataset's data.yaml")
    return config


def class_names(config: dict[str, Any]) -> tuple[str, ...]:
    names = config.get("names")
    if isinstance(names, dict):
        return tuple(str(names[key]) for key in sorted(names, key=int))
    return tuple(str(name) for name in names) if isinstance(names, list) else ()


def choose(data_yaml: Path, wanted: str | None = None, trained: Sequence[str] | None = None) -> Split:
    """The split to score: ``wanted``, else test when the dataset has one, else val. Refused, in one line: a
    ``wanted`` split the dataset lacks, a test split without a single label, names other than ``trained``."""
    config = read_yaml(data_yaml)
    present = [name for name in SPLITS if config.get(name)]
    if wanted is not None and wanted not in present:
        raise EvalSplitMissingError(
            f"the dataset has no {wanted} split (it has: {', '.join(present) or 'none'})",
            f"use --split {' or --split '.join(present)}" if present else "add test: or val: to its data.yaml",
        )
    name = wanted or present[0] if present else None
    if name is None:
        raise EvalSplitMissingError("the dataset names neither a test: nor a val: split", "add one to its data.yaml")
    names = class_names(config)
    if trained is not None and tuple(trained) != names:
        raise HeldOutClassesError(
            f"the dataset's classes ({', '.join(names) or 'none'}) are not the model's"
            f" ({', '.join(trained) or 'none'}): its {name} split would be scored against the wrong classes",
            "score it on the dataset it was trained on, or one with the same names in the same order",
        )
    root = Path(str(config.get("path") or data_yaml.parent))
    root = root if root.is_absolute() else data_yaml.parent / root
    images = tuple(listed(config[name], root))
    if name == "test" and not any(label_path(image).is_file() for image in images):
        raise HeldOutUnlabelledError(
            f"the dataset's test split has {len(images)} image(s) and not one label file",
            "add its labels, or remove test: from data.yaml (the validation split is scored then)",
        )
    return Split(name, images, names)


def listed(entries: Any, root: Path) -> list[Path]:
    """The split's images in libreyolo's order (``libreyolo.data.utils.get_img_files``): a folder's images at any
    depth, sorted; a list file's, relative to its folder, sorted; a list of either, in turn."""
    found: list[Path] = []
    for entry in entries if isinstance(entries, list) else [entries]:
        where = Path(str(entry))
        where = where if where.is_absolute() else root / where
        if where.is_dir():
            found += sorted(
                {path for ext in _IMAGES for case in (ext, ext.upper()) for path in where.rglob(f"*{case}")}
            )
        elif where.suffix.lower() == ".txt" and where.is_file():
            lines = [line.strip() for line in where.read_text().splitlines()]
            paths = [Path(line) for line in lines if line and not line.startswith("#")]
            paths = [path if path.is_absolute() else where.parent / path for path in paths]
            found += sorted(path for path in paths if path.suffix.lower() in _IMAGES)
        elif where.suffix.lower() in _IMAGES:
            found.append(where)
    return found


def label_path(image: Path) -> Path:
    """The image's label file: its path with the last ``images`` folder made ``labels``, and ``.txt``."""
    parts = list(image.parts)
    for index in range(len(parts) - 2, -1, -1):
        if parts[index] == "images":
            parts[index] = "labels"
            break
    return Path(*parts).with_suffix(".txt")


def truths(split: Split) -> list[list[Truth]]:
    """Each image's boxes in pixels (YOLO rows ``class cx cy w h``, normalised)."""
    found: list[list[Truth]] = []
    for image in split.images:
        label = label_path(image)
        rows = label.read_text().splitlines() if label.is_file() else []
        with Image.open(image) as opened:
            width, height = opened.size
        boxes: list[Truth] = []
        for row in rows:
            fields = row.split()
            if len(fields) < 5:
                continue
            cls, cx, cy, w, h = int(float(fields[0])), *map(float, fields[1:5])
            x1, y1 = max(0.0, (cx - w / 2) * width), max(0.0, (cy - h / 2) * height)
            x2, y2 = min(float(width), (cx + w / 2) * width), min(float(height), (cy + h / 2) * height)
            boxes.append(Truth(cls, (x1, y1, x2, y2)))
        found.append(boxes)
    return found
