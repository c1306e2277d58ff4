"""``trainbox sync`` on a run folder an earlier attempt left behind: it waits for the restarted
trainer's own end, and never sends the older volume over a newer Hub. Real processes, the local Hub,
a run folder written the way libreyolo writes it (stand-in checkpoints)."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pytest

from entrypoint.sync.checkpoint import inspect
from tests.fakes import libreyolo as fake_libreyolo
from tests.hubfixtures import HubContext
from tests.support import run_trainbox, start_trainbox, trainbox_env

pytestmark = pytest.mark.slow  # real `trainbox sync` processes, one waiting seconds on purpose


def write_epoch(run_dir: Path, epoch: int, *, state: str = "running", pid: int | None = None) -> None:
    """The epoch's checkpoints, then status.json renamed last, as libreyolo does."""
    weights = run_dir / "weights"
    weights.mkdir(parents=True, exist_ok=True)
    data = fake_libreyolo._checkpoint(epoch, 10)
    (weights / f"epoch_{epoch}.pt").write_bytes(data)
    (weights / "last.pt").write_bytes(data)
    status = {"state": state, "completed_epochs": epoch, "total_epochs": 10, "pid": pid}
    (run_dir / ".status.tmp").write_text(json.dumps(status))
    (run_dir / ".status.tmp").replace(run_dir / "status.json")


def env_for(hub_ctx: HubContext, tmp_path: Path, repo: str) -> dict[str, str]:
    return trainbox_env(tmp_path / "work", HF_TOKEN=hub_ctx.token, OUTPUT_REPO=repo)


def test_an_end_left_by_an_earlier_attempt_does_not_end_the_sync(hub_ctx: HubContext, tmp_path: Path) -> None:
    run_dir = tmp_path / "runs" / "again"
    write_epoch(run_dir, 2, state="failed")  # the earlier attempt's word; its trainer is being restarted
    repo = hub_ctx.repo_id("restarted")
    process = start_trainbox("sync", str(run_dir), env=env_for(hub_ctx, tmp_path, repo))
    try:
        time.sleep(8)
        assert process.poll() is None, f"the sync gave up on the restarted run\n{process.communicate()[0][-2000:]}"
        write_epoch(run_dir, 3)  # the restarted trainer's epochs are mirrored...
        write_epoch(run_dir, 4, state="completed")  # ...until its own end
        output, _ = process.communicate(timeout=120)
    finally:
        if process.poll() is None:
            os.kill(process.pid, signal.SIGKILL)
            process.communicate()
    assert process.returncode == 0, output[-2000:]
    assert inspect(hub_ctx.hub.blob_path(repo, "weights/last.pt")).completed_epochs == 4


def test_an_older_volume_never_overwrites_a_newer_hub(hub_ctx: HubContext, tmp_path: Path) -> None:
    repo = hub_ctx.repo_id("newer")
    newer = tmp_path / "newer"
    write_epoch(newer, 5, state="completed")
    env = env_for(hub_ctx, tmp_path, repo)
    assert run_trainbox("sync", str(newer), "--once", env=env, timeout=120).returncode == 0
    older = tmp_path / "older"  # the same run on a volume that stopped at epoch 3
    write_epoch(older, 3, state="completed")

    result = run_trainbox("sync", str(older), "--once", env=env, timeout=120)

    assert result.returncode == 0, result.output[-2000:]
    assert inspect(hub_ctx.hub.blob_path(repo, "weights/last.pt")).completed_epochs == 5
    assert "stay off the Hub" in result.output
    assert "weights/epoch_3.pt" in hub_ctx.hub.files(repo)  # what the Hub lacks still goes up
