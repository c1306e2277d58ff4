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


@dataclass(frozen=True)
class Child:
    wall_s: float
    stdout: str
    peak_mib: float  # VmHWM of the child itself
    peak_anon_mib: float  # its RssAnon


def run_child(argv: list[str], env: dict[str, str], *, shell: bool = False) -> Child:
    """Run one child to its end (``shell``: ``argv[0]`` is a shell command line); raise if it failed."""
    started = time.monotonic()
    process = subprocess.Popen(
        argv[0] if shell else argv, env=env, shell=shell, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    rss = PeakRss(process.pid)
    rss.start()
    out, err = process.communicate()
    wall = time.monotonic() - started
    peak = rss.stop()
    if process.returncode != 0:
        raise RuntimeError(f"{argv[0] if shell else ' '.join(argv)} failed ({process.returncode}): {err[-2000:]}")
    return Child(wall, out, peak, rss.peak_anon_kb / 1024)
