"""Resume after preemption: same disk or a new one, with the Hub as the source of truth.

The agent's behaviour runs the stand-in trainer (tests/fakes/libreyolo.py); one test trains the real
libreyolo, whose own resume from a real checkpoint is what it checks."""

from __future__ import annotations

import json
import random
import signal
import subprocess
import time
from pathlib import Path

import pytest

from entrypoint import errors
from entrypoint.sync.checkpoint import inspect
from tests.fakes import libreyolo as fake_libreyolo
from tests.hubfixtures import HubContext
from tests.support import TINY_RUN_ARGS, held_after, make_dataset, run_trainbox, start_trainbox, trainbox_env

pytestmark = pytest.mark.slow  # every test here runs the agent (a real training in one of them)

ARGS = f"{TINY_RUN_ARGS} save_period=1"


def stand_in(tmp_path: Path, workdir: Path, **env: str) -> dict[str, str]:
    """``trainbox run`` with the stand-in trainer, on the demo data, an epoch every half second."""
    trainer = fake_libreyolo.install(tmp_path / "bin")
    return trainbox_env(workdir, GPUS="cpu", TRAINBOX_LIBREYOLO=str(trainer), FAKE_EPOCH_SECONDS="0.5") | env


def local_epochs(workdir: Path) -> int:
    """Epochs completed in the run folder, as libreyolo's metrics.jsonl says."""
    for path in (workdir / "runs").glob("*/metrics.jsonl"):
        rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        return max((row["epoch"] for row in rows), default=0)
    return 0


def metric_epochs(text: str) -> list[int]:
    return [json.loads(line)["epoch"] for line in text.splitlines() if line.strip()]


def state(workdir: Path) -> dict:
    (path,) = (workdir / "runs").glob("*/trainbox.json")
    return json.loads(path.read_text())


def wait_for(predicate, timeout: float = 300.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.1)


def kill_hard(process: subprocess.Popen[str]) -> None:
    process.kill()  # SIGKILL: no handler runs, the libreyolo child is left running
    process.communicate(timeout=30)


@pytest.mark.transfer("xet")  # no Hub here
@pytest.mark.contract  # libreyolo's own resume from the real checkpoint a SIGKILL left
def test_kill_9_then_restart_on_the_same_disk_with_the_real_libreyolo(tmp_path: Path) -> None:
    """libreyolo's own resume from the checkpoint the agent chose: every epoch once, the count right."""
    dataset = make_dataset(tmp_path / "cones", train=16, val=4).parent
    workdir = tmp_path / "work"
    env = trainbox_env(workdir, DATASET_REPO=str(dataset), GPUS="cpu", RUN_ARGS=f"{ARGS} epochs=3")
    process = start_trainbox("run", env=env)
    wait_for(lambda: local_epochs(workdir) >= 1 or process.poll() is not None)
    kill_hard(process)
    done_at_kill = local_epochs(workdir)

    result = run_trainbox("run", env=env)
    assert result.returncode == 0, result.output[-3000:]
    final = state(workdir)
    assert final["resume"]["from"] == "volume"
    assert final["resume"]["epochs_done"] >= done_at_kill
    assert final["progress"] == {"epochs_done": 3, "epochs_total": 3}
    assert [attempt["reason"] for attempt in final["attempts"]] == ["lost", "success"]
    run_dir = next((workdir / "runs").iterdir())
    assert metric_epochs((run_dir / "metrics.jsonl").read_text()) == [1, 2, 3]
    assert inspect(run_dir / "weights" / "last.pt").completed_epochs == 3


