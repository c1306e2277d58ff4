"""What a run is, with the real agent (`trainbox run`), the stand-in trainer and the test Hub: the dataset commit
resolved at its first start (a resume or an extension trains on it after the dataset's `main` moved; an explicit
other DATASET_REVISION is refused), the settings a derived RUN_NAME hashes (an explicit RUN_NAME started again
with another one is refused, naming it; more epochs extend), the run id on the repo at the start whatever
PUBLISH_EVERY says, and a repo holding another run id of the same name never resumed from."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from entrypoint.sync.checkpoint import inspect
from tests.hubfixtures import HubContext
from tests.integration.test_bucket_run import Run, finish
from tests.integration.test_dataset_hub import dataset_tar, make_dataset, pack, publish
from tests.support import held_after, open_gate, run_standin_agent

pytestmark = pytest.mark.slow  # each test runs `trainbox run` a few times (the stand-in trains in a second)

AGENT_TIMEOUT = 120
NAME = "identity"
OTHER = "started with other settings"  # in a refusal's line


def agent(tmp_path: Path, hub_ctx: HubContext, volume: str, **extra: str) -> subprocess.CompletedProcess[str]:
    return run_standin_agent(tmp_path, hub_ctx.env(), tmp_path / volume, AGENT_TIMEOUT, **extra)


def state(tmp_path: Path, volume: str, name: str = NAME) -> dict[str, Any]:
    return dict(json.loads((tmp_path / volume / "runs" / name / "trainbox.json").read_text()))


def refusal(result: subprocess.CompletedProcess[str], marker: str) -> str:
    """The one line of a refusal at start (exit 10), libreyolo never started."""
    assert result.returncode == 10, result.stderr[-3000:]
    (line,) = [line for line in result.stderr.splitlines() if marker in line]
    assert " train " not in result.stderr
    return line


@pytest.mark.transfer("xet")
def test_an_extension_trains_on_the_dataset_commit_of_the_first_start(tmp_path: Path, hub_ctx: HubContext) -> None:
    dataset = publish(hub_ctx, {"cones.tar": dataset_tar(tmp_path)})
    first_commit = hub_ctx.hub.head(dataset, repo_type="dataset")
    repo = hub_ctx.repo_id("identity")
    run = {"OUTPUT_REPO": repo, "DATASET_REPO": dataset, "RUN_ARGS": "model=LibreYOLO9t.pt imgsz=64 epochs=2"}
    done = agent(tmp_path, hub_ctx, "m1", **run)
    assert done.returncode == 0, done.stderr[-3000:]
    name = json.loads(hub_ctx.hub.file_bytes(repo, "trainbox.json"))["run_name"]

    # the dataset's main moves on; the run is extended on a new machine: it learns the commit from the repo
    other = tmp_path / "other"
    make_dataset(other / "cones", train=10, seed=11)
    hub_ctx.hub.commit(dataset, {"cones.tar": pack(other / "cones", other / "cones.tar")}, repo_type="dataset")
    moved = hub_ctx.hub.head(dataset, repo_type="dataset")
    assert moved != first_commit
    longer_args = "model=LibreYOLO9t.pt imgsz=64 epochs=3"
    longer = agent(tmp_path, hub_ctx, "m2", **(run | {"RUN_ARGS": longer_args}))
    assert longer.returncode == 0, longer.stderr[-3000:]
    extended = state(tmp_path, "m2", name)
    assert extended["resume"]["from"] in {"hub", "bucket"} and extended["progress"]["epochs_done"] == 3
    assert extended["dataset"]["revision"] == first_commit and extended["dataset_revision"] == first_commit
    assert f"`{first_commit}`" in hub_ctx.hub.file_bytes(repo, "README.md").decode()

    # an explicit DATASET_REVISION naming another commit is another dataset: refused in one line, naming both
    head = hub_ctx.hub.head(repo)
    moved_on = run | {"DATASET_REVISION": "main", "RUN_ARGS": "model=LibreYOLO9t.pt imgsz=64 epochs=4"}
    line = refusal(agent(tmp_path, hub_ctx, "m2", **moved_on), "DATASET_REVISION")
    assert first_commit in line and moved in line and "RUN_NAME" in line
    assert hub_ctx.hub.head(repo) == head  # nothing written
    assert state(tmp_path, "m2", name)["dataset_revision"] == first_commit


def test_an_explicit_run_name_with_other_settings_is_refused_and_more_epochs_extend(
    tmp_path: Path, hub_ctx: HubContext
) -> None:
    repo = hub_ctx.repo_id("identity")
    run = {"RUN_NAME": NAME, "OUTPUT_REPO": repo, "RUN_ARGS": "model=LibreYOLO9t.pt imgsz=128 epochs=2"}
    assert agent(tmp_path, hub_ctx, "m1", **run).returncode == 0
    head = hub_ctx.hub.head(repo)
    # the volume knows the run: another model is refused, never swapped for the run's checkpoint; nothing changes
    line = refusal(agent(tmp_path, hub_ctx, "m1", **(run | {"RUN_ARGS": "model=LibreYOLO9s.pt imgsz=128"})), OTHER)
    assert "this volume" in line and "RUN_ARGS model is LibreYOLO9s.pt here, LibreYOLO9t.pt in that run" in line
    assert state(tmp_path, "m1")["settings"]["identity"]["RUN_ARGS"] == "model=LibreYOLO9t.pt imgsz=128"
    # the repo knows the run: a new volume with another imgsz is refused
    line = refusal(agent(tmp_path, hub_ctx, "m2", **(run | {"RUN_ARGS": "model=LibreYOLO9t.pt imgsz=96"})), OTHER)
    assert f"OUTPUT_REPO {repo}" in line and "RUN_ARGS imgsz is 96 here, 128 in that run" in line
    assert hub_ctx.hub.head(repo) == head

    # more epochs, nothing else changed: the same run goes on
    longer = agent(tmp_path, hub_ctx, "m1", **(run | {"RUN_ARGS": "model=LibreYOLO9t.pt imgsz=128 epochs=3"}))
    assert longer.returncode == 0, longer.stderr[-3000:]
    assert state(tmp_path, "m1")["progress"] == {"epochs_done": 3, "epochs_total": 3}


def test_with_publish_every_off_a_failed_first_publish_of_the_run_id_is_retried_during_training(
    tmp_path: Path, hub_ctx: HubContext
) -> None:
    run = Run(tmp_path, hub_ctx, epochs=4, PUBLISH_EVERY="off", FAKE_EPOCH_SECONDS="0.1")
    try:
        # the repo refuses the first commit of the run id (after the lease's take: a lease refused ends the start,
        # 74) at once: the start goes on to train
        refusal = dict(method="POST", path=f"/api/models/{run.repo}/commit/", times=1, skip=1)
        with hub_ctx.hub.inject("status", status=403, **refusal):
            process = run.start("m1", **held_after(tmp_path, 2))
            end = time.monotonic() + 30
            while "trainbox.json" not in (run.hub.files(run.repo) if run.hub.repo_exists(run.repo) else {}):
                assert process.poll() is None, finish(process)[1][-3000:]
                assert time.monotonic() < end, "the run id never reached the repo during training"
                time.sleep(0.1)
        assert json.loads(run.hub.file_bytes(run.repo, "trainbox.json"))["run_id"] == run.state("m1")["run_id"]
        assert process.poll() is None  # held after epoch 2: the end has not come
        open_gate(tmp_path, 2, 3)
        code, output = finish(process)
        assert code == 0, output[-3000:]
    finally:
        run.end()


def test_a_repo_holding_another_run_id_of_the_same_name_is_not_resumed_from(
    tmp_path: Path, hub_ctx: HubContext
) -> None:
    repo = hub_ctx.repo_id("identity")
    run = {"RUN_NAME": NAME, "OUTPUT_REPO": repo, "RUN_ARGS": "model=LibreYOLO9t.pt imgsz=64 epochs=2"}
    assert agent(tmp_path, hub_ctx, "m1", **run).returncode == 0
    ours = state(tmp_path, "m1")["run_id"]
    # the repo made again, and another run of the same name trained there from another volume
    hub_ctx.hub.delete_repo(repo)
    assert (
        agent(tmp_path, hub_ctx, "m2", **(run | {"RUN_ARGS": "model=LibreYOLO9t.pt imgsz=64 epochs=3"})).returncode == 0
    )
    theirs = json.loads(hub_ctx.hub.file_bytes(repo, "trainbox.json"))["run_id"]
    assert theirs != ours
    head = hub_ctx.hub.head(repo)

    line = refusal(
        agent(tmp_path, hub_ctx, "m1", **(run | {"RUN_ARGS": "model=LibreYOLO9t.pt imgsz=64 epochs=4"})),
        "another run of that name",
    )
    assert ours in line and theirs in line and repo in line
    assert hub_ctx.hub.head(repo) == head
    assert inspect(hub_ctx.hub.blob_path(repo, "weights/last.pt")).completed_epochs == 3
    assert inspect(tmp_path / "m1" / "runs" / NAME / "weights" / "last.pt").completed_epochs == 2
