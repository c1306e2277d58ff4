"""How the training is fed: its CPU threads, DataLoader workers and image cache, sized to what this
container may use (``host.grant``), unless the user chose them.

* Threads (``OMP_NUM_THREADS``, ``MKL_NUM_THREADS``, ``OPENBLAS_NUM_THREADS``; torch's intra-op pool reads
  the first two when it starts): the CPUs granted divided among the training processes of this node (one
  per GPU: libreyolo's own DDP launch or torchrun). torch would otherwise start one thread per core it
  sees, quota or not. OpenCV's pool (``OPENCV_FOR_THREADS_NUM``: its resizes while loading) the same where
  the training process loads its own images, one per DataLoader worker where workers do (each worker is
  a CPU's worth; torch already gives each one thread). A user who set any of them keeps all as set.
* ``workers``: on GPUs, the CPUs per training process with one left for the agent, at most
  ``MAX_WORKERS`` (libreyolo 1.6.0 starts its DataLoader workers anew every epoch: each costs a fork
  and memory per epoch, and past a dozen they feed no faster); on the CPU none: the training's own
  threads already use every CPU granted, a worker would only take CPU from them.
* ``cache``: ``ram`` when loading happens in the training process (``workers=0``; libreyolo's workers
  are respawned each epoch, so each would refill its own cache and drop it) and the decoded, resized
  images of every training process fit in ``RAM_SHARE`` of the memory left; else libreyolo's default
  (no cache). The size is measured: the images are counted and a sample's headers read.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from ..host import grant
from ..run_args import RunArgs
from ..settings import DEMO_CPU_BATCH

if TYPE_CHECKING:
    from ..settings import Settings

THREAD_VARS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "OPENCV_FOR_THREADS_NUM")
MAX_WORKERS = 16
RAM_SHARE = 0.5  # the rest stays for the model, the optimizer, the page cache and the agent
SAMPLE = 32  # images whose headers give the mean decoded size
IMAGE_SUFFIXES = frozenset({".jpg", ".jpeg", ".png", ".bmp", ".tif", ".tiff", ".webp"})
_MB = 1e6


@dataclass(frozen=True)
class Feed:
    """What the training command gets besides the user's arguments, and what trainbox.json records of it."""

    args: RunArgs = field(default_factory=RunArgs)  # keys the user did not set: workers, cache (the demo's CPU batch)
    env: dict[str, str] = field(default_factory=dict)  # the thread variables
    record: dict[str, Any] = field(default_factory=dict)


