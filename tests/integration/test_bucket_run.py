"""A real run with its working state in a Storage Bucket: kill -9 at a random epoch, then a new volume
resumes from the bucket at that epoch and finishes; the bucket holds one last.pt, the repo a few commits.

``BUCKET_RUN_EPOCHS`` (default 30) sets the run's length, for machines where an epoch takes a minute."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import random
import signal
from pathlib import Path

import pytest

from entrypoint.sync.checkpoint import inspect
from tests.hubfixtures import HubContext
from tests.integration.test_resume import ARGS, kill_hard, metric_epochs, state, wait_for
from tests.support import make_dataset, run_trainbox, start_trainbox, trainbox_env

pytestmark = pytest.mark.slow  # trains real models

EPOCHS = int(os.environ.get("BUCKET_RUN_EPOCHS", "30"))


@pytest.fixture
def dataset(tmp_path: Path) -> Path:
    return make_dataset(tmp_path / "cones", train=8, val=4).parent


def _manifest(hub_ctx: HubContext, bucket_id: str) -> dict | None:
    if bucket_id not in hub_ctx.hub._buckets:
        return None
    found = [path for path in hub_ctx.hub.bucket_files(bucket_id) if path.endswith("/manifest.json")]
    return json.loads(hub_ctx.hub.bucket_bytes(bucket_id, found[0])) if found else None


@pytest.mark.transfer("xet")
def test_kill_9_then_a_new_volume_resumes_from_the_bucket(hub_ctx: HubContext, tmp_path: Path, dataset: Path) -> None:
    hub = hub_ctx.hub
    repo = hub_ctx.repo_id("bucket-run")
    bucket_id = f"{repo}-checkpoints"  # derived from OUTPUT_REPO
    base = dict(HF_TOKEN=hub_ctx.token, DATASET_REPO=str(dataset), OUTPUT_REPO=repo, GPUS="cpu",
                CHECKPOINT_BUCKET="", RUN_ARGS=f"{ARGS} epochs={EPOCHS}")  # fmt: skip
    kill_at = random.randint(1, EPOCHS - 1)
    first = tmp_path / "machine1"
    process = start_trainbox("run", env=trainbox_env(first, **base))

    def bucket_epoch() -> int:  # what resume takes: the epoch of the bucket's last.pt, as its manifest says
        manifest = _manifest(hub_ctx, bucket_id)
        entry = manifest["files"].get("weights/last.pt") if manifest else None
        return int(entry["epoch"]) if entry else 0

    wait_for(lambda: bucket_epoch() >= kill_at or process.poll() is not None, timeout=120.0 * EPOCHS)
    kill_hard(process)
    with contextlib.suppress(OSError, KeyError, TypeError):  # its libreyolo child too: the machine is gone
        os.killpg(state(first)["training"]["pid"], signal.SIGKILL)
    at_kill = bucket_epoch()
    assert at_kill >= kill_at
    commits_before = len(hub.commits(repo))

    second = tmp_path / "machine2"  # a new volume
    result = run_trainbox("run", env=trainbox_env(second, **base), timeout=max(600.0, 60.0 * EPOCHS))
    assert result.returncode == 0, result.output[-3000:]
    final = state(second)
    assert final["resume"] == {"from": "bucket", "epochs_done": at_kill}
    assert final["progress"] == {"epochs_done": EPOCHS, "epochs_total": EPOCHS}
    assert final["storage"]["mode"] == "bucket" and final["storage"]["bucket"] == bucket_id
    run_dir = next((second / "runs").iterdir())
    assert metric_epochs((run_dir / "metrics.jsonl").read_text()) == list(range(1, EPOCHS + 1))

    # The bucket: one last.pt, the volume's; the manifest describes it.
    lasts = [path for path in hub.bucket_files(bucket_id) if path.endswith("weights/last.pt")]
    assert len(lasts) == 1
    assert hub.bucket_bytes(bucket_id, lasts[0]) == (run_dir / "weights" / "last.pt").read_bytes()
    manifest = _manifest(hub_ctx, bucket_id)
    assert manifest is not None and manifest["files"]["weights/last.pt"]["epoch"] == EPOCHS

    # The repo: milestones, a few commits per attempt, and the final last.pt and best.pt.
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    improvements = sum(1 for row in rows if row.get("is_best") and row["epoch"] > at_kill)
    assert len(hub.commits(repo)) - commits_before <= improvements + 4
    assert inspect(hub.blob_path(repo, "weights/last.pt")).completed_epochs == EPOCHS
    assert "weights/best.pt" in hub.files(repo)
    assert not [path for path in hub.files(repo) if "epoch_" in path]


@pytest.mark.transfer("xet")
def test_sigterm_puts_the_last_epoch_in_the_bucket_then_publishes(
    hub_ctx: HubContext, tmp_path: Path, dataset: Path
) -> None:
    import time

    hub = hub_ctx.hub
    repo = hub_ctx.repo_id("bucket-term")
    bucket_id = f"{repo}-checkpoints"
    env = trainbox_env(tmp_path / "m1", HF_TOKEN=hub_ctx.token, DATASET_REPO=str(dataset), OUTPUT_REPO=repo,
                       GPUS="cpu", CHECKPOINT_BUCKET="", RUN_ARGS=f"{ARGS} epochs=30")  # fmt: skip
    process = start_trainbox("run", env=env)

    def bucket_epoch() -> int:
        manifest = _manifest(hub_ctx, bucket_id)
        return int(manifest["epoch"]) if manifest else 0

    wait_for(lambda: bucket_epoch() >= 1 or process.poll() is not None, timeout=600.0)
    sent = time.monotonic()
    process.send_signal(signal.SIGTERM)
    process.communicate(timeout=60)
    took = time.monotonic() - sent
    assert process.returncode == 143 and took <= 6.0, took  # 5 s, and the interpreter's exit
    final = state(tmp_path / "m1")
    run_dir = next((tmp_path / "m1" / "runs").iterdir())
    done = metric_epochs((run_dir / "metrics.jsonl").read_text())[-1]
    # The last completed epoch is in the bucket, consistent with its manifest.
    manifest = _manifest(hub_ctx, bucket_id)
    assert manifest is not None and manifest["epoch"] == done
    (last,) = [p for p in hub.bucket_files(bucket_id) if p.endswith("weights/last.pt")]
    copy = tmp_path / "bucket-last.pt"
    copy.write_bytes(hub.bucket_bytes(bucket_id, last))
    assert hashlib.sha256(copy.read_bytes()).hexdigest() == manifest["files"]["weights/last.pt"]["sha256"]
    assert inspect(copy).completed_epochs == done
    # The repo's final publish followed as time allowed, and trainbox.json says how it went.
    assert final["phase"] == "preempted" and "done" in final["sync"]["final_publish"]
