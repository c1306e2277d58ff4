"""The one child-process helper: start in a new session, echo the command, stop the whole tree.

libreyolo's multi-GPU launch starts its coordinator in a session of its own, so signalling the
child's process group is not enough: ``stop`` also signals every descendant found in /proc.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import signal
import subprocess
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO

from .log import logger, redact


def descendants(pid: int) -> list[int]:
    """PIDs below ``pid`` (children first), read from /proc; empty where /proc is absent."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").glob("[0-9]*"):
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        # The command name may hold spaces and parentheses: fields start after the last ')'.
        fields = stat.rsplit(")", 1)[-1].split()
        if len(fields) > 1:
            children.setdefault(int(fields[1]), []).append(int(entry.name))
    found: list[int] = []
    queue = [pid]
    while queue:
        for child in children.get(queue.pop(0), []):
            found.append(child)
            queue.append(child)
    return found


class Child:
    """A child process in its own session, with its output piped to us."""

    def __init__(
        self, argv: Sequence[str], *, cwd: Path, env: Mapping[str, str], output: IO[bytes] | int = subprocess.PIPE
    ) -> None:
        logger.info("+ %s", redact(shlex.join(argv)))
        self.process = subprocess.Popen(
            list(argv),
            cwd=cwd,
            env=dict(env),
            stdin=subprocess.DEVNULL,
            stdout=output,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self.pid = self.process.pid
        self._stop_lock = threading.Lock()
        self._tree: set[int] = set()

    def poll(self) -> int | None:
        return self.process.poll()

    def wait(self, timeout: float | None = None) -> int:
        return self.process.wait(timeout)

    def send(self, signum: int) -> None:
        """Send ``signum`` to the child's group and every descendant it started elsewhere."""
        self._tree.update(descendants(self.pid))
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.pid, signum)
        for pid in self._tree:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signum)

    def stop(self, first: int = signal.SIGINT, grace: float = 10.0) -> int:
        """Ask politely with ``first``; SIGKILL the whole tree when ``grace`` runs out. Idempotent."""
        with self._stop_lock:
            if self.poll() is None:
                self.send(first)
                deadline = time.monotonic() + grace
                while self.poll() is None and time.monotonic() < deadline:
                    time.sleep(0.05)
            if self.poll() is None:
                logger.warning(
                    "training did not stop within %.0f s of %s: killing it", grace, signal.Signals(first).name
                )
            # Stragglers (DDP workers) must not outlive us holding GPU memory.
            self.send(signal.SIGKILL)
            return self.process.wait()
