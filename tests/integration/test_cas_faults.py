"""Faults on the Xet CAS routes (tests/fakes/hub/cas.py) during a dataset fetch and during a run's sync:
hf_xet's network client and the agent around it lose nothing and tear nothing, and a stalled CAS still
ends in the plain HTTP stream. In-process, against the local Hub in Xet mode."""

from __future__ import annotations

import hashlib
import os
import tarfile
from pathlib import Path
from typing import Any

import pytest

from entrypoint.hub import Hub
from entrypoint.sync.uploader import Uploader
from tests.hubfixtures import HubContext
from tests.integration.test_dataset_hub import FAST_ARGS, big_dataset, publish
from tests.integration.test_sync_faults import WAIT, boundary
from tests.support import trainbox_env

pytestmark = [pytest.mark.transfer("xet"), pytest.mark.slow]  # the fetches run libreyolo's dataset check

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

    env = trainbox_env(tmp_path / "work", DATASET_REPO=repo, RUN_ARGS=FAST_ARGS)
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
