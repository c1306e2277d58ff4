"""The uploader under faults that come in an unhelpful order: a disk that refuses the staged copy,
an error outside the commit, a commit whose answer is lost while the history cannot be read, a
429 with a long Retry-After, the Hub's commit limit. In-process, against the local Hub."""

from __future__ import annotations

import errno
import json
import shutil
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from entrypoint.hub import Hub
from entrypoint.sync.job import sync_error
from entrypoint.sync.ledger import Ledger
from entrypoint.sync.snapshot import Snapshotter
from entrypoint.sync.uploader import Uploader
from tests.fakes.hub import HubServer
from tests.hubfixtures import HubContext

WAIT = 60.0  # generous: how long a condition may take before the test calls it never


def wait_for(condition: Callable[[], bool], what: str, timeout: float = WAIT) -> None:
    end = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < end, f"never happened: {what}"
        time.sleep(0.05)


def boundary(run_dir: Path, epoch: int) -> None:
    """An epoch's files, then status.json renamed last, as libreyolo does."""
    (run_dir / f"epoch_{epoch}.txt").write_text(f"epoch {epoch}\n")
    (run_dir / ".status.tmp").write_text(json.dumps({"completed_epochs": epoch}))
    (run_dir / ".status.tmp").replace(run_dir / "status.json")


def assert_no_duplicate_commit(hub: HubServer, repo: str) -> None:
    """A commit sent twice (its first answer lost) lands as a second commit with the same tree."""
    commits = {commit.oid: commit for commit in hub.commits(repo)}
    for commit in commits.values():
        parent = commits.get(commit.parent) if commit.parent else None
        if parent is not None:
            same = {p: e.sha256 for p, e in commit.files.items()} == {p: e.sha256 for p, e in parent.files.items()}
            assert not same, f"commit {commit.oid[:8]} repeats its parent: a commit landed twice"
    descriptions = [commit.description for commit in commits.values() if commit.description]
    assert len(descriptions) == len(set(descriptions))


@pytest.fixture
def setup(hub_ctx: HubContext, tmp_path: Path) -> Iterator[tuple[Uploader, Path, str]]:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    repo = hub_ctx.repo_id("faults")
    hub = Hub(token=hub_ctx.token)
    hub.ensure_writable_repo(repo)
    uploader = Uploader(hub, repo, run_dir, tmp_path / "sync", poll_interval=0.05)
    uploader.start()
    yield uploader, run_dir, repo
    uploader.stop()


def test_a_file_that_cannot_be_staged_is_pending_and_failed(setup, hub_ctx: HubContext) -> None:
    uploader, run_dir, repo = setup
    # The staging volume refuses every copy (as a full disk would): a real OSError on each write.
    staging = uploader.snapshots.staging
    shutil.rmtree(staging)
    staging.write_text("not a folder")
    boundary(run_dir, 1)

    assert uploader.flush(5) is False
    assert "epoch_1.txt" in uploader.pending and "epoch_1.txt" in uploader.snapshots.stager.failed
    assert "cannot stage" in (sync_error(uploader).message)
    assert "epoch_1.txt" not in hub_ctx.hub.files(repo)

    # Room again: the next snapshot stages it and the Hub gets it.
    staging.unlink()
    staging.mkdir()
    assert uploader.flush(WAIT)
    assert uploader.pending == [] and uploader.snapshots.stager.failed == {}
    assert hub_ctx.hub.file_bytes(repo, "epoch_1.txt") == b"epoch 1\n"


def test_the_committer_survives_an_error_outside_the_commit(
    setup, hub_ctx: HubContext, monkeypatch: pytest.MonkeyPatch
) -> None:
    uploader, run_dir, repo = setup

    def disk_full(_self: object) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(Ledger, "_save", disk_full)  # every ledger write fails, commit after commit
    boundary(run_dir, 1)
    wait_for(lambda: "epoch_1.txt" in hub_ctx.hub.files(repo), "epoch 1 on the Hub")
    # No flush: the committer itself must still be at work for the next boundary.
    boundary(run_dir, 2)
    wait_for(lambda: "epoch_2.txt" in hub_ctx.hub.files(repo), "epoch 2 on the Hub without a flush")
    assert all(thread.is_alive() for thread in uploader._threads)


@pytest.mark.slow  # waits out the client's real retry backoff
def test_a_lost_answer_is_never_committed_twice_even_when_the_history_is_unreadable(setup, hub_ctx: HubContext) -> None:
    uploader, run_dir, repo = setup
    hub = hub_ctx.hub
    # The commit is applied but its answer never arrives, and the history that would tell is
    # unreadable for a while: resending blindly would land the same commit twice.
    lost = hub.inject("apply-then-reset", method="POST", path=r"/commit/", times=1)
    blind = hub.inject("500", method="GET", path=r"/commits/", times=8)  # more than the client retries
    boundary(run_dir, 1)

    assert uploader.flush(WAIT)
    assert lost.fired == 1 and blind.fired >= 1
    hub.clear_faults()
    assert hub.file_bytes(repo, "epoch_1.txt") == b"epoch 1\n"
    assert_no_duplicate_commit(hub, repo)


