"""The mirror loop that ``trainbox sync`` runs: any LibreYOLO run folder to OUTPUT_REPO until its training ends."""

from __future__ import annotations

import hashlib
import os
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path

from ..errors import ConfigError, PreemptedError
from ..hub import Hub
from ..log import logger
from ..settings import Settings
from .job import sync_error
from .read import hub_newer
from .uploader import Uploader
from .watcher import boundary_signature, run_ended


def mirror(settings: Settings, run_dir: Path, *, once: bool, timeout: float, uploading: Callable[[], None]) -> None:
    """Upload ``run_dir`` beside its training until it ends (``once``: what is there now), then flush
    within ``timeout``. ``uploading`` is called once the repo is writable, before anything is uploaded.
    SIGTERM and SIGINT end the wait; what was written is on the Hub, then ``PreemptedError``."""
    if settings.output_repo is None:
        raise ConfigError("OUTPUT_REPO is not set", "set OUTPUT_REPO=org/name")
    run_dir = run_dir.resolve()
    hub = Hub.for_settings(settings)
    hub.ensure_writable_repo(settings.output_repo)
    key = hashlib.sha256(f"{run_dir}:{settings.output_repo}".encode()).hexdigest()[:12]
    # Staging and ledger on the run's own volume unless WORKDIR says where (e.g. outside a container).
    base = settings.workdir if os.environ.get("WORKDIR") else run_dir.parent
    uploading()
    work = base / ".trainbox" / "sync" / key
    newer = hub_newer(hub, settings.output_repo, run_dir, work / "scratch")  # as `trainbox run` guards it
    uploader = Uploader(hub, settings.output_repo, run_dir, work, superseded=newer.__contains__ if newer else None)
    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())
    found, began = boundary_signature(run_dir), time.monotonic()
    uploader.start()
    logger.info("sync: mirroring %s to %s", run_dir, settings.output_repo)
    while not once and not stop.wait(2.0) and not run_ended(run_dir, found, began):
        pass
    synced = uploader.flush(timeout)
    uploader.stop()
    if not synced:
        raise sync_error(uploader)
    logger.info("sync: %s is on %s (%d commits)", run_dir.name, settings.output_repo, len(uploader.commits))
    if stop.is_set():  # exit 143 as before, for SIGINT too: what was written is on the Hub either way
        raise PreemptedError(f"sync stopped by a signal after {run_dir.name} was synced")
