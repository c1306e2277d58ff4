"""What a run will cost, before its first epoch (`trainbox plan`, the log, the card), said as an estimate.

dollars = $/h × hours; hours = epochs × training images × seconds per image ÷ 3600. The seconds per image
are measured (``--seconds-per-image``: the figure a run's card and trainbox.json give after its first
epoch) or tabled: the published training time of the YOLO of the same size on a V100 (``REFERENCE``),
× (imgsz / 640)², ÷ the card's memory bandwidth against the V100's (``GPUS``: a first proxy for how fast
a card trains a convnet, as in Tim Dettmers' GPU guide; small models are often held back by data
loading, large ones less). It is an estimate, within a factor of two or so: the first epoch's measured
figure replaces it in the progress line and on the card. The sources are in docs/costs.md.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..log import logger

if TYPE_CHECKING:
    from ..settings import Settings
    from ..state import RunState

# ultralytics/yolov5 README, "Training": "Training times for YOLOv5n/s/m/l/x are 1/2/4/6/8 days on a V100 GPU",
# 300 epochs of COCO train2017 (118,287 images) at 640 px; LibreYOLO's sizes mapped to the YOLOv5 of like compute.
COCO_TRAIN_IMAGES = 118_287
REFERENCE_SOURCE = "YOLOv5 README: a V100 trains YOLOv5{size} 300 COCO epochs in {days}"
_DAYS = {"n": 1, "s": 2, "m": 4, "l": 6, "x": 8}
_SIZE_CLASS = {"n": "n", "t": "n", "s": "s", "m": "m", "c": "l", "l": "l", "e": "x", "x": "x"}
V100_GBPS = 900.0  # NVIDIA V100 datasheet: 900 GB/s HBM2
REFERENCE_IMGSZ = 640
# Prices listed on 2026-05-07 on the providers' own pages (Modal bills per second: $/s × 3600).
_MODAL = "modal.com/pricing, 2026-05-07"
_LAMBDA = "lambda.ai/pricing, on demand, 2026-05-07"


@dataclass(frozen=True)
class Gpu:
    name: str
    match: tuple[str, ...]  # every word must appear in the name asked for, or that nvidia-smi reports
    memory_gbps: float  # NVIDIA datasheet memory bandwidth
    price_per_hour: float | None = None  # a listed on-demand price, where one provider lists a single one
    price_source: str | None = None


GPUS: tuple[Gpu, ...] = (  # most specific first
    Gpu("H200", ("h200",), 4800.0),
    Gpu("H100 PCIe", ("h100", "pcie"), 2000.0, 2.86, _LAMBDA),
    Gpu("H100", ("h100",), 3350.0, 3.95, _MODAL),
    Gpu("A100 80GB", ("a100", "80gb"), 2039.0, 2.50, _MODAL),
    Gpu("A100 40GB", ("a100",), 1555.0, 1.48, _LAMBDA),
    Gpu("L40S", ("l40s",), 864.0, 1.95, _MODAL),
    Gpu("L4", ("l4",), 300.0, 0.80, _MODAL),
    Gpu("A10G", ("a10g",), 600.0),
    Gpu("A10", ("a10",), 600.0, 0.86, _LAMBDA),
    Gpu("T4", ("t4",), 320.0, 0.59, _MODAL),
    Gpu("V100", ("v100",), 900.0),
    Gpu("RTX 6000 Ada", ("rtx", "6000", "ada"), 960.0),
    Gpu("RTX A6000", ("a6000",), 768.0),
    Gpu("RTX 4090", ("4090",), 1008.0),
    Gpu("RTX 3090", ("3090",), 936.0),
)
_SIZE = re.compile(r"(?:yolo[a-z0-9]*?)[-_]?([ntsmlcex])(?:\.pt)?$", re.IGNORECASE)


def gpu_table(model: str = "LibreYOLO9s.pt", epochs: int = 100, images: int = 5000) -> list[str]:
    """The table docs/costs.md prints (tests/unit/test_docs.py keeps it equal): each card's tabled figure and
    what ``epochs`` of ``images`` of ``model`` at 640 px would cost at its listed price."""
    rows = [
        f"| GPU | memory GB/s | s/image ({model}, 640 px) | {epochs} epochs of {images} images"
        " | listed $/h | price source |",
        "|---|---:|---:|---:|---:|---|",
    ]
    for gpu in GPUS:
        per_image, _ = seconds_per_image(gpu, model, REFERENCE_IMGSZ)
        found = Estimate(epochs, images, per_image, "", gpu.price_per_hour, gpu.price_source)
        money = (
            f"{hours_text(found.seconds)}, ${found.dollars:.2f}"
            if found.dollars is not None
            else hours_text(found.seconds)
        )
        price = f"{gpu.price_per_hour:.2f}" if gpu.price_per_hour is not None else "—"
        rows.append(
            f"| {gpu.name} | {gpu.memory_gbps:.0f} | {per_image:.4f} | {money} | {price} | {gpu.price_source or '—'} |"
        )
    return rows


def find_gpu(name: str | None) -> Gpu | None:
    """The table's entry for a card as a person or nvidia-smi names it (``A100-80GB``, ``NVIDIA H100 80GB HBM3``)."""
    words = (name or "").lower().replace("-", " ").replace("_", " ")
    tokens = set(words.split())
    for gpu in GPUS:
        if all(part in tokens or (len(part) > 3 and part in words) for part in gpu.match):
            return gpu
    return None


