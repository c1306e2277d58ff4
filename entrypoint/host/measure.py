"""The host's own figures, measured from the agent (no CUDA): disk write and read in WORKDIR, RAM,
CPU cores (affinity and cgroup quota), /dev/shm."""

from __future__ import annotations

import contextlib
import os
import shutil
import threading
import time
from pathlib import Path
from typing import Any

DISK_BYTES = 128 * 2**20  # enough to pass the page cache's write-back burst on a small disk, a second on a good one
_CHUNK = 4 * 2**20
_SHM = Path("/dev/shm")


PROBE_PREFIX = ".trainbox-disk-probe-"
_JOIN_STEP = 0.1  # the main thread waits in steps this long, so a signal's handler runs within it


def disk(directory: Path, size: int = DISK_BYTES) -> dict[str, Any]:
    """Sequential write (fsync'd) and read MB/s of a scratch file in ``directory`` (the page cache
    is told to drop the file before the read, so the read comes from the disk where it can).

    The probe runs in a daemon thread: an fsync on a slow disk cannot be interrupted, and a stop
    (SIGTERM, raised by the job's handler in this thread) must not wait for it. Its file is removed
    then, and a file an earlier attempt left (killed mid-probe) is removed before this one starts."""
    path = directory / f"{PROBE_PREFIX}{os.getpid()}"
    cancel = threading.Event()
    found: dict[str, Any] = {}
    worker = threading.Thread(
        target=_probe, args=(directory, path, size, cancel, found), name="disk-probe", daemon=True
    )
    worker.start()
    try:
        while worker.is_alive():
            worker.join(_JOIN_STEP)
    except BaseException:
        cancel.set()  # the next chunk is not written; a write or fsync under way is abandoned with the thread
        with contextlib.suppress(OSError):
            path.unlink()  # the space comes back once the thread lets go of the file
        raise
    return found


def _probe(directory: Path, path: Path, size: int, cancel: threading.Event, found: dict[str, Any]) -> None:
    block = os.urandom(_CHUNK)  # incompressible: a compressing filesystem does not flatter itself
    try:
        directory.mkdir(parents=True, exist_ok=True)
        remove_leftovers(directory)
        started = time.perf_counter()
        with path.open("wb", buffering=0) as handle:
            for _ in range(max(1, size // _CHUNK)):
                if cancel.is_set():
                    return
                handle.write(block)
            os.fsync(handle.fileno())
        written = time.perf_counter() - started
        with path.open("rb", buffering=0) as handle:
            with contextlib.suppress(AttributeError, OSError):
                os.posix_fadvise(handle.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)
            started = time.perf_counter()
            while not cancel.is_set() and handle.read(_CHUNK):
                pass
            read = time.perf_counter() - started
        total = max(1, size // _CHUNK) * _CHUNK
        found.update(
            path=str(directory),
            write_mbps=round(total / written / 1e6, 1) if written > 0 else None,
            read_mbps=round(total / read / 1e6, 1) if read > 0 else None,
            free_gib=round(shutil.disk_usage(directory).free / 2**30, 1),
        )
    except OSError as error:
        found.update(path=str(directory), error=f"{error.strerror or error}")
    finally:
        with contextlib.suppress(OSError):
            path.unlink()


def remove_leftovers(directory: Path) -> list[Path]:
    """Remove probe files of agents that are gone (a kill -9 mid-probe leaves 128 MiB behind)."""
    removed = []
    for leftover in directory.glob(f"{PROBE_PREFIX}*"):
        pid = leftover.name.removeprefix(PROBE_PREFIX)
        if pid.isdigit() and int(pid) != os.getpid() and _is_agent(int(pid)):
            continue  # another agent's probe, running now
        with contextlib.suppress(OSError):
            leftover.unlink()
            removed.append(leftover)
    return removed


def _is_agent(pid: int) -> bool:
    try:
        command = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False
    return b"trainbox" in command or b"entrypoint" in command


def _cgroup_cpus() -> float | None:
    """The cgroup v2 CPU quota in cores (``cpu.max``: ``quota period``), None when unlimited."""
    try:
        quota, period = Path("/sys/fs/cgroup/cpu.max").read_text().split()[:2]
    except (OSError, ValueError):
        return None
    return None if quota == "max" else int(quota) / int(period)


def _cgroup_memory() -> int | None:
    try:
        text = Path("/sys/fs/cgroup/memory.max").read_text().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


def _mem_total() -> int | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def host(workdir: Path) -> dict[str, Any]:
    """Everything but the GPUs."""
    cores = float(len(os.sched_getaffinity(0)))
    quota = _cgroup_cpus()
    if quota is not None:
        cores = min(cores, quota)
    memory = [value for value in (_mem_total(), _cgroup_memory()) if value is not None]
    try:
        shm: float | None = round(shutil.disk_usage(_SHM).total / 2**30, 2)
    except OSError:
        shm = None
    return {
        "cpu_cores": round(cores, 1),
        "ram_gib": round(min(memory) / 2**30, 1) if memory else None,
        "shm_gib": shm,
        "disk": disk(workdir / ".trainbox"),
    }
