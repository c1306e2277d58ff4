"""Disk sizing: what a dataset and its run need on WORKDIR's disk, the check before downloading, and the
disk to rent (`trainbox plan`)."""

from __future__ import annotations

import math
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import DiskSpaceError
from ..libreyolo import TRAIN_DEFAULTS
from ..run_args import RunArgs
from ..settings import DatasetKind, Settings
from .choose import remote_archive

GB = 1e9
# The guide's sizing rule: data + checkpoints + about 30 %.
DISK_MARGIN = 1.3
# Unpacked size per packed byte, before extraction tells: images barely compress.
_UNPACKED_PER_BYTE = {"tar": 1.0, "gz": 1.5}
# One checkpoint (model, EMA, optimizer) by model size letter, in MB; measured: YOLO9-t 35, YOLO9-s 119.
_CHECKPOINT_MB = {"n": 35, "t": 35, "s": 120, "m": 330, "c": 450, "l": 450, "x": 950, "e": 950}
_UNKNOWN_CHECKPOINT_MB = 450
_DEFAULT_MODEL = TRAIN_DEFAULTS["model"]
_DEFAULT_EPOCHS, _DEFAULT_SAVE_PERIOD = int(TRAIN_DEFAULTS["epochs"]), 10
# The templates' rule for the disk to rent (templates/README.md): 2.5x the tar (the tar, its extracted copy, room
# to spare) plus 30 GB for the checkpoints and the caches (the Hub's, libreyolo's weights, torch's); 10 GB more
# where the same disk holds the image too (Vast.ai, SkyPilot).
RENT_PER_TAR_BYTE, RENT_BASE_GB, IMAGE_GB = 2.5, 30, 10


@dataclass(frozen=True)
class DiskNeed:
    """What a dataset and its run need on WORKDIR's disk, in bytes, by the guide's sizing rule."""

    archive: int  # the tar still to be written (0 when it is already on disk)
    extracted: int  # estimate
    checkpoints: int  # estimate

    @property
    def required(self) -> int:
        return math.ceil((self.archive + self.extracted + self.checkpoints) * DISK_MARGIN)

    @property
    def recommended_gb(self) -> int:
        return max(1, math.ceil(self.required / GB))

    def rent_gb(self, tar_bytes: int) -> int:
        """The disk to rent for WORKDIR: the templates' rule, or this run's need where that is larger."""
        return max(self.recommended_gb, math.ceil(RENT_PER_TAR_BYTE * tar_bytes / GB + RENT_BASE_GB))

    def breakdown(self) -> str:
        return (
            f"tar {self.archive / GB:.1f} GB + extracted ≈{self.extracted / GB:.1f} GB"
            f" + checkpoints ≈{self.checkpoints / GB:.1f} GB, +{DISK_MARGIN - 1:.0%}"
        )

    def as_dict(self) -> dict[str, Any]:
        return {
            "archive_bytes": self.archive,
            "extracted_bytes_estimate": self.extracted,
            "checkpoint_bytes_estimate": self.checkpoints,
            "margin": DISK_MARGIN,
            "required_bytes": self.required,
            "recommended_disk_gb": self.recommended_gb,
        }


def unpacked_estimate(archive_name: str, archive_bytes: int) -> int:
    kind = "gz" if archive_name.endswith((".gz", ".tgz", ".zip")) else "tar"
    return math.ceil(archive_bytes * _UNPACKED_PER_BYTE[kind])


