"""Faults on the Xet CAS routes (tests/fakes/hub/cas.py) during a dataset fetch and during a run's sync:
hf_xet's network client and the agent around it lose nothing and tear nothing, and a stalled CAS still
ends in the plain HTTP stream. In-process, against the local Hub in Xet mode."""

from __future__ import annotations

import hashlib
import os
import tarfile
import time
from pathlib import Path
from typing import Any

import pytest

from entrypoint.hub import Hub
from entrypoint.sync.uploader import Uploader
from tests.hubfixtures import HubContext
from tests.integration.test_dataset_hub import (
    FAST_ARGS,
    big_dataset,
    dataset_env,
    doctor,  # noqa: F401  (autouse: the stand-in's doctor checks the data)
    publish,
)
from tests.integration.test_sync_faults import WAIT, boundary

pytestmark = [pytest.mark.transfer("xet"), pytest.mark.slow]

RECONSTRUCTION, DATA = r"^/cas/v1/reconstructions/", r"^/cas/xorbs/default/"
XORB, SHARD = r"^/cas/v1/xorbs/default/", r"^/cas/v1/shards$"

FETCH_FAULTS = [  # (kind, path, extra): each on one CAS route the download uses
    ("503", RECONSTRUCTION, {"times": 2}),
    ("429", RECONSTRUCTION, {"times": 1, "retry_after": 1}),
    ("401", RECONSTRUCTION, {"times": 1}),  # a CAS token that expired early: refreshed, asked again
    ("500", DATA, {"times": 2}),
    ("429", DATA, {"times": 1, "retry_after": 1}),
    ("reset", DATA, {"times": 1}),
    ("reset-body", DATA, {"times": 2}),
]


def _prepare(hub_ctx: HubContext, tmp_path: Path, repo: str) -> Path:
    from entrypoint import settings
    from entrypoint.dataset import fetch as dataset_hub

    env = dataset_env(tmp_path / "work", DATASET_REPO=repo, RUN_ARGS=FAST_ARGS)  # the stand-in's doctor
    prepared = dataset_hub.prepare(settings.from_env(env))
    return prepared.root / "cones"


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.mark.parametrize(("kind", "path", "extra"), FETCH_FAULTS, ids=lambda v: v if isinstance(v, str) else "")
def test_a_fault_on_a_cas_route_during_a_fetch_loses_and_tears_nothing(
    hub_ctx: HubContext, tmp_path: Path, kind: str, path: str, extra: dict[str, Any]
) -> None:
    tar = big_dataset(tmp_path)
    repo = publish(hub_ctx, {"cones.tar": tar})
    fault = hub_ctx.hub.inject(kind, method="GET", path=path, **extra)

    root = _prepare(hub_ctx, tmp_path, repo)

    assert fault.fired
    with tarfile.open(tar) as archive:
        sent = archive.extractfile("cones/extras/blob.bin")
        assert sent is not None and _digest(root / "extras" / "blob.bin") == hashlib.sha256(sent.read()).hexdigest()
    assert hub_ctx.hub.bytes_served("/resolve/") == 0  # hf_xet got past the fault itself


