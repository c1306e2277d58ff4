"""COCO JSON datasets, converted to the YOLO layout libreyolo trains from.

Two layouts are found: Roboflow's (a folder per split, each with ``_annotations.coco.json`` beside its
images) and the classic one (``annotations/instances_<split>.json`` with the images in ``images/<split>/``,
``<split>/`` or ``images/``). Category ids are not indexes: the names are the categories in id order,
less Roboflow's placeholder (a category with no box of its own that is the supercategory of others).

libreyolo 1.6.0 trains from COCO JSON itself (``annotations:`` in its data.yaml; tried on the classic layout),
but makes every category a class, Roboflow's placeholder included, and refuses names that leave it out; and
``libreyolo doctor`` reads YOLO label files only (it finds every image of a COCO dataset unlabelled). Converting
gives the right classes for both layouts and a dataset doctor can check. The images are hard links (symlinks
across file systems), so the conversion costs label files only.
"""

from __future__ import annotations

import json
import os
import re
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import (
    ClassIdError,
    DatasetFormError,
    HeldOutClassesError,
    NoLabelsError,
    NoValidationError,
    UnreadableImagesError,
)
from ..log import logger
from ..parsing import BoxFormat
from .boxes import BoxTally, to_cxcywh_normalised

ROBOFLOW_JSON = "_annotations.coco.json"
_CLASSIC = re.compile(r"instances_([A-Za-z]+)\d*\.json")
VALIDATION_NAMES = ("validation", "val", "valid")
COCO_FIX = "fix the COCO JSON, or export the dataset again"


@dataclass(frozen=True)
class CocoSplit:
    name: str  # train, val, test
    json: Path
    images: Path  # the folder its file_name entries are relative to


def find(root: Path) -> list[CocoSplit]:
    """The COCO splits of the dataset under ``root`` (none: not a COCO dataset)."""
    found: list[CocoSplit] = []
    for path in sorted(root.rglob(ROBOFLOW_JSON)):
        found.append(CocoSplit(_split_name(path.parent.name), path, path.parent))
    if found:
        return found
    for path in sorted(root.rglob("instances_*.json")):
        match = _CLASSIC.fullmatch(path.name)
        if match is None:
            continue
        stem = path.name.removeprefix("instances_").removesuffix(".json")
        base = path.parent.parent if path.parent.name == "annotations" else path.parent
        found.append(CocoSplit(_split_name(match.group(1)), path, _image_folder(base, stem, match.group(1), path)))
    return found


def _split_name(name: str) -> str:
    lowered = name.lower()
    return "val" if lowered in VALIDATION_NAMES else lowered


def _image_folder(base: Path, stem: str, split: str, json_path: Path) -> Path:
    """Where the classic layout keeps a split's images: the first candidate holding the first listed image."""
    candidates = [base / "images" / stem, base / stem, base / "images" / split, base / split, base / "images", base]
    first = _first_file_name(json_path)
    for folder in candidates:
        if first is not None and (folder / first).is_file():
            return folder
    return next((folder for folder in candidates if folder.is_dir()), base)


def _first_file_name(json_path: Path) -> str | None:
    try:
        images = json.loads(json_path.read_text()).get("images") or []
    except (OSError, ValueError, AttributeError):
        return None
    return str(images[0].get("file_name")) if images and isinstance(images[0], dict) else None


def convert(splits: Sequence[CocoSplit], root: Path, out: Path) -> dict[str, Any]:
    """Write ``out/images/<split>/`` (links) and ``out/labels/<split>/`` for each split; the data.yaml fields.

    Refuses (one line naming the JSON file): no annotations at all, an annotation whose category is not
    listed, most listed images missing, more boxes outside their image than a few, no validation split."""
    by_name = {split.name: split for split in splits}
    train = by_name.get("train")
    val = by_name.get("val") or by_name.get("test")
    shown = [str(split.json.relative_to(root)) for split in splits]
    if train is None:
        raise DatasetFormError(f"COCO files {', '.join(shown)}: none is a training split", COCO_FIX)
    if val is None:
        raise NoValidationError(
            f"the dataset has no validation split (COCO files: {', '.join(shown)})",
            "add a valid/ (or val/) split with its annotations; or test/, used for validation when there is none",
        )
    documents = {split.name: _load(split.json, root) for split in {train, val}}
    names, label_of = _classes(documents, root, train.json)
    tally = BoxTally()
    written = 0
    for name, split in (("train", train), ("val", val)):
        written += _write_split(split, documents[split.name], label_of, tally, root, out, name)
    source = " and ".join(str(split.json.relative_to(root)) for split in (train, val))
    tally.refuse_if_wrong(source, COCO_FIX + " (COCO boxes are [x, y, width, height] in pixels)")
    if written == 0:
        raise NoLabelsError(f"{source} hold no annotations: the model would learn nothing", COCO_FIX)
    logger.info("dataset: COCO %s converted (%d boxes, classes %s)", source, written, ", ".join(names))
    fields: dict[str, Any] = {"train": "images/train", "val": "images/val", "names": dict(enumerate(names))}
    test = by_name.get("test")
    if test is not None and test is not val:  # held out: what the trained model is scored on
        _held_out(test, names, root, out)
        fields["test"] = "images/test"
    return fields


