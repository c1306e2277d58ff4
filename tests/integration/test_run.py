"""`trainbox run` end to end: real libreyolo trainings on tiny generated data, on the CPU.

The contract lane's core: one real two-epoch run (trained once per session, whichever workers ask) is read by the
tests of what the agent reads from libreyolo's run folder, and resumed (on a copy) by the test of what it passes to
resume.
"""

from __future__ import annotations

import json
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from entrypoint import errors, libreyolo, settings
from entrypoint.run_args import parse
from entrypoint.sync.checkpoint import inspect
from entrypoint.training import oom
from tests.support import (
    ONE_TORCH_THREAD,
    TINY_RUN_ARGS,
    Result,
    make_dataset,
    run_trainbox,
    shared_run,
    trainbox_env,
)

pytestmark = pytest.mark.slow  # every test here runs the agent; the contract ones train real models

# The metrics.jsonl columns the agent reads (epoch line, plot, card): real libreyolo writes them, and so does
# the stand-in (tests/fakes/libreyolo.py) the agent-behaviour tests run.
READ_COLUMNS = ("epoch", "time", "train/loss", "is_best", "metrics/mAP50", "metrics/mAP50-95")


def state_of(workdir: Path) -> dict:
    (path,) = (workdir / "runs").glob("*/trainbox.json")
    return json.loads(path.read_text())


@dataclass(frozen=True)
class TrainedRun:
    """A finished real run: its workspace, the environment it ran with, and what `trainbox run` printed."""

    workdir: Path
    env: dict[str, str]
    result: Result

    @property
    def run_dir(self) -> Path:
        return self.workdir / "runs" / state_of(self.workdir)["run_name"]


@pytest.fixture(scope="module")
def two_epochs() -> TrainedRun:
    return two_epoch_run()


def two_epoch_run() -> TrainedRun:
    """Two real epochs on a local dataset, trained once per session (whichever workers run the tests that only
    read the result, or copy it: tests/support.py, ``shared_run``)."""
    run_args = f"{TINY_RUN_ARGS} epochs=2 save_period=1"  # save_period: the epoch_N.pt files the sync names

    def train(folder: Path) -> dict:
        data = make_dataset(folder / "cones", relative_path=False)
        settings = dict(DATASET_REPO=str(data.parent), GPUS="cpu", RUN_ARGS=run_args, **ONE_TORCH_THREAD)
        result = run_trainbox("run", env=trainbox_env(folder / "work", **settings))
        return {"settings": settings, "result": [result.returncode, result.stdout, result.stderr]}

    folder, made = shared_run("two-epochs", run_args, train)
    # the environment of this worker (its test Hub), with the run's own settings
    env = trainbox_env(folder / "work", **made["settings"])
    return TrainedRun(folder / "work", env, Result(*made["result"]))


@pytest.mark.contract
def test_local_dataset_trains_two_epochs(two_epochs: TrainedRun) -> None:
    workdir, env, result = two_epochs.workdir, two_epochs.env, two_epochs.result
    assert result.returncode == 0, result.output[-3000:]

    state = state_of(workdir)
    run_dir = workdir / "runs" / state["run_name"]
    assert (run_dir / "weights" / "best.pt").stat().st_size > 0
    assert (run_dir / "weights" / "last.pt").stat().st_size > 0
    assert state["phase"] == "done"
    assert state["exit"]["code"] == 0
    assert set(state["phases"]) >= {"preflight", "dataset", "training"}
    assert state["versions"]["libreyolo"] == "1.6.0"
    status = json.loads((run_dir / "status.json").read_text())
    assert status["state"] == "completed" and status["completed_epochs"] == 2
    # the child's output is kept in the run folder, and the agent logged the command it ran
    assert "Training complete" in (run_dir / "console.log").read_text()
    assert "+ " in result.stderr and " train " in result.stderr
    # GPUS=cpu says so
    assert "GPUS=cpu" in result.stderr

    # `trainbox status` reads it back, in both forms
    shown = run_trainbox("status", env=env)
    assert shown.returncode == 0 and "done" in shown.stdout and state["run_name"] in shown.stdout
    as_json = run_trainbox("status", "--json", env=env)
    assert json.loads(as_json.stdout)["phase"] == "done"


