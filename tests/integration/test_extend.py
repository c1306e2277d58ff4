"""Extending a finished run: libreyolo's resume takes a new total (the contract, with the real libreyolo), and the
agent, given a higher ``epochs`` and nothing else changed, continues the same run under the same RUN_NAME and repo
(the real agent, the stand-in libreyolo, the local Hub); any other change is refused, naming it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from entrypoint.sync.checkpoint import inspect
from tests.hubfixtures import HubContext
from tests.support import TINY_RUN_ARGS, make_dataset, run_standin_agent

pytestmark = pytest.mark.slow  # real trainings and `trainbox run`
AGENT_TIMEOUT = 120


def epochs_of(text: str) -> list[int]:
    return [json.loads(line)["epoch"] for line in text.splitlines() if line.strip()]


@pytest.mark.contract  # libreyolo's own resume with a new total: what the extension relies on
def test_libreyolo_resumes_a_finished_run_to_a_new_total(tmp_path: Path) -> None:
    """What the extension relies on: `resume=true epochs=5` on a finished 3-epoch run trains epochs 4 and 5 into the
    same folder (libreyolo 1.6.0: explicit arguments override the saved ones), every epoch recorded once."""
    data = make_dataset(tmp_path / "data")
    libreyolo = str(Path(sys.executable).parent / "libreyolo")  # the real one, whatever TRAINBOX_LIBREYOLO says
    base = [libreyolo, "train", *TINY_RUN_ARGS.split(), f"data={data}", "device=cpu", "batch=4"]
    base += [f"project={tmp_path / 'runs'}", "name=run", "exist_ok=true"]
    run_dir = tmp_path / "runs" / "run"
    first = subprocess.run([*base, "epochs=3"], capture_output=True, text=True, timeout=600)
    assert first.returncode == 0, first.stderr[-3000:]
    assert inspect(run_dir / "weights" / "last.pt").total_epochs == 3

    resumed = [arg for arg in base if not arg.startswith("pretrained=")]  # libreyolo refuses it with resume
    last = run_dir / "weights" / "last.pt"
    more = subprocess.run(
        [*resumed, f"model={last}", "resume=true", "epochs=5"], capture_output=True, text=True, timeout=600
    )
    assert more.returncode == 0, more.stderr[-3000:]
    assert epochs_of((run_dir / "metrics.jsonl").read_text()) == [1, 2, 3, 4, 5]
    status = json.loads((run_dir / "status.json").read_text())
    assert (status["state"], status["total_epochs"], status["start_epoch"]) == ("completed", 5, 4)
    info = inspect(last)
    assert (info.completed_epochs, info.total_epochs) == (5, 5)  # a later restart sees the new total


def agent(tmp_path: Path, hub_ctx: HubContext, machine: str, **extra: str) -> subprocess.CompletedProcess[str]:
    return run_standin_agent(tmp_path, hub_ctx.env(), tmp_path / machine, AGENT_TIMEOUT, **extra)


def state(workdir: Path) -> dict[str, Any]:
    (path,) = (workdir / "runs").glob("*/trainbox.json")
    return json.loads(path.read_text())


@pytest.mark.transfer("xet")
def test_a_finished_3_epoch_run_extended_to_5_has_epochs_1_to_5_once(tmp_path: Path, hub_ctx: HubContext) -> None:
    repo = hub_ctx.repo_id("extend")
    hub = hub_ctx.hub
    args = "model=LibreYOLO9t.pt imgsz=128"
    finished = agent(tmp_path, hub_ctx, "machine1", OUTPUT_REPO=repo, RUN_ARGS=f"{args} epochs=3")
    assert finished.returncode == 0, finished.stderr[-3000:]
    name = state(tmp_path / "machine1")["run_name"]
    assert epochs_of(hub.file_bytes(repo, "metrics.jsonl").decode()) == [1, 2, 3]

    # a new machine, the same settings but epochs=5: the same run goes on from the Hub's epoch 3
    longer = agent(tmp_path, hub_ctx, "machine2", OUTPUT_REPO=repo, RUN_ARGS=f"{args} epochs=5")
    assert longer.returncode == 0, longer.stderr[-3000:]
    assert "Extended from 3 to 5 epochs after epoch 3" in longer.stderr
    final = state(tmp_path / "machine2")
    assert final["run_name"] == name and final["resume"] == {"from": "hub", "epochs_done": 3}
    assert final["progress"] == {"epochs_done": 5, "epochs_total": 5}
    assert final["extensions"] == [{"from_epochs": 3, "to_epochs": 5, "after_epoch": 3, "how": "resume"}]
    assert "resume=true" in final["training"]["argv"] and "epochs=5" in final["training"]["argv"]
    assert [attempt["reason"] for attempt in final["attempts"]] == ["success", "success"]
    # every epoch once, on the Hub and on the new machine; the last checkpoint is epoch 5
    assert epochs_of(hub.file_bytes(repo, "metrics.jsonl").decode()) == [1, 2, 3, 4, 5]
    assert epochs_of((tmp_path / "machine2" / "runs" / name / "metrics.jsonl").read_text()) == [1, 2, 3, 4, 5]
    assert inspect(hub.blob_path(repo, "weights/last.pt")).completed_epochs == 5
    assert json.loads(hub.file_bytes(repo, "trainbox.json"))["extensions"] == final["extensions"]
    card = hub.file_bytes(repo, "README.md").decode()
    assert "Extended from 3 to 5 epochs after epoch 3, through libreyolo's resume with the new total" in card
    assert "5/5 epochs" in card

    # started again as it is: nothing left to train, and no second extension
    again = agent(tmp_path, hub_ctx, "machine2", OUTPUT_REPO=repo, RUN_ARGS=f"{args} epochs=5")
    assert again.returncode == 0, again.stderr[-3000:]
    assert "already trained 5/5" in again.stderr
    assert state(tmp_path / "machine2")["extensions"] == final["extensions"]

    # anything else that defines the run is another run: refused at start, in one line naming it
    other = agent(tmp_path, hub_ctx, "machine3", OUTPUT_REPO=repo, RUN_ARGS="model=LibreYOLO9t.pt imgsz=96 epochs=8")
    assert other.returncode == 10, other.stderr[-3000:]
    (line,) = [line for line in other.stderr.splitlines() if "already holds run" in line]
    assert f"already holds run {name!r}" in line and "RUN_ARGS imgsz is 96 here, 128 in that run" in line
    assert " train " not in other.stderr  # libreyolo was never started
    assert epochs_of(hub.file_bytes(repo, "metrics.jsonl").decode()) == [1, 2, 3, 4, 5]