def _held_out(test: CocoSplit, names: list[str], root: Path, out: Path) -> None:
    """The test split converted with training's classes; other class names are refused (exit 26)."""
    document = _load(test.json, root)
    theirs, label_of = _classes({"test": document}, root, test.json)
    if theirs != names:
        raise HeldOutClassesError(
            f"{test.json.relative_to(root)} names the classes {', '.join(theirs)}; training's are {', '.join(names)}",
            "give the test split the training split's categories, or remove it",
        )
    _write_split(test, document, label_of, BoxTally(), root, out, "test")


def _load(path: Path, root: Path) -> dict[str, Any]:
    try:
        document = json.loads(path.read_text())
    except (OSError, ValueError) as error:
        raise DatasetFormError(f"{path.relative_to(root)} is not valid JSON: {error}", COCO_FIX) from None
    if not isinstance(document, dict) or not isinstance(document.get("images"), list):
        raise DatasetFormError(f"{path.relative_to(root)} has no images list: not COCO JSON", COCO_FIX)
    return document


def _classes(documents: dict[str, dict[str, Any]], root: Path, train_json: Path) -> tuple[list[str], dict[int, int]]:
    """Names in id order, and category id → class index; Roboflow's placeholder category left out."""
    categories: dict[int, dict[str, Any]] = {}
    used: set[int] = set()
    for document in documents.values():
        for category in document.get("categories") or []:
            categories.setdefault(int(category["id"]), category)
        used.update(int(ann["category_id"]) for ann in document.get("annotations") or [] if "category_id" in ann)
    parents = {str(category.get("supercategory")) for category in categories.values()}
    kept = [cid for cid in sorted(categories) if cid in used or str(categories[cid].get("name")) not in parents]
    if not kept:
        raise DatasetFormError(f"{train_json.relative_to(root)} lists no categories", COCO_FIX)
    return [str(categories[cid].get("name")) for cid in kept], {cid: index for index, cid in enumerate(kept)}


def _write_split(
    split: CocoSplit,
    document: dict[str, Any],
    label_of: dict[int, int],
    tally: BoxTally,
    root: Path,
    out: Path,
    name: str,
) -> int:
    shown = split.json.relative_to(root)
    rows: dict[int, list[str]] = defaultdict(list)
    images = {int(image["id"]): image for image in document["images"]}
    for ann in document.get("annotations") or []:
        if ann.get("iscrowd"):
            continue
        cid = int(ann.get("category_id", -1))
        if cid not in label_of:
            raise ClassIdError(
                f"{shown}: annotation {ann.get('id')} has category_id {cid}, which its categories do not list",
                COCO_FIX,
            )
        image = images.get(int(ann.get("image_id", -1)))
        if image is None or not image.get("width") or not image.get("height"):
            continue
        box = to_cxcywh_normalised(ann.get("bbox") or [0, 0, 0, 0], BoxFormat.XYWH, image["width"], image["height"])
        row = tally.add(label_of[cid], box, f"{shown} annotation {ann.get('id')}")  # type: ignore[arg-type]
        if row is not None:
            rows[int(image["id"])].append(row)
    missing: list[str] = []
    written = 0
    for image_id, image in images.items():
        relative = str(image.get("file_name", ""))
        source = (split.images / relative).resolve()
        if not source.is_relative_to(root.resolve()) or not source.is_file():
            missing.append(relative)
            continue
        target = out / "images" / name / relative
        target.parent.mkdir(parents=True, exist_ok=True)
        _link(source, target)
        label = (out / "labels" / name / relative).with_suffix(".txt")
        label.parent.mkdir(parents=True, exist_ok=True)
        label.write_text("".join(row + "\n" for row in rows.get(image_id, [])))
        written += len(rows.get(image_id, []))
    if images and len(missing) > len(images) / 2:
        raise UnreadableImagesError(
            f"{len(missing)} of the {len(images)} images {shown} lists are not in the dataset (first: {missing[0]})",
            "put the images beside their JSON file (Roboflow) or in images/<split>/ (COCO)",
        )
    if missing:
        logger.warning("dataset: %d images %s lists are missing (first: %s); left out", len(missing), shown, missing[0])
    return written


def _link(source: Path, target: Path) -> None:
    if target.exists():
        target.unlink()
    try:
        os.link(source, target)
    except OSError:  # another file system: a link to the original
        os.symlink(source, target)
