"""Large files go up from a child process (entrypoint/xet/child.py), against the local Hub's CAS over HTTP:
the same bytes and the same commit as an upload in the agent's own process, the same errors, the token
never in the child's argv, and a child killed or a CAS failing mid-upload is retried without tearing
anything. The size from which the child takes a file is lowered so that a few MiB exercise it."""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from entrypoint import procs
from entrypoint.hub import Hub
from entrypoint.xet import child as xetchild
from tests.hubfixtures import HubContext
from tests.integration.test_cas_faults import SYNC_FAULTS, XORB, sync_two_epochs_through_a_fault
from tests.integration.test_sync_faults import WAIT
from tests.support import process_alive

pytestmark = [pytest.mark.transfer("xet"), pytest.mark.slow]  # each commit starts a Python child

SIZE = 3 * 1024 * 1024


@pytest.fixture
def children(monkeypatch: pytest.MonkeyPatch) -> list[list[str]]:
    """Files of 1 MiB and more go through the child; the argv of every child started is recorded."""
    started: list[list[str]] = []
    real = procs.Child

    def spy(argv: Sequence[str], **kwargs: Any) -> procs.Child:
        started.append(list(argv))
        return real(argv, **kwargs)

    monkeypatch.setattr(xetchild, "CHILD_MIN_BYTES", 1024 * 1024)
    monkeypatch.setattr(procs, "Child", spy)
    return started


def _files(tmp_path: Path) -> list[tuple[str, Path]]:
    big, small = tmp_path / "last.pt", tmp_path / "status.json"
    big.write_bytes(os.urandom(SIZE))
    small.write_text('{"completed_epochs": 1}')
    return [("weights/last.pt", big), ("status.json", small)]


def _writable_repo(hub_ctx: HubContext, name: str) -> tuple[str, Hub, int]:
    """A new repo the agent's Hub may write: its id, that Hub, and how many commits it has."""
    repo = hub_ctx.repo_id(name)
    hub = Hub(token=hub_ctx.token)
    hub.ensure_writable_repo(repo)
    return repo, hub, len(hub_ctx.hub.commits(repo))


def test_a_large_file_from_the_child_lands_the_same_bytes_and_commit(
    hub_ctx: HubContext, tmp_path: Path, children: list[list[str]], monkeypatch: pytest.MonkeyPatch
) -> None:
    files = _files(tmp_path)
    hub = Hub(token=hub_ctx.token)
    through_child, in_process = hub_ctx.repo_id("child"), hub_ctx.repo_id("inprocess")
    for repo in (through_child, in_process):
        hub.ensure_writable_repo(repo)
    hub_ctx.hub.reset_log()

    sha = hub.commit(through_child, files, "Epoch boundary")
    assert [argv[2:4] for argv in children] == [["entrypoint.xet.child", through_child]]
    assert not any(hub_ctx.token in part for argv in children for part in argv), "the token stays out of argv"
    assert hub_ctx.hub.find_requests("POST", XORB), "the bytes went to the CAS over HTTP"

    monkeypatch.setattr(xetchild, "CHILD_MIN_BYTES", 1 << 40)  # the agent's own process, as before
    hub.commit(in_process, files, "Epoch boundary")
    assert len(children) == 1

    ours, theirs = hub_ctx.hub.commits(through_child), hub_ctx.hub.commits(in_process)
    assert ours[0].oid == sha and len(ours) == len(theirs)
    assert ours[0].summary == theirs[0].summary
    entries = hub_ctx.hub.files(through_child)
    assert entries["weights/last.pt"].xet_hash, "stored in the CAS"
    for name, path in files:
        assert hub_ctx.hub.file_bytes(through_child, name) == path.read_bytes()
    strip = {name: (e.size, e.sha256, e.git_oid, e.lfs, e.xet_hash) for name, e in entries.items()}
    assert strip == {name: (e.size, e.sha256, e.git_oid, e.lfs, e.xet_hash) for name, e in theirs[0].files.items()}


def test_a_refused_upload_from_the_child_is_the_same_error(hub_ctx: HubContext, tmp_path: Path) -> None:
    files = _files(tmp_path)
    repo = hub_ctx.repo_id("refused")
    Hub(token=hub_ctx.token).ensure_writable_repo(repo)
    reader = Hub(token=hub_ctx.read_token)

    errors = []
    for threshold in (1024 * 1024, 1 << 40):  # through the child, then in the agent's own process
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(xetchild, "CHILD_MIN_BYTES", threshold)
            with pytest.raises(Exception) as caught:
                reader.commit(repo, files, "Epoch boundary")
        errors.append(caught.value)
    assert type(errors[0]) is type(errors[1])
    assert str(errors[0]) == str(errors[1])
    assert hub_ctx.read_token not in str(errors[0])


