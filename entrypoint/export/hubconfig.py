"""``config.json`` at the root of OUTPUT_REPO: what this model is (LibreYOLO model, image size, classes, files).

The Hub counts a model repo's downloads by requests for one file, ``config.json`` at the root, unless the repo's
library is one it knows (libreyolo is not): without it every Trainbox repo shows 0 downloads. The run folder is
mirrored at the repo's root, so the file is written there, at the end of a finished run.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import yaml

from .. import libreyolo
from ..run_args import RunArgs

CONFIG_FILE = "config.json"


def class_names(data_yaml: Path | None) -> list[str] | None:
    """data.yaml's ``names`` (a list, or a mapping of index to name) in index order."""
    if data_yaml is None:
        return None
    try:
        names = (yaml.safe_load(data_yaml.read_text()) or {}).get("names")
    except (OSError, yaml.YAMLError, AttributeError):
        return None
    if isinstance(names, dict):
        return [str(names[key]) for key in sorted(names, key=int)]
    return [str(name) for name in names] if isinstance(names, list) else None


def write(run_dir: Path, run_args: RunArgs, data_yaml: Path | None, exports: dict[str, dict[str, Any]]) -> Path:
    names = class_names(data_yaml)
    imgsz = run_args.get("imgsz")
    config: dict[str, Any] = {
        "library_name": "libreyolo",
        "model": run_args.get("model"),
        "imgsz": int(imgsz) if imgsz and imgsz.isdigit() else imgsz,
        "num_classes": len(names) if names is not None else None,
        "names": names,
        "weights": libreyolo.BEST_CHECKPOINT,
        "exports": {name: record["file"] for name, record in exports.items() if record.get("status") == "published"},
    }
    path = run_dir / CONFIG_FILE
    tmp = path.with_name(f".{CONFIG_FILE}.tmp")
    tmp.write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
    os.replace(tmp, path)
    return path
