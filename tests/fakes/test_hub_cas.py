"""The test Hub's Xet CAS over HTTP (tests/fakes/hub/cas.py), driven by the real huggingface_hub + hf_xet."""

from __future__ import annotations

import json
import os
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from huggingface_hub import hf_hub_download

from tests.hubfixtures import HubContext, NewRepo

MiB = 1024 * 1024


def _get(url: str, headers: dict[str, str]) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers)) as answer:
            return answer.status, answer.read()
    except urllib.error.HTTPError as err:
        return err.code, err.read()


def _cas_token(hub_ctx: HubContext, repo: str) -> dict[str, Any]:
    url = f"{hub_ctx.hub.url}/api/models/{repo}/xet-read-token/main"
    status, body = _get(url, {"Authorization": f"Bearer {hub_ctx.token}"})
    assert status == 200
    return dict(json.loads(body))


def test_upload_and_download_go_through_the_cas_routes(hub_ctx: HubContext, new_repo: NewRepo, tmp_path: Path) -> None:
    api, repo, hub = new_repo
    data = os.urandom(5 * MiB)
    local = tmp_path / "last.pt"
    local.write_bytes(data)
    hub.reset_log()

    api.upload_file(path_or_fileobj=local, path_in_repo="last.pt", repo_id=repo)

    assert [r.status for r in hub.find_requests("POST", r"^/cas/v1/xorbs/default/[0-9a-f]{64}$")] == [200]
    assert [r.status for r in hub.find_requests("POST", r"^/cas/v1/shards$")] == [200]
    assert hub.bytes_served("/resolve/") == 0 and not hub.find_requests(path=r"/info/lfs/|^/_lfs/")
    assert {r.user for r in hub.find_requests(path="^/cas/")} == {hub_ctx.user}

    hub.reset_log()
    path = hf_hub_download(repo, "last.pt", **hub_ctx.download_kwargs())

    assert Path(path).read_bytes() == data
    (rec,) = [r for r in hub.find_requests("GET", r"^/cas/v1/reconstructions/") if r.status == 200]
    assert rec.path.endswith(hub.files(repo)["last.pt"].xet_hash or "-")
    fetched = [r for r in hub.find_requests("GET", r"^/cas/xorbs/default/") if r.status == 206]
    assert fetched and all(r.range for r in fetched)
    assert sum(r.bytes_out for r in fetched) >= len(data)  # the bytes came over the data URLs
    assert hub.bytes_served("/resolve/") == 0
    assert not hub.find_requests(path="^/cas-internal/")  # the server's own rebuilds are never logged


def test_the_token_routes_hand_out_the_http_cas(hub_ctx: HubContext, new_repo: NewRepo) -> None:
    repo = new_repo.repo
    assert _cas_token(hub_ctx, repo)["casUrl"] == f"{hub_ctx.hub.url}/cas"


def _rebuild(fetch: dict[str, Any], terms: list[dict[str, Any]], offset: int, headers: dict[str, str]) -> bytes:
    """The bytes a reconstruction describes, for xorbs of stored (uncompressed) chunks: random data."""
    out = bytearray()
    for term in terms:
        (info,) = [i for i in fetch[term["hash"]] if i["range"] == term["range"]]
        byte_range = info["url_range"]
        status, raw = _get(info["url"], {"Range": f"bytes={byte_range['start']}-{byte_range['end']}"})
        assert status == 206 and len(raw) == byte_range["end"] - byte_range["start"] + 1
        at, piece = 0, bytearray()
        while at < len(raw):
            stored, scheme = int.from_bytes(raw[at + 1 : at + 4], "little"), raw[at + 4]
            assert scheme == 0, "random data is stored uncompressed"
            piece += raw[at + 8 : at + 8 + stored]
            at += 8 + stored
        assert len(piece) == term["unpacked_length"]
        out += piece
    return bytes(out[offset:])


def test_a_reconstruction_with_a_range_describes_exactly_those_bytes(
    hub_ctx: HubContext, new_repo: NewRepo, tmp_path: Path
) -> None:
    api, repo, hub = new_repo
    data = os.urandom(3 * MiB + 12345)
    (tmp_path / "w.pt").write_bytes(data)
    api.upload_file(path_or_fileobj=tmp_path / "w.pt", path_in_repo="w.pt", repo_id=repo)
    xet_hash = hub.files(repo)["w.pt"].xet_hash
    auth = {"Authorization": f"Bearer {_cas_token(hub_ctx, repo)['accessToken']}"}
    url = f"{hub.url}/cas/v1/reconstructions/{xet_hash}"

    for lo, hi in [(0, len(data) - 1), (1, 2), (MiB + 7, 2 * MiB + 99999), (len(data) - 10, len(data) + 50)]:
        status, body = _get(url, {**auth, "Range": f"bytes={lo}-{hi}"})
        assert status == 200
        plan = json.loads(body)
        got = _rebuild(plan["fetch_info"], plan["terms"], plan["offset_into_first_range"], auth)
        assert got[: min(hi, len(data) - 1) - lo + 1] == data[lo : hi + 1]

    assert _get(url, {**auth, "Range": f"bytes={len(data)}-{len(data) + 5}"})[0] == 416
    assert _get(url, {"Authorization": "Bearer nope"})[0] == 401
    assert _get(f"{hub.url}/cas/v2/reconstructions/{xet_hash}", auth)[0] == 404  # hf_xet falls back to v1
    assert _get(f"{hub.url}/cas/v1/chunks/default-merkledb/{xet_hash}", auth)[0] == 404  # no global dedup


