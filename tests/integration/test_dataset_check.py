"""The dataset check (``libreyolo doctor``) runs beside the training's start instead of before it: a cold start
is not delayed by it, a failed check stops training at once, and a run only reaches the training phase once the
check passed. Real ``trainbox run`` processes with a stand-in ``libreyolo`` that logs what happens when."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from entrypoint import errors
from tests.support import make_dataset, run_trainbox, trainbox_env

pytestmark = pytest.mark.slow  # every test here runs `trainbox run` (a stand-in libreyolo trains)

# `doctor` waits (boundedly) for training to start, so the log's order shows whether the two overlapped;
# FAKE_DOCTOR=bad makes it report an error. `train` runs until interrupted when the check is to fail, else it
# waits for the check to finish and trains two quick epochs.
FAKE_LIBREYOLO = """\
import json, os, signal, sys, time
log = os.environ["FAKE_LOG"]
bad = os.environ.get("FAKE_DOCTOR") == "bad"

def note(text):
    with open(log, "a") as f:
        f.write(text + "\\n")

def wait_for(line):
    deadline = time.monotonic() + 30
    while line not in open(log).read() and time.monotonic() < deadline:
        time.sleep(0.05)

if sys.argv[1] == "doctor":
    note("doctor started")
    wait_for("train started")
    findings = [{"severity": "error", "message": "class ids outside names", "paths": ["labels/train/000.txt"]}]
    findings = findings if bad else []
    note("doctor finished")
    print(json.dumps({"findings": findings, "summary": {"errors": len(findings), "warnings": 0}}))
    sys.exit(1 if bad else 0)

args = dict(a.split("=", 1) for a in sys.argv[2:] if "=" in a)
run_dir = os.path.join(args["project"], args["name"])
os.makedirs(run_dir, exist_ok=True)
note("train started")

def interrupted(*_):
    note("train interrupted")
    sys.exit(130)

signal.signal(signal.SIGINT, interrupted)
if bad:
    while True:
        time.sleep(0.1)
wait_for("doctor finished")
for epoch in (1, 2):
    with open(os.path.join(run_dir, ".status.tmp"), "w") as f:
        json.dump({"state": "running" if epoch < 2 else "completed", "current_epoch": epoch}, f)
    os.replace(os.path.join(run_dir, ".status.tmp"), os.path.join(run_dir, "status.json"))
note("train finished")
"""


def agent_env(tmp_path: Path, **extra: str) -> tuple[dict[str, str], Path]:
    script = tmp_path / "bin" / "libreyolo"
    script.parent.mkdir()
    script.write_text(f"#!{sys.executable}\n" + FAKE_LIBREYOLO)
    script.chmod(0o755)
    data = make_dataset(tmp_path / "cones")
    log = tmp_path / "libreyolo.log"
    env = trainbox_env(
        tmp_path / "work",
        DATASET_REPO=str(data.parent),
        GPUS="cpu",
        RUN_ARGS="model=LibreYOLO9t.pt epochs=2",
        TRAINBOX_LIBREYOLO=str(script),
        FAKE_LOG=str(log),
        **extra,
    )
    return env, log


def state_of(workdir: Path) -> dict:
    (path,) = (workdir / "runs").glob("*/trainbox.json")
    return json.loads(path.read_text())


def test_training_starts_while_the_dataset_is_checked(tmp_path: Path) -> None:
    env, log = agent_env(tmp_path)
    result = run_trainbox("run", env=env, timeout=120)
    assert result.returncode == 0, result.output[-3000:]
    events = log.read_text().splitlines()
    # the check ended only after the training child had started: they overlapped (either may start first)
    assert sorted(events[:2]) == ["doctor started", "train started"], events
    assert events[2:] == ["doctor finished", "train finished"], events
    state = state_of(tmp_path / "work")
    assert state["phase"] == "done"
    phases = list(state["phases"])
    assert phases.index("dataset") < phases.index("training")
    # the pass is remembered: a later run on this data skips the check
    assert list((tmp_path / "work" / "data").rglob(".trainbox-doctor.json"))


def test_a_failed_check_stops_training_at_once(tmp_path: Path) -> None:
    env, log = agent_env(tmp_path, FAKE_DOCTOR="bad")
    result = run_trainbox("run", env=env, timeout=120)
    assert result.returncode == errors.DatasetInvalidError.exit_code, result.output[-3000:]
    assert "class ids outside names" in result.stderr
    events = log.read_text().splitlines()
    assert sorted(events[:2]) == ["doctor started", "train started"], events
    assert events[2:] == ["doctor finished", "train interrupted"], "training is stopped as soon as the check fails"
    state = state_of(tmp_path / "work")
    assert state["exit"]["reason"] == "dataset_invalid"
    assert "training" not in state["phases"], "the run never counts as training on a dataset that failed"
    assert not list((tmp_path / "work" / "data").rglob(".trainbox-doctor.json"))
