"""What this container may use: its CPUs (affinity and cgroup CPU quota) and its memory (cgroup limit).

torch sizes its thread pool from the cores it sees: it respects the affinity mask, not a CPU quota
(``docker run --cpus``, a Kubernetes CPU limit), so a container limited to 8 CPUs on a 64-core host
runs dozens of threads on 8 CPUs' worth of time and is throttled every period.

The quota is read where the kernel keeps it for this process: ``/proc/self/cgroup`` names the
process's cgroup, ``/proc/self/mountinfo`` where each hierarchy is mounted and which part of it (a
container sees its own cgroup mounted at ``/sys/fs/cgroup/...`` with that cgroup as the mount's root).
Every level from the process's cgroup up to the mount counts: a limit on a parent (a Kubernetes pod,
a systemd slice) binds its children too, so the smallest wins. cgroup v1 (``cpu.cfs_quota_us`` /
``cpu.cfs_period_us``, ``memory.limit_in_bytes``) and v2 (``cpu.max``, ``memory.max``) both.

A folder standing in for ``/proc/self`` (its ``cgroup`` and ``mountinfo`` files) may be passed as ``proc``
(settings: ``TRAINBOX_PROC_SELF``), so a test can run the agent against a cgroup tree of its own making.
"""

from __future__ import annotations

import contextlib
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

_PROC_SELF = Path("/proc/self")


@dataclass(frozen=True)
class Mount:
    version: int  # 1 or 2
    controllers: frozenset[str]  # v1: the mount's controllers; v2: empty (all of them)
    root: str  # the part of the hierarchy mounted here ("/" on the host, the container's own cgroup inside one)
    point: Path


@dataclass(frozen=True)
class CpuGrant:
    """The CPUs this process may use: the affinity mask's count, the cgroup quota in CPUs (None: no quota)."""

    affinity: int
    quota: float | None = None
    quota_at: str | None = None  # the cgroup file that set it

    @property
    def cpus(self) -> int:
        """Whole CPUs: a quota of 2.5 runs two threads flat out, not three throttled ones."""
        if self.quota is None:
            return self.affinity
        return max(1, min(self.affinity, math.floor(self.quota)))

    def describe(self) -> str:
        if self.quota is None:
            return f"{self.cpus} CPUs (affinity {self.affinity}, no CPU quota)"
        return f"{self.cpus} CPUs (affinity {self.affinity}, cgroup quota {self.quota:g} CPUs)"

    def record(self) -> dict[str, Any]:
        return {"cpus": self.cpus, "affinity": self.affinity, "quota": self.quota, "quota_at": self.quota_at}


def proc_self() -> Path:
    return _PROC_SELF


def parse_mountinfo(text: str) -> list[Mount]:
    """The cgroup mounts of a ``/proc/self/mountinfo`` (``id parent dev root point opts [tags] - type src opts``)."""
    mounts = []
    for line in text.splitlines():
        left, sep, right = line.partition(" - ")
        fields, tail = left.split(), right.split()
        if not sep or len(fields) < 5 or len(tail) < 3 or tail[0] not in {"cgroup", "cgroup2"}:
            continue
        root, point = _unescape(fields[3]), Path(_unescape(fields[4]))
        if tail[0] == "cgroup2":
            mounts.append(Mount(2, frozenset(), root, point))
        else:
            mounts.append(Mount(1, frozenset(tail[2].split(",")), root, point))
    # A mount over another at the same point hides it: the last one is what a path there reaches.
    return list({(mount.version, mount.point): mount for mount in mounts}.values())


def parse_cgroup(text: str) -> dict[str, str]:
    """``/proc/self/cgroup``: controller → path; ``""`` is the v2 hierarchy (``0::/path``)."""
    paths: dict[str, str] = {}
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        for controller in parts[1].split(",") if parts[1] else [""]:
            paths.setdefault(controller, parts[2])
    return paths


