"""Children: every wait is bounded, every child gets the scrubbed environment (real child processes)."""

from __future__ import annotations

import ast
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from entrypoint import procs, settings
from entrypoint.dataset import checks
from entrypoint.errors import DeadlineError
from entrypoint.run_args import parse
from entrypoint.training import process as training
from entrypoint.training import profiling

ENTRYPOINT = Path(__file__).resolve().parents[2] / "entrypoint"
PROVIDER_KEYS = {"RUNPOD_API_KEY": "rp-canary-1f2e", "CONTAINER_API_KEY": "vast-canary-9d8c", "VAST_API_KEY": "va-7b6a"}
HANG_GUARD = 60.0  # far above any bound under test: only there so a regression fails instead of hanging


def finishes(call: Callable[[], object]) -> object:
    """Run ``call`` in a thread; fail (instead of hanging the suite) if it never returns."""
    result: list[object] = []
    thread = threading.Thread(target=lambda: result.append(call()), daemon=True)
    thread.start()
    thread.join(HANG_GUARD)
    assert not thread.is_alive(), "the call never returned: an unbounded wait"
    return result[0]


def gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[-1].split()[0]
    return state == "Z"  # a zombie of an exited test helper


def wait_until(check: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + HANG_GUARD
    while not check():
        assert time.monotonic() < deadline, what
        time.sleep(0.1)


class StuckWait:
    """Stands in for a child in uninterruptible sleep: it survives SIGKILL, so a wait only ever times out."""

    def __init__(self, process: subprocess.Popen[bytes]) -> None:
        self.real = process
        self.returncode = None
        self.stdout = process.stdout
        self.pid = process.pid

    def poll(self) -> None:
        return None

    def wait(self, timeout: float | None = None) -> int:
        if timeout is None:
            threading.Event().wait()  # what the kernel does to a waiter on a D-state process
        raise subprocess.TimeoutExpired("stuck", timeout)


def close_pipes(process: subprocess.Popen[bytes]) -> None:
    for pipe in (process.stdin, process.stdout, process.stderr):
        if pipe is not None:
            pipe.close()


def test_stop_gives_up_on_a_child_that_survives_sigkill(tmp_path: Path) -> None:
    child = procs.Child([sys.executable, "-c", "import time; time.sleep(600)"], cwd=tmp_path)
    real = child.process
    child.process = StuckWait(real)  # type: ignore[assignment]
    try:
        code = finishes(lambda: child.stop(signal.SIGINT, grace=0.2, kill_wait=0.5))
        assert code == -signal.SIGKILL and child.unreaped
        assert finishes(lambda: child.stop(signal.SIGINT, grace=0.2, kill_wait=0.5)) == -signal.SIGKILL  # idempotent
    finally:
        real.kill()
        real.wait()
        close_pipes(real)


def test_training_stop_is_bounded_and_says_so(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(procs, "KILL_WAIT", 0.5)
    monkeypatch.setattr(procs.Child.stop, "__defaults__", (signal.SIGINT, 10.0, 0.5))
    command = training.TrainCommand(
        argv=(sys.executable, "-c", "import time; print('up', flush=True); time.sleep(600)"),
        cwd=tmp_path,
        run_dir=tmp_path / "run",
    )
    echo = open(os.devnull, "wb")  # noqa: SIM115
    trainer = training.TrainingProcess(command, dict(os.environ), echo=echo)
    real = trainer.child.process
    trainer.child.process = StuckWait(real)  # type: ignore[assignment]
    try:
        assert finishes(lambda: trainer.stop(signal.SIGINT, 0.2)) == -signal.SIGKILL
        assert trainer.unreaped
    finally:
        real.kill()
        real.wait()
        close_pipes(real)
        echo.close()


def _sleeper_command(tmp_path: Path, script: str) -> training.TrainCommand:
    return training.TrainCommand(argv=(sys.executable, "-c", script), cwd=tmp_path, run_dir=tmp_path / "run")


def test_a_finished_trainings_output_pipe_is_closed_by_its_reader(tmp_path: Path) -> None:
    # Left open, the pipe is closed by the garbage collector later, warning wherever that happens.
    with open(os.devnull, "wb") as echo:
        trainer = training.TrainingProcess(_sleeper_command(tmp_path, "print('epoch 1', flush=True)"), {}, echo=echo)
        assert finishes(trainer.wait) == 0
    stream = trainer.child.process.stdout
    assert stream is not None and stream.closed
    assert (tmp_path / "run" / training.CONSOLE_LOG).read_bytes() == b"epoch 1\n"


def test_a_training_whose_start_fails_halfway_leaves_no_child(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    started: list[procs.Child] = []

    class Recorded(procs.Child):
        def __init__(self, *args: object, **kwargs: object) -> None:
            super().__init__(*args, **kwargs)  # type: ignore[arg-type]
            started.append(self)

    def broken_liveness(*_: object) -> None:
        raise OSError("no /proc")

    monkeypatch.setattr(training, "Child", Recorded)
    monkeypatch.setattr(training, "Liveness", broken_liveness)
    command = _sleeper_command(tmp_path, "import time; time.sleep(600)")
    with open(os.devnull, "wb") as echo, pytest.raises(OSError, match="no /proc"):
        training.TrainingProcess(command, {}, echo=echo)
    [child] = started
    assert child.poll() == -signal.SIGKILL  # stopped before the error went on: nobody else could
    wait_until(lambda: child.process.stdout is not None and child.process.stdout.closed, "the pipe was left open")


def test_run_kills_the_whole_tree_on_timeout(tmp_path: Path) -> None:
    script = "import subprocess, time; print(subprocess.Popen(['sleep', '600']).pid, flush=True); time.sleep(600)"
    result = finishes(lambda: procs.run([sys.executable, "-c", script], timeout=2.0, cwd=tmp_path))
    assert isinstance(result, procs.Completed)
    assert result.timed_out and result.returncode is None and not result.unreaped
    grandchild = int(result.stdout.split()[0])
    wait_until(lambda: gone(grandchild), "the grandchild survived the timeout")


def test_run_gives_up_on_pipes_held_by_an_escaped_grandchild(tmp_path: Path) -> None:
    # setsid: the grandchild leaves the group, and once its parent is gone no /proc walk finds it.
    script = "import os, subprocess, time; subprocess.Popen(['setsid', 'sleep', '30']); os._exit(0)"
    result = finishes(lambda: procs.run([sys.executable, "-c", script], timeout=1.0, cwd=tmp_path, kill_wait=0.5))
    assert isinstance(result, procs.Completed) and result.timed_out


def test_every_child_gets_the_scrubbed_environment(tmp_path: Path) -> None:
    env = {**os.environ, **PROVIDER_KEYS, "KEEP_ME": "1"}
    result = procs.run(
        [sys.executable, "-c", "import json, os; print(json.dumps(dict(os.environ)))"], timeout=60, env=env
    )
    seen = json.loads(result.stdout)
    assert seen["KEEP_ME"] == "1"
    assert not set(PROVIDER_KEYS) & set(seen)


def test_libreyolo_doctor_never_sees_a_provider_key(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    standin = tmp_path / "libreyolo"
    standin.write_text(
        f"#!{sys.executable}\nimport json, os, sys\n"
        f"json.dump(dict(os.environ), open({str(tmp_path / 'env.json')!r}, 'w'))\n"
        "print(json.dumps({'findings': []}))\n"
    )
    standin.chmod(0o755)
    for key, value in PROVIDER_KEYS.items():
        monkeypatch.setenv(key, value)
    data_yaml = tmp_path / "data" / "data.yaml"
    data_yaml.parent.mkdir()
    data_yaml.write_text("names: [a]\n")
    checks.doctor(data_yaml, imgsz=64, fingerprint="x", command=str(standin))
    seen = json.loads((tmp_path / "env.json").read_text())
    assert not set(PROVIDER_KEYS) & set(seen)


def test_a_hung_profile_is_stopped_with_its_whole_tree(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pid_file = tmp_path / "grandchild"
    standin = tmp_path / "libreyolo"
    standin.write_text(  # hangs in `profile` only: `train --help-json` (the options, asked first) fails at once
        f"#!{sys.executable}\nimport subprocess, sys, time\n"
        "if sys.argv[1:2] != ['profile']:\n    sys.exit(1)\n"
        f"open({str(pid_file)!r}, 'w').write(str(subprocess.Popen(['sleep', '600']).pid))\ntime.sleep(600)\n"
    )
    standin.chmod(0o755)
    monkeypatch.setattr(profiling, "PROFILE_TIMEOUT", 2.0)
    (tmp_path / "work").mkdir()
    config = settings.from_env({"WORKDIR": str(tmp_path / "work"), "PROFILE": "1", "TRAINBOX_LIBREYOLO": str(standin)})
    assert finishes(lambda: profiling.profile(config, tmp_path / "data.yaml", (0,))) is None
    wait_until(lambda: gone(int(pid_file.read_text())), "the profiler's own child outlived the timeout")


def test_every_spawn_goes_through_procs() -> None:
    """One place builds a child's environment: nothing else may start a process."""
    spawners = {"run", "Popen", "call", "check_call", "check_output", "system", "execv", "execve", "execvp",
                "execvpe", "spawnv", "spawnve", "posix_spawn", "posix_spawnp", "fork"}  # fmt: skip
    found = []
    for path in sorted(ENTRYPOINT.rglob("*.py")):  # subpackages too
        if path == ENTRYPOINT / "procs.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and isinstance(node.func.value, ast.Name)
                and node.func.value.id in {"subprocess", "os"}
                and node.func.attr in spawners
            ):
                found.append(f"{path.relative_to(ENTRYPOINT)}:{node.lineno} {node.func.value.id}.{node.func.attr}")
    assert found == []


def test_run_args_help_child_goes_through_procs(monkeypatch: pytest.MonkeyPatch) -> None:
    from entrypoint import libreyolo

    seen: list[object] = []

    def fake_run(argv: list[str], **kwargs: object) -> procs.Completed:
        seen.append(kwargs.get("timeout"))
        return procs.Completed(0, "  --epochs INTEGER\n  --batch INTEGER\n", "")

    monkeypatch.setattr(procs, "run", fake_run)
    assert {"epochs", "batch"} <= set(libreyolo._options_from_help())
    assert seen == [120]
    assert parse("epochs=1").get("epochs") == "1"


def test_a_dataset_check_whose_second_doctor_cannot_start_stops_the_first(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    standin = tmp_path / "libreyolo"
    standin.write_text(f"#!{sys.executable}\nimport time\ntime.sleep(600)\n")
    standin.chmod(0o755)
    started: list[procs.Child] = []

    class SecondFails(procs.Child):
        def __init__(self, *args: object, **kwargs: object) -> None:
            if started:
                raise OSError("too many open files")
            super().__init__(*args, **kwargs)  # type: ignore[arg-type]
            started.append(self)

    monkeypatch.setattr(procs, "Child", SecondFails)
    wanted = {name: (tmp_path / name / "data.yaml", 64, None) for name in ("train", "val")}
    for data_yaml, _, _ in wanted.values():
        data_yaml.parent.mkdir()
    with pytest.raises(OSError, match="too many open files"):
        checks.DatasetCheck(wanted, str(standin))
    [first] = started
    assert first.poll() == -signal.SIGKILL


class _FullDiskLog:
    """console.log on a disk that filled up: every write and the last flush fail with ENOSPC."""

    def __init__(self, *_: object) -> None:
        self.tries = 0

    def write(self, data: bytes) -> int:
        self.tries += 1
        raise OSError(28, "No space left on device")

    def flush(self) -> None:
        pass

    def close(self) -> None:
        raise OSError(28, "No space left on device")


def test_a_console_log_that_cannot_be_written_never_stops_the_output_pump(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # 2 MB of output: far past the pipe's 64 KB, so a reader that gave up would block the trainer for good.
    script = "import sys\nfor n in range(20000): sys.stdout.write(f'line {n} ' + 'x' * 90 + '\\n')\nprint('done')"
    logs: list[_FullDiskLog] = []
    monkeypatch.setattr(training, "open", lambda *args: logs.append(_FullDiskLog()) or logs[-1], raising=False)
    with open(os.devnull, "wb") as echo:
        trainer = training.TrainingProcess(_sleeper_command(tmp_path, script), {}, echo=echo)
        assert finishes(trainer.wait) == 0
    assert trainer._tail[-1] == "done" and logs[0].tries > 1  # read to the end, the log tried on every line
    assert trainer.saw_no_space and not trainer.pump_stuck  # the disk is blamed if the training fails now
    assert training.blame_full_disk(training.error_for_exit(1, ""), tmp_path, trainer.saw_no_space) is not None


def test_a_stop_under_way_can_be_hurried(tmp_path: Path) -> None:
    # A wrap-up (MAX_RUNTIME, a stall) gives the trainer 15 s; a SIGTERM meanwhile leaves it 5 s for everything.
    script = "import signal, time; signal.signal(signal.SIGINT, signal.SIG_IGN); time.sleep(600)"
    child = procs.Child([sys.executable, "-c", script], cwd=tmp_path, output=subprocess.DEVNULL, echo=False)
    time.sleep(0.3)  # its SIGINT handler is in place
    threading.Timer(0.3, lambda: child.hurry(time.monotonic() + 0.2)).start()
    started = time.monotonic()
    assert finishes(lambda: child.stop(signal.SIGINT, grace=15.0)) == -signal.SIGKILL
    assert time.monotonic() - started < 15.0, "the grace under way ignored the hurry"  # far from the 15 s grace


def test_a_stop_raised_during_run_leaves_no_child_running(tmp_path: Path) -> None:
    # The signal handler raises the stop inside run's wait (the PROFILE=1 profiler, say): the child goes too.
    pid_file = tmp_path / "pid"
    script = f"import os, time; open({str(pid_file)!r}, 'w').write(str(os.getpid())); time.sleep(600)"

    def stop(*_: object) -> None:
        raise DeadlineError("MAX_RUNTIME (1 s) expired")

    previous = signal.signal(signal.SIGALRM, stop)
    try:
        signal.setitimer(signal.ITIMER_REAL, 1.0)
        with pytest.raises(DeadlineError):
            procs.run([sys.executable, "-c", script], timeout=60.0, cwd=tmp_path, echo=False)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    wait_until(lambda: gone(int(pid_file.read_text())), "the child outlived the stop")
