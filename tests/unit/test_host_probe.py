"""The host check's disk probe: nothing left behind by a killed agent, every failure a figure, no stop waits."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from types import FrameType

import pytest

from entrypoint.host import measure


class Stopped(Exception):
    pass


def test_a_probe_file_left_by_a_killed_agent_is_removed_before_the_next_probe(tmp_path: Path) -> None:
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    leftover = tmp_path / f"{measure.PROBE_PREFIX}{gone.stdout.strip()}"
    leftover.write_bytes(b"x" * 4096)  # what a kill -9 during the write leaves
    stray = tmp_path / f"{measure.PROBE_PREFIX}junk"
    stray.write_bytes(b"x")

    found = measure.disk(tmp_path, size=4 * 2**20)

    assert found["write_mbps"] > 0
    assert list(tmp_path.iterdir()) == []


@pytest.fixture
def live_agent() -> Iterator[int]:
    """A running process whose command line says it is an agent."""
    process = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", "trainbox"])
    cmdline = Path(f"/proc/{process.pid}/cmdline")
    deadline = time.monotonic() + 10
    while b"trainbox" not in cmdline.read_bytes() and time.monotonic() < deadline:  # empty until exec
        time.sleep(0.01)
    try:
        yield process.pid
    finally:
        process.kill()
        process.wait()


def test_the_probe_file_of_another_running_agent_is_left_alone(tmp_path: Path, live_agent: int) -> None:
    running = tmp_path / f"{measure.PROBE_PREFIX}{live_agent}"
    running.write_bytes(b"x")

    assert measure.remove_leftovers(tmp_path) == []
    assert running.exists()


def test_a_probe_directory_that_cannot_be_made_is_a_figure_not_a_crash(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("not a folder")

    found = measure.disk(tmp_path / "file" / ".trainbox", size=4 * 2**20)

    assert found["path"] == str(tmp_path / "file" / ".trainbox") and found["error"]


@pytest.fixture
def stuck_fsync(monkeypatch: pytest.MonkeyPatch) -> Iterator[threading.Event]:
    """os.fsync that blocks until released, as on a disk that stopped answering."""
    release = threading.Event()
    entered = threading.Event()

    def fsync(_fd: int) -> None:
        entered.set()
        release.wait(30)

    monkeypatch.setattr(measure.os, "fsync", fsync)
    yield entered
    release.set()


def test_a_stop_during_a_stuck_fsync_is_not_held_by_the_probe(tmp_path: Path, stuck_fsync: threading.Event) -> None:
    def handler(_signum: int, _frame: FrameType | None) -> None:  # as the job's handler raises its stop
        raise Stopped

    previous = signal.signal(signal.SIGALRM, handler)
    try:
        threading.Thread(target=lambda: (stuck_fsync.wait(10), os.kill(os.getpid(), signal.SIGALRM))).start()
        began = time.monotonic()
        with pytest.raises(Stopped):
            measure.disk(tmp_path, size=4 * 2**20)
        waited = time.monotonic() - began
    finally:
        signal.signal(signal.SIGALRM, previous)

    assert stuck_fsync.is_set()
    # held by the probe, the stop would come only once the stuck fsync returns: 30 s after it began
    assert waited < 30.0, f"the stop waited {waited:.1f} s for the probe"
    assert list(tmp_path.glob(f"{measure.PROBE_PREFIX}*")) == []  # removed, though the thread still holds it


def test_an_orphaned_trainer_is_stopped_before_the_gpu_and_host_checks_measure(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import json

    from entrypoint import pipeline, preflight, settings

    orphan = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)", "libreyolo"])
    cmdline = Path(f"/proc/{orphan.pid}/cmdline")
    deadline = time.monotonic() + 10
    while b"libreyolo" not in cmdline.read_bytes() and time.monotonic() < deadline:  # empty until exec
        time.sleep(0.01)
    run_dir = tmp_path / "runs" / "orphaned"
    run_dir.mkdir(parents=True)
    # what a kill -9 of the agent leaves: its trainbox.json still names the trainer it started
    (run_dir / "trainbox.json").write_text(json.dumps({"phase": "training", "training": {"pid": orphan.pid}}))
    job = pipeline.Job(settings.from_env({"WORKDIR": str(tmp_path), "RUN_NAME": "orphaned", "GPUS": "cpu"}, options={}))
    seen: list[int | None] = []

    class Measured(Exception):
        pass

    def check_gpus(*_: object, **__: object) -> None:
        seen.append(orphan.poll())
        raise Measured

    monkeypatch.setattr(preflight, "check_gpus", check_gpus)
    try:
        with pytest.raises(Measured):
            job._preflight()
    finally:
        orphan.kill()
        orphan.wait()

    assert seen and seen[0] is not None, "the GPU check ran beside the previous attempt's trainer"
