"""Signs of progress besides output lines, read from real child processes, files and a stand-in nvidia-smi."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from entrypoint.training import liveness
from tests.support import process_alive

AGENT_FILES = frozenset({"console.log", "trainbox.json"})


@pytest.fixture
def no_gpu(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("PATH", str(tmp_path / "empty-bin"))  # no nvidia-smi


def start(*argv: str) -> Iterator[subprocess.Popen[bytes]]:
    process = subprocess.Popen(argv, start_new_session=True)
    try:
        yield process
    finally:
        os.killpg(process.pid, signal.SIGKILL)  # its own session: the group holds every descendant
        process.wait(10)


def asleep(pid: int) -> bool:
    """In the kernel's sleep (state S): done loading, no CPU spent from now on."""
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "S"


@pytest.fixture
def idle() -> Iterator[subprocess.Popen[bytes]]:
    # Popen returns at exec; the dynamic loader's CPU comes after it. Counted between the watch's first reading
    # and its first sample (a tick, a loaded machine stretching the load), it would be "progress" of an idle child.
    for process in start("/bin/sleep", "600"):
        deadline = time.monotonic() + 60
        while not asleep(process.pid):
            assert time.monotonic() < deadline, "sleep never went to sleep"
            time.sleep(0.01)
        yield process


@pytest.fixture
def burner() -> Iterator[subprocess.Popen[bytes]]:
    # The busy process is a grandchild: the tree counts, not just the direct child.
    yield from start("/bin/sh", "-c", f"{sys.executable} -c 'while True: pass' & wait")


def run_dir(tmp_path: Path) -> Path:
    path = tmp_path / "run"
    path.mkdir(exist_ok=True)
    return path


def test_an_idle_child_shows_no_progress(tmp_path: Path, idle: subprocess.Popen[bytes], no_gpu: None) -> None:
    watch = liveness.Liveness(idle.pid, run_dir(tmp_path), AGENT_FILES)
    assert watch.sample() is None
    (run_dir(tmp_path) / "console.log").write_text("the agent's own writes\n")
    assert watch.sample() is None


def test_cpu_time_of_a_silent_descendant_is_progress(
    tmp_path: Path, burner: subprocess.Popen[bytes], no_gpu: None
) -> None:
    watch = liveness.Liveness(burner.pid, run_dir(tmp_path), AGENT_FILES)
    before = time.monotonic()
    deadline = before + 60
    while (sign := watch.sample()) is None:  # CPU time is counted in clock ticks: wait for a few
        assert time.monotonic() < deadline
        time.sleep(0.2)
    assert sign >= before


def test_a_file_written_in_the_run_folder_is_progress(
    tmp_path: Path, idle: subprocess.Popen[bytes], no_gpu: None
) -> None:
    folder = run_dir(tmp_path)
    (folder / "old.txt").write_text("before training")
    watch = liveness.Liveness(idle.pid, folder, AGENT_FILES)
    assert watch.sample() is None
    (folder / "weights").mkdir()
    (folder / "weights" / "last.pt").write_bytes(b"checkpoint")
    assert watch.sample() is not None
    assert watch.sample() is None  # the same write counts once


def fake_smi(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, body: str) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    script = bin_dir / "nvidia-smi"
    script.write_text(f"#!/bin/sh\n{body}\n")
    script.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:/usr/bin:/bin")


def test_gpu_utilisation_is_progress(
    tmp_path: Path, idle: subprocess.Popen[bytes], monkeypatch: pytest.MonkeyPatch
) -> None:
    fake_smi(tmp_path, monkeypatch, 'printf "0\\n87\\n"')
    assert liveness.Liveness(idle.pid, run_dir(tmp_path), AGENT_FILES).sample() is not None


@pytest.mark.parametrize(
    "body", ['printf "0\\n3\\n"', 'echo "No devices were found"; exit 6', "echo NVML: Driver Not Loaded >&2; exit 9"]
)
def test_idle_or_missing_gpus_are_no_progress(
    tmp_path: Path, idle: subprocess.Popen[bytes], monkeypatch: pytest.MonkeyPatch, body: str
) -> None:
    fake_smi(tmp_path, monkeypatch, body)
    assert liveness.Liveness(idle.pid, run_dir(tmp_path), AGENT_FILES).sample() is None


def test_a_hung_nvidia_smi_is_bounded_and_not_asked_again(
    tmp_path: Path, idle: subprocess.Popen[bytes], monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    calls = tmp_path / "calls"
    fake_smi(tmp_path, monkeypatch, f"echo $$ >> {calls}; exec sleep 600")
    monkeypatch.setattr(liveness, "GPU_QUERY_TIMEOUT", 0.5)  # however long the machine takes, it never answers
    monkeypatch.setattr(liveness, "GPU_SAMPLE_INTERVAL", 0.0)
    watch = liveness.Liveness(idle.pid, run_dir(tmp_path), AGENT_FILES)
    assert watch.sample() is None
    assert "nvidia-smi did not answer" in caplog.text
    (hung,) = map(int, calls.read_text().split())
    assert not process_alive(hung), "the hung query was left running"
    fake_smi(tmp_path, monkeypatch, f"echo $$ >> {calls}; echo 99")
    assert watch.sample() is None  # given up on: a card off the bus would hang every query
    assert calls.read_text().split() == [str(hung)], "asked again"


def test_nvidia_smi_output() -> None:
    assert liveness.gpu_busy("0\n 45\n")
    assert not liveness.gpu_busy("0\n4\n[N/A]\n")
    assert not liveness.gpu_busy("")
