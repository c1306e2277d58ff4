"""The stop rule in dollars end to end: the real agent, the local Hub, and the stand-in libreyolo
(tests/fakes/libreyolo.py) validating every epoch along a scripted mAP50-95 curve (``FAKE_MAP``), at a price
that makes each epoch's seconds its dollars."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from entrypoint.sync.checkpoint import inspect
from entrypoint.training import stoprule
from tests.hubfixtures import HubContext
from tests.support import run_standin_agent

pytestmark = pytest.mark.slow  # `trainbox run` with the stand-in libreyolo
AGENT_TIMEOUT = 180
# mAP50-95 per epoch: it rises until epoch 4, then creeps by less than STOP_MIN_GAIN (0.005)
CURVE = "0.10,0.20,0.30,0.40,0.401,0.402,0.403,0.404,0.50,0.60"
EPOCH_SECONDS = "1.0"  # longer than the agent's half-second look: the stop lands inside the next epoch
PRICE = "3600"  # $1 a second: an epoch is $1


def run(tmp_path: Path, hub_ctx: HubContext, repo: str, **extra: str) -> subprocess.CompletedProcess[str]:
    scripted = {
        "FAKE_EPOCH_SECONDS": EPOCH_SECONDS,
        "FAKE_MAP": CURVE,
        "PRICE_PER_HOUR": PRICE,
        "RUN_ARGS": "epochs=10",
    }
    return run_standin_agent(
        tmp_path, hub_ctx.env(), tmp_path / "work", AGENT_TIMEOUT, OUTPUT_REPO=repo, **(scripted | extra)
    )


def state(tmp_path: Path) -> dict[str, Any]:
    (path,) = (tmp_path / "work" / "runs").glob("*/trainbox.json")
    return json.loads(path.read_text())


@pytest.mark.transfer("xet")
def test_a_flat_map_for_that_many_dollars_ends_the_run_as_finished(tmp_path: Path, hub_ctx: HubContext) -> None:
    repo = hub_ctx.repo_id("flat")
    result = run(tmp_path, hub_ctx, repo, STOP_FLAT_SPEND="3")

    assert result.returncode == 0, result.stderr[-3000:]
    final = state(tmp_path)
    # $3 after epoch 4 (best 0.40), epoch 7's best 0.403 rose 0.003 < 0.005: stopped at that boundary
    assert final["phase"] == "done"
    assert final["exit"]["code"] == 0 and final["exit"]["reason"] == stoprule.REASON
    assert "rose +0.0030 over the last $3 of training (epochs 5-7)" in final["exit"]["message"]
    assert final["stop_rule"]["stopped"] is True and final["stop_rule"]["epoch"] == 7
    assert final["stop_rule"]["spent"] == pytest.approx(7.0)
    assert final["progress"]["epochs_done"] == 7
    assert final["receipt"]["stopped"] == final["exit"]["message"]
    assert final["exit"]["message"] in result.stderr
    # the run folder's last checkpoint is the boundary's, whole, and so is the Hub's
    run_dir = tmp_path / "work" / "runs" / final["run_name"]
    assert inspect(run_dir / "weights" / "last.pt").completed_epochs == 7
    assert inspect(hub_ctx.hub.blob_path(repo, "weights/last.pt")).completed_epochs == 7
    hub_state = json.loads(hub_ctx.hub.file_bytes(repo, "trainbox.json"))
    assert hub_state["exit"]["reason"] == stoprule.REASON and hub_state["exit"]["final"] is True
    card = hub_ctx.hub.file_bytes(repo, "README.md").decode()
    assert "**State: done, stopped early by the dollar rule** after 7/10 epochs: STOP_FLAT_SPEND:" in card
    assert "Stopped early by the dollar rule: STOP_FLAT_SPEND:" in card  # the receipt on the card

    # The container starts again on the same volume: the rule already stopped this run, nothing is trained.
    again = run(tmp_path, hub_ctx, repo, STOP_FLAT_SPEND="3")
    assert again.returncode == 0, again.stderr[-3000:]
    final = state(tmp_path)
    assert final["exit"]["reason"] == stoprule.REASON and final["progress"]["epochs_done"] == 7
    assert inspect(run_dir / "weights" / "last.pt").completed_epochs == 7
    assert "pid" not in final.get("training", {})  # no training child this time


@pytest.mark.transfer("xet")
def test_without_the_rule_or_with_a_wide_window_every_epoch_is_trained(tmp_path: Path, hub_ctx: HubContext) -> None:
    result = run(tmp_path / "a", hub_ctx, hub_ctx.repo_id("wide"), STOP_FLAT_SPEND="6")
    assert result.returncode == 0, result.stderr[-3000:]
    final = state(tmp_path / "a")
    assert final["exit"]["reason"] == "success" and final["progress"]["epochs_done"] == 10
    assert final["stop_rule"]["stopped"] is False and "receipt" in final and "stopped" not in final["receipt"]

    result = run(tmp_path / "b", hub_ctx, hub_ctx.repo_id("off"))
    assert result.returncode == 0, result.stderr[-3000:]
    final = state(tmp_path / "b")
    assert final["exit"]["reason"] == "success" and "stop_rule" not in final


def test_without_a_price_it_is_refused_before_anything_is_spent(tmp_path: Path, hub_ctx: HubContext) -> None:
    result = run(tmp_path, hub_ctx, hub_ctx.repo_id("unpriced"), STOP_FLAT_SPEND="3", PRICE_PER_HOUR="")
    assert result.returncode == 10, result.stderr[-3000:]
    assert "STOP_FLAT_SPEND=3 needs the instance's price" in result.stderr and "PRICE_PER_HOUR" in result.stderr
    assert not (tmp_path / "work" / "runs").exists()
