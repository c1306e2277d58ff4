"""Signs that training is making progress, beside its output lines.

libreyolo prints its progress bar only on a terminal, so during a long epoch the agent may see no
output at all. Progress is also: CPU time spent by the child's process tree (loaders, DDP ranks),
GPU utilisation (``nvidia-smi``, when there is one) and files written in the run folder. A child
that is idle on every count (stuck in a wait, in the kernel, on a dead card) shows none of them.
"""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

from .. import procs
from ..log import logger

# CPU time per second of wall time that counts as work (an idle Python process spends ~0).
CPU_BUSY_FRACTION = 0.05
GPU_BUSY_PERCENT = 5
GPU_QUERY_TIMEOUT = 10.0
GPU_SAMPLE_INTERVAL = 5.0


def gpu_busy(nvidia_smi_output: str) -> bool:
    """Any GPU above ``GPU_BUSY_PERCENT`` in ``--query-gpu=utilization.gpu --format=csv,noheader,nounits``."""
    values = [line.strip() for line in nvidia_smi_output.splitlines()]
    return any(value.isdigit() and int(value) >= GPU_BUSY_PERCENT for value in values)


class Liveness:
    """Sampled by ``sample()``; each returns the monotonic time of the newest sign of progress, or None."""

    def __init__(self, pid: int, run_dir: Path, ignore: frozenset[str]) -> None:
        self.pid = pid
        self.run_dir = run_dir
        self.ignore = ignore  # file names the agent itself writes in the run folder
        self._cpu = procs.tree_cpu(pid)
        self._cpu_at = time.monotonic()
        self._newest_file = self._newest_write()
        self._smi = shutil.which("nvidia-smi")
        self._gpu_at = 0.0

    def sample(self) -> float | None:
        now = time.monotonic()
        signs = [self._cpu_progress(now), self._file_progress(now), self._gpu_progress(now)]
        found = [sign for sign in signs if sign is not None]
        return max(found) if found else None

    def _cpu_progress(self, now: float) -> float | None:
        current = procs.tree_cpu(self.pid)
        # Per process, so a loader that exits does not hide the work of the others; a new one counts whole.
        spent = sum(max(0.0, cpu - self._cpu.get(pid, 0.0)) for pid, cpu in current.items())
        elapsed, self._cpu, self._cpu_at = now - self._cpu_at, current, now
        return now if spent > 0 and spent >= CPU_BUSY_FRACTION * elapsed else None

    def _newest_write(self) -> int:
        newest = 0
        stack = [self.run_dir]
        while stack:
            try:
                with os.scandir(stack.pop()) as entries:
                    for entry in entries:
                        if entry.is_dir(follow_symlinks=False):
                            stack.append(Path(entry.path))
                        elif entry.name not in self.ignore:
                            newest = max(newest, entry.stat(follow_symlinks=False).st_mtime_ns)
            except OSError:
                continue
        return newest

    def _file_progress(self, now: float) -> float | None:
        newest = self._newest_write()
        if newest <= self._newest_file:
            return None
        self._newest_file = newest
        return min(now, now - (time.time() - newest / 1e9))  # when it was written, on the monotonic clock

    def _gpu_progress(self, now: float) -> float | None:
        if self._smi is None or now - self._gpu_at < GPU_SAMPLE_INTERVAL:
            return None
        self._gpu_at = now
        query = ["--query-gpu=utilization.gpu", "--format=csv,noheader,nounits"]
        try:
            result = procs.run([self._smi, *query], timeout=GPU_QUERY_TIMEOUT, echo=False)
        except OSError:
            result = None
        if result is None or result.timed_out:
            # A hung nvidia-smi (a card off the bus) is no progress; don't start another every few seconds.
            logger.warning("liveness: nvidia-smi did not answer; GPU utilisation is no longer watched")
            self._smi = None
            return None
        return now if result.returncode == 0 and gpu_busy(result.stdout) else None
