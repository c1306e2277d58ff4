"""The working state in a Storage Bucket (entrypoint/sync/bucket.py, places.py) against the test Hub's bucket
routes and the real client: files first, manifest last, overwritten in place, and a resume that trusts
only what matches the manifest. Synthetic run folders: no training here."""

from __future__ import annotations

import json
import time
from pathlib import Path

import torch

from entrypoint.hub import Hub
from entrypoint.sync import bucket, checkpoint
from entrypoint.sync.bucket import BucketTarget, BucketUnavailable, Store
from entrypoint.sync.ledger import CommitBudget
from entrypoint.sync.uploader import Uploader
from tests.hubfixtures import HubContext


def _save(path: Path, completed: int, total: int = 30) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    state = {"model": {"w": torch.randn(32, 32)}, "epoch": completed - 1, "config": {"epochs": total}}
    tmp = path.with_name(f".{path.name}.tmp")
    torch.save(state, tmp)
    tmp.replace(path)


def boundary(run_dir: Path, completed: int, *, snapshot: bool = True) -> None:
    """What libreyolo leaves at the end of an epoch: weights, then the metrics row, then status.json."""
    _save(run_dir / "weights" / "last.pt", completed)
    if completed == 2:
        _save(run_dir / "weights" / "best.pt", completed)
    if snapshot:
        _save(run_dir / "weights" / f"epoch_{completed}.pt", completed)
    with (run_dir / "metrics.jsonl").open("a") as rows:
        rows.write(json.dumps({"epoch": completed, "loss": 1.0 / completed}) + "\n")
    tmp = run_dir / ".status.json.tmp"
    tmp.write_text(json.dumps({"completed_epochs": completed, "total_epochs": 30, "state": "running"}))
    tmp.replace(run_dir / "status.json")


def _store(hub_ctx: HubContext) -> Store:
    store = Store(Hub(token=hub_ctx.token, endpoint=hub_ctx.url), hub_ctx.repo_id("ckpt"), "run-a")
    store.open()
    return store


def _uploader(store: Store, run_dir: Path, work: Path) -> Uploader:
    return Uploader(
        BucketTarget(store), store.bucket_id, run_dir, work, budget=CommitBudget(per_hour=10**9, burst=10**9)
    )


def test_boundaries_overwrite_in_place_and_the_manifest_describes_them(hub_ctx: HubContext, tmp_path: Path) -> None:
    store = _store(hub_ctx)
    run_dir = tmp_path / "run"
    up = _uploader(store, run_dir, tmp_path / "work")
    up.start()
    try:
        for epoch in (1, 2, 3):
            boundary(run_dir, epoch)
            assert up.flush(60), up.last_error
    finally:
        up.stop()
    files = hub_ctx.hub.bucket_files(store.bucket_id)
    assert {"run-a/weights/last.pt", "run-a/weights/epoch_3.pt", "run-a/manifest.json"} <= set(files)
    assert (
        hub_ctx.hub.bucket_bytes(store.bucket_id, "run-a/weights/last.pt")
        == (run_dir / "weights" / "last.pt").read_bytes()
    )
    manifest = store.manifest()
    assert manifest is not None and manifest["epoch"] == 3
    entry = manifest["files"]["weights/last.pt"]
    assert entry == {
        "sha256": bucket.sha256_of(run_dir / "weights" / "last.pt"),
        "size": (run_dir / "weights" / "last.pt").stat().st_size,
        "epoch": 3,
    }
    assert manifest["files"]["weights/epoch_2.pt"]["epoch"] == 2
    # Each boundary wrote the files before the manifest.
    batches = [r for r in hub_ctx.hub.find_requests("POST", r"/api/buckets/.*/batch$") if r.status == 200]
    assert len(batches) == 6

    # A new volume resumes from the bucket, with the run's history.
    fresh = tmp_path / "fresh"
    found = bucket.newest(store, tmp_path / "scratch", 0, fresh)
    assert found is not None and found[1].completed_epochs == 3
    assert len((fresh / "metrics.jsonl").read_text().splitlines()) == 3
    assert (fresh / "weights" / "best.pt").read_bytes() == (run_dir / "weights" / "best.pt").read_bytes()


