"""A torchrun worker whose training returned leaves 0 with its output, before the interpreter's teardown (where
gloo's threads can abort a process whose peer node already left); a failed one ends as Python ends it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys


def worker(entry: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {key: value for key, value in os.environ.items() if key not in ("MASTER_ADDR", "MASTER_PORT")}
    env["TRAINBOX_DDP_ENTRY"] = f"tests.fakes.ddp_teardown:{entry}"
    command = [sys.executable, "-m", "entrypoint.training.ddp_worker", *args]
    return subprocess.run(command, env=env, capture_output=True, text=True, timeout=60)


def test_the_teardown_stand_in_aborts_a_process_that_runs_its_teardown() -> None:
    # the stand-in is what it says: run by Python itself, its finished training ends in SIGABRT
    code = "from tests.fakes import ddp_teardown; ddp_teardown.finishes(['epochs=3'])"
    ran = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert ran.returncode == -signal.SIGABRT


def test_a_finished_training_leaves_0_with_its_output_before_the_teardown() -> None:
    ran = worker("finishes", "epochs=3", "batch=4")
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout == "trained: epochs=3 batch=4\n"


def test_an_exit_0_leaves_before_the_teardown_too() -> None:
    ran = worker("exits", "0")
    assert ran.returncode == 0, ran.stderr
    assert "stopped" in ran.stderr and "teardown ran" not in ran.stderr


def test_a_failed_training_ends_with_its_code_as_python_ends_it() -> None:
    ran = worker("exits", "3")
    assert ran.returncode == 3, ran.stderr
    assert "teardown ran" in ran.stderr
