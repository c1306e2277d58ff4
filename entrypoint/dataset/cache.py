"""Extracted archives cached on the volume: a staging folder renamed into place once checked, and a ready marker."""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from ..errors import CrashLoopError
from ..log import logger
from ..settings import Settings
from ..state import now_iso, write_json_atomic
from . import extract, verify
from .checks import Deferred, doctor, imgsz_of
from .disk import GB
from .forms import libreyolo_yaml

# Extractions of the same archive cut short without a word (the agent killed: out of memory) before
# the next start refuses it, instead of being killed the same way on every restart.
EXTRACT_STARTS = 3
READY_MARKER = ".trainbox-ready.json"


@dataclass(frozen=True)
class PreparedDataset:
    data_yaml: Path  # the data.yaml libreyolo gets: its `path` points at the dataset root
    root: Path
    description: str
    revision: str | None = None  # the resolved commit sha of a Hub dataset
    timings: Mapping[str, float] = field(default_factory=dict)  # seconds by step, when work was done
    download_mbps: float | None = None  # the dataset's download, when it was fetched now (the host report)


def data_dir(settings: Settings) -> Path:
    return settings.workdir / "data"


def path_key(path: Path) -> str:
    return hashlib.sha256(str(path.resolve()).encode()).hexdigest()[:12]


def safe_name(name: str) -> str:
    """A file-system-friendly form of a name from elsewhere (repo ids, file names)."""
    return re.sub(r"[^A-Za-z0-9._-]+", "-", name).strip("-.")[:80] or "x"


Fill = Callable[[Path], extract.ExtractReport]


def read_ready_marker(entry: Path, identity: dict[str, Any]) -> dict[str, Any] | None:
    """The marker of a complete entry for exactly this archive, or None."""
    try:
        marker = json.loads((entry / READY_MARKER).read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(marker, dict) or marker.get("identity") != identity or not (entry / "tree").is_dir():
        return None
    return marker


def install_archive(
    settings: Settings,
    entry: Path,
    identity: dict[str, Any],
    fill: Fill,
    description: str,
    *,
    defer_to: Deferred | None = None,
) -> tuple[PreparedDataset, dict[str, Any]]:
    """Extract an archive into ``entry/tree`` through a staging folder; check it; mark it ready.

    ``fill(folder)`` extracts into ``folder`` (which must not exist yet). Nothing is left behind
    on failure; ``entry`` appears only once the data passed the check (or, with ``defer_to``, once
    the check is noted there: ``checks.doctor``).
    """
    staging = entry.with_name(f".{entry.name}.staging")
    starts = _count_extraction(entry, identity)
    shutil.rmtree(staging, ignore_errors=True)  # an earlier attempt that was cut short
    shutil.rmtree(entry, ignore_errors=True)  # present without its marker: incomplete
    staging.mkdir(parents=True)
    try:
        started = time.monotonic()
        report = fill(staging / "tree")
        timings = {"transfer": round(time.monotonic() - started, 3)}
        logger.info(
            "dataset: %d files, %.2f GB extracted in %.1f s", report.files, report.bytes / GB, timings["transfer"]
        )
        started = time.monotonic()
        _checked_yaml(settings, staging, report.data_yamls, identity, defer_to=defer_to)
        timings["check"] = round(time.monotonic() - started, 3)
        os.rename(staging, entry)
    except BaseException as error:
        if not isinstance(error, extract.STOP_REQUESTS):
            shutil.rmtree(staging, ignore_errors=True)
        raise
    finally:  # any end the agent lived to see, success or error, is not a kill
        starts.unlink(missing_ok=True)
    prepared = _checked_yaml(settings, entry, report.data_yamls, identity, description, defer_to=defer_to)
    marker = {
        "identity": identity,
        "files": report.files,
        "bytes": report.bytes,
        "data_yamls": report.data_yamls,
        "created_at": now_iso(),
    }
    write_json_atomic(entry / READY_MARKER, marker)
    return replace(prepared, timings=timings), marker


def _count_extraction(entry: Path, identity: dict[str, Any]) -> Path:
    """Count this start of the extraction on the volume; refuse after ``EXTRACT_STARTS`` that ended in a kill.

    The crash-loop breaker judges attempts that ended with an exit code; an agent killed by the
    kernel (out of memory) leaves none, so only this count on the volume stops the loop."""
    path = entry.with_name(f".{entry.name}.starts.json")
    try:
        record = json.loads(path.read_text())
    except (OSError, ValueError):
        record = {}
    count = int(record.get("starts", 0)) if record.get("identity") == identity else 0
    if count >= EXTRACT_STARTS:
        raise CrashLoopError(
            f"the last {count} extractions of this dataset archive were cut short without an error"
            " (the agent was killed: out of memory?); not trying again",
            f"check the archive, or use a machine with more memory and delete {path}",
        )
    path.parent.mkdir(parents=True, exist_ok=True)
    write_json_atomic(path, {"identity": identity, "starts": count + 1, "at": now_iso()})
    return path


def use_ready_archive(
    settings: Settings, entry: Path, marker: dict[str, Any], description: str, *, defer_to: Deferred | None = None
) -> PreparedDataset:
    return _checked_yaml(settings, entry, marker.get("data_yamls"), marker["identity"], description, defer_to=defer_to)


def _checked_yaml(
    settings: Settings,
    entry: Path,
    data_yamls: Sequence[str] | None,
    identity: dict[str, Any],
    description: str = "",
    *,
    defer_to: Deferred | None = None,
) -> PreparedDataset:
    root = entry / "tree"
    resolved = libreyolo_yaml(root, settings.data_yaml, list(data_yamls) if data_yamls is not None else None, entry)
    chosen = settings.data_yaml or sorted(data_yamls or [])
    fingerprint = hashlib.sha256(json.dumps([identity, chosen], sort_keys=True).encode()).hexdigest()
    verify.refuse(resolved, root, fingerprint)  # never deferred: training must not start on such data
    doctor(
        resolved,
        imgsz=imgsz_of(settings),
        fingerprint=fingerprint,
        defer_to=defer_to,
        command=settings.libreyolo_command,
        root=root,
    )
    return PreparedDataset(data_yaml=resolved, root=root, description=description)