def test_killed_between_weights_and_manifest_resumes_from_the_last_consistent_state(
    hub_ctx: HubContext, tmp_path: Path
) -> None:
    store = _store(hub_ctx)
    run_dir = tmp_path / "run"
    target = BucketTarget(store)
    for epoch in (1, 2):
        boundary(run_dir, epoch)
        names = ["weights/last.pt", f"weights/epoch_{epoch}.pt", "metrics.jsonl", "status.json"]
        target.commit(store.bucket_id, [(n, run_dir / n) for n in names], "boundary")
    boundary(run_dir, 3, snapshot=False)
    store.upload([("weights/last.pt", run_dir / "weights" / "last.pt")])  # then killed: no manifest
    found = bucket.newest(store, tmp_path / "scratch", 0, tmp_path / "fresh")
    assert found is not None
    path, info = found
    assert info.completed_epochs == 2 and path.name == "epoch_2.pt"
    assert checkpoint.inspect(path).completed_epochs == 2

    # A manifest naming a file the bucket lacks: that file is skipped too.
    hub_ctx.api().batch_bucket_files(store.bucket_id, delete=["run-a/weights/epoch_2.pt"])
    found = bucket.newest(store, tmp_path / "scratch2", 0, tmp_path / "fresh2")
    assert found is not None and found[1].completed_epochs == 1
    # Nothing newer than the volume: nothing downloaded.
    assert bucket.newest(store, tmp_path / "scratch3", 5, tmp_path / "fresh3") is None


def test_bucket_500s_and_resets_lose_nothing(hub_ctx: HubContext, tmp_path: Path) -> None:
    store = _store(hub_ctx)
    run_dir = tmp_path / "run"
    up = _uploader(store, run_dir, tmp_path / "work")
    hub = hub_ctx.hub
    up.start()
    try:
        with (
            hub.inject("500", path=r"^/api/buckets/.*/batch$", skip=1, times=2) as errors,
            hub.inject("reset", path=r"^/api/buckets/.*/batch$", skip=2, times=1) as resets,
            hub.inject("apply-then-reset", path=r"^/api/buckets/.*/batch$", skip=2, times=2) as lost,
        ):
            for epoch in (1, 2, 3, 4):
                boundary(run_dir, epoch)
                time.sleep(0.2)
            assert up.flush(120), up.last_error
        assert errors.fired and resets.fired and lost.fired
    finally:
        up.stop()
    manifest = store.manifest()
    assert manifest is not None
    for rel in ("weights/last.pt", "weights/epoch_4.pt", "metrics.jsonl"):
        assert manifest["files"][rel]["sha256"] == bucket.sha256_of(run_dir / rel)
    found = bucket.newest(store, tmp_path / "scratch", 0, tmp_path / "fresh")
    assert found is not None and found[1].completed_epochs == 4


def test_unavailable_buckets_are_said_in_one_line(hub_ctx: HubContext) -> None:
    hub = Hub(token=hub_ctx.token, endpoint=hub_ctx.url)
    hub_ctx.hub.set_buckets(False)
    try:
        store = Store(hub, hub_ctx.repo_id("ckpt"), "run")
        try:
            store.open()
            raise AssertionError("a Hub without buckets was taken for one with")
        except BucketUnavailable as error:
            assert "no Storage Buckets" in error.line() and "CHECKPOINT_BUCKET=off" in error.line()
    finally:
        hub_ctx.hub.set_buckets(True)
    hub_ctx.hub.deny_buckets(hub_ctx.token)
    try:
        Store(hub, hub_ctx.repo_id("ckpt"), "run").open()
        raise AssertionError("a token without bucket rights was taken for one with")
    except BucketUnavailable as error:
        assert "may write the model repo but not the bucket" in str(error)
    # An existing bucket the token may read but not write is refused too.
    hub_ctx.hub.create_bucket(f"{hub_ctx.user}/existing")
    try:
        Store(hub, f"{hub_ctx.user}/existing", "run").open()
        raise AssertionError("a bucket the token cannot write was accepted")
    except BucketUnavailable as error:
        assert "HTTP 403" in str(error)