def threads(cpus: grant.CpuGrant, processes: int, env: dict[str, str]) -> tuple[dict[str, str], dict[str, Any]]:
    """The thread variables for each training process, and their record; none where the user set one."""
    chosen = {name: env[name] for name in THREAD_VARS if env.get(name)}
    if chosen:
        return {}, {"per_process": _int(chosen.get("OMP_NUM_THREADS")), "source": "user", "set": chosen}
    per_process = max(1, cpus.cpus // max(1, processes))
    source = "cgroup quota" if cpus.quota is not None and cpus.cpus < cpus.affinity else "affinity"
    return {name: str(per_process) for name in THREAD_VARS}, {"per_process": per_process, "source": source}


def workers(cpus: grant.CpuGrant, processes: int, on_gpu: bool) -> int:
    """DataLoader workers of each training process."""
    if not on_gpu:
        return 0
    return max(1, min(MAX_WORKERS, (cpus.cpus - 1) // max(1, processes)))


def cache(
    workers: int, processes: int, decoded: tuple[int, int] | None, available: int | None
) -> tuple[str | None, str]:
    """``ram`` or None (libreyolo's default), and why."""
    if workers > 0:
        return None, "DataLoader workers are restarted every epoch (libreyolo 1.6.0): a RAM cache would not last"
    if decoded is None or available is None:
        return None, "the decoded size or the free memory could not be measured"
    needed = decoded[1] * max(1, processes)
    fits = needed <= RAM_SHARE * available
    verdict = "fit in" if fits else "exceed"
    free = f"{RAM_SHARE:.0%} of {available / _MB:.0f} MB free"
    return ("ram" if fits else None), f"{needed / _MB:.0f} MB decoded ({decoded[0]} images) {verdict} {free}"


def decoded_size(data_yaml: Path, imgsz: int) -> tuple[int, int] | None:
    """(images, bytes) of the train and val images decoded and resized as libreyolo caches them (the longer
    side to ``imgsz``, 3 bytes a pixel); None where the data.yaml or the images cannot be read."""
    try:
        from PIL import Image  # libreyolo's own dependency; imported only when a cache is weighed
    except ImportError:
        return None
    images = dataset_images(data_yaml)
    if not images:
        return None
    step = max(1, len(images) // SAMPLE)
    sizes = []
    for path in images[::step][:SAMPLE]:
        try:
            with Image.open(path) as image:
                width, height = image.size
        except (OSError, ValueError, Image.DecompressionBombError):
            continue
        ratio = imgsz / max(width, height)
        sizes.append(int(width * ratio) * int(height * ratio) * 3)
    if not sizes:
        return None
    return len(images), int(sum(sizes) / len(sizes) * len(images))


def dataset_images(data_yaml: Path) -> list[Path]:
    """The image files the train and val entries of a data.yaml name (folders, ``.txt`` lists, or lists of them)."""
    try:
        config = yaml.safe_load(data_yaml.read_text())
    except (OSError, yaml.YAMLError):
        return []
    if not isinstance(config, dict):
        return []
    root = Path(str(config.get("path") or data_yaml.parent))
    root = root if root.is_absolute() else data_yaml.parent / root
    found: list[Path] = []
    for split in ("train", "val"):
        entries = config.get(split)
        for entry in entries if isinstance(entries, list) else [entries]:
            if isinstance(entry, str) and entry:
                found += _images_of(root / entry, root)
    return sorted(set(found))


def _images_of(place: Path, root: Path) -> list[Path]:
    if place.is_dir():
        return [
            Path(folder) / name
            for folder, _, names in os.walk(place)
            for name in names
            if Path(name).suffix.lower() in IMAGE_SUFFIXES
        ]
    if place.suffix == ".txt" and place.is_file():
        listed = [line.strip() for line in place.read_text(errors="replace").splitlines() if line.strip()]
        return [path if path.is_absolute() else root / path for path in map(Path, listed)]
    return []


def _int(text: str | None) -> int | None:
    return int(text) if text is not None and text.strip().isdigit() else None


def imgsz(args: RunArgs) -> int:
    """The longer side of ``imgsz`` (``640``, ``480x640``); libreyolo's default 640."""
    sides = [int(part) for part in re.split(r"[x,]", (args.get("imgsz") or "640").lower()) if part.strip().isdigit()]
    return max(sides, default=640)


def plan(
    args: RunArgs,
    user_args: RunArgs,
    env: dict[str, str],
    *,
    processes: int,
    on_gpu: bool,
    data_yaml: Path | None,
    cpus: grant.CpuGrant | None = None,
    available: int | None = None,
    proc: Path | None = None,
) -> Feed:
    """The feed of a training with ``args`` (the arguments libreyolo gets) of which ``user_args`` came from
    RUN_ARGS (the rest: the demo's defaults), on ``processes`` training processes of this node."""
    cpus = cpus or grant.cpus(proc)  # proc: a folder standing in for /proc/self (TRAINBOX_PROC_SELF)
    thread_env, thread_record = threads(cpus, processes, env)
    added: list[tuple[str, str]] = []
    record: dict[str, Any] = {"cpus": cpus.record(), "processes": processes, "threads": thread_record}

    def given(key: str) -> str | None:
        return None if key not in args else "RUN_ARGS" if key in user_args else "demo default"

    source = given("workers")
    count = _int(args.get("workers")) if source else workers(cpus, processes, on_gpu)
    if source is None:
        added.append(("workers", str(count)))
        why = "the CPUs per GPU, one left for the agent" if on_gpu else "on the CPU, the threads use every CPU"
    record["workers"] = {"value": count, "source": source or "sized", **({} if source else {"why": why})}
    if thread_env and count:  # the workers resize the images, one CPU's worth each
        thread_env["OPENCV_FOR_THREADS_NUM"] = "1"

    source = given("cache")
    if source is not None:
        record["cache"] = {"value": args.get("cache"), "source": source}
    else:
        decoded = decoded_size(data_yaml, imgsz(args)) if data_yaml is not None and count == 0 else None
        if count == 0 and available is None:
            available = grant.memory_available(proc)
        choice, why = cache(count if count is not None else 1, processes, decoded, available)
        if choice is not None:
            added.append(("cache", choice))
        record["cache"] = {"value": choice, "source": "sized", "why": why}
        if decoded is not None:
            record["cache"] |= {"images": decoded[0], "decoded_mb": round(decoded[1] / _MB, 1)}
        if available is not None:
            record["cache"]["available_mb"] = round(available / _MB)
    return Feed(RunArgs(tuple(added)), thread_env, record)


def describe(record: dict[str, Any]) -> str:
    """A trainbox.json ``sizing`` record in a phrase: ``2 CPUs: 2 threads per process, workers 0, cache ram``."""
    cpus = record.get("cpus") or {}
    threads_ = record.get("threads") or {}
    per_process = threads_.get("per_process")
    parts = [
        f"{per_process} thread{'' if per_process == 1 else 's'} per process" if per_process else "user-set threads"
    ]
    for key in ("workers", "cache"):
        value = (record.get(key) or {}).get("value")
        parts.append(f"{key} {value if value not in (None, '') else 'off' if key == 'cache' else '?'}")
    quota = f", quota {cpus['quota']:g}" if isinstance(cpus.get("quota"), int | float) else ""
    count = cpus.get("cpus", "?")
    return f"{count} CPU{'' if count == 1 else 's'}{quota}: " + ", ".join(parts)


def demo_cpu_batch(settings: Settings, gpu_indices: tuple[int, ...] | None) -> RunArgs | None:
    """The demo on a CPU trains at DEMO_CPU_BATCH, unless RUN_ARGS names a batch."""
    if settings.is_demo and gpu_indices is None and "batch" not in settings.user_run_args:
        return RunArgs((("batch", str(DEMO_CPU_BATCH)),))
    return None


def for_job(settings: Settings, args: RunArgs, gpu_indices: tuple[int, ...] | None, data_yaml: Path | None) -> Feed:
    """The feed of this job's training on this node (one process per GPU; the CPU: one), with the demo's
    CPU batch where it applies."""
    feed = plan(
        args,
        settings.user_run_args,
        dict(settings.env),
        processes=len(gpu_indices) if gpu_indices else 1,
        on_gpu=bool(gpu_indices),
        data_yaml=data_yaml,
        proc=settings.proc_self,
    )
    demo = demo_cpu_batch(settings, gpu_indices)
    return replace(feed, args=RunArgs(feed.args.pairs + (demo.pairs if demo is not None else ())))
