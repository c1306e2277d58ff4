"""`trainbox plan`: the run `trainbox run` would start, priced before renting.

The same settings as the run (the model, epochs and imgsz of ``training/planned.py``: RUN_ARGS', else libreyolo's
defaults), the dataset's size from ``--images``, a local folder (counted) or the tar's size (on the Hub, read
without downloading it), and every line from the one set of arguments: the cost, the disk, the checkpoints. When
it prices the bundled demo (DATASET_REPO unset), or RUN_ARGS on a dataset the run would not train, it says so.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

from ..release import cost
from ..settings import DatasetKind, Settings
from ..training.planned import planned
from . import dashboard, estimate

# COCO train2017: 118,287 images in 18 GB (cocodataset.org/#download, "2017 Train images [118K/18GB]"): roughly the
# images a tar of a given size holds, where nobody counted them.
COCO_BYTES_PER_IMAGE = 18e9 / 118_287


@dataclass(frozen=True)
class Options:
    gpu: str | None = None
    price: float | None = None
    epochs: int | None = None
    images: int | None = None
    seconds_per_image: float | None = None
    disk_gb: float | None = None
    storage_price: float | None = None
    rebuild_cost: float | None = None


def report(settings: Settings | None, options: Options) -> tuple[dict[str, Any], list[str]]:
    """The plan as JSON fields and text lines; ``settings`` None: only the stop-or-destroy arithmetic was asked."""
    fields: dict[str, Any] = {}
    lines: list[str] = []
    disk_gb = options.disk_gb
    if settings is not None:
        target, said = _the_run(settings, options)
        run = planned(target.run_args)
        fields["run"] = run.as_dict()
        lines.append(f"run: {run.describe()}")
        disk: dict[str, Any] | None = None
        if disk_gb is None or settings.dataset_repo:
            from .. import dataset  # the Hub's client and the dataset code only where the disk is asked

            disk, disk_lines = dataset.disk_report(target, unknown_dataset=said is not None)
            fields["disk"] = disk
            disk_gb = disk_gb if disk_gb is not None else float(disk["recommended_disk_gb"])
        else:
            disk_lines = []
        images, basis = _images(target, options.images, disk, said)
        fields["dataset"] = {"images": images, "basis": basis}
        lines.append(f"dataset: {basis}")
        found = estimate.for_plan(target, options.gpu, options.price, None, images, options.seconds_per_image)
        fields["estimate"] = found.as_dict() if isinstance(found, estimate.Estimate) else {"missing": found}
        lines += found.lines() if isinstance(found, estimate.Estimate) else [f"cost: {found}"]
        lines += disk_lines
        if (board := dashboard.where(settings)) is not None:
            fields["dashboard"] = board
            lines.append(f"dashboard: {board}")
    if options.storage_price is None or disk_gb is None:
        lines.append("add --storage-price ($/GB-month) to see when stopping beats destroying")
        return fields, lines
    stop_or_destroy = cost.StopOrDestroy(disk_gb, options.storage_price, options.rebuild_cost)
    fields["stop_or_destroy"] = stop_or_destroy.as_dict()
    lines += stop_or_destroy.lines()
    return fields, lines


def _the_run(settings: Settings, options: Options) -> tuple[Settings, str | None]:
    """The settings of the run priced, and what to say of its dataset when it is not what `trainbox run` trains."""
    args, said = settings.run_args, None
    if settings.is_demo and options.images is not None:
        # A dataset of that many images, not the demo: RUN_ARGS as given, without the demo's defaults.
        args = settings.user_run_args
        said = (
            "DATASET_REPO is unset, so `trainbox run` would train the bundled demo instead;"
            " set DATASET_REPO to price the run it starts"
        )
    if options.epochs is not None:
        args = args.set("epochs", str(options.epochs))
    return dataclasses.replace(settings, run_args=args), said


def _images(
    settings: Settings, given: int | None, disk: dict[str, Any] | None, said: str | None
) -> tuple[int | None, str]:
    """The training images priced, and one line saying where the number comes from."""
    source = settings.dataset_repo or "the bundled demo"
    if given is not None:
        return given, f"{given} training images (--images){f'; {said}' if said else ''}"
    if settings.is_demo:
        counted = estimate.local_train_images(settings)
        return counted, (
            f"DATASET_REPO is unset: pricing the bundled demo ({counted} training images, with the demo's RUN_ARGS"
            " defaults); set DATASET_REPO, or give --images N, to price your own dataset"
        )
    if settings.dataset_kind is DatasetKind.LOCAL_DIR:
        counted = estimate.local_train_images(settings)
        if counted is not None:
            return counted, f"{source}: {counted} training images, counted"
    tar = int((disk or {}).get("tar_bytes") or 0)
    if tar > 0:
        images = max(1, math.floor(tar / COCO_BYTES_PER_IMAGE))
        return images, (
            f"{source}: the tar is {tar / 1e9:.2f} GB, about {images} images at COCO train2017's"
            f" {COCO_BYTES_PER_IMAGE / 1e3:.0f} KB an image (18 GB / 118,287), all counted as training images:"
            " an estimate; --images N gives the true count"
        )
    return None, f"{source}: its images are not counted without downloading it"