@pytest.mark.contract
def test_the_run_folder_holds_what_the_agent_reads(two_epochs: TrainedRun) -> None:
    assert two_epochs.result.returncode == 0, two_epochs.result.output[-3000:]
    run_dir = two_epochs.run_dir
    rows = [json.loads(line) for line in (run_dir / libreyolo.METRICS_FILE).read_text().splitlines() if line.strip()]
    assert [row["epoch"] for row in rows] == [1, 2] and libreyolo.epochs_done(run_dir) == 2
    for row in rows:  # eval_interval=1: every epoch validated
        missing = [column for column in READ_COLUMNS if column not in row]
        assert not missing, f"metrics.jsonl lacks {missing}: {sorted(row)}"
        assert all(isinstance(row[column], int | float) for column in READ_COLUMNS), row
    # the checkpoints: what resume and the sync read (epochs done, epochs asked), and one file per epoch
    last = inspect(run_dir / libreyolo.LAST_CHECKPOINT)
    assert (last.completed_epochs, last.total_epochs) == (2, 2)
    assert inspect(run_dir / libreyolo.BEST_CHECKPOINT).completed_epochs in (1, 2)
    epochs = sorted(path.relative_to(run_dir).as_posix() for path in run_dir.glob(f"*/{libreyolo.EPOCH_GLOB}"))
    assert epochs == ["weights/epoch_1.pt", "weights/epoch_2.pt"]
    assert all(libreyolo.EPOCH_CHECKPOINT.match(name) for name in epochs)
    assert inspect(run_dir / epochs[0]).completed_epochs == 1
    # batch=-1 (the agent's default): AutoBatch's choice is in train_config.yaml, where the OOM handling reads it
    assert "batch=-1" in json.dumps(state_of(two_epochs.workdir)["training"]["argv"])
    assert oom.batch_in_use(run_dir, parse("batch=-1")) == 16  # on the CPU libreyolo keeps its default


@pytest.mark.contract
def test_a_finished_run_given_more_epochs_resumes_from_its_checkpoint(two_epochs: TrainedRun, tmp_path: Path) -> None:
    assert two_epochs.result.returncode == 0, two_epochs.result.output[-3000:]
    workdir = tmp_path / "work"
    shutil.copytree(two_epochs.workdir, workdir, symlinks=True)
    env = two_epochs.env | {"WORKDIR": str(workdir), "RUN_ARGS": f"{TINY_RUN_ARGS} epochs=3 save_period=1"}
    env["RUN_NAME"] = state_of(workdir)["run_name"]  # the same run, one more epoch
    result = run_trainbox("run", env=env)
    assert result.returncode == 0, result.output[-3000:]
    state = state_of(workdir)
    assert state["resume"]["from"] == "volume" and state["resume"]["epochs_done"] == 2, state.get("resume")
    run_dir = workdir / "runs" / state["run_name"]
    argv = state["training"]["argv"]  # libreyolo's resume switch, on the checkpoint of this volume
    assert "resume=true" in argv and f"model={run_dir / libreyolo.LAST_CHECKPOINT}" in argv, argv
    rows = [json.loads(line) for line in (run_dir / libreyolo.METRICS_FILE).read_text().splitlines() if line.strip()]
    assert [row["epoch"] for row in rows] == [1, 2, 3]  # epoch 3 trained, 1 and 2 kept, none again
    trained = (two_epochs.run_dir / libreyolo.METRICS_FILE).read_text().splitlines()
    assert [json.loads(line) for line in trained] == rows[:2], "epochs 1 and 2 were trained again"
    assert inspect(run_dir / libreyolo.LAST_CHECKPOINT).completed_epochs == 3


# The demo's final mAP50 with README command 1 (all demo defaults) is measured in
# docs/benchmarks.md; the floor sits well below it, so a slower or busier machine still passes.
DEMO_MAP50_FLOOR = 0.5


