"""One agent per run on a volume: an exclusive ``flock`` on ``<WORKDIR>/.trainbox/<run>.lock``, held for the job.

The Hub lease (lease.py) keeps two machines from writing one run; two agents on one volume (a second
`docker run` on the same named volume, a `docker exec … trainbox run`, a run without OUTPUT_REPO, which has no
lease) would meet before it: the second would rewrite trainbox.json, stop the first's trainer as an orphan of a
killed attempt, and train into the same run folder. The kernel drops the lock with its process, ``kill -9``
included, so a restart after a crash is never refused by it; the descriptor is not inherited by children
(Python's default), so a trainer left behind does not hold it.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import secrets
from collections.abc import Iterator
from pathlib import Path

from ..errors import LeaseHeldError
from ..log import logger

_HELD: set[Path] = set()  # the locks this process holds now


def lock_path(workdir: Path, run_name: str) -> Path:
    return workdir / ".trainbox" / f"{run_name}.lock"


def is_held(path: Path) -> bool:
    """This process holds the lock at ``path``: no other agent on this volume runs the run (the kernel drops a
    lock with its process, so an earlier holder on this volume is gone)."""
    return path in _HELD


def volume_id(workdir: Path) -> str | None:
    """This volume's id (made once, kept on the volume): the run's lease names it, so a container started again
    on the same volume knows its earlier holder. None when the volume cannot keep one."""
    path = workdir / ".trainbox" / "volume-id"
    try:
        if not path.is_file():
            path.parent.mkdir(parents=True, exist_ok=True)
            scratch = path.with_name(f".volume-id.{os.getpid()}")
            scratch.write_text(secrets.token_hex(8) + "\n")
            os.replace(scratch, path)
        found = path.read_text().strip()
    except OSError:
        return None
    return found or None


@contextlib.contextmanager
def held(path: Path, run_name: str) -> Iterator[None]:
    """Hold the run's lock on this volume for the block; ``LeaseHeldError`` (nothing written) when another
    live agent holds it. A volume where the lock cannot be made (read-only, full) is not refused here: the
    job's first write reports that volume in its own words."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        descriptor = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as error:
        logger.debug("volume lock %s: not made (%s); going on without it", path, error)
        descriptor = None
    if descriptor is None:
        yield
        return
    try:
        try:
            fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _read_holder(descriptor)
            raise LeaseHeldError(
                f"another trainbox agent is running {run_name} on this volume{holder}",
                "stop it first, or give this one another WORKDIR or RUN_NAME",
            ) from None
        except OSError as error:  # a filesystem without locks: the Hub lease still guards the repo
            logger.debug("volume lock %s: flock unsupported (%s); going on without it", path, error)
        else:
            with contextlib.suppress(OSError):  # who holds it, for the refused one's line
                os.ftruncate(descriptor, 0)
                os.pwrite(descriptor, f"{os.getpid()} {os.uname().nodename}\n".encode(), 0)
            _HELD.add(path)
        yield
    finally:
        _HELD.discard(path)
        os.close(descriptor)  # closing drops the lock; the file stays (removing it would race a newcomer)


def _read_holder(descriptor: int) -> str:
    with contextlib.suppress(OSError, ValueError):
        pid, host = os.pread(descriptor, 200, 0).decode().split()
        return f" (pid {int(pid)} on {host})"
    return ""
