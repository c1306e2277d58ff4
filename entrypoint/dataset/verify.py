"""The refusals before training: a dataset that would train and learn nothing, or the wrong thing.

Read from the data.yaml libreyolo gets (every path absolute) and its label files: no labels at all; a
class id outside ``names``; no validation images; most images unreadable (a sample's headers); more
boxes outside their image than a few. Each is one line naming a path of the dataset (relative to its
own root) and the fix, with its own exit code; lesser findings are warnings, and ``libreyolo doctor``
judges the rest. A pass is remembered beside the data.yaml, so a restart does not read it all again.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

from ..errors import (
    BoxesOutsideError,
    ClassIdError,
    NoLabelsError,
    NoValidationError,
    StopRequested,
    UnreadableImagesError,
)
from ..log import logger
from ..state import write_json_atomic
from .boxes import OUTSIDE_SHARE, inside

IMAGE_SUFFIXES = frozenset({".jpg", ".jpeg", ".png", ".bmp", ".webp", ".tif", ".tiff", ".dng", ".mpo", ".pfm"})
SAMPLE = 200  # images per split whose headers are read
_MARKER = ".trainbox-verified.json"
_LABEL_FIX = "one labels/<split>/<image>.txt per image, rows `class cx cy w h` normalised to 0-1 (docs/datasets.md)"


def refuse(data_yaml: Path, root: Path, fingerprint: str) -> None:
    """Raise the first refusal the dataset earns; log the warnings. Nothing when this data passed before."""
    marker = data_yaml.parent / _MARKER
    try:
        if json.loads(marker.read_text()).get("fingerprint") == fingerprint:
            return
    except (OSError, ValueError, AttributeError):
        pass
    config = yaml.safe_load(data_yaml.read_text()) or {}
    Verifier(config, root.resolve()).run()
    write_json_atomic(marker, {"fingerprint": fingerprint})


class Verifier:
    def __init__(self, config: dict[str, Any], root: Path) -> None:
        self.config, self.root = config, root
        names = config.get("names") or {}
        self.classes = len(names) if names else int(config.get("nc") or 0)

    def shown(self, path: Path) -> str:
        """A path as the dataset names it (never a staging or cache folder)."""
        try:
            return path.resolve().relative_to(self.root).as_posix()
        except ValueError:
            return path.name

    def run(self) -> None:
        train, val = self.images("train"), self.images("val")
        if not val:
            raise NoValidationError(
                f"the dataset has no validation images (val: {self.split_shown('val')} holds none)",
                "add validation images to the val: split, or split some off the training images",
            )
        for split, images in (("train", train), ("val", val)):
            self.readable(split, images)
        rows = boxes = outside = 0
        example: str | None = None
        for image in train + val:
            label = label_path(image)
            for number, fields in numbered_rows(label):
                rows += 1
                try:
                    cls, cx, cy, w, h = int(float(fields[0])), *(float(value) for value in fields[1:5])
                except (ValueError, TypeError):
                    continue  # libreyolo doctor names malformed rows
                if not 0 <= cls < self.classes:
                    raise ClassIdError(
                        f"{self.shown(label)} line {number}: class {cls}, but the data.yaml names"
                        f" {self.classes} classes (0-{self.classes - 1})",
                        "add the class to names: in data.yaml, or fix the label",
                    )
                boxes += 1
                if not inside(cx, cy, w, h):
                    outside += 1
                    example = example or f"{self.shown(label)} line {number}"
        if rows == 0:
            raise NoLabelsError(
                f"none of the {len(train) + len(val)} images has a label"
                f" (looked for {self.shown(label_path(train[0]).parent) if train else 'labels/'}/*.txt)",
                _LABEL_FIX,
            )
        if boxes and outside > OUTSIDE_SHARE * boxes:
            raise BoxesOutsideError(
                f"{outside} of {boxes} boxes fall outside their image (first: {example})",
                "labels are `class cx cy w h` normalised to 0-1, not pixels: divide by the image's width and height",
            )
        if outside:
            logger.warning("dataset: %d of %d boxes stick out of their image (first: %s)", outside, boxes, example)

    def images(self, split: str) -> list[Path]:
        value = self.config.get(split)
        if not value:
            return []
        found: list[Path] = []
        for item in value if isinstance(value, list) else [value]:
            found.extend(list_images(Path(item)))
        return sorted(found)

    def split_shown(self, split: str) -> str:
        value = self.config.get(split)
        first = value[0] if isinstance(value, list) and value else value
        return self.shown(Path(str(first))) if first else "(none)"

    def readable(self, split: str, images: list[Path]) -> None:
        """Most of a sample unreadable: refused; some: a warning."""
        from PIL import Image

        step = max(1, len(images) // SAMPLE)
        sample = images[::step][:SAMPLE]
        bad = []
        for path in sample:
            try:
                with Image.open(path) as image:
                    image.size  # noqa: B018  # the header only: cheap
            except StopRequested:
                raise
            except Exception:
                bad.append(path)
        if bad and len(bad) > len(sample) / 2:
            raise UnreadableImagesError(
                f"{len(bad)} of {len(sample)} {split} images checked cannot be read (first: {self.shown(bad[0])})",
                "upload the images again (truncated or not images at all)",
            )
        if bad:
            first = self.shown(bad[0])
            logger.warning("dataset: %d of %d %s images are unreadable (%s)", len(bad), len(sample), split, first)


def list_images(path: Path) -> Iterator[Path]:
    if path.is_file() and path.suffix == ".txt":  # a list of image paths, relative to the list's folder
        for line in path.read_text().splitlines():
            if line.strip():
                entry = Path(line.strip())
                yield entry if entry.is_absolute() else (path.parent / entry)
        return
    for folder, _, files in os.walk(path):
        for name in files:
            if os.path.splitext(name)[1].lower() in IMAGE_SUFFIXES:
                yield Path(folder) / name


def label_path(image: Path) -> Path:
    """libreyolo's rule: every ``images`` folder of the path becomes ``labels``, the suffix ``.txt``."""
    parts = [("labels" if part == "images" else part) for part in image.parts[:-1]]
    return Path(*parts, image.name).with_suffix(".txt")


def numbered_rows(label: Path) -> Iterator[tuple[int, list[str]]]:
    try:
        text = label.read_text(errors="replace")
    except OSError:
        return
    for number, line in enumerate(text.splitlines(), start=1):
        fields = line.split()
        if len(fields) >= 5:
            yield number, fields