def test_new_machine_resumes_from_the_hub_then_a_finished_run_is_not_trained_again(
    hub_ctx: HubContext, tmp_path: Path
) -> None:
    repo = hub_ctx.repo_id("resume")
    hub = hub_ctx.hub
    base = dict(HF_TOKEN=hub_ctx.token, OUTPUT_REPO=repo, RUN_ARGS="epochs=6")
    first = tmp_path / "machine1"
    process = start_trainbox("run", env=stand_in(tmp_path, first, **held_after(tmp_path, 2), **base))

    def hub_epochs() -> int:
        if not hub.repo_exists(repo) or "metrics.jsonl" not in hub.files(repo):
            return 0
        return max(metric_epochs(hub.file_bytes(repo, "metrics.jsonl").decode()), default=0)

    wait_for(lambda: hub_epochs() >= 2 or process.poll() is not None)
    process.send_signal(signal.SIGTERM)
    process.communicate(timeout=60)
    assert process.returncode == 143
    on_hub = hub_epochs()

    second = tmp_path / "machine2"  # a new machine: empty disk, same env
    result = run_trainbox("run", env=stand_in(tmp_path, second, **base))
    assert result.returncode == 0, result.output[-3000:]
    final = state(second)
    assert final["resume"] == {"from": "hub", "epochs_done": on_hub}
    assert final["run_id"] == state(first)["run_id"], "the new machine learnt the run id from the repo"
    assert [attempt["reason"] for attempt in final["attempts"]] == ["preempted", "success"]
    hub_state = json.loads(hub.file_bytes(repo, "trainbox.json"))
    assert hub_state["attempt"] == 2 and hub_state["phase"] == "done"
    # history was carried over: every epoch once, on the Hub and locally
    assert metric_epochs(hub.file_bytes(repo, "metrics.jsonl").decode()) == list(range(1, 7))
    assert inspect(hub.blob_path(repo, "weights/last.pt")).completed_epochs == 6

    commits_before = len(hub.commits(repo))
    again = run_trainbox("run", env=stand_in(tmp_path, second, **base))
    assert again.returncode == 0, again.output[-3000:]
    assert "already trained 6/6" in again.stderr
    assert " train " not in again.stderr  # libreyolo was not started
    assert state(second)["exit"]["reason"] == "already_complete"
    assert json.loads(hub.file_bytes(repo, "trainbox.json"))["attempt"] == 3
    assert len(hub.commits(repo)) > commits_before  # the final state is on the Hub


@pytest.mark.transfer("xet")  # the fallback is decided after the download: once is enough
def test_corrupt_last_pt_on_the_hub_falls_back(hub_ctx: HubContext, tmp_path: Path) -> None:
    repo = hub_ctx.repo_id("corrupt")
    hub = hub_ctx.hub
    base = dict(HF_TOKEN=hub_ctx.token, OUTPUT_REPO=repo, RUN_ARGS="epochs=5")
    process = start_trainbox("run", env=stand_in(tmp_path, tmp_path / "m1", **held_after(tmp_path, 2), **base))
    wait_for(lambda: (hub.repo_exists(repo) and "weights/epoch_2.pt" in hub.files(repo)) or process.poll() is not None)
    process.send_signal(signal.SIGTERM)
    process.communicate(timeout=60)
    hub.upload_bytes(repo, "weights/last.pt", b"PK\x03\x04 not a whole checkpoint")

    result = run_trainbox("run", env=stand_in(tmp_path, tmp_path / "m2", **base))
    assert result.returncode == 0, result.output[-3000:]
    assert "weights/last.pt on the Hub is corrupt" in result.stderr
    resumed = state(tmp_path / "m2")["resume"]
    assert resumed["from"] == "hub" and resumed["epochs_done"] >= 2
    assert inspect(hub.blob_path(repo, "weights/last.pt")).completed_epochs == 5


def test_crash_loop_stops_after_three_identical_failures(tmp_path: Path) -> None:
    workdir = tmp_path / "work"
    env = stand_in(tmp_path, workdir, RUN_ARGS="epochs=3", FAKE_TRAIN_MODE="enospc")  # the disk fills at epoch 2
    for _ in range(3):
        assert run_trainbox("run", env=env).returncode == errors.DiskSpaceError.exit_code
    fourth = run_trainbox("run", env=env)
    assert fourth.returncode == errors.CrashLoopError.exit_code
    assert "not retrying" in fourth.stderr
    final = state(workdir)
    assert final["exit"]["reason"] == "crash_loop"
    assert "dataset" not in final["phases"] and "preflight" not in final["phases"]
    assert [a["reason"] for a in final["attempts"]] == ["disk_too_small"] * 3 + ["crash_loop"]
    # and it keeps refusing, rather than counting its own refusals
    assert run_trainbox("run", env=env).returncode == errors.CrashLoopError.exit_code


