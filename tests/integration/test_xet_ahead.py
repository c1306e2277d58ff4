"""Large checkpoints go up while they are staged (entrypoint/xet/ahead.py), against the local Hub's CAS over
HTTP with the real child: the upload starts before the copy is done and the commit sends nothing again; a
secret in a checkpoint never reaches the CAS; a checkpoint rewritten while it is staged is never committed
torn; a child that dies leaves the commit to the usual upload. The size from which a checkpoint goes ahead
is lowered where a few MiB show the same."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import signal
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from entrypoint import log, procs
from entrypoint.hub import Hub
from entrypoint.sync import staging
from entrypoint.sync.uploader import Uploader
from entrypoint.xet import ahead as xetahead
from entrypoint.xet import child as xetchild
from tests.hubfixtures import HubContext
from tests.integration.test_cas_faults import SYNC_FAULTS, XORB
from tests.integration.test_sync import _checkpoint_bytes, _write_slowly, assert_every_checkpoint_valid
from tests.integration.test_sync_faults import WAIT
from tests.support import process_alive

pytestmark = [pytest.mark.transfer("xet"), pytest.mark.slow]  # real children, real uploads

MIB = 1024 * 1024


@pytest.fixture
def children(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[list[str]]]:
    """Every child started (its argv), no session left from another test, and none left behind."""
    started: list[list[str]] = []
    real = procs.Child

    def spy(argv: Sequence[str], **kwargs: Any) -> procs.Child:
        started.append(list(argv))
        return real(argv, **kwargs)

    monkeypatch.setattr(procs, "Child", spy)
    xetahead.forget()
    yield started
    xetahead.forget()


AHEAD, COMMIT = "ahead", "commit"  # the child a staging copy feeds; the one a commit starts (xet/child.py)


def _kind(started: list[list[str]], kind: str) -> int:
    children = [argv for argv in started if argv[2:3] == ["entrypoint.xet.child"]]
    return sum(1 for argv in children if (argv[3] == "--ahead") == (kind == AHEAD))


def _armed(hub_ctx: HubContext, tmp_path: Path, name: str) -> tuple[Hub, str, Path]:
    """A writable repo and a staging folder whose first commit landed there (status.json, as at a start)."""
    repo = hub_ctx.repo_id(name)
    hub = Hub(token=hub_ctx.token)
    hub.ensure_writable_repo(repo)
    folder = tmp_path / "staging"
    folder.mkdir()
    (folder / "0-status.json").write_text('{"completed_epochs": 0}')
    hub.commit(repo, [("status.json", folder / "0-status.json")], "Epoch boundary: status.json")
    return hub, repo, folder


def _xorb_starts(hub_ctx: HubContext) -> list[float]:
    return sorted(record.started for record in hub_ctx.hub.find_requests("POST", XORB))


def test_the_upload_starts_while_the_copy_is_made_and_the_commit_sends_nothing_again(
    hub_ctx: HubContext, tmp_path: Path, children: list[list[str]], monkeypatch: pytest.MonkeyPatch
) -> None:
    hub, repo, folder = _armed(hub_ctx, tmp_path, "ahead")
    source = tmp_path / "last.pt"
    source.write_bytes(os.urandom(80 * MIB))  # more than one xorb (64 MiB): the first can go before the end
    real_cleared = xetahead.Feed.cleared
    paused = []

    def cleared(feed: xetahead.Feed, upto: int) -> None:
        real_cleared(feed, upto)
        if upto >= 72 * MIB and not paused:  # the copy lingers before its last chunks
            paused.append(time.time())
            end = time.monotonic() + WAIT
            while not _xorb_starts(hub_ctx) and time.monotonic() < end:
                time.sleep(0.05)

    monkeypatch.setattr(xetahead.Feed, "cleared", cleared)
    hub_ctx.hub.reset_log()

    target = folder / "1-last.pt"
    sha256, _, holds_secret = staging.copy_checked(source, target, is_checkpoint=True)
    copied = time.time()
    assert not holds_secret
    assert paused and _xorb_starts(hub_ctx) and _xorb_starts(hub_ctx)[0] < copied, "bytes left before the copy ended"

    sha = hub.commit(repo, [("weights/last.pt", target)], "Epoch boundary: weights/last.pt")

    assert _kind(children, AHEAD) >= 1
    assert _kind(children, COMMIT) == 0, "the commit uploaded nothing itself"
    assert not any(hub_ctx.token in part for argv in children for part in argv), "the token stays out of argv"
    assert hub_ctx.hub.commits(repo)[0].oid == sha
    entry = hub_ctx.hub.files(repo)["weights/last.pt"]
    assert entry.sha256 == sha256 == hashlib.sha256(source.read_bytes()).hexdigest() and entry.xet_hash
    assert hub_ctx.hub.file_bytes(repo, "weights/last.pt") == source.read_bytes()
    sent = sum(record.bytes_in for record in hub_ctx.hub.find_requests("POST", XORB))
    assert sent < 1.05 * 80 * MIB, "the bytes went up once"


def test_a_secret_in_a_checkpoint_never_reaches_the_cas(
    hub_ctx: HubContext, tmp_path: Path, children: list[list[str]], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(xetchild, "CHILD_MIN_BYTES", MIB)
    secret = f"hf_ahead_secret_{os.urandom(12).hex()}"
    visible = f"not-a-secret-{os.urandom(12).hex()}"  # the control: a marker that does go up
    log.register_secret(secret)
    hub, repo, folder = _armed(hub_ctx, tmp_path, "secret")
    best, last = bytearray(os.urandom(6 * MIB)), bytearray(os.urandom(6 * MIB))
    at = 5 * MIB - 7  # across a chunk boundary of the copy, deep into the file
    best[at : at + len(secret)] = secret.encode()
    last[at : at + len(visible)] = visible.encode()
    (tmp_path / "best.pt").write_bytes(bytes(best))
    (tmp_path / "last.pt").write_bytes(bytes(last))

    _, _, best_secret = staging.copy_checked(tmp_path / "best.pt", folder / "1-best.pt", is_checkpoint=True)
    _, _, last_secret = staging.copy_checked(tmp_path / "last.pt", folder / "2-last.pt", is_checkpoint=True)
    assert (best_secret, last_secret) == (True, False)
    hub.commit(repo, [("weights/last.pt", folder / "2-last.pt")], "Epoch boundary: weights/last.pt")  # as the snapshot

    answer = xetahead._copies[folder / "1-best.pt"].session.answer(None)
    assert set(answer["files"][str(folder / "1-best.pt")]) == {"short"}, "never offered whole"
    assert answer["files"][str(folder / "1-best.pt")]["short"] <= at, "the child stopped before the secret"
    stored = [path.read_bytes() for path in hub_ctx.hub.cas.rglob("*") if path.is_file()]
    assert any(visible.encode() in blob for blob in stored), "the control: bytes that go up are found so"
    assert not any(secret.encode() in blob for blob in stored), "the secret never reached the CAS"
    assert "weights/best.pt" not in hub_ctx.hub.files(repo)


def test_a_checkpoint_rewritten_while_it_is_staged_is_never_committed_torn(
    hub_ctx: HubContext, tmp_path: Path, children: list[list[str]], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(xetchild, "CHILD_MIN_BYTES", MIB // 2)
    monkeypatch.setattr(staging, "_COPY_CHUNK", 256 * 1024)  # more, smaller reads: more chances to be caught
    run_dir = tmp_path / "run"
    (run_dir / "weights").mkdir(parents=True)
    versions = [_checkpoint_bytes(epoch, 3 * MIB) for epoch in range(3)]
    repo = hub_ctx.repo_id("torn")
    hub = Hub(token=hub_ctx.token)
    hub.ensure_writable_repo(repo)
    (run_dir / "status.json").write_text(json.dumps({"completed_epochs": 0}))
    uploader = Uploader(hub, repo, run_dir, tmp_path / "sync", poll_interval=0.05)
    uploader.start()
    try:
        assert uploader.flush(WAIT, final=False)  # the first commit: the folder's copies go ahead from now on
        for epoch, data in enumerate(versions):
            stop = threading.Event()
            writer = threading.Thread(target=_write_slowly, args=(run_dir / "weights" / "last.pt", data, stop))
            writer.start()
            for tick in range(15):  # boundaries fire while last.pt is being rewritten in place
                (run_dir / "status.tmp").write_text(json.dumps({"completed_epochs": epoch, "tick": tick}))
                os.replace(run_dir / "status.tmp", run_dir / "status.json")
                time.sleep(0.07)
            stop.set()
            writer.join()
        assert uploader.flush(WAIT)
    finally:
        uploader.stop()
    assert uploader.snapshots.stager.refused, "the test never caught a file mid-write"
    assert _kind(children, AHEAD) >= 1, "the copies went ahead"
    assert assert_every_checkpoint_valid(hub_ctx.hub, repo) >= 1
    assert hub_ctx.hub.file_bytes(repo, "weights/last.pt") == versions[-1]


def _kill_ahead_children() -> list[int]:
    killed = []
    for pid in procs.descendants(os.getpid()):
        with contextlib.suppress(OSError):
            if b"entrypoint.xet.child\x00--ahead" in Path(f"/proc/{pid}/cmdline").read_bytes():
                os.kill(pid, signal.SIGKILL)
                killed.append(pid)
    return killed


def test_a_child_that_dies_while_sending_ahead_leaves_the_commit_to_the_usual_upload(
    hub_ctx: HubContext, tmp_path: Path, children: list[list[str]]
) -> None:
    hub, repo, folder = _armed(hub_ctx, tmp_path, "died")
    # The child's first xorb never gets its answer: the child is mid-send when it is killed.
    stalled = hub_ctx.hub.inject("slow", method="POST", path=XORB, rate=1, times=1)
    source = tmp_path / "last.pt"
    source.write_bytes(os.urandom(80 * MIB))  # more than one xorb (64 MiB): the first goes during the copy
    staging.copy_checked(source, folder / "1-last.pt", is_checkpoint=True)
    end = time.monotonic() + WAIT
    while not stalled.fired and time.monotonic() < end:
        time.sleep(0.05)
    assert stalled.fired, "the child never sent its first xorb"
    assert _kill_ahead_children(), "the child was sending"
    stalled.remove()

    sha = hub.commit(repo, [("weights/last.pt", folder / "1-last.pt")], "Epoch boundary: weights/last.pt")

    assert _kind(children, AHEAD) >= 1 and _kind(children, COMMIT) == 1, "the commit uploaded it itself"
    assert hub_ctx.hub.commits(repo)[0].oid == sha
    assert hub_ctx.hub.file_bytes(repo, "weights/last.pt") == source.read_bytes()


def test_an_uploader_sends_each_new_checkpoint_ahead_once_its_first_commit_landed(
    hub_ctx: HubContext, tmp_path: Path, children: list[list[str]], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(xetchild, "CHILD_MIN_BYTES", MIB)
    run_dir = tmp_path / "run"
    (run_dir / "weights").mkdir(parents=True)
    repo = hub_ctx.repo_id("boundaries")
    hub = Hub(token=hub_ctx.token)
    hub.ensure_writable_repo(repo)
    (run_dir / "status.json").write_text(json.dumps({"completed_epochs": 0}))
    uploader = Uploader(hub, repo, run_dir, tmp_path / "sync", poll_interval=0.05)
    uploader.start()
    versions = [_checkpoint_bytes(epoch, 2 * MIB) for epoch in range(3)]
    try:
        assert uploader.flush(WAIT, final=False)
        for epoch, data in enumerate(versions, start=1):
            (run_dir / "weights" / ".last.tmp").write_bytes(data)
            os.replace(run_dir / "weights" / ".last.tmp", run_dir / "weights" / "last.pt")
            (run_dir / "status.tmp").write_text(json.dumps({"completed_epochs": epoch}))
            os.replace(run_dir / "status.tmp", run_dir / "status.json")
            assert uploader.flush(WAIT, final=False), uploader.last_error
    finally:
        uploader.stop()
    assert _kind(children, COMMIT) == 0, "no commit uploaded a checkpoint itself"
    assert _kind(children, AHEAD) >= len(versions)
    shas = [hashlib.sha256(data).hexdigest() for data in versions]
    committed: list[str] = []
    for commit in reversed(hub_ctx.hub.commits(repo)):
        entry = commit.files.get("weights/last.pt")
        if entry is not None and (not committed or committed[-1] != entry.sha256):
            committed.append(entry.sha256)
    assert committed == shas, "each version, in order, whole"


@pytest.mark.parametrize(("kind", "path", "extra"), SYNC_FAULTS, ids=lambda v: v if isinstance(v, str) else "")
def test_a_fault_on_a_cas_route_while_a_copy_goes_ahead_loses_and_tears_nothing(
    hub_ctx: HubContext,
    tmp_path: Path,
    children: list[list[str]],
    monkeypatch: pytest.MonkeyPatch,
    kind: str,
    path: str,
    extra: dict[str, Any],
) -> None:
    monkeypatch.setattr(xetchild, "CHILD_MIN_BYTES", MIB)
    hub, repo, folder = _armed(hub_ctx, tmp_path, "faults")
    fault = hub_ctx.hub.inject(kind, method="POST", path=path, **extra)
    source = tmp_path / "last.pt"
    source.write_bytes(os.urandom(3 * MIB))
    before = len(hub_ctx.hub.commits(repo))

    staging.copy_checked(source, folder / "1-last.pt", is_checkpoint=True)
    sha = hub.commit(repo, [("weights/last.pt", folder / "1-last.pt")], "Epoch boundary: weights/last.pt")

    assert fault.fired and _kind(children, AHEAD) >= 1
    commits = hub_ctx.hub.commits(repo)
    assert commits[0].oid == sha and len(commits) == before + 1, "one commit"
    assert hub_ctx.hub.file_bytes(repo, "weights/last.pt") == source.read_bytes()


def test_nothing_goes_ahead_to_the_repo_while_a_bucket_takes_the_boundaries(
    hub_ctx: HubContext, tmp_path: Path, children: list[list[str]], monkeypatch: pytest.MonkeyPatch
) -> None:
    from tests.integration.test_bucket_sync import boundary, folder_of, keys, uploader

    monkeypatch.setattr(xetchild, "CHILD_MIN_BYTES", 1)  # every checkpoint counts as large
    folder = folder_of(hub_ctx)
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "trainbox.json").write_text(json.dumps({"run_name": "run-a"}))
    up = uploader(hub_ctx, folder, run_dir, tmp_path / "work")
    up.start()
    try:
        assert up.flush(WAIT, final=False, everywhere=True)  # a run's start: the bucket and the repo both took it
        for completed in (1, 2, 3):
            boundary(run_dir, completed)
            assert up.flush(WAIT, final=False), up.last_error
    finally:
        up.stop()
    assert _kind(children, AHEAD) == 0, "the bucket's boundaries go as before, and nothing to the repo ahead"
    assert up.bucket is not None and len(up.bucket.commits) >= 3
    assert any(key.endswith("/weights/last.pt") for key in keys(hub_ctx, folder))


AGENT = """
import sys, time
from pathlib import Path
from entrypoint.xet import child as xetchild
from entrypoint.hub import Hub
from entrypoint.sync import staging
xetchild.CHILD_MIN_BYTES = 1024 * 1024
hub, folder = Hub(token=sys.argv[1]), Path(sys.argv[3])
hub.commit(sys.argv[2], [("status.json", folder / "0-status.json")], "Epoch boundary: status.json")
staging.copy_checked(Path(sys.argv[4]), folder / "1-last.pt", is_checkpoint=True)
time.sleep(600)
"""


@pytest.mark.parametrize("signum", [signal.SIGKILL, signal.SIGTERM])
def test_no_child_sending_ahead_outlives_the_agent(hub_ctx: HubContext, tmp_path: Path, signum: int) -> None:
    import subprocess
    import sys

    repo = hub_ctx.repo_id("orphan")
    Hub(token=hub_ctx.token).ensure_writable_repo(repo)
    folder = tmp_path / "staging"
    folder.mkdir()
    (folder / "0-status.json").write_text("{}")
    source = tmp_path / "last.pt"
    source.write_bytes(os.urandom(3 * MIB))
    hub_ctx.hub.inject("slow", method="POST", path=XORB, rate=1)  # the upload never finishes
    hub_ctx.hub.reset_log()
    agent = subprocess.Popen(
        [sys.executable, "-c", AGENT, hub_ctx.token, repo, str(folder), str(source)], env=hub_ctx.env()
    )
    try:
        end, child = time.monotonic() + WAIT, None
        while child is None and time.monotonic() < end:
            for pid in procs.descendants(agent.pid):
                with contextlib.suppress(OSError):
                    if b"entrypoint.xet.child\x00--ahead" in Path(f"/proc/{pid}/cmdline").read_bytes():
                        child = pid
            time.sleep(0.05)
        assert child is not None, "the child sending ahead started"
        while not hub_ctx.hub.find_requests("GET", r"/xet-write-token/") and time.monotonic() < end:
            time.sleep(0.05)  # the child has opened its upload
        agent.send_signal(signum)
        agent.wait(WAIT)
        end = time.monotonic() + 5.0
        while process_alive(child) and time.monotonic() < end:
            time.sleep(0.05)
        assert not process_alive(child), "the child ended with the agent"
    finally:
        if agent.poll() is None:
            agent.kill()
            agent.wait()