def _unescape(field: str) -> str:
    """mountinfo writes a space as ``\\040`` (and tab, newline, backslash alike)."""
    return field.replace("\\040", " ").replace("\\011", "\t").replace("\\012", "\n").replace("\\134", "\\")


def cgroup_dirs(controller: str, proc: Path | None = None) -> list[Path]:
    """The folders holding ``controller``'s files for this process, from its own cgroup up to the mount
    (v1's mount of that controller, and v2's hierarchy); [] where the files cannot be read."""
    proc = proc or proc_self()
    try:
        paths = parse_cgroup((proc / "cgroup").read_text())
        mounts = parse_mountinfo((proc / "mountinfo").read_text())
    except OSError:
        return []
    found: list[Path] = []
    for mount in mounts:
        path = paths.get("" if mount.version == 2 else controller)
        if path is None or (mount.version == 1 and controller not in mount.controllers):
            continue
        found += _up_to_the_mount(mount, path)
    return found


def _up_to_the_mount(mount: Mount, path: str) -> list[Path]:
    root = mount.root.rstrip("/")
    # A cgroup outside what is mounted here (another namespace's view): only the mount itself is ours.
    inside = path == root or path.startswith(root + "/")
    relative = path[len(root) :].strip("/") if inside else ""
    here = mount.point / relative if relative else mount.point
    while relative and not here.is_dir():  # a path the container cannot see: its deepest visible part
        relative = relative.rpartition("/")[0]
        here = mount.point / relative if relative else mount.point
    levels = [here]
    while here != mount.point and mount.point in here.parents:
        here = here.parent
        levels.append(here)
    return levels


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None


def _number(path: Path) -> int | None:
    text = _read(path)
    try:
        return None if text is None else int(text)
    except ValueError:
        return None


def cpu_quota(proc: Path | None = None) -> tuple[float, str] | None:
    """The smallest CPU quota over this process's cgroups, in CPUs, and the file that set it; None: no quota."""
    quotas: list[tuple[float, str]] = []
    for folder in cgroup_dirs("cpu", proc):
        v2 = _read(folder / "cpu.max")
        if v2 is not None:
            with contextlib.suppress(ValueError, IndexError):
                quota, period = v2.split()[:2]
                if quota != "max" and int(period) > 0:
                    quotas.append((int(quota) / int(period), str(folder / "cpu.max")))
            continue
        quota_us, period_us = _number(folder / "cpu.cfs_quota_us"), _number(folder / "cpu.cfs_period_us")
        if quota_us is not None and period_us is not None and quota_us > 0 and period_us > 0:  # v1: -1 is no quota
            quotas.append((quota_us / period_us, str(folder / "cpu.cfs_quota_us")))
    return min(quotas, default=None)


def cpus(proc: Path | None = None) -> CpuGrant:
    """The CPUs this process may use now."""
    try:
        affinity = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        affinity = os.cpu_count() or 1
    quota = cpu_quota(proc)
    return CpuGrant(affinity, *quota) if quota is not None else CpuGrant(affinity)


def memory_available(proc: Path | None = None, meminfo: Path = Path("/proc/meminfo")) -> int | None:
    """Bytes this process could still take: the kernel's MemAvailable, and under a cgroup memory limit
    the room left below it (the smallest over the levels); None where neither can be read."""
    room: list[int] = []
    with contextlib.suppress(OSError, ValueError, IndexError):
        for line in meminfo.read_text().splitlines():
            if line.startswith("MemAvailable:"):
                room.append(int(line.split()[1]) * 1024)
    for folder in cgroup_dirs("memory", proc):
        for limit_file, usage_file in (
            ("memory.max", "memory.current"),
            ("memory.limit_in_bytes", "memory.usage_in_bytes"),
        ):
            limit, usage = _number(folder / limit_file), _number(folder / usage_file)  # v2's "max": no limit
            if limit is not None and usage is not None and limit < 2**62:  # v1 writes "no limit" as a huge number
                room.append(max(0, limit - usage))
    return min(room, default=None)
