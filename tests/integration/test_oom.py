"""Out of GPU memory, end to end: the real agent, the local Hub, and the stand-in libreyolo
(tests/fakes/libreyolo.py) dying as libreyolo 1.6.0 does (status.json ``OutOfMemoryError``, exit 1)
whenever its batch is above ``FAKE_OOM_ABOVE``."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from entrypoint import errors
from entrypoint.sync.checkpoint import inspect
from tests.hubfixtures import HubContext
from tests.support import run_standin_agent

pytestmark = pytest.mark.slow  # `trainbox run` with the stand-in libreyolo
AGENT_TIMEOUT = 120


def run(tmp_path: Path, hub_ctx: HubContext, repo: str, **extra: str) -> subprocess.CompletedProcess[str]:
    return run_standin_agent(tmp_path, hub_ctx.env(), tmp_path / "work", AGENT_TIMEOUT, OUTPUT_REPO=repo, **extra)


def state(tmp_path: Path) -> dict[str, Any]:
    (path,) = (tmp_path / "work" / "runs").glob("*/trainbox.json")
    return json.loads(path.read_text())


def hub_epochs(hub_ctx: HubContext, repo: str) -> list[int]:
    text = hub_ctx.hub.file_bytes(repo, "metrics.jsonl").decode()
    return [json.loads(line)["epoch"] for line in text.splitlines() if line.strip()]


@pytest.mark.transfer("xet")
@pytest.mark.parametrize("batch", ["16", "-1"])  # explicit, and AutoBatch's choice (train_config.yaml)
def test_out_of_memory_after_an_epoch_resumes_with_half_the_batch(
    tmp_path: Path, hub_ctx: HubContext, batch: str
) -> None:
    repo = hub_ctx.repo_id("oom")
    result = run(tmp_path, hub_ctx, repo, RUN_ARGS=f"epochs=4 batch={batch}", FAKE_OOM_ABOVE="8")

    assert result.returncode == 0, result.stderr[-3000:]
    assert "out of GPU memory at epoch 2 with batch=16" in result.stderr
    assert "resuming after epoch 1 with batch=8" in result.stderr
    final = state(tmp_path)
    healed, done = final["attempts"]
    assert healed["reason"] == errors.GpuMemoryError.reason and healed["exit_code"] == 65
    assert (healed["epochs_done"], healed["batch"], healed["next_batch"]) == (1, 16, 8)
    assert done["reason"] == "success" and done["batch"] == 8 and final["attempt"] == 2
    assert "batch=8" in final["training"]["argv"] and "resume=true" in final["training"]["argv"]
    # every epoch on the Hub once, the last checkpoint the last epoch
    assert hub_epochs(hub_ctx, repo) == [1, 2, 3, 4]
    names = hub_ctx.hub.files(repo)
    assert {f"weights/epoch_{n}.pt" for n in range(1, 5)} <= set(names)
    assert inspect(hub_ctx.hub.blob_path(repo, "weights/last.pt")).completed_epochs == 4
    card = hub_ctx.hub.file_bytes(repo, "README.md").decode()
    assert "Out of GPU memory at epoch 2 with batch=16: resumed after epoch 1 with batch=8." in card
    assert json.loads(hub_ctx.hub.file_bytes(repo, "trainbox.json"))["attempts"][0]["next_batch"] == 8


@pytest.mark.transfer("xet")
def test_out_of_memory_again_and_again_stops_after_oom_retries(tmp_path: Path, hub_ctx: HubContext) -> None:
    repo = hub_ctx.repo_id("oom")
    result = run(tmp_path, hub_ctx, repo, RUN_ARGS="epochs=4 batch=16", FAKE_OOM_ABOVE="2", OOM_RETRIES="2")

    assert result.returncode == errors.GpuMemoryError.exit_code, result.stderr[-3000:]
    assert "training ran out of GPU memory at epoch 2 with batch=4 after 2 smaller batches" in result.stderr
    attempts = state(tmp_path)["attempts"]
    assert [(a["batch"], a.get("next_batch")) for a in attempts] == [(16, 8), (8, 4), (4, None)]
    assert all(a["reason"] == "out_of_memory" for a in attempts)
    assert hub_epochs(hub_ctx, repo) == [1]  # epoch 1 kept, never repeated

    # The next start keeps the smallest batch and, with the batch no longer shrinking, fails the same way;
    # the crash-loop breaker counts only the attempts at that same batch.
    again = run(tmp_path, hub_ctx, repo, RUN_ARGS="epochs=4 batch=16", FAKE_OOM_ABOVE="2", OOM_RETRIES="2")
    assert again.returncode == 65 and "training with batch=4" in again.stderr
    third = run(tmp_path, hub_ctx, repo, RUN_ARGS="epochs=4 batch=16", FAKE_OOM_ABOVE="2", OOM_RETRIES="2")
    assert third.returncode == 65
    fourth = run(tmp_path, hub_ctx, repo, RUN_ARGS="epochs=4 batch=16", FAKE_OOM_ABOVE="2", OOM_RETRIES="2")
    assert fourth.returncode == errors.CrashLoopError.exit_code, fourth.stderr[-2000:]


@pytest.mark.transfer("xet")
def test_out_of_memory_in_the_first_step_names_a_smaller_batch(tmp_path: Path, hub_ctx: HubContext) -> None:
    repo = hub_ctx.repo_id("oom")
    result = run(tmp_path, hub_ctx, repo, RUN_ARGS="epochs=4 batch=16", FAKE_OOM_ABOVE="8", FAKE_OOM_EPOCH="1")

    assert result.returncode == errors.ConfigError.exit_code, result.stderr[-3000:]
    assert "RUN_ARGS batch=16 does not fit in the GPU's memory" in result.stderr
    assert "set batch=8 in RUN_ARGS" in result.stderr
    assert [a["reason"] for a in state(tmp_path)["attempts"]] == ["config"]