def model_size(model: str | None) -> str | None:
    """The size letter of a LibreYOLO model name (``LibreYOLO9s.pt`` → s, ``yolox-m`` → m); None if none."""
    stem = Path((model or "").split("@")[0]).name
    found = _SIZE.search(stem)
    return found.group(1).lower() if found else None


def seconds_per_image(gpu: Gpu, model: str | None, imgsz: int) -> tuple[float, str]:
    """The tabled figure and where it comes from."""
    known = _SIZE_CLASS.get(model_size(model) or "")
    size = known or "s"
    days = _DAYS[size]
    reference = days * 86400 / (300 * COCO_TRAIN_IMAGES)
    value = reference * (imgsz / REFERENCE_IMGSZ) ** 2 * V100_GBPS / gpu.memory_gbps
    reference_text = REFERENCE_SOURCE.format(size=size, days=f"{days} day" + "s" * (days > 1))
    unknown = "" if known else " (model size unknown: s assumed)"
    source = (
        f"{reference_text}{unknown}, × ({imgsz}/640)², × V100's {V100_GBPS:.0f} GB/s"
        f" ÷ the {gpu.name}'s {gpu.memory_gbps:.0f} GB/s"
    )
    return value, source


@dataclass(frozen=True)
class Estimate:
    epochs: int
    images: int
    seconds_per_image: float
    speed_source: str
    price_per_hour: float | None
    price_source: str | None

    @property
    def seconds(self) -> float:
        return self.epochs * self.images * self.seconds_per_image

    @property
    def dollars(self) -> float | None:
        return None if self.price_per_hour is None else self.seconds / 3600 * self.price_per_hour

    def as_dict(self) -> dict[str, Any]:
        return {
            "epochs": self.epochs,
            "images": self.images,
            "seconds_per_image": round(self.seconds_per_image, 6),
            "speed_source": self.speed_source,
            "training_hours": round(self.seconds / 3600, 3),
            "price_per_hour": self.price_per_hour,
            "price_source": self.price_source,
            "dollars": None if self.dollars is None else round(self.dollars, 2),
        }

    def money(self) -> str:
        if self.dollars is None:
            return "dollars unknown (set PRICE_PER_HOUR or --price)"
        return f"~${self.dollars:.2f}" if self.dollars >= 0.01 else "under $0.01"

    def line(self) -> str:
        """The log's line: ``estimate: ~$1.62 for 100 epochs of 5000 images (~2.0 h at $0.80/h), from …``."""
        price = f" at ${self.price_per_hour:.2f}/h" if self.price_per_hour is not None else ""
        return (
            f"estimate: {self.money()} for {self.epochs} epochs of {self.images} images (~{hours_text(self.seconds)}"
            f"{price}), from {self.seconds_per_image:.3g} s/image ({self.speed_source});"
            " the first epoch's measured figure replaces it"
        )

    def lines(self) -> list[str]:
        """`trainbox plan`'s lines."""
        price = f" at ${self.price_per_hour:.2f}/h ({self.price_source})" if self.price_per_hour is not None else ""
        return [
            f"cost: {self.money()} for {self.epochs} epochs of {self.images} images:"
            f" ~{hours_text(self.seconds)} of training{price}",
            f"  an estimate from {self.seconds_per_image:.3g} s/image: {self.speed_source}",
            "  a run measures its own figure in its first epoch (the epoch line and the card show it);"
            " setup, the dataset and the uploads add minutes (the run's receipt shows each)",
        ]


def from_record(record: Any) -> Estimate | None:
    """The ``estimate`` block of trainbox.json back as an Estimate (None when absent or damaged)."""
    if not isinstance(record, dict):
        return None
    try:
        return Estimate(
            epochs=int(record["epochs"]),
            images=int(record["images"]),
            seconds_per_image=float(record["seconds_per_image"]),
            speed_source=str(record["speed_source"]),
            price_per_hour=None if record.get("price_per_hour") is None else float(record["price_per_hour"]),
            price_source=record.get("price_source"),
        )
    except (KeyError, TypeError, ValueError):
        return None


def projected(rows: list[dict[str, Any]], total: int | None, price_per_hour: float | None) -> dict[str, Any] | None:
    """From the epochs done (metrics.jsonl rows): the measured seconds per epoch, and the training's dollars
    at that pace for ``total`` epochs (what replaces the estimate once the first epoch is done)."""
    times = [float(row["time"]) for row in rows if isinstance(row.get("time"), int | float)]
    if not times or not total:
        return None
    pace = sum(times[-5:]) / len(times[-5:])
    seconds = sum(times) + pace * max(0, total - len(times))
    dollars = None if price_per_hour is None else round(seconds / 3600 * price_per_hour, 2)
    return {"seconds_per_epoch": round(pace, 2), "training_hours": round(seconds / 3600, 3), "dollars": dollars}


