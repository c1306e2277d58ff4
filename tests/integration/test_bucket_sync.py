"""The working state in a Storage Bucket (entrypoint/sync/bucket.py, bucket_store.py, uploader.py, read.py)
against the test Hub's bucket routes and the real client: a boundary's objects and manifest go to new keys,
what the newest whole manifest no longer names is deleted only after it landed, a torn or refused boundary
leaves the previous one loadable, another run id is never read, a newer attempt fences an older one, and a
failing bucket falls back to repo commits. Synthetic run folders (stand-in checkpoints): no training here."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from entrypoint.errors import TakenOverError
from entrypoint.hub import Hub
from entrypoint.sync import checkpoint, read
from entrypoint.sync.bucket import Bucket, BucketUnavailable, RunFolder, new_attempt
from entrypoint.sync.bucket_store import BucketStore
from entrypoint.sync.places import FALLBACK_AFTER
from entrypoint.sync.staging import sha256_of
from entrypoint.sync.uploader import Uploader
from tests.fakes import libreyolo as fake_libreyolo
from tests.hubfixtures import HubContext

WAIT = 60.0


def boundary(run_dir: Path, completed: int, *, total: int = 30) -> None:
    """What libreyolo leaves at the end of an epoch: weights, then the metrics row, then status.json."""
    weights = run_dir / "weights"
    weights.mkdir(parents=True, exist_ok=True)
    data = fake_libreyolo._checkpoint(completed, total)
    (weights / "last.pt").write_bytes(data)
    if completed in (1, 2):
        (weights / "best.pt").write_bytes(data)
    (weights / f"epoch_{completed}.pt").write_bytes(data)
    with (run_dir / "metrics.jsonl").open("a") as rows:
        rows.write(json.dumps({"epoch": completed, "loss": 1.0 / completed}) + "\n")
    (run_dir / "trainbox.json").write_text(json.dumps({"run_name": "run-a", "progress": {"epochs_done": completed}}))
    tmp = run_dir / ".status.json.tmp"
    tmp.write_text(json.dumps({"completed_epochs": completed, "total_epochs": total, "state": "running"}))
    tmp.replace(run_dir / "status.json")


def folder_of(hub_ctx: HubContext, run_id: str = "1234abcd5678ef90", bucket_id: str | None = None) -> RunFolder:
    bucket = Bucket(Hub(token=hub_ctx.token, endpoint=hub_ctx.url), bucket_id or f"{hub_ctx.user}/ckpt")
    bucket.open(write=True)
    return RunFolder(bucket, "run-a", run_id)


def uploader(hub_ctx: HubContext, folder: RunFolder, run_dir: Path, work: Path, **extra: Any) -> Uploader:
    repo = hub_ctx.repo_id("milestones")
    hub = Hub(token=hub_ctx.token, endpoint=hub_ctx.url)
    hub.ensure_writable_repo(repo)
    store = BucketStore.begin(folder)
    return Uploader(hub, repo, run_dir, work, poll_interval=0.05, bucket=store, publish_every=3600, **extra)


def keys(hub_ctx: HubContext, folder: RunFolder) -> set[str]:
    return {key for key in hub_ctx.hub.bucket_files(folder.bucket.bucket_id) if key.startswith(folder.prefix + "/")}


def resumed(folder: RunFolder, tmp_path: Path, name: str) -> read.Copy | None:
    run_dir, work = tmp_path / name / "run", tmp_path / name / "work"
    work.mkdir(parents=True)
    return read.find_newest(run_dir, work, folder=folder)


@pytest.mark.protocol  # the protocol lane (no retry pauses)
def test_boundaries_go_to_new_keys_and_the_superseded_ones_go_once_the_new_manifest_landed(
    hub_ctx: HubContext, tmp_path: Path
) -> None:
    folder = folder_of(hub_ctx)
    run_dir = tmp_path / "run"
    told: list[str] = []  # "on the Hub N s ago": durable working state only, never a milestone commit
    up = uploader(hub_ctx, folder, run_dir, tmp_path / "work", on_commit=lambda sha, _names: told.append(sha))
    up.start()
    seen: list[set[str]] = []
    try:
        for epoch in (1, 2, 3, 4):
            boundary(run_dir, epoch)
            assert up.flush(WAIT, final=False), up.last_error
            seen.append(keys(hub_ctx, folder))
    finally:
        up.stop()
    (newest,) = folder.whole_manifests()
    assert newest.epoch == 4 and newest.run_id == folder.run_id
    for relative in ("weights/last.pt", "weights/epoch_4.pt", "metrics.jsonl", "trainbox.json", "status.json"):
        entry = newest.files[relative]
        assert entry["sha256"] == sha256_of(run_dir / relative) and entry["size"] == (run_dir / relative).stat().st_size
        assert hub_ctx.hub.bucket_bytes(folder.bucket.bucket_id, entry["key"]) == (run_dir / relative).read_bytes()
    assert newest.files["weights/epoch_2.pt"]["epoch"] == 2 and newest.files["weights/last.pt"]["epoch"] == 4
    # Never one key rewritten: each boundary's last.pt has a key of its own.
    lasts = [k for k in set().union(*seen) if k.endswith("/weights/last.pt")]
    assert len(lasts) == 4
    # After each landing the bucket holds that boundary alone: one manifest, the objects it names.
    for epoch, present in enumerate(seen, start=1):
        manifests = [k for k in present if "/manifests/" in k]
        assert len(manifests) == 1, (epoch, manifests)
        assert len([k for k in present if k.endswith("/weights/last.pt")]) == 1
    assert keys(hub_ctx, folder) == newest.keys() | {newest.key}
    assert len(told) >= 4 and all("/manifests/" in sha for sha in told), told
    assert len(hub_ctx.hub.commits(up.repo_id)) >= 2  # the repo got a milestone, which told nobody

    # A new volume resumes from the bucket, with the run's history and best weights.
    found = resumed(folder, tmp_path, "fresh")
    assert found is not None and found.source == "bucket" and found.epochs == 4
    fresh = tmp_path / "fresh" / "run"
    assert len((fresh / "metrics.jsonl").read_text().splitlines()) == 4
    assert (fresh / "weights" / "best.pt").read_bytes() == (run_dir / "weights" / "best.pt").read_bytes()
    assert read.bucket_state(folder, tmp_path)["progress"] == {"epochs_done": 4}


@pytest.mark.slow  # real retry pauses
@pytest.mark.parametrize("refused", [r"/manifests/", r"/weights/last\.pt$"], ids=["manifest", "an-object"])
def test_a_boundary_the_bucket_refuses_in_part_leaves_the_last_whole_one_loadable(
    hub_ctx: HubContext, tmp_path: Path, refused: str
) -> None:
    folder = folder_of(hub_ctx)
    run_dir = tmp_path / "run"
    up = uploader(hub_ctx, folder, run_dir, tmp_path / "work")
    up.start()
    try:
        for epoch in (1, 2):
            boundary(run_dir, epoch)
            assert up.flush(WAIT, final=False), up.last_error
        hub_ctx.hub.refuse_bucket_paths(refused)  # the batch of epoch 3 lands in part only, again and again
        boundary(run_dir, 3)
        up.flush(3, final=False)  # the bucket refuses it: after a few tries the repo takes it (fallback)
        found = resumed(folder, tmp_path, "during")
        assert found is not None and found.epochs == 2, "the torn boundary 3 was read, or 2 was lost"
        hub_ctx.hub.refuse_bucket_paths(None)
        end = time.monotonic() + WAIT
        while not (up.flush(WAIT, final=False) and up.fallback is None) and time.monotonic() < end:
            time.sleep(0.1)
        assert up.fallback is None, up.last_error
    finally:
        hub_ctx.hub.refuse_bucket_paths(None)
        up.stop()
    found = resumed(folder, tmp_path, "after")
    assert found is not None and found.epochs == 3
    (newest,) = folder.whole_manifests()
    assert keys(hub_ctx, folder) == newest.keys() | {newest.key}, "the torn boundary's leftovers were not tidied"


@pytest.mark.protocol  # the protocol lane (no retry pauses)
def test_a_manifest_naming_a_missing_file_is_not_whole_and_the_one_before_is_used(
    hub_ctx: HubContext, tmp_path: Path
) -> None:
    folder = folder_of(hub_ctx)
    store = BucketStore.begin(folder)
    run_dir = tmp_path / "run"
    for epoch in (1, 2):
        boundary(run_dir, epoch)
        staged = _staged(run_dir, tmp_path / f"staged{epoch}")
        store.commit(staged, "boundary", deadline=None, commit_id=f"c{epoch}")  # no tidy: both stay
    newest = folder.whole_manifests()[0]
    hub_ctx.api().batch_bucket_files(folder.bucket.bucket_id, delete=[newest.files["weights/last.pt"]["key"]])
    found = resumed(folder, tmp_path, "fresh")
    assert found is not None and found.epochs == 1
    assert checkpoint.inspect(found.path).completed_epochs == 1


@pytest.mark.slow  # real retry pauses
def test_500s_resets_and_lost_answers_lose_nothing_and_land_nothing_twice(hub_ctx: HubContext, tmp_path: Path) -> None:
    folder = folder_of(hub_ctx)
    run_dir = tmp_path / "run"
    up = uploader(hub_ctx, folder, run_dir, tmp_path / "work")
    hub = hub_ctx.hub
    batch = r"^/api/buckets/.*/batch$"
    up.start()
    try:
        with (
            hub.inject("500", path=batch, skip=1, times=2) as errors,
            hub.inject("reset", path=batch, skip=2, times=1) as resets,
            hub.inject("apply-then-reset", path=batch, skip=2, times=2) as lost,
        ):
            for epoch in (1, 2, 3, 4):
                boundary(run_dir, epoch)
                time.sleep(0.2)
            assert up.flush(WAIT, final=False), up.last_error
        assert errors.fired and resets.fired and lost.fired
    finally:
        up.stop()
    assert up.fallback is None
    (newest,) = folder.whole_manifests()
    for relative in ("weights/last.pt", "weights/epoch_4.pt", "metrics.jsonl"):
        assert newest.files[relative]["sha256"] == sha256_of(run_dir / relative)
    found = resumed(folder, tmp_path, "fresh")
    assert found is not None and found.epochs == 4


@pytest.mark.protocol  # the protocol lane (no retry pauses)
def test_another_run_id_under_the_same_run_name_is_never_read_nor_deleted(
    hub_ctx: HubContext, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    old = folder_of(hub_ctx, run_id="0000aaaa0000aaaa")
    run_dir = tmp_path / "old-run"
    up = uploader(hub_ctx, old, run_dir, tmp_path / "old-work")
    up.start()
    try:
        for epoch in (1, 2, 3):
            boundary(run_dir, epoch)
        assert up.flush(WAIT, final=False), up.last_error
    finally:
        up.stop()
    before = keys(hub_ctx, old)

    new = RunFolder(old.bucket, old.run_name, "1111bbbb1111bbbb")  # the repo made again: a new run id
    with caplog.at_level("WARNING", logger="trainbox"):
        assert resumed(new, tmp_path, "fresh") is None
    said = [r.getMessage() for r in caplog.records if "another run's state" in r.getMessage()]
    assert len(said) == 1 and "0000aaaa0000aaaa" in said[0] and "not resumed" in said[0]
    run_dir = tmp_path / "new-run"
    up = uploader(hub_ctx, new, run_dir, tmp_path / "new-work")
    up.start()
    try:
        boundary(run_dir, 1)
        assert up.flush(WAIT, final=False), up.last_error
    finally:
        up.stop()
    assert keys(hub_ctx, old) == before, "another run's files were touched"
    assert resumed(new, tmp_path, "again").epochs == 1  # type: ignore[union-attr]


@pytest.mark.protocol  # the protocol lane (no retry pauses)
def test_a_newer_attempt_fences_the_older_writer(hub_ctx: HubContext, tmp_path: Path) -> None:
    folder = folder_of(hub_ctx)
    told: list[TakenOverError] = []
    first_dir, second_dir = tmp_path / "first", tmp_path / "second"
    first = uploader(hub_ctx, folder, first_dir, tmp_path / "w1", on_taken_over=told.append)
    first.start()
    second: Uploader | None = None
    try:
        boundary(first_dir, 1)
        assert first.flush(WAIT, final=False)
        second = uploader(hub_ctx, folder, second_dir, tmp_path / "w2")  # a second container on the same run
        second.start()
        boundary(second_dir, 1)
        assert second.flush(WAIT, final=False)
        boundary(first_dir, 2)  # the older one's next boundary lands, then it finds the newer manifest
        assert not first.flush(WAIT, final=False)
        assert len(told) == 1 and "another agent" in str(told[0]) and first.taken_over is told[0]
        boundary(first_dir, 3)  # nothing more from it
        assert not first.flush(2, final=False)
        for epoch in (2, 3):
            boundary(second_dir, epoch)
            assert second.flush(WAIT, final=False)
    finally:
        first.stop()
        if second is not None:
            second.stop()
    assert second is not None and second.taken_over is None
    (newest,) = folder.whole_manifests()
    assert newest.attempt == second.bucket.store.attempt and newest.epoch == 3  # type: ignore[union-attr]
    attempts = {folder.attempt_of(key) for key in keys(hub_ctx, folder)}
    assert attempts == {newest.attempt}, "the older attempt's files were not tidied away"


@pytest.mark.slow  # real retry pauses
def test_a_failing_bucket_falls_back_to_repo_commits_and_comes_back(hub_ctx: HubContext, tmp_path: Path) -> None:
    folder = folder_of(hub_ctx)
    run_dir = tmp_path / "run"
    changes: list[dict[str, Any]] = []
    up = uploader(hub_ctx, folder, run_dir, tmp_path / "work", on_storage=changes.append)
    hub = hub_ctx.hub
    up.start()
    try:
        boundary(run_dir, 1)
        assert up.flush(WAIT, final=False)
        assert "weights/last.pt" not in hub.files(up.repo_id)  # milestones only while the bucket answers
        with hub.inject("503", path=r"^/api/buckets/.*/batch$") as down:
            boundary(run_dir, 2)
            end = time.monotonic() + WAIT
            while up.fallback is None and time.monotonic() < end:
                time.sleep(0.1)
            assert up.fallback is not None and up.bucket is not None and up.bucket.failures >= FALLBACK_AFTER
            assert up.flush(WAIT, final=False), up.last_error  # the repo holds the working state now
            repo_last = checkpoint.inspect(hub.blob_path(up.repo_id, "weights/last.pt")).completed_epochs
            assert repo_last == 2
            boundary(run_dir, 3)
            assert up.flush(WAIT, final=False)
            assert checkpoint.inspect(hub.blob_path(up.repo_id, "weights/last.pt")).completed_epochs == 3
            assert down.fired >= FALLBACK_AFTER
        assert changes[0]["mode"] == "repo" and changes[0]["fallback"] is True and "503" in changes[0]["why"]
        up.bucket.retry_at = 0.0  # type: ignore[union-attr]
        boundary(run_dir, 4)
        end = time.monotonic() + WAIT
        while up.fallback is not None and time.monotonic() < end:
            time.sleep(0.1)
        assert up.fallback is None and changes[-1] == {"mode": "bucket", "fallback": False, "why": None}
        assert up.flush(WAIT, final=False)
    finally:
        up.stop()
    found = resumed(folder, tmp_path, "fresh")
    assert found is not None and found.epochs == 4


@pytest.mark.protocol  # the protocol lane (no retry pauses)
def test_unavailable_buckets_are_said_in_one_line(hub_ctx: HubContext) -> None:
    hub = Hub(token=hub_ctx.token, endpoint=hub_ctx.url)
    hub_ctx.hub.set_buckets(False)
    try:
        with pytest.raises(BucketUnavailable) as raised:
            Bucket(hub, hub_ctx.repo_id("ckpt")).open(write=True)
        assert "no Storage Buckets" in raised.value.line() and "CHECKPOINT_BUCKET=off" in raised.value.line()
    finally:
        hub_ctx.hub.set_buckets(True)
    hub_ctx.hub.deny_buckets(hub_ctx.token)
    with pytest.raises(BucketUnavailable, match="may write the model repo but not the bucket"):
        Bucket(hub, hub_ctx.repo_id("ckpt")).open(write=True)
    # An existing bucket the token may read but not write is refused for writing, not for reading.
    hub_ctx.hub.create_bucket(f"{hub_ctx.user}/existing")
    with pytest.raises(BucketUnavailable, match="HTTP 403"):
        Bucket(hub, f"{hub_ctx.user}/existing").open(write=True)
    Bucket(hub, f"{hub_ctx.user}/existing").open(write=False)


@pytest.mark.protocol  # the protocol lane (no retry pauses)
def test_a_newer_attempt_is_later_even_on_a_clock_behind() -> None:
    ahead = f"{int(time.time() * 1000) + 3_600_000:013d}-abcdef"  # the last writer's clock was an hour ahead
    assert new_attempt(after=ahead) > ahead
    assert new_attempt() < ahead


def _staged(run_dir: Path, staging: Path) -> list[Any]:
    """The run folder staged as the snapshotter would (private copies, hashed, checked)."""
    import threading

    from entrypoint.sync.snapshot import Snapshotter

    out: list[Any] = []
    snapshots = Snapshotter(run_dir, staging, changed=threading.Condition(), deliver=out.extend, poll_interval=1.0)
    snapshots.prepare()
    snapshots.snapshot()
    return out


@pytest.mark.protocol  # the protocol lane (no retry pauses)
def test_huggingface_hubs_own_retries_never_nest_inside_ours(hub_ctx: HubContext) -> None:
    from huggingface_hub.errors import HfHubHTTPError

    folder = folder_of(hub_ctx)
    with hub_ctx.hub.inject("503", path=r"^/api/buckets/.*/batch$") as refused:
        began = time.monotonic()
        with pytest.raises(HfHubHTTPError):
            folder.bucket.batch([(b"x", f"{folder.prefix}/x")])
        took = time.monotonic() - began
    assert refused.fired == 2, "each of our two attempts is one request: the client's backoff ran inside ours"
    assert took < 5.0, took
    # Outside our retries (another module, a test) the client keeps its own.
    with hub_ctx.hub.inject("503", path=r"^/api/buckets/.*/batch$", times=1) as once:
        hub_ctx.api().batch_bucket_files(folder.bucket.bucket_id, add=[(b"y", f"{folder.prefix}/y")])
    assert once.fired == 1


_FAILING_CAS = """
import os, sys, tempfile, time
os.environ["WORKDIR"] = tempfile.mkdtemp()
from entrypoint import settings
settings.load(os.environ)  # as the agent starts: hf_xet's retries bounded before its first use
from entrypoint.hub import Hub
from entrypoint.sync.bucket import Bucket
bucket = Bucket(Hub(token=sys.argv[1]), sys.argv[2])
began = time.monotonic()
try:
    bucket.batch([(b"weights" * 1000, "run/x.pt")])
