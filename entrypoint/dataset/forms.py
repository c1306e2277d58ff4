"""The data.yaml libreyolo gets, from whichever form the dataset has: a YOLO data.yaml (its paths made
absolute), or COCO JSON (converted: ``coco``). Parquet is converted while it is fetched (``parquet``).

A YOLO export's paths are relative to its ``path``, to the yaml's own folder, or (Roboflow, Ultralytics)
begin with ``../`` though the split folders sit beside the yaml: each is tried in that order, and only a
folder inside the dataset is taken. A split that is nowhere is refused for train and val, dropped for test.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import yaml

from ..errors import DatasetInvalidError, DataYamlNotFoundError, NoValidationError
from ..log import logger
from . import coco
from .checks import locate_data_yaml

SPLITS = ("train", "val", "test")
_LAYOUT = ".trainbox-layout.json"


def libreyolo_yaml(root: Path, wanted: str | None, candidates: list[str] | None, out: Path) -> Path:
    """``out/data.yaml``: the dataset under ``root`` as libreyolo reads it, every path absolute."""
    try:
        source = locate_data_yaml(root, wanted, candidates)
    except DataYamlNotFoundError:
        splits = [] if wanted is not None else coco.find(root)
        if not splits:
            raise DataYamlNotFoundError(
                "no data.yaml and no COCO JSON in the dataset",
                "add a data.yaml (YOLO format) or COCO annotations, or set DATA_YAML (see docs/datasets.md)",
            ) from None
        return _coco_yaml(splits, root, out)
    return write_resolved_yaml(source, out / "data.yaml", root)


def write_resolved_yaml(source: Path, target: Path, root: Path | None = None) -> Path:
    """A copy of ``source`` whose ``path`` and split paths are absolute folders inside ``root``."""
    root = (root or source.parent).resolve()
    try:
        config = yaml.safe_load(source.read_text()) or {}
    except (OSError, yaml.YAMLError) as error:
        raise DatasetInvalidError(f"{source.name} is not valid YAML: {error}".splitlines()[0], "fix the file") from None
    if not isinstance(config, dict):
        raise DatasetInvalidError(f"{source.name} is not a YAML mapping", "see libreyolo's dataset format")
    shown = _shown(source, root)
    base = source.parent.resolve()
    given = config.get("path")
    if isinstance(given, str) and given and not Path(given).is_absolute():
        # An absolute path from the machine the dataset was made on is meaningless here.
        candidate = (base / given).resolve()
        if candidate.is_dir() and candidate.is_relative_to(root):
            base = candidate
    config["path"] = str(base)
    for split in SPLITS:
        value = config.get(split)
        if not value:
            continue
        values = value if isinstance(value, list) else [value]
        found = [_located(str(item), base, source.parent.resolve(), root) for item in values]
        if any(path is None for path in found):
            lost = next(str(item) for item, path in zip(values, found, strict=True) if path is None)
            if split == "test":
                logger.warning("dataset: %s's test: %s is not in the dataset; left out", shown, lost)
                del config[split]
                continue
            refusal = NoValidationError if split == "val" else DatasetInvalidError
            raise refusal(
                f"{shown} names {split}: {lost}, which is not a folder or file of the dataset",
                f"fix {split}: in {shown} (a path relative to the yaml's folder)",
            )
        resolved = [str(path) for path in found]
        config[split] = resolved if isinstance(value, list) else resolved[0]
    if not config.get("val"):
        raise NoValidationError(
            f"{shown} names no val: split: the dataset has no validation images",
            f"add val: (a folder of validation images) to {shown}",
        )
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(yaml.safe_dump(config, sort_keys=False))
    return target


def _located(value: str, base: Path, yaml_dir: Path, root: Path) -> Path | None:
    """A split path as the exports mean it: relative to ``path``, to the yaml's folder, or with its
    leading ``../`` dropped (Roboflow writes ``../train/images`` beside a data.yaml at the root)."""
    path = Path(value)
    stripped = Path(*[part for part in path.parts if part != ".."]) if not path.is_absolute() else path
    for candidate in (base / path, yaml_dir / path, base / stripped, yaml_dir / stripped):
        resolved = candidate.resolve()
        if resolved.exists() and resolved.is_relative_to(root):
            return resolved
    return None


def _shown(source: Path, root: Path) -> str:
    try:
        return source.resolve().relative_to(root).as_posix()
    except ValueError:
        return source.name


def _coco_yaml(splits: list[coco.CocoSplit], root: Path, out: Path) -> Path:
    """COCO converted once into ``out/converted`` (kept while its JSON files are unchanged), and its data.yaml."""
    converted = out / "converted"
    stats = [(split, split.json.stat()) for split in splits]
    identity = [[str(split.json.relative_to(root)), stat.st_size, stat.st_mtime_ns] for split, stat in stats]
    fields: dict[str, Any] | None = None
    try:
        layout = json.loads((converted / _LAYOUT).read_text())
        if layout.get("identity") == identity:
            fields = layout["fields"]
    except (OSError, ValueError, KeyError):
        pass
    if fields is None:
        shutil.rmtree(converted, ignore_errors=True)
        converted.mkdir(parents=True)
        fields = coco.convert(splits, root, converted)
        (converted / _LAYOUT).write_text(json.dumps({"identity": identity, "fields": fields}))
    config: dict[str, Any] = {"path": str(converted.resolve())}
    config |= {key: str(converted.resolve() / value) for key, value in fields.items() if key in SPLITS}
    config["names"] = {int(key): name for key, name in fields["names"].items()}
    target = out / "data.yaml"
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(yaml.safe_dump(config, sort_keys=False))
    return target
