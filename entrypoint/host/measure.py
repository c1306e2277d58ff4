"""The host's own figures, measured from the agent (no CUDA): disk write and read in WORKDIR, RAM,
CPU cores (affinity and cgroup quota), /dev/shm."""

from __future__ import annotations

import contextlib
import os
import shutil
import time
from pathlib import Path
from typing import Any

DISK_BYTES = 128 * 2**20  # enough to pass the page cache's write-back burst on a small disk, a second on a good one
_CHUNK = 4 * 2**20
_SHM = Path("/dev/shm")


def disk(directory: Path, size: int = DISK_BYTES) -> dict[str, Any]:
    """Sequential write (fsync'd) and read MB/s of a scratch file in ``directory`` (the page cache
    is told to drop the file before the read, so the read comes from the disk where it can)."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f".trainbox-disk-probe-{os.getpid()}"
    block = os.urandom(_CHUNK)  # incompressible: a compressing filesystem does not flatter itself
    try:
        started = time.perf_counter()
        with path.open("wb", buffering=0) as handle:
            for _ in range(max(1, size // _CHUNK)):
                handle.write(block)
            os.fsync(handle.fileno())
        written = time.perf_counter() - started
        with path.open("rb", buffering=0) as handle:
            with contextlib.suppress(AttributeError, OSError):
                os.posix_fadvise(handle.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)
            started = time.perf_counter()
            while handle.read(_CHUNK):
                pass
            read = time.perf_counter() - started
    except OSError as error:
        return {"path": str(directory), "error": f"{error.strerror or error}"}
    finally:
        with contextlib.suppress(OSError):
            path.unlink()
    total = max(1, size // _CHUNK) * _CHUNK
    return {
        "path": str(directory),
        "write_mbps": round(total / written / 1e6, 1) if written > 0 else None,
        "read_mbps": round(total / read / 1e6, 1) if read > 0 else None,
        "free_gib": round(shutil.disk_usage(directory).free / 2**30, 1),
    }


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