def test_a_429_holds_every_commit_until_retry_after(setup, hub_ctx: HubContext) -> None:
    uploader, run_dir, _repo = setup
    hub = hub_ctx.hub
    limited = hub.inject("429", method="POST", path=r"/commit/", retry_after=3600)
    boundary(run_dir, 1)
    wait_for(lambda: limited.fired >= 1, "a commit meets the rate limit")
    for epoch in range(2, 6):  # boundaries keep coming while the Hub asks for quiet
        boundary(run_dir, epoch)
        uploader.snapshot()

    # The hour the Hub asked for is longer than the final upload may take: it says so at once.
    assert uploader.flush(30) is False
    assert limited.fired == 1, "a commit was sent while the Hub had asked to wait"
    assert uploader.repo.budget.hold() > 3000
    assert "rate-limits" in (uploader.last_error or "")
    assert sorted(uploader.pending) == sorted(["status.json"] + [f"epoch_{n}.txt" for n in range(1, 6)])


@pytest.mark.slow  # waits out a real (scaled-down) commit-rate window
def test_the_hubs_commit_limit_loses_nothing(setup, hub_ctx: HubContext) -> None:
    uploader, run_dir, repo = setup
    hub = hub_ctx.hub
    hub.set_commit_rate_limit(3, window_s=4.0)  # the Hub's 128/hour, scaled down
    for epoch in range(1, 13):
        boundary(run_dir, epoch)
        time.sleep(0.15)

    assert uploader.flush(WAIT)
    files = hub.files(repo)
    assert all(f"epoch_{n}.txt" in files for n in range(1, 13))
    assert json.loads(hub.file_bytes(repo, "status.json"))["completed_epochs"] == 12
    refused = [r for r in hub.find_requests(method="POST", path=r"/commit/") if r.status == 429]
    accepted = [r for r in hub.find_requests(method="POST", path=r"/commit/") if r.status == 200]
    assert refused, "the limit was never reached"
    # Each 429 holds every commit until the Hub's Retry-After: the agent does not hammer.
    assert len(refused) <= len(accepted)
    assert_no_duplicate_commit(hub, repo)


def test_the_duplicate_check_can_fail(hub_ctx: HubContext) -> None:
    hub = hub_ctx.hub
    repo = hub_ctx.repo_id("twice")
    hub.create_repo(repo)
    hub.upload_bytes(repo, "a.txt", b"same")
    hub.upload_bytes(repo, "a.txt", b"same")  # what a blindly resent commit leaves behind
    with pytest.raises(AssertionError, match="landed twice"):
        assert_no_duplicate_commit(hub, repo)


def _unknown_compression(path: Path) -> None:
    """A zip whose member claims a compression method zipfile does not implement (NotImplementedError)."""
    import zipfile

    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("last/data.pkl", b"\x80\x02}q\x00.")
    data = bytearray(path.read_bytes())
    for signature, offset in ((b"PK\x03\x04", 8), (b"PK\x01\x02", 10)):  # local header, central directory
        at = data.index(signature)
        data[at + offset : at + offset + 2] = (99).to_bytes(2, "little")
    path.write_bytes(bytes(data))


def test_a_file_that_fails_to_stage_in_any_way_is_pending_and_failed(setup, hub_ctx: HubContext) -> None:
    uploader, run_dir, repo = setup
    (run_dir / "weights").mkdir()
    _unknown_compression(run_dir / "weights" / "last.pt")  # checking it raises neither OSError nor InvalidCheckpoint
    (run_dir / "args.yaml").write_text("epochs: 1\n")  # staged in the same pass, before it
    boundary(run_dir, 1)

    assert uploader.flush(5) is False, "flush said the Hub has everything"
    failed = uploader.snapshots.stager.failed
    assert "weights/last.pt" in failed and "NotImplementedError" in failed["weights/last.pt"]
    assert "weights/last.pt" in uploader.pending
    # What was staged in that pass still went up; no copy of the failed file is left in staging.
    assert {"args.yaml", "epoch_1.txt", "status.json"} <= set(hub_ctx.hub.files(repo))
    assert not [p for p in uploader.snapshots.staging.iterdir() if p.name.endswith("last.pt")]


def test_a_snapshot_that_fails_as_a_whole_is_never_a_complete_flush(
    setup, hub_ctx: HubContext, monkeypatch: pytest.MonkeyPatch
) -> None:
    uploader, run_dir, repo = setup

    def unreadable(self: Snapshotter) -> list[tuple[Path, str]]:
        raise RuntimeError("the run folder cannot be listed")

    monkeypatch.setattr(Snapshotter, "_files", unreadable)
    boundary(run_dir, 1)
    assert uploader.flush(3) is False
    assert uploader.pending and "cannot be listed" in (uploader.last_error or "")
    monkeypatch.undo()
    assert uploader.flush(WAIT) and uploader.pending == []
    assert "epoch_1.txt" in hub_ctx.hub.files(repo)
