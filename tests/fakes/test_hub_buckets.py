"""Storage Buckets of the local Hub (tests/fakes/hub/buckets.py) against the real huggingface_hub client.

Every bucket call the agent makes (entrypoint/sync/bucket.py) goes through here: create_bucket, bucket_info,
batch_bucket_files (add, delete), list_bucket_tree, get_bucket_paths_info, download_bucket_files.
"""

from __future__ import annotations

import contextlib
import os
import secrets
from pathlib import Path

import pytest
from huggingface_hub.errors import BucketNotFoundError, HfHubHTTPError

from tests.hubfixtures import HubContext

MiB = 1024 * 1024


def _bucket(hub_ctx: HubContext) -> str:
    return hub_ctx.repo_id("bucket")


def test_every_bucket_call_round_trips(hub_ctx: HubContext, tmp_path: Path) -> None:
    api = hub_ctx.api()
    bucket_id = _bucket(hub_ctx)
    url = api.create_bucket(bucket_id, private=True, exist_ok=True)
    assert url.bucket_id == bucket_id
    api.create_bucket(bucket_id, private=True, exist_ok=True)  # 409 taken as "already there"
    weights = tmp_path / "last.pt"
    weights.write_bytes(os.urandom(3 * MiB))
    api.batch_bucket_files(bucket_id, add=[(weights, "run/weights/last.pt"), (b'{"epoch": 1}\n', "run/m.json")])

    info = api.bucket_info(bucket_id)
    assert (info.id, info.private, info.total_files, info.size) == (bucket_id, True, 2, 3 * MiB + 13)
    tree = {item.path: item for item in api.list_bucket_tree(bucket_id, "run", recursive=True)}
    assert set(tree) == {"run/weights/last.pt", "run/m.json"}
    top = {(item.type, item.path) for item in api.list_bucket_tree(bucket_id, "run")}
    assert top == {("file", "run/m.json"), ("directory", "run/weights")}
    listed = list(api.get_bucket_paths_info(bucket_id, ["run/weights/last.pt", "run/absent"]))
    assert [(f.path, f.size) for f in listed] == [("run/weights/last.pt", 3 * MiB)]
    assert listed[0].xet_hash == tree["run/weights/last.pt"].xet_hash

    out = tmp_path / "out"
    api.download_bucket_files(bucket_id, [("run/weights/last.pt", out / "last.pt"), ("run/m.json", out / "m.json")])
    assert (out / "last.pt").read_bytes() == weights.read_bytes()
    assert (out / "m.json").read_bytes() == b'{"epoch": 1}\n'
    assert hub_ctx.hub.bucket_bytes(bucket_id, "run/m.json") == b'{"epoch": 1}\n'

    # Overwritten in place: one file per path, no history; then deleted.
    weights.write_bytes(os.urandom(MiB))
    api.batch_bucket_files(bucket_id, add=[(weights, "run/weights/last.pt")], delete=["run/m.json"])
    files = hub_ctx.hub.bucket_files(bucket_id)
    assert set(files) == {"run/weights/last.pt"} and files["run/weights/last.pt"].size == MiB
    api.download_bucket_files(bucket_id, [("run/weights/last.pt", out / "last.pt")])
    assert (out / "last.pt").read_bytes() == weights.read_bytes()


def test_missing_hidden_and_refused(hub_ctx: HubContext) -> None:
    api = hub_ctx.api()
    bucket_id = _bucket(hub_ctx)
    with pytest.raises(BucketNotFoundError):
        api.bucket_info(bucket_id)
    api.create_bucket(bucket_id, private=True)
    _, other = hub_ctx.new_user()
    with pytest.raises(BucketNotFoundError):
        hub_ctx.api(other).bucket_info(bucket_id)
    hub_ctx.hub.reset_log()
    with pytest.raises(ConnectionError):  # hf_xet, refused its CAS write token, says so as a network error
        hub_ctx.api(hub_ctx.read_token).batch_bucket_files(bucket_id, add=[(b"x", "a.txt")])
    assert [r.status for r in hub_ctx.hub.find_requests("GET", r"/xet-write-token$")] == [403]
    with pytest.raises(HfHubHTTPError) as refused:
        hub_ctx.api(hub_ctx.read_token).batch_bucket_files(bucket_id, delete=["a.txt"])
    assert refused.value.response.status_code == 403
    with pytest.raises(HfHubHTTPError) as denied:
        hub_ctx.api(other).create_bucket(f"{hub_ctx.user}/elsewhere")
    assert denied.value.response.status_code == 403


def test_fine_grained_token_may_not_touch_buckets(hub_ctx: HubContext) -> None:
    hub_ctx.hub.deny_buckets(hub_ctx.token)
    with pytest.raises(HfHubHTTPError) as denied:
        hub_ctx.api().create_bucket(_bucket(hub_ctx), private=True)
    assert denied.value.response.status_code == 403


