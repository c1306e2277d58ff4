"""Parquet datasets as ``datasets.push_to_hub`` writes them, streamed into the YOLO layout.

``data/<split>-00000-of-0000N.parquet``: an ``image`` column (a struct with the file's ``bytes``), an
``objects`` column with ``bbox`` (COCO pixels unless ``DATASET_BBOX`` says otherwise) and ``category``
(a ClassLabel: its names are in the file's ``huggingface`` schema metadata, else in the README's
``dataset_info``). Splits by name: train; for validation, validation, else val, else valid, else test;
test is held out beside a validation split (what the trained model is scored on).

One file at a time is downloaded (the next one while the current is converted) and read row group by
row group, a few rows at a time, in a child process (``parquet_child``): memory stays flat whatever the
dataset's size, and pyarrow never enters the agent. Images and
label files come out as ``images/<split>/`` and ``labels/<split>/`` with a data.yaml, cached on the
volume like an extracted tar.
"""

from __future__ import annotations

import io
import json
import re
import struct
import threading
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import yaml

from ..errors import (
    ClassIdError,
    DatasetFormError,
    NoArchiveError,
    NoLabelsError,
    NoValidationError,
    StopRequested,
    UnreadableImagesError,
)
from ..log import logger
from ..parsing import BoxFormat
from .boxes import BoxTally, to_cxcywh_normalised
from .extract import ExtractReport, _too_big
from .writers import WRITERS, Writers

_SHARD = re.compile(r"(?P<split>[A-Za-z0-9_.]+?)(-\d{5}-of-\d{5})?")
VALIDATION_ORDER = ("validation", "val", "valid", "test")
_ROWS = 32  # rows in memory at a time
BBOX_FIX = "set DATASET_BBOX to the boxes' format: xywh (COCO pixels), xyxy or cxcywh; xywhn, xyxyn or cxcywhn if 0-1"
FORM_FIX = "push the dataset with datasets' push_to_hub: an image column and objects with bbox and category"

# Downloads one repo file to a local path (resumable, verified): given by the caller (fetch).
Download = Callable[[str, Path], None]


def splits_of(files: Sequence[str]) -> dict[str, list[str]]:
    """Parquet files by split, from their names (``data/train-00000-of-00002.parquet``, ``train/0000.parquet``)."""
    found: dict[str, list[str]] = {}
    for path in sorted(files):
        if not path.endswith(".parquet"):
            continue
        parent, _, name = path.rpartition("/")
        match = _SHARD.fullmatch(name.removesuffix(".parquet"))
        split = match.group("split") if match and match.group(2) else parent.rpartition("/")[2] or name
        found.setdefault(split.lower(), []).append(path)
    return found


def chosen_splits(files: Sequence[str], repo: str) -> tuple[list[str], list[str]]:
    """(train files, validation files), or a refusal naming what the repo holds."""
    train, validation, _ = chosen_splits_with_test(files, repo)
    return train, validation


def chosen_splits_with_test(files: Sequence[str], repo: str) -> tuple[list[str], list[str], list[str]]:
    """(train, validation, held-out test) files: test is held out when the repo has a validation split too."""
    splits = splits_of(files)
    if "train" not in splits:
        raise NoArchiveError(
            f"dataset {repo} holds parquet files but no train split ({', '.join(sorted(splits)) or 'none'})",
            "name the training files train-*.parquet (push_to_hub does)",
        )
    validation = next((splits[name] for name in VALIDATION_ORDER if name in splits), None)
    if validation is None:
        raise NoValidationError(
            f"dataset {repo} has only a train split: no validation images",
            "push a validation (or test) split too: dataset.train_test_split(test_size=0.1)",
        )
    test = splits.get("test", [])
    return splits["train"], validation, [] if validation is test else test