@pytest.mark.parametrize("route", ["shards"])
def test_a_shard_naming_a_missing_xorb_is_refused(hub_ctx: HubContext, new_repo: NewRepo, route: str) -> None:
    from tests.fakes.hub.cas import _BOOKEND, _E

    repo, hub = new_repo.repo, new_repo.hub
    token = _cas_token(hub_ctx, repo)["accessToken"]
    file_header = b"\x11" * 32 + (1).to_bytes(4, "little") + (1).to_bytes(4, "little") + bytes(8)
    term = b"\x22" * 32 + bytes(4) + (10).to_bytes(4, "little") + bytes(4) + (1).to_bytes(4, "little")
    shard = bytes(_E) + file_header + term + _BOOKEND + bytes(16) + _BOOKEND + bytes(16)
    request = urllib.request.Request(
        f"{hub.url}/cas/v1/{route}", data=shard, method="POST", headers={"Authorization": f"Bearer {token}"}
    )
    with pytest.raises(urllib.error.HTTPError) as err:
        urllib.request.urlopen(request)
    assert err.value.code == 400 and b"lacks" in err.value.read()


_UPLOAD_AND_READ = """
import os, sys
from pathlib import Path
from huggingface_hub import HfApi, hf_hub_download
api, name = HfApi(), sys.argv[2]
for i in range(2):
    local = Path(sys.argv[3]) / f"{name}{i}.pt"
    local.write_bytes(os.urandom(8 * 1024 * 1024))
    api.upload_file(path_or_fileobj=local, path_in_repo=local.name, repo_id=sys.argv[1])
    got = hf_hub_download(sys.argv[1], local.name, local_dir=Path(sys.argv[3]) / "back")
    assert Path(got).read_bytes() == local.read_bytes()
"""


def test_two_processes_on_one_hf_home_upload_and_download_at_once(
    hub_ctx: HubContext, new_repo: NewRepo, tmp_path: Path
) -> None:
    """A run's uploader and a `trainbox sync` sidecar (or two nodes) sharing one HF_HOME: hf_xet's network
    client keeps no lock there. (With a ``local://`` CAS both would open the CAS folder's own redb index and
    the second fail with "Database already open": a property of that test-only CAS, not of HF_HOME.)"""
    import subprocess
    import sys

    repo = new_repo.repo
    env = hub_ctx.env(HF_HOME=str(tmp_path / "hf"), HF_HUB_DISABLE_PROGRESS_BARS="1")
    for name in ("HF_HUB_CACHE", "HF_XET_CACHE"):
        env.pop(name, None)  # both under HF_HOME, as on a shared volume
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _UPLOAD_AND_READ, repo, name, str(tmp_path)],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for name in ("run", "sidecar")
    ]
    for proc in procs:
        _, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, err[-2000:]
    assert len(hub_ctx.hub.find_requests("POST", r"^/cas/v1/shards$")) >= 4
    assert sorted(f for f in hub_ctx.hub.files(repo) if f.endswith(".pt")) == [
        "run0.pt",
        "run1.pt",
        "sidecar0.pt",
        "sidecar1.pt",
    ]


def test_the_bandwidth_cap_holds_the_cas_to_its_rate(hub_ctx: HubContext, new_repo: NewRepo, tmp_path: Path) -> None:
    import time

    api, repo, hub = new_repo
    data = os.urandom(6 * MiB)
    (tmp_path / "w.pt").write_bytes(data)
    api.upload_file(path_or_fileobj=tmp_path / "w.pt", path_in_repo="w.pt", repo_id=repo)
    rate = 4 * MiB
    hub.set_cas_bandwidth(rate)
    try:
        started = time.monotonic()
        path = hf_hub_download(repo, "w.pt", **hub_ctx.download_kwargs())
        elapsed = time.monotonic() - started
    finally:
        hub.set_cas_bandwidth(None)
    assert Path(path).read_bytes() == data
    # a lower bound only: a slow machine is slower still, never faster than the link
    assert elapsed >= 0.8 * len(data) / rate
