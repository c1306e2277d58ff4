"""The mirror loop that ``trainbox sync`` runs: any LibreYOLO run folder to OUTPUT_REPO until its training ends."""

from __future__ import annotations

import hashlib
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path
from types import FrameType

from ..errors import ConfigError, PreemptedError, SyncError
from ..hub import Hub
from ..log import logger
from ..release.clock import PREEMPT_BUDGET, ShutdownClock
from ..settings import Settings
from .job import sync_error
from .read import hub_newer
from .uploader import Uploader
from .watcher import boundary_signature, run_ended

# How long the threads may take to end once the flush is over, when no signal presses.
STOP_TIMEOUT = 5.0


def mirror(settings: Settings, run_dir: Path, *, once: bool, timeout: float, uploading: Callable[[], None]) -> None:
    """Upload ``run_dir`` beside its training until it ends (``once``: what is there now), then flush
    within ``timeout``. ``uploading`` is called once the repo is writable, before anything is uploaded.

    SIGTERM and SIGINT end the wait and put the rest under the shutdown clock: the process ends within
    PREEMPT_BUDGET of the signal, with ``PreemptedError`` (143) when the Hub holds everything, else a
    ``SyncError`` (70) naming what is not on it (still in the run folder)."""
    if settings.output_repo is None:
        raise ConfigError("OUTPUT_REPO is not set", "set OUTPUT_REPO=org/name")
    run_dir = run_dir.resolve()
    clock = ShutdownClock()
    stop = threading.Event()
    running: list[Uploader] = []  # the uploader once its threads run: a signal cuts its flush short

    def on_signal(signum: int, _frame: FrameType | None) -> None:
        if not clock.preempt():
            return  # a second signal: the first one's bound holds
        stop.set()
        stop_name = signal.Signals(signum).name
        if not running:  # nothing uploaded yet: nothing to wait for (raised through any retry under way)
            raise PreemptedError(f"sync stopped by {stop_name} before its upload began")
        logger.warning("sync: %s: the upload gets %.0f s more, then the sync ends", stop_name, PREEMPT_BUDGET)
        running[0].cut_short(clock.upload_cutoff)

    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, on_signal)
    found, began = boundary_signature(run_dir), time.monotonic()  # an end already written may be an older one's
    try:
        uploader = _begin(settings, run_dir, uploading)
    except PreemptedError as early:
        raise SyncError(f"{early}: nothing of {run_dir.name} was uploaded", "run `trainbox sync` again") from None
    running.append(uploader)
    logger.info("sync: mirroring %s to %s", run_dir, settings.output_repo)
    while not once and not stop.wait(2.0) and not run_ended(run_dir, found, began):
        pass
    synced = uploader.flush(timeout)
    uploader.stop(timeout=clock.remaining(STOP_TIMEOUT))
    stopped = " (stopped by a signal)" if clock.preempted else ""
    if not synced:
        raise sync_error(uploader, stopped)
    logger.info("sync: %s is on %s (%d commits)", run_dir.name, settings.output_repo, len(uploader.commits))
    if stopped:  # exit 143 as before, for SIGINT too: what was written is on the Hub either way
        raise PreemptedError(f"sync stopped by a signal after {run_dir.name} was synced")


def _begin(settings: Settings, run_dir: Path, uploading: Callable[[], None]) -> Uploader:
    """The repo writable, what the Hub holds newer read, the uploader's threads running."""
    assert settings.output_repo is not None
    hub = Hub.for_settings(settings)
    hub.ensure_writable_repo(settings.output_repo)
    key = hashlib.sha256(f"{run_dir}:{settings.output_repo}".encode()).hexdigest()[:12]
    # Staging and ledger on the run's own volume unless WORKDIR says where (e.g. outside a container).
    base = settings.workdir if settings.workdir_given else run_dir.parent
    uploading()
    work = base / ".trainbox" / "sync" / key
    newer = hub_newer(hub, settings.output_repo, run_dir, work / "scratch")  # as `trainbox run` guards it
    uploader = Uploader(hub, settings.output_repo, run_dir, work, superseded=newer.__contains__ if newer else None)
    uploader.start()
    return uploader