def test_a_hub_without_buckets_answers_plain_404(hub_ctx: HubContext) -> None:
    hub_ctx.hub.set_buckets(False)
    try:
        with pytest.raises(HfHubHTTPError) as missing:
            hub_ctx.api().create_bucket(_bucket(hub_ctx), private=True, exist_ok=True)
        assert missing.value.response.status_code == 404
        assert not isinstance(missing.value, BucketNotFoundError)
    finally:
        hub_ctx.hub.set_buckets(True)


def test_batch_naming_an_unknown_xet_hash_fails_that_file(hub_ctx: HubContext) -> None:
    from huggingface_hub.errors import BucketBatchError

    api = hub_ctx.api()
    bucket_id = _bucket(hub_ctx)
    api.create_bucket(bucket_id, private=True)
    from huggingface_hub._buckets import _BucketAddFile

    # Not "0" * 64: that is the Xet hash of an empty file, which another test may have put in the CAS.
    bogus = _BucketAddFile(source=b"x", destination="bogus.bin", xet_hash=secrets.token_hex(32), size=1)
    with pytest.raises(BucketBatchError) as failed:
        api._batch_bucket_files(bucket_id, add=[bogus])
    assert failed.value.failures[0]["path"] == "bogus.bin"
    assert hub_ctx.hub.bucket_files(bucket_id) == {}


def test_faults_apply_to_bucket_routes(hub_ctx: HubContext, tmp_path: Path) -> None:
    api = hub_ctx.api()
    bucket_id = _bucket(hub_ctx)
    api.create_bucket(bucket_id, private=True)
    with hub_ctx.hub.inject("500", path=r"^/api/buckets/.*/batch$", times=1) as fault:
        api.batch_bucket_files(bucket_id, add=[(b"one", "a.txt")])  # the client retries a 5xx
    assert fault.fired == 1 and set(hub_ctx.hub.bucket_files(bucket_id)) == {"a.txt"}
    with hub_ctx.hub.inject("403", path=r"/paths-info$"), pytest.raises(HfHubHTTPError):
        list(api.get_bucket_paths_info(bucket_id, ["a.txt"]))
    # No answer comes; what matters is that the batch was applied.
    with hub_ctx.hub.inject("apply-then-reset", path=r"/batch$", times=1) as fault, contextlib.suppress(Exception):
        api.batch_bucket_files(bucket_id, add=[(b"two", "b.txt")])
    assert fault.fired == 1 and "b.txt" in hub_ctx.hub.bucket_files(bucket_id)
    assert hub_ctx.hub.find_requests("POST", r"/batch$")


def test_refused_paths_fail_their_operations_and_the_rest_of_the_batch_lands(hub_ctx: HubContext) -> None:
    from huggingface_hub.errors import BucketBatchError

    api = hub_ctx.api()
    bucket_id = _bucket(hub_ctx)
    api.create_bucket(bucket_id, private=True)
    hub_ctx.hub.refuse_bucket_paths(r"/manifests/", times=1)
    try:
        with pytest.raises(BucketBatchError) as failed:
            api.batch_bucket_files(bucket_id, add=[(b"weights", "r/objects/a.pt"), (b"{}", "r/manifests/1.json")])
        assert [f["path"] for f in failed.value.failures] == ["r/manifests/1.json"]
        assert set(hub_ctx.hub.bucket_files(bucket_id)) == {"r/objects/a.pt"}  # not transactional, as on the Hub
        api.batch_bucket_files(bucket_id, add=[(b"{}", "r/manifests/1.json")])  # times=1: the next one lands
        assert "r/manifests/1.json" in hub_ctx.hub.bucket_files(bucket_id)
        hub_ctx.hub.refuse_bucket_paths(r"/objects/")
        with pytest.raises(BucketBatchError):
            api.batch_bucket_files(bucket_id, delete=["r/objects/a.pt"])
        assert "r/objects/a.pt" in hub_ctx.hub.bucket_files(bucket_id)
    finally:
        hub_ctx.hub.refuse_bucket_paths(None)


def test_bucket_bytes_go_through_the_cas_over_http(hub_ctx: HubContext, tmp_path: Path) -> None:
    api = hub_ctx.api()
    bucket_id = _bucket(hub_ctx)
    api.create_bucket(bucket_id, private=True)
    hub_ctx.hub.reset_log()
    data = os.urandom(2 * MiB)
    api.batch_bucket_files(bucket_id, add=[(data, "big.bin")])
    assert hub_ctx.hub.find_requests("POST", r"^/cas/v1/xorbs/"), "the bucket's bytes did not reach the HTTP CAS"
    api.download_bucket_files(bucket_id, [("big.bin", tmp_path / "big.bin")])
    assert (tmp_path / "big.bin").read_bytes() == data == hub_ctx.hub.bucket_bytes(bucket_id, "big.bin")