def checkpoint_estimate(args: RunArgs) -> int:
    """Bytes of the checkpoints a run keeps: last.pt, best.pt, one epoch_N.pt per save_period, upload copies."""
    model = args.get("model") or _DEFAULT_MODEL
    stem = Path(model).name.lower().removesuffix(".pt").removesuffix(".yaml")
    letter = stem[-1:] if "yolo" in stem or "detr" in stem else ""
    each = _CHECKPOINT_MB.get(letter, _UNKNOWN_CHECKPOINT_MB) * 1e6
    epochs = _int_arg(args, "epochs", _DEFAULT_EPOCHS)
    period = _int_arg(args, "save_period", _DEFAULT_SAVE_PERIOD)
    kept = 2 + (epochs // period if period > 0 else 0) + 3  # + copies staged for upload
    return math.ceil(each * kept)


def _int_arg(args: RunArgs, key: str, default: int) -> int:
    try:
        return int(args.get(key) or default)
    except ValueError:
        return default


def free_bytes(path: Path) -> int:
    """Free space for us on the filesystem holding ``path`` (or its nearest existing parent)."""
    probe = path
    while not probe.exists() and probe.parent != probe:
        probe = probe.parent
    return shutil.disk_usage(probe).free


def check_disk(workdir: Path, need: DiskNeed) -> int:
    """Stop before downloading when WORKDIR's disk is too small; return its free bytes."""
    free = free_bytes(workdir)
    if free < need.required:
        raise DiskSpaceError(
            f"WORKDIR has {free / GB:.1f} GB free, this dataset and run need {need.required / GB:.1f} GB"
            f" ({need.breakdown()})",
            f"rent a disk of at least {need.recommended_gb} GB, or free space in {workdir}",
        )
    return free


# -- `trainbox plan`: the disk to rent ---------------------------------------------------------------
def disk_report(settings: Settings, unknown_dataset: bool = False) -> tuple[dict[str, Any], list[str]]:
    """The disk WORKDIR needs for this job (JSON fields, text lines): from the tar's size, on the Hub
    without downloading it, and the checkpoints the chosen model and RUN_ARGS keep; the disk to rent by the
    templates' rule. ``unknown_dataset``: priced for a dataset not named (its tar unknown, not the demo's)."""
    checkpoints = checkpoint_estimate(settings.run_args)
    kind = settings.dataset_kind
    if kind is DatasetKind.HUB:
        remote = remote_archive(settings)
        size = tar = remote.size or 0
        need = DiskNeed(size, unpacked_estimate(remote.path, size), checkpoints)
        source = f"{settings.dataset_repo}:{remote.path} at {remote.revision[:12]}"
    elif kind is DatasetKind.LOCAL_TAR:
        assert settings.dataset_repo is not None
        tar = Path(settings.dataset_repo).stat().st_size
        need = DiskNeed(0, unpacked_estimate(settings.dataset_repo, tar), checkpoints)
        source = settings.dataset_repo
    else:  # a local folder is already in place; the demo is a few MB
        tar = 0
        need = DiskNeed(0, 0, checkpoints)
        source = settings.dataset_repo or "the bundled demo"
    if unknown_dataset:
        source = "not named (DATASET_REPO unset): its tar not counted"
    args = settings.run_args
    model = args.get("model") or _DEFAULT_MODEL
    epochs, period = _int_arg(args, "epochs", _DEFAULT_EPOCHS), _int_arg(args, "save_period", _DEFAULT_SAVE_PERIOD)
    rent = need.rent_gb(tar)
    fields = {
        "dataset": source,
        "tar_bytes": tar,
        "model": model,
        "epochs": epochs,
        "save_period": period,
        **need.as_dict(),
        "recommended_disk_gb": rent,
    }
    lines = [
        f"disk: {need.breakdown()} = {need.required / GB:.1f} GB",
        f"  dataset {source}; checkpoints of {model}, {epochs} epochs, one kept every {period}",
        f"  rent at least {rent} GB for WORKDIR: the templates' rule, {RENT_PER_TAR_BYTE:g}x the tar"
        f" ({tar / GB:.1f} GB) + {RENT_BASE_GB} GB for checkpoints and caches, or the need above if larger;"
        f" {IMAGE_GB} GB more where the same disk holds the image (Vast.ai, SkyPilot). A disk cannot shrink later,"
        " and bills while stopped",
    ]
    return fields, lines