def test_a_stalled_cas_data_url_ends_in_the_plain_http_stream(
    hub_ctx: HubContext, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    from entrypoint.dataset import hub_reads

    tar = big_dataset(tmp_path)
    repo = publish(hub_ctx, {"cones.tar": tar})
    monkeypatch.setattr(hub_reads, "XET_STALL_S", 1.0)  # a minute in production
    hub_ctx.hub.inject("slow", method="GET", path=DATA, rate=1)  # the data URLs never deliver

    with caplog.at_level("WARNING", logger="trainbox"):
        root = _prepare(hub_ctx, tmp_path, repo)

    assert (root / "images" / "train" / "000.png").is_file()
    assert "continuing over plain HTTP" in caplog.text
    assert 0 < hub_ctx.hub.bytes_served("/resolve/") <= tar.stat().st_size


class _EndsAtOnce:
    """A download group whose streams end at once, with no byte and no error: what hf_xet 1.8's stream does, now
    and then on a loaded machine, when the CAS answers its reconstruction request with a 401."""

    def __init__(self, group: Any) -> None:
        self.group = group

    def download_stream(self, *args: Any, **kwargs: Any) -> Any:
        stream = self.group.download_stream(*args, **kwargs)
        stream.cancel()
        return _Empty()

    def finish(self) -> Any:
        return self.group.finish()

    def abort(self) -> Any:
        return self.group.abort()


class _Empty:
    def __iter__(self) -> _Empty:
        return self

    def __next__(self) -> bytes:
        raise StopIteration

    def cancel(self) -> None:
        pass


def test_a_xet_stream_that_ends_short_is_tried_again_not_taken_for_the_file(
    hub_ctx: HubContext, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    from huggingface_hub.utils import _xet

    tar = big_dataset(tmp_path)
    repo = publish(hub_ctx, {"cones.tar": tar})
    session, groups = _xet.get_xet_session, []

    class FirstStreamEndsAtOnce:
        def new_download_stream_group(self, **kwargs: Any) -> Any:
            group = session().new_download_stream_group(**kwargs)
            groups.append(group)
            return _EndsAtOnce(group) if len(groups) == 1 else group

    monkeypatch.setattr(_xet, "get_xet_session", FirstStreamEndsAtOnce)
    with caplog.at_level("WARNING", logger="trainbox"):
        root = _prepare(hub_ctx, tmp_path, repo)

    assert len(groups) == 2 and "ended at byte 0 of" in caplog.text and "trying once more" in caplog.text
    with tarfile.open(tar) as archive:
        sent = archive.extractfile("cones/extras/blob.bin")
        assert sent is not None and _digest(root / "extras" / "blob.bin") == hashlib.sha256(sent.read()).hexdigest()
    assert hub_ctx.hub.bytes_served("/resolve/") == 0  # the second try was Xet's own


SYNC_FAULTS = [  # each on one CAS route an upload uses
    ("500", XORB, {"times": 2}),
    ("503", SHARD, {"times": 2}),
    ("429", XORB, {"times": 1, "retry_after": 1}),
    ("reset", XORB, {"times": 1}),
    ("reset", SHARD, {"times": 1}),
    ("401", SHARD, {"times": 1}),
    ("apply-then-reset", SHARD, {"times": 1}),  # the shard is stored, its answer lost
]


def sync_two_epochs_through_a_fault(
    hub_ctx: HubContext, tmp_path: Path, kind: str, path: str, extra: dict[str, Any], size: int
) -> None:
    """Two epochs of ``size``-byte files synced while ``kind`` strikes ``path``: both land whole in the CAS."""
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    repo = hub_ctx.repo_id("casfaults")
    hub = Hub(token=hub_ctx.token)
    hub.ensure_writable_repo(repo)
    fault = hub_ctx.hub.inject(kind, method="POST", path=path, **extra)
    uploader = Uploader(hub, repo, run_dir, tmp_path / "sync", poll_interval=0.05)
    uploader.start()
    try:
        for epoch in (1, 2):
            (run_dir / f"epoch_{epoch}.bin").write_bytes(os.urandom(size))
            boundary(run_dir, epoch)
            assert uploader.flush(WAIT), uploader.last_error
    finally:
        uploader.stop()

    assert fault.fired
    for epoch in (1, 2):
        name = f"epoch_{epoch}.bin"
        entry = hub_ctx.hub.files(repo)[name]
        assert entry.xet_hash, "the bytes went to the CAS"
        assert hub_ctx.hub.file_bytes(repo, name) == (run_dir / name).read_bytes()


@pytest.mark.parametrize(("kind", "path", "extra"), SYNC_FAULTS, ids=lambda v: v if isinstance(v, str) else "")
def test_a_fault_on_a_cas_route_during_a_sync_loses_and_tears_nothing(
    hub_ctx: HubContext, tmp_path: Path, kind: str, path: str, extra: dict[str, Any]
) -> None:
    sync_two_epochs_through_a_fault(hub_ctx, tmp_path, kind, path, extra, 3 * 1024 * 1024)


def test_a_lifted_slow_fault_ends_the_xet_streams_it_stalled(hub_ctx: HubContext, tmp_path: Path) -> None:
    """Xet streams the agent gave up on (a stall) sit inside hf_xet, which cannot cancel a read in progress: they
    end only when their connection does. Lifting the fault ends them, so a trickle set up for one test never
    holds hf_xet's download slots while later Xet downloads of this process (a resume, a test after) wait."""
    from entrypoint.dataset import hub_reads

    tar = big_dataset(tmp_path)
    repo = publish(hub_ctx, {"cones.tar": tar})
    hub = Hub(token=hub_ctx.token)
    remote = hub_reads.dataset_file(hub, repo, "cones.tar", hub_reads.dataset_revision(hub, repo, "main"))
    assert remote.xet
    slow = hub_ctx.hub.inject("slow", method="GET", path=DATA, rate=1)  # the data URLs trickle, never finish
    for _ in range(2):  # as remote_chunks: a try, then one more
        with pytest.raises(hub_reads.XetStalled):
            for _chunk in hub_reads.xet_stream_dataset_file(hub, remote, stall_s=1.0):
                pass
    slow.remove()

    trickled = hub_ctx.hub.find_requests(method="GET", path=DATA)
    assert trickled
    deadline = time.monotonic() + 20
    while any(record.duration == 0 for record in trickled) and time.monotonic() < deadline:
        time.sleep(0.1)  # a handler ends (its duration is set) once its client has closed the connection
    assert all(record.duration > 0 for record in trickled), "the abandoned transfers still hold their connections"
    got = b"".join(hub_reads.xet_stream_dataset_file(hub, remote, stall_s=30.0))
    assert hashlib.sha256(got).hexdigest() == _digest(tar)
