"""Local sources: a folder holding a data.yaml (used in place), or a tar on this machine (extracted into the cache)."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from ..errors import DatasetNotFoundError
from ..log import logger
from ..settings import Settings
from . import extract, unzip, verify
from .cache import PreparedDataset, data_dir, install_archive, path_key, read_ready_marker, safe_name, use_ready_archive
from .checks import Deferred, doctor, imgsz_of
from .disk import GB, DiskNeed, check_disk, checkpoint_estimate, unpacked_estimate
from .forms import libreyolo_yaml


def prepare_folder(settings: Settings, *, defer_to: Deferred | None = None) -> PreparedDataset:
    assert settings.dataset_repo is not None
    root = Path(settings.dataset_repo)
    if not root.is_dir():
        raise DatasetNotFoundError(f"dataset folder {root} does not exist", "fix DATASET_REPO")
    resolved = libreyolo_yaml(root, settings.data_yaml, None, data_dir(settings) / "local" / path_key(root))
    fingerprint = _folder_fingerprint(root, resolved)
    verify.refuse(resolved, root, fingerprint)  # never deferred: training must not start on such data
    doctor(
        resolved,
        imgsz=imgsz_of(settings),
        fingerprint=fingerprint,
        defer_to=defer_to,
        command=settings.libreyolo_command,
        root=root,
    )
    return PreparedDataset(data_yaml=resolved, root=root, description=str(root))


def prepare_tar(settings: Settings, *, defer_to: Deferred | None = None) -> PreparedDataset:
    assert settings.dataset_repo is not None
    tar = Path(settings.dataset_repo)
    try:
        info = tar.stat()
    except OSError:
        raise DatasetNotFoundError(f"dataset tar {tar} does not exist", "fix DATASET_REPO") from None
    identity = {"source": "local_tar", "path": str(tar), "size": info.st_size, "mtime_ns": info.st_mtime_ns}
    entry = data_dir(settings) / "local" / f"{path_key(tar)}-{safe_name(tar.name)}"
    marker = read_ready_marker(entry, identity)
    if marker is not None:
        logger.info("dataset: %s already extracted (%d files), not repeated", tar.name, marker.get("files", 0))
        return use_ready_archive(settings, entry, marker, str(tar), defer_to=defer_to)
    need = DiskNeed(0, unpacked_estimate(tar.name, info.st_size), checkpoint_estimate(settings.run_args))
    free = check_disk(settings.workdir, need)
    logger.info("dataset: extracting %s (%.2f GB)", tar, info.st_size / GB)

    def fill(folder: Path) -> extract.ExtractReport:
        if unzip.is_zip(tar.name):
            return unzip.extract_zip(tar, folder, max_bytes=free - need.checkpoints)
        return extract.extract(extract.read_file(tar), folder, max_bytes=free - need.checkpoints)

    prepared, _ = install_archive(settings, entry, identity, fill, str(tar), defer_to=defer_to)
    return prepared


def _folder_fingerprint(root: Path, data_yaml: Path) -> str:
    """Cheap identity of a local dataset: the data.yaml libreyolo gets and the names, sizes and times of its files."""
    digest = hashlib.sha256(data_yaml.read_bytes())
    for folder, _, files in sorted(os.walk(root)):
        for name in sorted(files):
            stat = os.stat(os.path.join(folder, name))
            digest.update(f"{folder}/{name}:{stat.st_size}:{stat.st_mtime_ns}\n".encode())
    return digest.hexdigest()
