"""What the dataset benchmarks share: a child process's wall time and peak memory, and cleaning up between
measures so that one measure's files (and their writeback) do not land on the next."""

from __future__ import annotations

import os
import shutil
import subprocess
import threading
import time
from dataclasses import dataclass
from pathlib import Path

SETTLE_S = 1.0  # after cleaning up and syncing, so the previous measure's writeback does not land on the next


def settle(*paths: Path) -> float:
    """Delete ``paths``, flush the disk and wait ``SETTLE_S``; the seconds it took (for the bench's log).

    Each tree is renamed aside at once and the renamed trees are deleted by ``rm -rf`` in parallel (about
    twice as fast as ``shutil.rmtree`` on tens of thousands of files), all finished before the sync: nothing
    of it overlaps the next measure.
    """
    started = time.monotonic()
    doomed = []
    for path in paths:
        if path.exists():
            aside = path.with_name(f"{path.name}.deleting-{time.monotonic_ns()}")
            path.rename(aside)
            doomed.append(aside)
    removers = [subprocess.Popen(["rm", "-rf", "--", str(path)]) for path in doomed]
    for remover, path in zip(removers, doomed, strict=True):
        if remover.wait() != 0:
            shutil.rmtree(path, ignore_errors=True)
    os.sync()
    time.sleep(SETTLE_S)
    return time.monotonic() - started


class PeakRss(threading.Thread):
    """The peak memory of one process, read from /proc until it exits: resident (VmHWM) and anonymous
    (RssAnon: its heap, not the file pages it maps)."""

    def __init__(self, pid: int) -> None:
        super().__init__(daemon=True)
        self.pid, self.peak_kb, self.peak_anon_kb = pid, 0, 0
        self._done = threading.Event()

    def run(self) -> None:
        while not self._done.is_set():
            try:
                for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
                    if line.startswith("VmHWM:"):
                        self.peak_kb = max(self.peak_kb, int(line.split()[1]))
                    elif line.startswith("RssAnon:"):
                        self.peak_anon_kb = max(self.peak_anon_kb, int(line.split()[1]))
            except (OSError, ValueError):
                return
            time.sleep(0.02)

    def stop(self) -> float:
        """Stop reading; the peak VmHWM in MiB."""
        self._done.set()
        self.join()
        return self.peak_kb / 1024


class PeakTree(threading.Thread):
    """The peaks of a process's descendants, from /proc: the largest VmHWM of its upload children
    (entrypoint.xet.child), the largest sum of its RSS and theirs at one sample, and the largest VmHWM
    of any other descendant (`trainbox sync` asks `libreyolo train --help-json` for its options)."""

    def __init__(self, pid: int) -> None:
        super().__init__(daemon=True)
        self.pid, self.child_kb, self.total_kb, self.other_kb = pid, 0, 0, 0
        self._done = threading.Event()

    @staticmethod
    def _status(pid: int) -> dict[str, int]:
        try:
            lines = Path(f"/proc/{pid}/status").read_text().splitlines()
        except OSError:
            return {}
        return {line.split(":")[0]: int(line.split()[1]) for line in lines if line.startswith(("VmHWM:", "VmRSS:"))}

    def run(self) -> None:
        from entrypoint.procs import descendants

        while not self._done.is_set():
            total = self._status(self.pid).get("VmRSS", 0)
            for pid in descendants(self.pid):
                status = self._status(pid)
                try:
                    upload = b"entrypoint.xet.child" in Path(f"/proc/{pid}/cmdline").read_bytes()
                except OSError:
                    continue
                if upload:
                    self.child_kb = max(self.child_kb, status.get("VmHWM", 0))
                    total += status.get("VmRSS", 0)
                else:
                    self.other_kb = max(self.other_kb, status.get("VmHWM", 0))
            self.total_kb = max(self.total_kb, total)
            time.sleep(0.02)

    def stop(self) -> None:
        self._done.set()
        self.join()


@dataclass(frozen=True)
class Child:
    wall_s: float
    stdout: str
    peak_mib: float  # VmHWM of the child itself
    peak_anon_mib: float  # its RssAnon
    upload_child_peak_mib: float = 0.0  # with ``tree``: its Xet upload children's largest VmHWM
    together_peak_mib: float = 0.0  # with ``tree``: it and its upload children, RSS summed at one sample
    other_peak_mib: float = 0.0  # with ``tree``: any other descendant's largest VmHWM


def run_child(argv: list[str], env: dict[str, str], *, shell: bool = False, tree: bool = False) -> Child:
    """Run one child to its end (``shell``: ``argv[0]`` is a shell command line); raise if it failed.
    ``tree``: also follow its descendants' memory (see ``PeakTree``)."""
    started = time.monotonic()
    process = subprocess.Popen(
        argv[0] if shell else argv, env=env, shell=shell, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    rss = PeakRss(process.pid)
    rss.start()
    below = PeakTree(process.pid) if tree else None
    if below is not None:
        below.start()
    out, err = process.communicate()
    wall = time.monotonic() - started
    peak = rss.stop()
    if below is not None:
        below.stop()
    if process.returncode != 0:
        raise RuntimeError(f"{argv[0] if shell else ' '.join(argv)} failed ({process.returncode}): {err[-2000:]}")
    if below is None:
        return Child(wall, out, peak, rss.peak_anon_kb / 1024)
    together = max(below.total_kb / 1024, peak)
    return Child(wall, out, peak, rss.peak_anon_kb / 1024, below.child_kb / 1024, together, below.other_kb / 1024)
