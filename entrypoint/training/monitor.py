"""MONITOR=1: LibreYOLO's own read-only dashboard (``libreyolo monitor``) beside training.

It binds MONITOR_HOST (127.0.0.1 by default; the image sets 0.0.0.0 so a published port
reaches it, and compose publishes it on the host's 127.0.0.1 only) on port 8420.
"""

from __future__ import annotations

import signal
from pathlib import Path

from .. import libreyolo
from ..log import logger
from ..procs import Child
from ..settings import Settings

MONITOR_PORT = 8420


class Monitor:
    def __init__(self, settings: Settings) -> None:
        log_path = settings.workdir / ".trainbox" / "monitor.log"
        log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log = log_path.open("ab")
        argv = [
            libreyolo.executable(settings.libreyolo_command),
            "monitor",
            str(settings.workdir / "runs"),
            "--host",
            settings.monitor_host,
            "--port",
            str(MONITOR_PORT),
            "--no-browser",
        ]
        self.child = Child(argv, cwd=settings.workdir, env=settings.env, output=self._log)
        logger.info(
            "monitor: libreyolo's dashboard on %s:%d (log %s)", settings.monitor_host, MONITOR_PORT, Path(log_path).name
        )

    def stop(self, grace: float = 3.0) -> None:
        self.child.stop(signal.SIGTERM, grace=grace)
        self._log.close()


def start(settings: Settings) -> Monitor | None:
    if not settings.monitor:
        return None
    try:
        return Monitor(settings)
    except OSError as error:  # a dashboard is a convenience: never a reason to stop training
        logger.warning("monitor: could not start libreyolo monitor: %s", error)
        return None