def convert(
    train: Sequence[str],
    validation: Sequence[str],
    download: Download,
    scratch: Path,
    folder: Path,
    *,
    bbox: BoxFormat,
    readme: str | None,
    max_bytes: int | None,
    test: Sequence[str] = (),
) -> ExtractReport:
    """The files into ``folder`` (images, labels, data.yaml); each downloaded into ``scratch`` and deleted.
    In this process; the agent has ``parquet_child.convert_in_child`` do the reading in a child."""
    folder.mkdir(parents=True)
    jobs = [("train", path) for path in train] + [("val", path) for path in validation]
    jobs += [("test", path) for path in test]
    converter = _Converter(folder, bbox, readme, max_bytes)
    scratch.mkdir(parents=True, exist_ok=True)
    try:
        pending = Prefetch(download, jobs[0][1], scratch / "00000.parquet")
        for index, (split, path) in enumerate(jobs):
            local = pending.result()
            if index + 1 < len(jobs):  # the next file downloads while this one is converted
                pending = Prefetch(download, jobs[index + 1][1], scratch / f"{index + 1:05d}.parquet")
            converter.file(local, path, split)
            local.unlink(missing_ok=True)
        return converter.finish()
    finally:
        converter.close()


class Prefetch(threading.Thread):
    """One file downloading beside the conversion. A daemon: a stop never waits for it (what it wrote is kept
    as a partial file, continued by the next start)."""

    def __init__(self, download: Download, path: str, local: Path) -> None:
        super().__init__(name="parquet-download", daemon=True)
        self.download, self.path, self.local = download, path, local
        self.error: BaseException | None = None
        self.start()

    def run(self) -> None:
        try:
            self.download(self.path, self.local)
        except BaseException as error:  # raised in the converting thread by result()
            self.error = error

    def result(self) -> Path:
        self.join()
        if self.error is not None:
            raise self.error
        return self.local