except Exception as error:
    print("failed", type(error).__name__, round(time.monotonic() - began, 1))
"""


@pytest.mark.slow  # a Python child, so that hf_xet reads its retry setting afresh
def test_a_failing_cas_fails_a_bucket_write_in_seconds_not_minutes(hub_ctx: HubContext) -> None:
    import subprocess
    import sys

    bucket = folder_of(hub_ctx).bucket.bucket_id
    with hub_ctx.hub.inject("500", path=r"^/cas/"):  # hf_xet alone would retry for about four minutes
        child = subprocess.run(
            [sys.executable, "-c", _FAILING_CAS, hub_ctx.token, bucket],
            env=hub_ctx.env(),
            capture_output=True,
            text=True,
            timeout=120,
        )
    verdict = child.stdout.split()
    assert verdict[:1] == ["failed"], child.stdout + child.stderr[-2000:]
    assert float(verdict[-1]) < 15.0, child.stdout


@pytest.mark.protocol  # the protocol lane (no retry pauses)
def test_several_machines_resume_from_the_bucket_at_the_same_boundary(hub_ctx: HubContext, tmp_path: Path) -> None:
    """Node 0 writes the bucket; every node resumes from the stores alone (volume=False): the same epoch."""
    folder = folder_of(hub_ctx)
    run_dir = tmp_path / "node0"
    up = uploader(hub_ctx, folder, run_dir, tmp_path / "work0")
    up.start()
    try:
        for epoch in (1, 2, 3):
            boundary(run_dir, epoch)
        assert up.flush(WAIT, final=False), up.last_error
    finally:
        up.stop()
    hub = Hub(token=hub_ctx.token, endpoint=hub_ctx.url)
    revision = hub.head(up.repo_id)  # node 0's commit of the repo: milestones, no last.pt
    found = []
    for node in (1, 2):
        work = tmp_path / f"work{node}"
        work.mkdir()
        copy = read.find_newest(
            tmp_path / f"node{node}", work, volume=False, folder=folder, hub=hub, repo_id=up.repo_id, revision=revision
        )
        assert copy is not None and copy.source == "bucket"
        found.append((copy.epochs, sha256_of(copy.path)))
    assert found[0] == found[1] == (3, sha256_of(run_dir / "weights" / "last.pt"))


BUCKET_CALLS = {
    "batch": ("POST", r"^/api/buckets/.*/batch$"),  # the boundary's batch, the clean-up's deletes
    "listing": ("GET", r"^/api/buckets/.*/tree"),  # the fence check and the clean-up
    "paths-info": ("POST", r"^/api/buckets/.*/paths-info$"),  # a lost answer's check
    "token": ("GET", r"^/api/buckets/.*/xet-write-token$"),  # the Xet upload session
}


@pytest.mark.slow  # real retry pauses
@pytest.mark.parametrize("call", list(BUCKET_CALLS))
def test_a_5xx_on_any_bucket_call_loses_nothing_and_leaves_one_whole_boundary(
    hub_ctx: HubContext, tmp_path: Path, call: str
) -> None:
    folder = folder_of(hub_ctx)
    run_dir = tmp_path / "run"
    up = uploader(hub_ctx, folder, run_dir, tmp_path / "work")
    method, path = BUCKET_CALLS[call]
    up.start()
    try:
        boundary(run_dir, 1)
        assert up.flush(WAIT, final=False)
        # The next landing's answer lost too, so that its check (paths-info) runs under the fault.
        lost = hub_ctx.hub.inject("apply-then-reset", method="POST", path=r"/batch$", times=2)  # both tries
        with hub_ctx.hub.inject("503", method=method, path=path, times=2) as fault:
            for epoch in (2, 3):
                boundary(run_dir, epoch)
                up.flush(10, final=False)
        lost.remove()
        assert fault.fired, f"no {call} call met the fault"
        assert up.flush(WAIT, final=False), up.last_error
        boundary(run_dir, 4)  # one more boundary: its clean-up takes whatever an earlier one left
        assert up.flush(WAIT, final=False), up.last_error
    finally:
        up.stop()
    (newest,) = folder.whole_manifests()
    assert newest.epoch == 4 and keys(hub_ctx, folder) == newest.keys() | {newest.key}
    found = resumed(folder, tmp_path, "fresh")
    assert found is not None and found.epochs == 4


@pytest.mark.slow  # real retry pauses
@pytest.mark.parametrize("call", ["listing", "paths-info", "download"])
def test_a_bucket_that_cannot_be_read_at_resume_is_said_and_the_other_stores_serve(
    hub_ctx: HubContext, tmp_path: Path, call: str, caplog: pytest.LogCaptureFixture
) -> None:
    folder = folder_of(hub_ctx)
    store = BucketStore.begin(folder)
    run_dir = tmp_path / "run"
    boundary(run_dir, 1)
    store.commit(_staged(run_dir, tmp_path / "staged"), "boundary", deadline=None, commit_id="c1")
    method, path = {
        "listing": ("GET", r"/tree"),
        "paths-info": ("POST", r"/paths-info$"),
        "download": ("HEAD", r"^/buckets/.*/resolve/"),
    }[call]
    with hub_ctx.hub.inject("500", method=method, path=path), caplog.at_level("WARNING", logger="trainbox"):
        found = resumed(folder, tmp_path, "fresh")
    assert found is None  # the volume is empty and there is no repo: nothing, and no crash
    assert f"cannot read {folder.label}" in caplog.text


@pytest.mark.protocol  # the protocol lane (no retry pauses)
def test_a_full_disk_while_staging_keeps_the_bucket_at_the_last_whole_boundary(
    hub_ctx: HubContext, tmp_path: Path
) -> None:
    folder = folder_of(hub_ctx)
    run_dir = tmp_path / "run"
    up = uploader(hub_ctx, folder, run_dir, tmp_path / "work")
    up.start()
    try:
        boundary(run_dir, 1)
        assert up.flush(WAIT, final=False)
        staging = up.snapshots.staging  # every copy refused from now on, as on a full disk
        for item in staging.iterdir():
            item.unlink(missing_ok=True)  # the uploader may be removing its sent copies at the same time
        staging.rmdir()
        staging.write_text("not a folder")
        boundary(run_dir, 2)
        assert not up.flush(3, final=False)
        assert "weights/last.pt" in up.pending and "weights/last.pt" in up.snapshots.stager.failed
        (newest,) = folder.whole_manifests()
        assert newest.epoch == 1, "a boundary staged in part was taken for a whole one"
        staging.unlink()
        staging.mkdir()
        assert up.flush(WAIT, final=False), up.last_error
    finally:
        up.stop()
    (newest,) = folder.whole_manifests()
    assert newest.epoch == 2


@pytest.mark.protocol  # the protocol lane (no retry pauses)
def test_the_clean_up_never_deletes_a_newer_attempts_objects_nor_a_file_it_does_not_know(
    hub_ctx: HubContext, tmp_path: Path
) -> None:
    folder = folder_of(hub_ctx)
    store = BucketStore.begin(folder)
    older = folder.object_key("0000000000001-aaaaaa", "ab" * 32, "weights/last.pt")  # a killed attempt's leftover
    newer = folder.object_key(new_attempt(after=store.attempt), "cd" * 32, "weights/last.pt")  # manifest on its way
    unknown = f"{folder.prefix}/notes.txt"  # put there by hand
    folder.bucket.batch([(b"old", older), (b"new", newer), (b"mine", unknown)])
    run_dir = tmp_path / "run"
    boundary(run_dir, 1)
    store.commit(_staged(run_dir, tmp_path / "staged"), "boundary", deadline=None, commit_id="c1")
    store.tidy(deadline=None)
    left = keys(hub_ctx, folder)
    assert older not in left and {newer, unknown} <= left


@pytest.mark.protocol  # the protocol lane (no retry pauses)
def test_the_end_gives_the_repo_one_commit_of_the_newest_milestones_not_an_older_one_first(
    hub_ctx: HubContext, tmp_path: Path
) -> None:
    """PUBLISH_EVERY=off: the repo holds a boundary's milestones until the end; the end's own snapshot stages
    newer ones, and the repo waits for them however slow that snapshot is: one commit, the newest state."""
    folder = folder_of(hub_ctx)
    run_dir = tmp_path / "run"
    repo = hub_ctx.repo_id("milestones")
    hub = Hub(token=hub_ctx.token, endpoint=hub_ctx.url)
    hub.ensure_writable_repo(repo)
    slow = threading.Event()
    up = Uploader(
        hub,
        repo,
        run_dir,
        tmp_path / "work",
        poll_interval=0.05,
        bucket=BucketStore.begin(folder),
        publish_every=None,
        before_snapshot=lambda: slow.is_set() and time.sleep(1.0),  # the end's snapshot is slow to stage
    )
    up.start()
    try:
        boundary(run_dir, 1)
        give_up = time.monotonic() + WAIT
        while up.kept_epochs < 1 and time.monotonic() < give_up:  # epoch 1 in the bucket
            time.sleep(0.05)
        with up.changed:
            assert "metrics.jsonl" in up.repo.pending, "off: the boundary's milestones wait for the end"
        slow.set()
        boundary(run_dir, 2)
        assert up.flush(WAIT), up.last_error
    finally:
        up.stop()
    commits = hub_ctx.hub.commits(repo)
    versions = [commit.files["metrics.jsonl"].sha256 for commit in commits if "metrics.jsonl" in commit.files]
    assert set(versions) == {sha256_of(run_dir / "metrics.jsonl")}, "the repo got an older metrics.jsonl first"
    assert len(up.repo.commits) == 1, "one commit at the end: the milestones and the final last.pt"