def test_five_random_kills_cost_at_most_the_epoch_in_progress(tmp_path: Path) -> None:
    workdir = tmp_path / "work"
    env = stand_in(tmp_path, workdir, RUN_ARGS="epochs=12")
    rng = random.Random(20261202)
    done_at_kill = 0

    def resumed(attempt: int) -> int | None:
        """Epochs the given attempt resumed from, once it is past its resume phase."""
        try:
            current = state(workdir)
        except ValueError:
            return None
        if current.get("attempt") != attempt or current.get("phase") in {"starting", "preflight", "resume"}:
            return None
        return (current.get("resume") or {}).get("epochs_done", 0)

    for attempt in range(1, 6):
        process = start_trainbox("run", env=env)
        if attempt > 1:
            wait_for(lambda: resumed(attempt) is not None or process.poll() is not None, timeout=120)  # noqa: B023
            assert (resumed(attempt) or 0) >= done_at_kill, "a kill cost more than the epoch in progress"
        time.sleep(rng.uniform(1.0, 3.0))
        if process.poll() is not None:
            break
        done_at_kill = local_epochs(workdir)
        kill_hard(process)
    result = run_trainbox("run", env=env)
    assert result.returncode == 0, result.output[-3000:]
    assert (state(workdir).get("resume") or {}).get("epochs_done", 0) >= done_at_kill
    run_dir = next((workdir / "runs").iterdir())
    assert metric_epochs((run_dir / "metrics.jsonl").read_text()) == list(range(1, 13))
    assert inspect(run_dir / "weights" / "last.pt").completed_epochs == 12


@pytest.mark.transfer("xet")
def test_a_pinned_commit_resumes_from_that_commits_checkpoint(hub_ctx: HubContext, tmp_path: Path) -> None:
    """Several nodes resume at node 0's commit: a checkpoint committed after it is not theirs."""
    from entrypoint.hub import Hub
    from entrypoint.run_args import parse
    from entrypoint.training import resume

    repo = hub_ctx.repo_id("pinned")
    api = hub_ctx.api()
    api.create_repo(repo)
    commits = []
    for epoch in (2, 4):
        api.upload_folder(
            folder_path=str(_run_folder(tmp_path / f"epoch{epoch}", epoch)), repo_id=repo, commit_message=f"{epoch}"
        )
        commits.append(api.repo_info(repo).sha)
    hub = Hub(token=hub_ctx.token)
    for commit, completed in zip(commits, (2, 4), strict=True):
        run_dir, work = tmp_path / f"node-{completed}" / "run", tmp_path / f"node-{completed}" / "work"
        work.mkdir(parents=True)
        point = resume.find(
            run_dir, parse("epochs=10"), hub=hub, repo_id=repo, work_dir=work, volume=False, revision=commit
        )
        assert point is not None and point.completed_epochs == completed
        assert inspect(run_dir / "weights" / "last.pt").completed_epochs == completed
        rows = (run_dir / "metrics.jsonl").read_text().splitlines()
        assert len(rows) == completed  # the history of that commit too, not the newer one


def _run_folder(folder: Path, completed: int) -> Path:
    (folder / "weights").mkdir(parents=True)
    (folder / "weights" / "last.pt").write_bytes(fake_libreyolo._checkpoint(completed, 10))
    rows = [json.dumps({"epoch": done}) for done in range(1, completed + 1)]
    (folder / "metrics.jsonl").write_text("\n".join(rows) + "\n")
    return folder