class _Converter:
    def __init__(self, folder: Path, bbox: BoxFormat, readme: str | None, max_bytes: int | None) -> None:
        self.folder, self.bbox, self.readme, self.max_bytes = folder, bbox, readme, max_bytes
        self.names: list[str] | None = None
        self.tally = BoxTally()
        self.report = ExtractReport()
        self.labels = 0
        self.sources: list[str] = []
        self.writers = Writers(WRITERS)
        self.counts = {"train": 0, "val": 0, "test": 0}
        self.unreadable: list[str] = []
        self.closed = False
        self.made: set[Path] = set()  # folders made so far: a mkdir per file costs more than the write

    def file(self, local: Path, shown: str, split: str) -> None:
        import pyarrow.parquet as pq

        self.sources.append(shown)
        try:
            # 1 MB reads, no read-ahead threads: a row group's column chunks are the most held at once
            handle = pq.ParquetFile(local, buffer_size=1 << 20, pre_buffer=False)
        except StopRequested:
            raise
        except Exception as error:
            raise DatasetFormError(f"{shown} is not a readable parquet file: {error}", FORM_FIX) from None
        with handle:
            features = _features(handle.schema_arrow.metadata)
            if self.names is None:
                self.names = _class_names(features, self.readme)
            image_column = _column(handle.schema_arrow.names, features, "Image", ("image", "img"))
            objects_column = _column(handle.schema_arrow.names, {}, "", ("objects", "annotations", "labels"))
            if image_column is None or objects_column is None:
                raise DatasetFormError(
                    f"{shown} has no image and objects columns (it has {', '.join(handle.schema_arrow.names)})",
                    FORM_FIX,
                )
            sizes = [name for name in ("width", "height") if name in handle.schema_arrow.names]
            columns = [image_column, objects_column, *(sizes if len(sizes) == 2 else [])]
            row = 0
            for batch in handle.iter_batches(batch_size=_ROWS, columns=columns, use_threads=False):
                for record in batch.to_pylist():
                    self.row(record, image_column, objects_column, split, f"{shown} row {row}")
                    row += 1

    def row(self, record: dict[str, Any], image_column: str, objects_column: str, split: str, where: str) -> None:
        image = record.get(image_column) or {}
        data = image.get("bytes") if isinstance(image, dict) else image
        if not data:
            return
        width, height = record.get("width"), record.get("height")
        if not width or not height:
            width, height = _size(data)
        if not width or not height:
            self.unreadable.append(where)
            return
        index = self.counts[split]
        self.counts[split] += 1
        suffix = _suffix(image.get("path") if isinstance(image, dict) else None, data)
        relative = f"images/{split}/{index:07d}{suffix}"
        rows = []
        for number, (box, category) in enumerate(_objects(record.get(objects_column))):
            assert self.names is not None
            if not 0 <= category < len(self.names):
                raise ClassIdError(
                    f"{where}: object {number} has category {category}, but the dataset names"
                    f" {len(self.names)} classes",
                    "fix the category column, or its ClassLabel names",
                )
            normalised = to_cxcywh_normalised(box, self.bbox, float(width), float(height))
            line = self.tally.add(category, normalised, f"{where}, object {number}: {box}")  # type: ignore[arg-type]
            if line is not None:
                rows.append(line)
        self.labels += len(rows)
        self._write(relative, data)
        self._write(f"labels/{split}/{index:07d}.txt", "".join(line + "\n" for line in rows).encode())

    def _write(self, relative: str, data: bytes) -> None:
        self.report.bytes += len(data)
        if self.max_bytes is not None and self.report.bytes > self.max_bytes:
            raise _too_big(self.max_bytes)
        path = self.folder / relative
        if path.parent not in self.made:
            path.parent.mkdir(parents=True, exist_ok=True)
            self.made.add(path.parent)
        self.writers.submit(str(path), relative, 0o644, data)
        self.report.files += 1

    def close(self) -> None:
        """Every write ended (after a failure, what is still queued is dropped)."""
        if not self.closed:
            self.closed = True
            self.writers.cancel()
            self.writers.close()

    def finish(self) -> ExtractReport:
        self.writers.flush()
        source = ", ".join(self.sources[:3]) + (" ..." if len(self.sources) > 3 else "")
        total = sum(self.counts.values()) + len(self.unreadable)
        if self.unreadable and len(self.unreadable) > total / 2:
            raise UnreadableImagesError(
                f"{len(self.unreadable)} of {total} images cannot be read (first: {self.unreadable[0]})",
                "push the images again (their bytes are not an image)",
            )
        if self.unreadable:
            first = self.unreadable[0]
            logger.warning("dataset: %d images cannot be read (first: %s); left out", len(self.unreadable), first)
        self.tally.refuse_if_wrong(f"{source} read as DATASET_BBOX={self.bbox.value}", BBOX_FIX)
        if self.labels == 0:
            raise NoLabelsError(f"{source} hold no objects: the model would learn nothing", FORM_FIX)
        if self.counts["val"] == 0:
            raise NoValidationError(f"the validation files of {source} hold no images", FORM_FIX)
        names = self.names or []
        config: dict[str, Any] = {"path": ".", "train": "images/train", "val": "images/val"}
        config |= {"test": "images/test"} if self.counts["test"] else {}
        config["names"] = dict(enumerate(names))
        (self.folder / "data.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
        self.report.data_yamls.append("data.yaml")
        logger.info(
            "dataset: %d train and %d validation images, %d boxes, classes %s",
            self.counts["train"],
            self.counts["val"],
            self.labels,
            ", ".join(names),
        )
        return self.report


def _features(metadata: dict[bytes, bytes] | None) -> dict[str, Any]:
    try:
        info = json.loads((metadata or {}).get(b"huggingface", b"{}"))
        features = info.get("info", {}).get("features", {})
        return features if isinstance(features, dict) else {}
    except (ValueError, AttributeError):
        return {}


def _walk(node: Any) -> Iterator[dict[str, Any]]:
    if isinstance(node, dict):
        yield node
        for value in node.values():
            yield from _walk(value)
    elif isinstance(node, list):
        for value in node:
            yield from _walk(value)


def _class_names(features: dict[str, Any], readme: str | None) -> list[str]:
    """The ClassLabel names: from the features in the parquet metadata, else the README's ``dataset_info``."""
    for node in _walk(features):
        if node.get("_type") == "ClassLabel" and isinstance(node.get("names"), list):
            return [str(name) for name in node["names"]]
    card = _front_matter(readme)
    for node in _walk(card.get("dataset_info")):
        label = node.get("class_label")
        if isinstance(label, dict) and isinstance(label.get("names"), dict):
            names = label["names"]
            return [str(names[key]) for key in sorted(names, key=lambda key: int(key))]
    raise DatasetFormError(
        "the parquet files carry no class names (no ClassLabel in their features or the README's dataset_info)",
        "make category a ClassLabel (datasets.ClassLabel(names=[...])) and push the dataset again",
    )


def _front_matter(readme: str | None) -> dict[str, Any]:
    if not readme or not readme.startswith("---"):
        return {}
    try:
        card = yaml.safe_load(readme.split("---", 2)[1])
    except (yaml.YAMLError, IndexError):
        return {}
    return card if isinstance(card, dict) else {}


def _column(names: Sequence[str], features: dict[str, Any], kind: str, fallback: Sequence[str]) -> str | None:
    for name, feature in features.items():
        if kind and isinstance(feature, dict) and feature.get("_type") == kind and name in names:
            return name
    return next((name for name in fallback if name in names), None)


def _objects(objects: Any) -> Iterator[tuple[list[float], int]]:
    """(bbox, category) pairs from a struct of lists (``Sequence`` of a dict) or a list of structs."""
    if isinstance(objects, dict):
        boxes = objects.get("bbox") or objects.get("bboxes") or []
        categories = objects.get("category")
        categories = categories if categories is not None else objects.get("category_id") or objects.get("label") or []
        yield from zip(boxes, (int(value) for value in categories), strict=False)
    elif isinstance(objects, list):
        for item in objects:
            if isinstance(item, dict) and item.get("bbox") is not None:
                category = item.get("category", item.get("category_id", item.get("label", -1)))
                yield item["bbox"], int(category if category is not None else -1)


_SOF = frozenset({0xC0, 0xC1, 0xC2, 0xC3, 0xC5, 0xC6, 0xC7, 0xC9, 0xCA, 0xCB, 0xCD, 0xCE, 0xCF})


def _size(data: bytes) -> tuple[int | None, int | None]:
    """Width and height from the header: PNG's IHDR, JPEG's start-of-frame (a segment walk, a few steps), else
    Pillow (which costs about 0.5 ms an image: seconds over a large dataset)."""
    if data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) >= 24:
        return struct.unpack(">II", data[16:24])
    if data[:2] == b"\xff\xd8":
        at = 2
        while at + 9 < len(data) and data[at] == 0xFF:
            marker = data[at + 1]
            if marker in _SOF:
                height, width = struct.unpack(">HH", data[at + 5 : at + 9])
                return (width, height) if width and height else (None, None)
            at += 2 + struct.unpack(">H", data[at + 2 : at + 4])[0]
    from PIL import Image

    try:
        with Image.open(io.BytesIO(data)) as image:
            return image.size
    except StopRequested:
        raise
    except Exception:
        return None, None


def _suffix(path: str | None, data: bytes) -> str:
    if path and "." in path.rpartition("/")[2]:
        suffix = "." + path.rpartition(".")[2].lower()
        if suffix in (".jpg", ".jpeg", ".png", ".bmp", ".webp", ".tif", ".tiff"):
            return suffix
    if data.startswith(b"\x89PNG"):
        return ".png"
    return ".jpg"