def test_squash_history_leaves_one_commit_with_the_same_files(hub_ctx: HubContext) -> None:
    from entrypoint.sync.places import squash_history

    repo = hub_ctx.repo_id("squash")
    hub_ctx.hub.create_repo(repo, private=True)
    for epoch in (1, 2, 3):
        hub_ctx.hub.upload_bytes(repo, "weights/last.pt", f"epoch {epoch}".encode() * 1000)
    before = hub_ctx.hub.files(repo)
    assert squash_history(Hub(token=hub_ctx.token, endpoint=hub_ctx.url), repo)
    assert len(hub_ctx.hub.commits(repo)) == 1
    assert hub_ctx.hub.files(repo) == before
    assert hub_ctx.hub.file_bytes(repo, "weights/last.pt") == b"epoch 3" * 1000
    # A token that may not write the repo: reported, not raised.
    assert not squash_history(Hub(token=hub_ctx.read_token, endpoint=hub_ctx.url), repo)


def _finished_run(hub_ctx: HubContext, tmp_path: Path, **extra: str) -> tuple[dict[str, str], Path]:
    """An agent's env whose run folder already holds every epoch: the agent trains nothing, only syncs."""
    from tests.support import TINY_RUN_ARGS, make_dataset, trainbox_env

    dataset = make_dataset(tmp_path / "cones", train=4, val=2).parent
    workdir = tmp_path / "work"
    run_dir = workdir / "runs" / "done-run"
    for epoch in (1, 2):
        boundary(run_dir, epoch)
    _save(run_dir / "weights" / "best.pt", 2)
    env = trainbox_env(workdir, HF_TOKEN=hub_ctx.token, DATASET_REPO=str(dataset), OUTPUT_REPO=hub_ctx.repo_id("done"),
                       GPUS="cpu", RUN_NAME="done-run", RUN_ARGS=f"{TINY_RUN_ARGS} epochs=2", **extra)  # fmt: skip
    return env, run_dir


def test_a_hub_without_buckets_falls_back_to_commits_said_in_one_line(hub_ctx: HubContext, tmp_path: Path) -> None:
    from tests.support import run_trainbox

    env, run_dir = _finished_run(hub_ctx, tmp_path, CHECKPOINT_BUCKET="")
    hub_ctx.hub.set_buckets(False)
    result = run_trainbox("run", env=env)
    assert result.returncode == 0, result.output[-3000:]
    said = [line for line in result.stderr.splitlines() if "Storage Buckets" in line]
    assert len(said) == 1 and "go to the model repo as commits" in said[0] and "CHECKPOINT_BUCKET=off" in said[0]
    storage = json.loads((run_dir / "trainbox.json").read_text())["storage"]
    assert storage["mode"] == "repo" and "no Storage Buckets" in storage["unavailable"]
    files = hub_ctx.hub.files(env["OUTPUT_REPO"])
    assert {"weights/last.pt", "weights/epoch_2.pt", "metrics.jsonl"} <= set(files)  # today's mirror


def test_a_finished_run_puts_its_working_state_in_the_bucket_and_milestones_in_the_repo(
    hub_ctx: HubContext, tmp_path: Path
) -> None:
    from tests.support import run_trainbox

    env, run_dir = _finished_run(hub_ctx, tmp_path, CHECKPOINT_BUCKET="")
    result = run_trainbox("run", env=env)
    assert result.returncode == 0, result.output[-3000:]
    repo, bucket_id = env["OUTPUT_REPO"], env["OUTPUT_REPO"] + "-checkpoints"
    in_bucket = hub_ctx.hub.bucket_files(bucket_id)
    assert {"done-run/weights/last.pt", "done-run/weights/epoch_2.pt", "done-run/manifest.json"} <= set(in_bucket)
    files = hub_ctx.hub.files(repo)
    assert {"weights/last.pt", "weights/best.pt", "metrics.jsonl", "trainbox.json", "README.md"} <= set(files)
    assert not [path for path in files if "epoch_" in path]  # the snapshots stay in the bucket
    assert len(hub_ctx.hub.commits(repo)) <= 4
    state = json.loads((run_dir / "trainbox.json").read_text())
    assert state["storage"] == {"mode": "bucket", "bucket": bucket_id, "prefix": "done-run"}
    assert state["sync"]["final_publish"]["done"] is True
    assert "hf://buckets/" in hub_ctx.hub.file_bytes(repo, "README.md").decode()
