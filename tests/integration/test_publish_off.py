"""PUBLISH_EVERY=off: with a bucket, the model repo gets the run id before training and its milestones only at
the end; a value under the Hub's commit budget is raised to the floor in one line. The real agent and the
stand-in trainer against the test Hub."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from entrypoint.variables import MIN_PUBLISH_EVERY
from tests.hubfixtures import HubContext
from tests.integration.test_bucket_run import Run, finish, wait_for
from tests.support import held_after, open_gate, run_trainbox, trainbox_env


@pytest.fixture
def run(tmp_path: Path, hub_ctx: HubContext) -> Iterator[Run]:
    bucket_run = Run(tmp_path, hub_ctx, epochs=6, PUBLISH_EVERY="off")
    yield bucket_run
    bucket_run.end()


@pytest.mark.slow  # runs the agent with the stand-in trainer
def test_off_gives_the_repo_its_milestones_only_at_the_end(run: Run) -> None:
    process = run.start("m1", **held_after(run.tmp_path, 4))  # the end cannot come before the look
    wait_for(lambda: run.bucket_epoch() >= 4, "epoch 4 in the bucket", process)
    during = set(run.hub.files(run.repo))
    open_gate(run.tmp_path, 4, 5)
    code, output = finish(process)
    assert code == 0, output[-3000:]
    assert "trainbox.json" in during, "the run id goes to the repo before training, off or not"
    assert not during & {"metrics.jsonl", "weights/best.pt"}, f"a milestone went before the end: {during}"
    commits = run.hub.commits(run.repo)
    versions = {commit.files["metrics.jsonl"].sha256 for commit in commits if "metrics.jsonl" in commit.files}
    assert len(versions) == 1, "the repo held metrics.jsonl before its final version"
    assert run.repo_epoch() == 6 and "weights/best.pt" in run.hub.files(run.repo)


def test_a_value_over_the_commit_budget_is_raised_to_the_floor_in_one_line(tmp_path: Path) -> None:
    env = trainbox_env(tmp_path / "work", OUTPUT_REPO="acme/yolo", PUBLISH_EVERY="5s")
    result = run_trainbox("run", "--dry-run", env=env, timeout=120)
    assert result.returncode == 0, result.output[-2000:]
    said = [line for line in result.output.splitlines() if "PUBLISH_EVERY=5s" in line]
    assert len(said) == 1 and f"at most every {MIN_PUBLISH_EVERY:.0f} s" in said[0], said