def hours_text(seconds: float) -> str:
    if seconds >= 3600:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 60:.0f} min" if seconds >= 60 else f"{seconds:.0f} s"


def train_images(data_yaml: Path) -> int | None:
    """How many training images the data.yaml names (folders counted, list files read); None if unreadable."""
    import yaml  # the agent's dependency; imported here, where it is needed

    try:
        config = yaml.safe_load(data_yaml.read_text())
        root = Path(str(config.get("path") or data_yaml.parent))
        root = root if root.is_absolute() else data_yaml.parent / root
        entries = config["train"] if isinstance(config["train"], list) else [config["train"]]
        return sum(_count(root / str(entry)) for entry in entries) or None
    except (OSError, ValueError, KeyError, TypeError, AttributeError, yaml.YAMLError):
        return None


_IMAGES = frozenset({".jpg", ".jpeg", ".png", ".bmp", ".webp", ".tif", ".tiff"})


def at_start(
    settings: Settings, state: RunState, data_yaml: Path, price: Callable[[], float | None]
) -> dict[str, Any] | None:
    """Once the dataset is ready: what training the epochs left should cost (logged), for trainbox.json; only the
    image count on a CPU or a card without figures."""
    images = train_images(data_yaml)
    if images is None:
        return None
    snapshot = state.snapshot()
    done = (snapshot.get("progress") or {}).get("epochs_done") or 0
    args = settings.run_args
    total = (snapshot.get("progress") or {}).get("epochs_total") or int(args.get("epochs") or 300)
    names = [str(gpu.get("name")) for gpu in (snapshot.get("gpus") or {}).get("gpus") or []]
    gpu = find_gpu(names[0]) if names and not settings.gpus.cpu else None
    if gpu is None or total <= done:
        return {"images": images}
    per_image, source = seconds_per_image(gpu, args.get("model"), int(args.get("imgsz") or 640))
    workers = len(names) * settings.topology.nnodes
    if workers > 1:  # data parallel: each GPU takes its share of every epoch
        per_image, source = per_image / workers, f"{source}, ÷ {workers} GPUs"
    cost = snapshot.get("cost") or {}
    found = Estimate(total - done, images, per_image, source, price(), cost.get("price_source") or "PRICE_PER_HOUR")
    logger.info("%s", found.line())
    return found.as_dict()


def _count(where: Path) -> int:
    if where.is_dir():
        return sum(1 for path in where.rglob("*") if path.suffix.lower() in _IMAGES)
    if where.is_file() and where.suffix == ".txt":
        return sum(1 for line in where.read_text().splitlines() if line.strip())
    return 0


def for_plan(
    settings: Settings,
    gpu_name: str | None,
    price: float | None,
    epochs: int | None,
    images: int | None,
    measured: float | None,
) -> Estimate | str:
    """`trainbox plan`'s estimate, or the one line saying what it still needs. Epochs, model and imgsz come from
    RUN_ARGS unless given; a local dataset's (or the demo's) images are counted."""
    gpu = find_gpu(gpu_name) if gpu_name else None
    if gpu_name and gpu is None and measured is None:
        names = ", ".join(entry.name for entry in GPUS)
        return f"no figures for GPU {gpu_name!r}: use one of {names}, or give --seconds-per-image"
    images = images or local_train_images(settings)
    if images is None:
        return f"add --images N (the training images in {settings.dataset_repo}) to see dollars"
    args = settings.run_args
    total = epochs or _int(args.get("epochs")) or LIBREYOLO_DEFAULT_EPOCHS
    if measured is not None:
        speed, source = measured, "measured, --seconds-per-image"
    elif gpu is not None:
        speed, source = seconds_per_image(gpu, args.get("model"), _int(args.get("imgsz")) or REFERENCE_IMGSZ)
    else:
        return "add --gpu NAME (H100, A100-80GB, L40S, L4, T4, …) or --seconds-per-image to see dollars"
    per_hour: float | None
    price_source: str | None
    if price is not None:
        per_hour, price_source = price, "--price"
    elif settings.price_per_hour is not None:
        per_hour, price_source = settings.price_per_hour, "PRICE_PER_HOUR"
    else:
        per_hour, price_source = (gpu.price_per_hour, gpu.price_source) if gpu else (None, None)
    return Estimate(total, images, speed, source, per_hour, price_source)


LIBREYOLO_DEFAULT_EPOCHS = 300


def local_train_images(settings: Settings) -> int | None:
    """The training images of the demo or a local dataset folder (a Hub dataset is not downloaded to count)."""
    from ..dataset import demo
    from ..settings import DatasetKind

    if settings.dataset_kind is DatasetKind.DEMO:
        return demo.TRAIN_IMAGES
    if settings.dataset_kind is DatasetKind.LOCAL_DIR and settings.dataset_repo:
        root = Path(settings.dataset_repo)
        found = [root / settings.data_yaml] if settings.data_yaml else sorted(root.rglob("data.yaml"))
        return train_images(found[0]) if len(found) == 1 else None
    return None


def _int(text: str | None) -> int | None:
    try:
        return int(text) if text is not None else None
    except ValueError:
        return None