def _kill_children_once_stalled(fault: Any, killed: list[int]) -> threading.Thread:
    def kill() -> None:
        end = time.monotonic() + WAIT
        while time.monotonic() < end and not killed:
            if fault.fired:
                for pid in procs.descendants(os.getpid()):
                    try:
                        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
                    except OSError:
                        continue
                    if b"entrypoint.xet.child" in cmdline:
                        os.kill(pid, signal.SIGKILL)
                        killed.append(pid)
            time.sleep(0.05)

    thread = threading.Thread(target=kill, daemon=True)
    thread.start()
    return thread


def test_a_child_killed_mid_upload_is_retried_and_tears_nothing(
    hub_ctx: HubContext, tmp_path: Path, children: list[list[str]], caplog: pytest.LogCaptureFixture
) -> None:
    files = _files(tmp_path)
    repo, hub, before = _writable_repo(hub_ctx, "killed")
    fault = hub_ctx.hub.inject("slow", method="POST", path=XORB, rate=1, times=1)  # the first xorb never answers
    killed: list[int] = []
    killer = _kill_children_once_stalled(fault, killed)

    with caplog.at_level("WARNING", logger="trainbox"):
        sha = hub.commit(repo, files, "Epoch boundary")
    killer.join(timeout=WAIT)

    assert killed and len(children) == 2, "killed once, then a second child finished the upload"
    assert "XetChildDied" in caplog.text, "retried as a lost connection"
    commits = hub_ctx.hub.commits(repo)
    assert commits[0].oid == sha and len(commits) == before + 1, "one commit, not two"
    for name, path in files:
        assert hub_ctx.hub.file_bytes(repo, name) == path.read_bytes()


@pytest.mark.parametrize(("kind", "path", "extra"), SYNC_FAULTS, ids=lambda v: v if isinstance(v, str) else "")
def test_a_fault_on_a_cas_route_during_a_child_upload_loses_and_tears_nothing(
    hub_ctx: HubContext, tmp_path: Path, children: list[list[str]], kind: str, path: str, extra: dict[str, Any]
) -> None:
    sync_two_epochs_through_a_fault(hub_ctx, tmp_path, kind, path, extra, SIZE)
    assert children, "the large files went through the child"


PARENT = """
import sys
from pathlib import Path
from entrypoint.xet import child as xetchild
from entrypoint.hub import Hub
xetchild.CHILD_MIN_BYTES = 1024 * 1024
Hub(token=sys.argv[1]).commit(sys.argv[2], [("weights/last.pt", Path(sys.argv[3]))], "Epoch boundary")
"""


@pytest.mark.parametrize("signum", [signal.SIGKILL, signal.SIGTERM])
def test_no_upload_child_outlives_the_agent(hub_ctx: HubContext, tmp_path: Path, signum: int) -> None:
    import subprocess
    import sys

    (_, big), _ = _files(tmp_path)
    repo = hub_ctx.repo_id("orphan")
    Hub(token=hub_ctx.token).ensure_writable_repo(repo)
    hub_ctx.hub.inject("slow", method="POST", path=XORB, rate=1)  # the upload never finishes
    env = hub_ctx.env()
    agent = subprocess.Popen([sys.executable, "-c", PARENT, hub_ctx.token, repo, str(big)], env=env)
    try:
        end, child = time.monotonic() + WAIT, None
        while child is None and time.monotonic() < end:
            for pid in procs.descendants(agent.pid):
                with contextlib.suppress(OSError):
                    if b"entrypoint.xet.child" in Path(f"/proc/{pid}/cmdline").read_bytes():
                        child = pid
            time.sleep(0.05)
        assert child is not None, "the upload child started"
        agent.send_signal(signum)
        agent.wait(WAIT)
        end = time.monotonic() + 5.0
        while process_alive(child) and time.monotonic() < end:
            time.sleep(0.05)
        assert not process_alive(child), "the upload child ended with the agent"
    finally:
        if agent.poll() is None:
            agent.kill()
            agent.wait()


def test_a_deadline_stops_the_child_and_fails_the_commit_promptly(
    hub_ctx: HubContext, tmp_path: Path, children: list[list[str]]
) -> None:
    from entrypoint.errors import SyncError

    files = _files(tmp_path)
    repo, hub, before = _writable_repo(hub_ctx, "deadline")
    hub_ctx.hub.inject("slow", method="POST", path=XORB, rate=1)  # the upload never finishes
    began = time.monotonic()

    with pytest.raises(SyncError, match="TimeoutError"):
        hub.commit(repo, files, "Final state", deadline=began + 3.0)

    assert time.monotonic() - began < 3.0 + 2.0, "the child's grace is 1 s"
    assert not any(
        b"entrypoint.xet.child" in Path(f"/proc/{pid}/cmdline").read_bytes()
        for pid in procs.descendants(os.getpid())
        if Path(f"/proc/{pid}/cmdline").exists()
    ), "no upload child left running"
    assert len(hub_ctx.hub.commits(repo)) == before, "nothing committed"
