"""Running the GPU probe child: its progress lines read as they come, a hang watchdog per step, and its
whole process tree gone afterwards (all-reduce ranks orphaned by a crash hold GPU memory)."""

from __future__ import annotations

import contextlib
import glob
import json
import queue
import shutil
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO, Any

from ..log import redact
from ..procs import Child, kill_tree, proc_table
from .probe import PREFIX

# No step of the check (importing torch, one card's context and matmul) takes this long on a
# working machine; the child's own all-reduce deadline is shorter, so it reports before this.
STEP_TIMEOUT = 90.0
NCCL_TIMEOUT = 45.0
_OUTPUT_LINES = 40
_POLL = 0.2
_KILL_WAIT = 5.0


def nvidia_present() -> bool:
    """A cheap look for an NVIDIA driver, so a CPU machine fails in milliseconds, not after importing torch."""
    return bool(glob.glob("/dev/nvidia[0-9]*")) or shutil.which("nvidia-smi") is not None


def _pump(stream: IO[bytes], lines: queue.Queue[bytes | None]) -> None:
    try:
        for line in iter(stream.readline, b""):
            lines.put(line)
    finally:
        stream.close()  # here, not in run_probe: closing it there would wait for a read a grandchild keeps open
        lines.put(None)


def _group_members(pgid: int) -> list[int]:
    """Live (not zombie) processes of a process group, from /proc."""
    return [entry.pid for entry in proc_table() if entry.pgid == pgid and entry.state != "Z"]


def _wait_for_group_exit(pgid: int, timeout: float) -> None:
    """SIGKILL is delivered asynchronously: let the GPU memory of the killed tree be freed before going on."""
    deadline = time.monotonic() + timeout
    while _group_members(pgid) and time.monotonic() < deadline:
        time.sleep(0.05)


def _gone(child: Child, bound: float) -> None:
    """A process stuck in the driver may not die at all: don't wait for it forever."""
    with contextlib.suppress(subprocess.TimeoutExpired):
        child.wait(timeout=bound)
    _wait_for_group_exit(child.pid, bound)


def run_probe(
    selection: str,
    env: Mapping[str, str],
    *,
    step_timeout: float = STEP_TIMEOUT,
    argv: Sequence[str] | None = None,
    name: str = "the GPU check",
    extra: Sequence[str] = (),
) -> dict[str, Any]:
    """Run the probe child; its report, or ``{"hang": step}`` / ``{"crashed": …}``. Never leaves a process behind."""
    command = list(argv or [sys.executable, "-m", "entrypoint.gpu.probe", "--gpus", selection])
    if argv is None:
        command += ["--nccl-timeout", str(NCCL_TIMEOUT), *extra]
    child = Child(command, cwd=Path.cwd(), env=env)
    lines: queue.Queue[bytes | None] = queue.Queue()
    assert child.process.stdout is not None
    threading.Thread(target=_pump, args=(child.process.stdout, lines), name="gpu-probe-output", daemon=True).start()
    current: dict[str, Any] = {"what": f"starting {name}"}
    report: dict[str, Any] | None = None
    output: deque[str] = deque(maxlen=_OUTPUT_LINES)
    deadline = time.monotonic() + step_timeout
    exited = False
    try:
        while True:
            try:
                raw = lines.get(timeout=_POLL)
            except queue.Empty:
                # Orphaned grandchildren may hold the pipe open after the check itself exited: once it
                # has, stop when its last words are read.
                if exited:
                    break
                exited = child.poll() is not None
                if time.monotonic() > deadline:
                    return {"hang": {**current, "timeout": step_timeout}, "output": list(output)}
                continue
            if raw is None:
                break
            text = raw.decode(errors="replace").rstrip()
            if not text.startswith(PREFIX):
                if text.strip():
                    output.append(redact(text))
                continue
            try:
                event = json.loads(text[len(PREFIX) :])
            except ValueError:
                continue
            if "report" in event:
                report = event["report"]
            else:  # a step that waits on other machines names its own bound
                current = event
                deadline = time.monotonic() + float(event.get("timeout", step_timeout))
        try:
            code = child.wait(timeout=step_timeout)
        except subprocess.TimeoutExpired:
            return {"hang": {"what": f"{name} exiting", "timeout": step_timeout}, "output": list(output)}
    finally:
        # Running: its group and every descendant. Exited: its group only, where all-reduce ranks
        # orphaned by a crash still hold GPU memory; Linux does not reuse the number of a group that
        # still has members (a descendant lookup by a number already free could find a stranger's).
        members = child.members if child.poll() is None else lambda: ()
        kill_tree(child.pid, members=members, wait=lambda bound: _gone(child, bound), kill_wait=_KILL_WAIT)
    if report is None:
        return {
            "crashed": f"{name} exited with code {code} without a report",
            "during": current,
            "output": list(output),
        }
    report["output"] = list(output)
    return report
