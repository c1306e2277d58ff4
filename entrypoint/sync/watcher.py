"""The watcher: wakes the snapshotter at each epoch boundary, and tells when the training has ended."""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path

from watchdog.events import (
    EVENT_TYPE_CLOSED_NO_WRITE,
    EVENT_TYPE_OPENED,
    FileSystemEvent,
    FileSystemEventHandler,
)
from watchdog.observers import Observer
from watchdog.observers.api import BaseObserver

from .. import libreyolo
from ..log import logger
from ..state import STATE_FILE
from .staging import Signature

BOUNDARY_FILE = libreyolo.STATUS_FILE
# A trainer whose pid is not visible counts as ended only after this long without an epoch.
SILENCE = 15 * 60.0

_READ_ONLY_EVENTS = frozenset({EVENT_TYPE_OPENED, EVENT_TYPE_CLOSED_NO_WRITE})


class _BoundaryHandler(FileSystemEventHandler):
    """Runs on watchdog's thread: it only signals, never does I/O."""

    def __init__(self, wake: threading.Event) -> None:
        self.wake = wake

    def on_any_event(self, event: FileSystemEvent) -> None:
        if event.event_type in _READ_ONLY_EVENTS:  # a reader (the dashboard, trainbox status) changes nothing
            return
        target = getattr(event, "dest_path", "") or event.src_path
        if os.path.basename(os.fsdecode(target)) in {BOUNDARY_FILE, STATE_FILE}:
            self.wake.set()


def watch(run_dir: Path, wake: threading.Event) -> BaseObserver | None:
    """Sets ``wake`` at each write of status.json or trainbox.json in ``run_dir``, from a started
    watchdog observer (the caller stops it); None when file events are unavailable."""
    try:
        observer = Observer()
        observer.schedule(_BoundaryHandler(wake), str(run_dir), recursive=False)
        observer.start()
    except OSError as error:  # no inotify (limits, some volumes): polling alone still works
        logger.warning("file events unavailable (%s): polling the run folder", error)
        return None
    return observer


def training_finished(run_dir: Path, *, now: float | None = None) -> bool:
    """LibreYOLO's status.json says the run ended, or its trainer is gone and the run is silent.

    A missing pid alone proves nothing: ``trainbox sync`` may run as a sidecar in another PID
    namespace, where the trainer's pid does not exist. So a vanished pid ends the sync only once
    status.json has also gone without an update for longer than its epochs take (``SILENCE``
    at least)."""
    path = run_dir / BOUNDARY_FILE
    try:
        status = json.loads(path.read_text())
        age = (time.time() if now is None else now) - path.stat().st_mtime
    except (OSError, ValueError):
        return False
    if status.get("state") in {"completed", "failed"}:
        return True
    pid = status.get("pid")
    if not isinstance(pid, int):
        return False
    try:
        os.kill(pid, 0)
        return False  # alive here (or a process of another namespace with that pid: keep syncing)
    except ProcessLookupError:
        pass
    except PermissionError:
        return False
    # Killed without a word (SIGKILL, OOM) or another namespace: wait out the longest quiet spell.
    return age > _quiet_spell(status)


def boundary_signature(run_dir: Path) -> tuple[int, int, int] | None:
    """status.json as it is now (size, mtime, inode); None when absent."""
    try:
        found = Signature.of(run_dir / BOUNDARY_FILE)
    except OSError:
        return None
    return found.size, found.mtime_ns, found.inode


def run_ended(run_dir: Path, found: tuple[int, int, int] | None, began: float) -> bool:
    """``training_finished`` for a sync that started at ``began`` (monotonic) and found status.json as
    ``found``: an end written before the sync started may be an earlier attempt's, which a restarted
    trainer has not rewritten yet; it counts only once status.json stays unchanged for a quiet spell."""
    if not training_finished(run_dir):
        return False
    if boundary_signature(run_dir) != found:
        return True  # written since the sync started: this run's own word
    try:
        status = json.loads((run_dir / BOUNDARY_FILE).read_text())
    except (OSError, ValueError):
        return False
    return time.monotonic() - began > _quiet_spell(status if isinstance(status, dict) else {})


def _quiet_spell(status: dict[str, object]) -> float:
    """How long a live trainer may leave status.json alone: three epochs, at least SILENCE."""
    epoch = max(
        (v for v in (status.get("mean_epoch_seconds"), status.get("epoch_seconds")) if isinstance(v, (int, float))),
        default=0.0,
    )
    return max(SILENCE, 3 * float(epoch))
