"""Every child dies with the agent, however the agent ends: outside a container nothing else would stop a
trainer whose agent was killed with SIGKILL (the OOM killer, a supervisor), and it would train on with nothing
uploading and nothing releasing the machine."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from entrypoint import procs
from tests.fakes import libreyolo as fake_libreyolo
from tests.support import held_after, open_gate, process_alive, trainbox_env

WAIT = 60.0


def _trainer_of(agent: int) -> int | None:
    for pid in procs.descendants(agent):
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"train" in argv and any(part.endswith(b"libreyolo") for part in argv):
            return pid
    return None


@pytest.mark.slow
def test_a_trainer_does_not_outlive_an_agent_killed_with_sigkill(tmp_path: Path) -> None:
    script = fake_libreyolo.install(tmp_path / "bin")
    env = trainbox_env(
        tmp_path / "box",
        GPUS="cpu",
        TRAINBOX_LIBREYOLO=str(script),
        RUN_ARGS="epochs=5",
        **held_after(tmp_path, 1),  # the trainer waits after epoch 1: alive when the agent dies, and for good
    )
    agent = subprocess.Popen(
        [sys.executable, "-m", "entrypoint", "run"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,  # as a supervisor starts it: nothing but the agent's own care ends its children
    )
    trainer = None
    try:
        end = time.monotonic() + WAIT
        while trainer is None and time.monotonic() < end and agent.poll() is None:
            trainer = _trainer_of(agent.pid)
            time.sleep(0.1)
        assert trainer is not None, "the stand-in trainer started"
        os.kill(agent.pid, signal.SIGKILL)
        agent.wait(WAIT)
        end = time.monotonic() + 10.0
        while process_alive(trainer) and time.monotonic() < end:
            time.sleep(0.05)
        assert not process_alive(trainer), "the trainer outlived its agent"
        # The volume's lock died with the agent: the next start on this volume is not refused by it.
        again = subprocess.run(
            [sys.executable, "-m", "entrypoint", "run"],
            env=env | {"FAKE_EPOCH_GATE": ""},
            capture_output=True,
            text=True,
            timeout=WAIT,
        )
        assert again.returncode == 0, again.stderr[-3000:]
    finally:
        if agent.poll() is None:
            agent.kill()
            agent.wait()
        if trainer is not None and process_alive(trainer):
            os.kill(trainer, signal.SIGKILL)


def test_the_warden_kills_a_registered_tree_when_its_agent_is_gone(tmp_path: Path) -> None:
    """The mechanism alone, without a training: a process that starts a child through procs.Child (which
    starts a grandchild of its own in another session, as libreyolo's DDP launcher does), then dies by SIGKILL."""
    pids = tmp_path / "pids"
    agent_code = (
        "import sys, time, subprocess; from pathlib import Path; from entrypoint import procs\n"
        "child = procs.Child([sys.executable, '-c', "
        '\'import subprocess, sys, time; g = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"],'
        " start_new_session=True); print(g.pid, flush=True); time.sleep(60)'], cwd=Path('.'), echo=False)\n"
        "grandchild = child.process.stdout.readline().decode().strip()\n"
        f"Path({str(pids)!r}).write_text(f'{{child.pid}} {{grandchild}}')\n"
        "time.sleep(60)\n"
    )
    agent = subprocess.Popen(
        [sys.executable, "-c", agent_code],
        env=os.environ | {"PYTHONPATH": str(Path(__file__).resolve().parents[2])},
        start_new_session=True,
    )
    try:
        end = time.monotonic() + WAIT
        while not (pids.exists() and len(pids.read_text().split()) == 2) and time.monotonic() < end:
            time.sleep(0.05)
        child, grandchild = (int(pid) for pid in pids.read_text().split())
        assert process_alive(child) and process_alive(grandchild)
        os.kill(agent.pid, signal.SIGKILL)
        agent.wait(WAIT)
        end = time.monotonic() + 10.0
        while (process_alive(child) or process_alive(grandchild)) and time.monotonic() < end:
            time.sleep(0.05)
        assert not process_alive(child) and not process_alive(grandchild)
    finally:
        if agent.poll() is None:
            agent.kill()
            agent.wait()


@pytest.mark.slow
def test_a_second_agent_on_the_volume_is_refused_and_the_first_trains_on(tmp_path: Path) -> None:
    """Without OUTPUT_REPO there is no lease: the volume's lock alone keeps a second `trainbox run` (a second
    container on the same volume, a `docker exec`) from stopping the first's trainer as a killed attempt's orphan,
    rewriting its trainbox.json and training into its run folder."""
    script = fake_libreyolo.install(tmp_path / "bin")
    env = trainbox_env(
        tmp_path / "box", GPUS="cpu", TRAINBOX_LIBREYOLO=str(script), RUN_ARGS="epochs=3", **held_after(tmp_path, 1)
    )
    first = subprocess.Popen(
        [sys.executable, "-m", "entrypoint", "run"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        trainer = None
        end = time.monotonic() + WAIT
        while trainer is None and time.monotonic() < end and first.poll() is None:
            trainer = _trainer_of(first.pid)
            time.sleep(0.1)
        assert trainer is not None, "the stand-in trainer started"
        (state_file,) = (tmp_path / "box" / "runs").glob("*/trainbox.json")
        before = json.loads(state_file.read_text())

        second = subprocess.run(
            [sys.executable, "-m", "entrypoint", "run"], env=env, capture_output=True, text=True, timeout=WAIT
        )
        assert second.returncode == 72, second.stderr[-3000:]
        (said,) = second.stderr.splitlines()
        assert (
            f"ERROR: another trainbox agent is running {state_file.parent.name} on this volume (pid {first.pid}" in said
        )
        assert "stop it first, or give this one another WORKDIR or RUN_NAME" in said
        assert process_alive(trainer), "the second agent stopped the first's trainer"
        after = json.loads(state_file.read_text())  # the first's own saves go on; the second wrote nothing
        assert (after["attempt"], after["started_at"], after["exit"]) == (before["attempt"], before["started_at"], None)

        open_gate(tmp_path, 1, 2)
        output, _ = first.communicate(timeout=WAIT)
        assert first.returncode == 0, output[-3000:]
    finally:
        if first.poll() is None:
            first.kill()
            first.wait()