@pytest.mark.contract
@pytest.mark.timeout(3600)  # 8 real epochs on the CPU (README command 1): the longest test
def test_demo_default_needs_no_configuration_and_learns(tmp_path: Path) -> None:
    workdir = tmp_path / "work"
    # Nothing but a workspace: README command 1, the bundled demo on GPUS=all, which falls back to
    # the CPU here, with every demo default (no time limit: a busy machine is slower, not wrong).
    # every default: the score at the end and the host's measure too
    env = {key: value for key, value in trainbox_env(workdir).items() if key not in {"EVAL", "HOST_CHECK"}}
    result = run_trainbox("run", env=env, timeout=3600)
    assert result.returncode == 0, result.output[-3000:]
    assert "NO GPU FOUND" in result.stderr
    state = state_of(workdir)
    assert state["phase"] == "done"
    assert state["dataset"]["source"] == "bundled demo"
    run_dir = workdir / "runs" / state["run_name"]
    assert (run_dir / "weights" / "best.pt").is_file()
    assert (workdir / "data" / "demo" / "data.yaml").is_file()

    # It visibly learned: the last epoch's mAP50 clears the measured floor.
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    final = rows[-1]
    assert final["epoch"] == int(settings.DEMO_RUN_ARGS.split("epochs=")[1].split()[0])
    assert final["metrics/mAP50"] >= DEMO_MAP50_FLOOR, [round(row.get("metrics/mAP50", 0), 3) for row in rows]

    # It was scored at the end, on the demo's validation split (it has no test split), and said so.
    assert "scored on the validation split (also used to pick best.pt)" in result.stderr

    # The end says what to do next, and warns about no Hub it was never asked to use.
    assert "the Hub is not known" not in result.output
    steps = [line.split("next: ", 1)[1] for line in result.stderr.splitlines() if "next: " in line]
    assert str(run_dir / "weights") in steps[0] and "best.pt" in steps[0]
    assert any("trainbox sync" in step and "OUTPUT_REPO=" in step for step in steps)
    assert any("hf upload" in step and "--repo-type dataset" in step for step in steps)
    assert any("DATASET_REPO=" in step and "trainbox run" in step for step in steps)
    # The prediction line runs as printed (libreyolo from this environment).
    (predict,) = [step.split(": ", 1)[1] for step in steps if "libreyolo predict" in step]
    words = shlex.split(predict)
    assert words[:2] == ["libreyolo", "predict"]
    ran = subprocess.run(
        [str(Path(sys.executable).with_name("libreyolo")), *words[1:]],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert ran.returncode == 0, ran.stdout[-2000:] + ran.stderr[-2000:]


@pytest.mark.contract  # libreyolo's own check of the data
def test_bad_data_fails_with_the_dataset_code(tmp_path: Path) -> None:
    data = make_dataset(tmp_path / "broken")
    for label in (data.parent / "images" / "train").iterdir():
        label.unlink()  # data.yaml names a train folder with no images in it
    workdir = tmp_path / "work"
    env = trainbox_env(workdir, DATASET_REPO=str(data.parent), GPUS="cpu", RUN_ARGS=f"{TINY_RUN_ARGS} epochs=1")
    result = run_trainbox("run", env=env)
    assert result.returncode == errors.DatasetInvalidError.exit_code, result.output[-3000:]
    state = state_of(workdir)
    assert state["phase"] == "failed"
    assert state["exit"]["reason"] == "dataset_invalid"
    assert state["exit"]["message"]
    assert "training" not in state["phases"], "a broken dataset must fail before training starts"


def test_bad_setting_stops_before_anything_is_spent(tmp_path: Path) -> None:
    env = trainbox_env(tmp_path / "work", GPUS="cpu", MAX_RUNTIME="6x")
    result = run_trainbox("run", env=env, timeout=60)
    assert result.returncode == errors.ConfigError.exit_code
    lines = [line for line in result.stderr.splitlines() if "ERROR" in line]
    assert len(lines) == 1 and "MAX_RUNTIME" in lines[0] and "90m" in lines[0]
    assert not (tmp_path / "work" / "runs").exists()


@pytest.mark.parametrize(("run_args", "variable"), [("data=x.yaml", "DATASET_REPO"), ("device=0", "GPUS")])
def test_owned_run_args_are_refused(tmp_path: Path, run_args: str, variable: str) -> None:
    result = run_trainbox("run", env=trainbox_env(tmp_path, GPUS="cpu", RUN_ARGS=run_args), timeout=60)
    assert result.returncode == errors.ConfigError.exit_code
    assert variable in result.stderr


def test_real_run_without_a_gpu_is_refused(tmp_path: Path) -> None:
    data = make_dataset(tmp_path / "cones")
    env = trainbox_env(tmp_path / "work", DATASET_REPO=str(data.parent), RUN_ARGS=TINY_RUN_ARGS)
    result = run_trainbox("run", env=env, timeout=120)
    assert result.returncode == errors.NoGpuError.exit_code
    assert "GPUS=cpu" in result.stderr
    assert "dataset" not in state_of(tmp_path / "work")["phases"]
