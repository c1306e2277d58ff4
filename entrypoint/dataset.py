"""Dataset stage: get the data onto the volume, find its data.yaml, and have libreyolo check it.

Sources: the bundled demo (generated), a local folder holding a data.yaml, a local tar, or a
Hugging Face dataset repo holding the dataset as one tar.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from . import demo
from .errors import AmbiguousDataYamlError, DatasetInvalidError, DatasetNotFoundError, DataYamlNotFoundError
from .log import logger
from .settings import DatasetKind, Settings
from .state import write_json_atomic
from .training import libreyolo_executable

DOCTOR_TIMEOUT = 30 * 60.0
_DOCTOR_MARKER = ".trainbox-doctor.json"


@dataclass(frozen=True)
class PreparedDataset:
    data_yaml: Path  # the data.yaml libreyolo gets: its `path` points at the dataset root
    root: Path
    description: str
    revision: str | None = None  # the resolved commit sha of a Hub dataset


def data_dir(settings: Settings) -> Path:
    return settings.workdir / "data"


def prepare(settings: Settings) -> PreparedDataset:
    if settings.dataset_kind is DatasetKind.DEMO:
        data_yaml = demo.write_demo_dataset(data_dir(settings) / "demo")
        logger.info(
            "dataset: the bundled demo (%d images, classes %s)",
            demo.TRAIN_IMAGES + demo.VAL_IMAGES,
            ", ".join(demo.CLASSES),
        )
        return PreparedDataset(data_yaml=data_yaml, root=data_yaml.parent, description="bundled demo")
    if settings.dataset_kind is DatasetKind.LOCAL_DIR:
        assert settings.dataset_repo is not None
        root = Path(settings.dataset_repo)
        if not root.is_dir():
            raise DatasetNotFoundError(f"dataset folder {root} does not exist", "fix DATASET_REPO")
        source_yaml = locate_data_yaml(root, settings.data_yaml)
        resolved = write_resolved_yaml(source_yaml, data_dir(settings) / "local" / _path_key(root) / "data.yaml")
        doctor(resolved, imgsz=_imgsz(settings), fingerprint=_folder_fingerprint(root, source_yaml))
        return PreparedDataset(data_yaml=resolved, root=root, description=str(root))
    from . import dataset_hub

    return dataset_hub.prepare(settings)


def locate_data_yaml(root: Path, wanted: str | None) -> Path:
    """``DATA_YAML`` (relative to the root) or the only data.yaml in the tree."""
    if wanted is not None:
        candidate = (root / wanted).resolve()
        if not candidate.is_relative_to(root.resolve()) or not candidate.is_file():
            raise DataYamlNotFoundError(
                f"DATA_YAML={wanted} is not a file in the dataset", "give a path relative to its root"
            )
        return candidate
    found = sorted(path for path in root.rglob("*.yaml") if path.name in {"data.yaml", "dataset.yaml"})
    if not found:
        raise DataYamlNotFoundError(f"no data.yaml in {root}", "add one (YOLO format), or set DATA_YAML")
    if len(found) > 1:
        listed = ", ".join(str(path.relative_to(root)) for path in found[:5])
        raise AmbiguousDataYamlError(f"several data.yaml files: {listed}", "choose one with DATA_YAML")
    return found[0]


def write_resolved_yaml(source: Path, target: Path) -> Path:
    """A copy of ``source`` whose ``path`` is absolute, so libreyolo finds the data wherever it runs."""
    try:
        config = yaml.safe_load(source.read_text()) or {}
    except (OSError, yaml.YAMLError) as error:
        raise DatasetInvalidError(f"{source.name} is not valid YAML: {error}".splitlines()[0], "fix the file") from None
    if not isinstance(config, dict):
        raise DatasetInvalidError(f"{source.name} is not a YAML mapping", "see libreyolo's dataset format")
    root = source.parent
    given = config.get("path")
    if isinstance(given, str) and given:
        given_path = Path(given)
        # An absolute path from the machine the dataset was made on is meaningless here.
        if not given_path.is_absolute() and (root / given_path).is_dir():
            root = (root / given_path).resolve()
    config["path"] = str(root.resolve())
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(yaml.safe_dump(config, sort_keys=False))
    return target


def doctor(data_yaml: Path, *, imgsz: int, fingerprint: str) -> dict[str, Any]:
    """Run ``libreyolo doctor``; stop on its errors. Skipped when this exact data already passed."""
    marker = data_yaml.parent / _DOCTOR_MARKER
    try:
        cached = json.loads(marker.read_text())
        if cached.get("fingerprint") == fingerprint:
            logger.info("dataset check: passed before, not repeated")
            return cached["report"]
    except (OSError, ValueError, KeyError):
        pass
    argv = [libreyolo_executable(), "doctor", str(data_yaml), "--imgsz", str(imgsz), "--json"]
    logger.info("+ %s", " ".join(argv))
    result = subprocess.run(argv, capture_output=True, text=True, timeout=DOCTOR_TIMEOUT, cwd=data_yaml.parent)
    try:
        report = json.loads(result.stdout)
    except ValueError:
        tail = (result.stderr.strip().splitlines() or ["no output"])[-1]
        raise DatasetInvalidError(f"libreyolo doctor failed: {tail}", "check the data.yaml") from None
    findings = report.get("findings", [])
    for finding in findings:
        if finding.get("severity") == "warning":
            logger.warning("dataset check: %s", finding.get("message"))
    problems = [finding for finding in findings if finding.get("severity") == "error"]
    if result.returncode != 0 or problems:
        first = problems[0] if problems else {"message": f"exit code {result.returncode}"}
        paths = first.get("paths") or []
        where = f" ({paths[0]})" if paths else ""
        more = f" and {len(problems) - 1} more" if len(problems) > 1 else ""
        raise DatasetInvalidError(
            f"the dataset check found errors: {first.get('message')}{where}{more}",
            "fix the dataset; run `libreyolo doctor <data.yaml>` to see every finding",
        )
    summary = report.get("summary", {})
    logger.info("dataset check: %s errors, %s warnings", summary.get("errors", 0), summary.get("warnings", 0))
    write_json_atomic(marker, {"fingerprint": fingerprint, "report": report})
    return report


def _imgsz(settings: Settings) -> int:
    value = settings.run_args.get("imgsz") or "640"
    try:
        return max(int(part) for part in value.lower().replace("x", ",").split(",") if part.strip())
    except ValueError:
        return 640


def _path_key(path: Path) -> str:
    return hashlib.sha256(str(path.resolve()).encode()).hexdigest()[:12]


def _folder_fingerprint(root: Path, data_yaml: Path) -> str:
    """Cheap identity of a local dataset: its data.yaml and the names, sizes and times of its files."""
    digest = hashlib.sha256(data_yaml.read_bytes())
    for folder, _, files in sorted(os.walk(root)):
        for name in sorted(files):
            stat = os.stat(os.path.join(folder, name))
            digest.update(f"{folder}/{name}:{stat.st_size}:{stat.st_mtime_ns}\n".encode())
    return digest.hexdigest()
