"""The local Hub (tests/fakes/hub/) against the real huggingface_hub client, over real sockets, no mocks.

The rest of the suite trusts the server because of these tests: each one pins a behaviour of the real Hub
that the client (or Trainbox) depends on.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from huggingface_hub import (
    CommitOperationAdd,
    CommitOperationDelete,
    get_hf_file_metadata,
    hf_hub_download,
    hf_hub_url,
    snapshot_download,
)
from huggingface_hub.errors import (
    EntryNotFoundError,
    HfHubHTTPError,
    RepositoryNotFoundError,
    RevisionNotFoundError,
)

from tests.fakes.hub import RemoteHub, git_blob_sha1
from tests.hubfixtures import HubContext, NewRepo

MiB = 1024 * 1024
ROOT = Path(__file__).parents[2]


def _status(err: pytest.ExceptionInfo[HfHubHTTPError]) -> int:
    return err.value.response.status_code


def _statuses(ctx: HubContext, method: str, path: str) -> list[int]:
    return [r.status for r in ctx.hub.find_requests(method, path)]


# -- repos ------------------------------------------------------------------------------------------------


def test_create_repo_private_public_and_exist_ok(hub_ctx: HubContext) -> None:
    api, private, public = hub_ctx.api(), hub_ctx.repo_id("private"), hub_ctx.repo_id("public")

    url = api.create_repo(private, repo_type="dataset", private=True)
    assert (url.repo_type, url.repo_id) == ("dataset", private)
    api.create_repo(public)
    assert api.dataset_info(private).private is True
    assert api.model_info(public).private is False
    assert api.list_repo_files(public) == [".gitattributes"]  # the Hub's initial commit

    with pytest.raises(HfHubHTTPError) as err:
        api.create_repo(public)
    assert _status(err) == 409
    assert api.create_repo(public, exist_ok=True).repo_id == public  # the client reads "url" from the 409
    assert hub_ctx.hub.repo_exists(private, repo_type="dataset")
    assert api.repo_exists(public) and not api.repo_exists(hub_ctx.repo_id("missing"))


# -- uploads ----------------------------------------------------------------------------------------------


@pytest.mark.transfer("lfs")  # asserts the LFS requests
def test_upload_file_binary_takes_lfs_path_and_downloads_back(
    hub_ctx: HubContext, new_repo: NewRepo, tmp_path: Path
) -> None:
    api, repo, hub = new_repo
    data = os.urandom(6 * MiB)
    local = tmp_path / "weights.safetensors"
    local.write_bytes(data)

    info = api.upload_file(path_or_fileobj=local, path_in_repo="ckpt/weights.safetensors", repo_id=repo)

    assert info.oid == hub.head(repo)
    (put,) = hub.find_requests("PUT", r"^/_lfs/")
    assert (put.status, put.bytes_in, put.user) == (200, len(data), None)  # no Authorization on the PUT
    assert _statuses(hub_ctx, "POST", r"\.git/info/lfs/objects/batch$") == [200]
    assert hub.file_bytes(repo, "ckpt/weights.safetensors") == data
    (entry,) = [f for f in api.list_repo_tree(repo, recursive=True) if f.path == "ckpt/weights.safetensors"]
    assert entry.lfs is not None and entry.lfs.sha256 == hashlib.sha256(data).hexdigest()

    path = Path(hf_hub_download(repo, "ckpt/weights.safetensors", **hub_ctx.download_kwargs()))
    assert path.read_bytes() == data
    assert path.resolve().name == hashlib.sha256(data).hexdigest()  # cache blob named after the LFS ETag
    assert path.parents[1].name == info.oid  # snapshots/<X-Repo-Commit>/ckpt/...


def test_download_cache_hit_sends_no_body_and_regular_etag_is_git_sha1(hub_ctx: HubContext, new_repo: NewRepo) -> None:
    api, repo, hub = new_repo
    api.upload_file(path_or_fileobj=b"epochs: 3\n", path_in_repo="config.yaml", repo_id=repo)
    assert not hub.find_requests("PUT")  # small text goes inline in the commit ("regular")

    meta = get_hf_file_metadata(hf_hub_url(repo, "config.yaml"), token=hub_ctx.token)
    assert meta.etag == git_blob_sha1(b"epochs: 3\n") and meta.commit_hash == hub.head(repo) and meta.size == 10

    first = hf_hub_download(repo, "config.yaml", **hub_ctx.download_kwargs())
    hub.reset_log()
    second = hf_hub_download(repo, "config.yaml", **hub_ctx.download_kwargs())
    assert first == second
    assert [r.method for r in hub.requests] == ["HEAD"]  # ETag unchanged: served from cache
    assert hub.bytes_served("/resolve/") == 0


@pytest.mark.transfer("lfs")  # asserts the LFS requests
def test_upload_folder_then_unchanged_files_are_skipped(hub_ctx: HubContext, tmp_path: Path) -> None:
    api, repo, hub = hub_ctx.api(), hub_ctx.repo_id(), hub_ctx.hub
    api.create_repo(repo, repo_type="dataset")
    folder = tmp_path / "run"
    (folder / "sub").mkdir(parents=True)
    (folder / "notes.txt").write_text("hello\n")
    (folder / "sub" / "metrics.json").write_text('{"map": 0.5}\n')
    (folder / "sub" / "last.pt").write_bytes(os.urandom(200_000))

    api.upload_folder(folder_path=folder, repo_id=repo, repo_type="dataset")
    files = api.list_repo_files(repo, repo_type="dataset")
    assert files == [".gitattributes", "notes.txt", "sub/last.pt", "sub/metrics.json"]
    assert len(hub.find_requests("PUT", r"^/_lfs/")) == 1  # only the .pt is LFS
    commits = len(hub.commits(repo, repo_type="dataset"))

    hub.reset_log()
    api.upload_folder(folder_path=folder, repo_id=repo, repo_type="dataset")  # nothing changed
    assert len(hub.commits(repo, repo_type="dataset")) == commits
    assert not hub.find_requests("POST", "/commit/") and not hub.find_requests("PUT")

    (folder / "notes.txt").write_text("changed\n")
    hub.reset_log()
    api.upload_folder(folder_path=folder, repo_id=repo, repo_type="dataset")
    assert len(hub.commits(repo, repo_type="dataset")) == commits + 1
    assert not hub.find_requests("PUT")  # the unchanged LFS file was not sent again
    assert hub.file_bytes(repo, "notes.txt", repo_type="dataset") == b"changed\n"


def test_create_commit_adds_and_deletes(hub_ctx: HubContext, new_repo: NewRepo) -> None:
    api, repo, hub = new_repo
    hub.commit(repo, {"old.txt": b"old", "keep.txt": b"keep", "logs/a.txt": b"a", "logs/b.txt": b"b"})
    blob = os.urandom(3000)

    api.create_commit(
        repo,
        operations=[
            CommitOperationAdd("new.txt", b"new"),
            CommitOperationAdd("model.bin", io.BytesIO(blob)),
            CommitOperationDelete("old.txt"),
            CommitOperationDelete("logs/", is_folder=True),
        ],
        commit_message="Reshape",
        commit_description="several operations at once",
    )

    assert set(hub.files(repo)) == {".gitattributes", "keep.txt", "new.txt", "model.bin"}
    assert hub.files(repo)["model.bin"].lfs and hub.file_bytes(repo, "model.bin") == blob
    latest = api.list_repo_commits(repo)[0]
    assert (latest.title, latest.message, latest.authors) == ("Reshape", "several operations at once", [hub_ctx.user])

    with pytest.raises(EntryNotFoundError):
        api.delete_file("does-not-exist.txt", repo)


def test_old_commits_branches_and_tags_resolve(hub_ctx: HubContext, new_repo: NewRepo) -> None:
    api, repo, hub = new_repo
    v1 = api.upload_file(path_or_fileobj=b"v1", path_in_repo="state.txt", repo_id=repo).oid
    v2 = api.upload_file(path_or_fileobj=b"v2", path_in_repo="state.txt", repo_id=repo).oid
    kwargs = hub_ctx.download_kwargs()

    assert Path(hf_hub_download(repo, "state.txt", revision=v1, **kwargs)).read_bytes() == b"v1"
    assert Path(hf_hub_download(repo, "state.txt", **kwargs)).read_bytes() == b"v2"
    assert api.model_info(repo, revision=v1).sha == v1 and api.model_info(repo).sha == v2
    assert api.list_repo_commits(repo, revision=v1)[0].commit_id == v1

    api.create_branch(repo, branch="dev", revision=v1)
    api.create_tag(repo, tag="first", revision=v1)
    assert Path(hf_hub_download(repo, "state.txt", revision="first", **kwargs)).read_bytes() == b"v1"
    dev = api.upload_file(path_or_fileobj=b"dev", path_in_repo="state.txt", repo_id=repo, revision="dev").oid
    assert hub.head(repo, revision="dev") == dev and hub.head(repo) == v2
    assert {b.name for b in api.list_repo_refs(repo).branches} == {"main", "dev"}

    with pytest.raises(RevisionNotFoundError):
        hf_hub_download(repo, "state.txt", revision="no-such-branch", **kwargs)
    with pytest.raises(RevisionNotFoundError):  # commits go to existing branches only, as on the Hub
        api.upload_file(path_or_fileobj=b"x", path_in_repo="x.txt", repo_id=repo, revision="no-such-branch")


def test_listings_and_repo_info(hub_ctx: HubContext) -> None:
    api, repo, hub = hub_ctx.api(), hub_ctx.repo_id(), hub_ctx.hub
    api.create_repo(repo, repo_type="dataset")
    sha = hub.commit(repo, {"a.txt": b"a", "d/b.txt": b"b", "d/e/c.bin": b"\0c"}, repo_type="dataset")

    top = {(e.path, type(e).__name__) for e in api.list_repo_tree(repo, repo_type="dataset")}
    assert top == {(".gitattributes", "RepoFile"), ("a.txt", "RepoFile"), ("d", "RepoFolder")}
    nested = [e.path for e in api.list_repo_tree(repo, "d", repo_type="dataset", recursive=True)]
    assert nested == ["d/b.txt", "d/e", "d/e/c.bin"]
    (expanded,) = api.list_repo_tree(repo, "d/e", repo_type="dataset", expand=True)
    assert expanded.last_commit is not None and expanded.last_commit.oid == sha
    with pytest.raises(EntryNotFoundError):
        list(api.list_repo_tree(repo, "nope", repo_type="dataset"))

    infos = api.get_paths_info(repo, ["a.txt", "d", "missing"], repo_type="dataset")
    assert [(i.path, type(i).__name__) for i in infos] == [("a.txt", "RepoFile"), ("d", "RepoFolder")]
    info = api.dataset_info(repo, files_metadata=True)
    assert info.sha == sha and info.id == repo
    sizes = {s.rfilename: s.size for s in info.siblings}
    assert sizes == {".gitattributes": sizes[".gitattributes"], "a.txt": 1, "d/b.txt": 1, "d/e/c.bin": 2}
    assert [c.commit_id for c in api.list_repo_commits(repo, repo_type="dataset")] == [
        c.oid for c in hub.commits(repo, repo_type="dataset")
    ]
    snapshot = Path(snapshot_download(repo, repo_type="dataset", **hub_ctx.download_kwargs()))
    assert (snapshot / "d" / "e" / "c.bin").read_bytes() == b"\0c"


# -- auth -------------------------------------------------------------------------------------------------


def test_whoami(hub_ctx: HubContext) -> None:
    me = hub_ctx.api().whoami()
    assert me["type"] == "user" and me["name"] == hub_ctx.user
    assert me["auth"]["accessToken"]["role"] == "write"
    assert hub_ctx.api(hub_ctx.read_token).whoami()["auth"]["accessToken"]["role"] == "read"
    with pytest.raises(HfHubHTTPError) as err:
        hub_ctx.api("hf_not_a_token").whoami()
    assert _status(err) == 401


def test_private_repo_access(hub_ctx: HubContext) -> None:
    repo = hub_ctx.repo_id()
    hub_ctx.api().create_repo(repo, private=True)
    hub_ctx.hub.upload_bytes(repo, "secret.txt", b"s")
    _, stranger = hub_ctx.new_user()

    with pytest.raises(RepositoryNotFoundError) as anonymous:
        hub_ctx.api(False).model_info(repo)
    assert _status(anonymous) == 401  # no token: 401 + RepoNotFound, the Hub hides the repo
    with pytest.raises(RepositoryNotFoundError):
        hf_hub_download(repo, "secret.txt", cache_dir=hub_ctx.cache_dir, token=False)
    with pytest.raises(RepositoryNotFoundError) as foreign:
        hub_ctx.api(stranger).model_info(repo)
    assert _status(foreign) == 404  # a valid token without access: 404 RepoNotFound
    with pytest.raises(HfHubHTTPError) as bad_token:
        hub_ctx.api("hf_not_a_token").model_info(repo)
    assert _status(bad_token) == 401 and not isinstance(bad_token.value, RepositoryNotFoundError)

    read = hub_ctx.api(hub_ctx.read_token)
    assert read.model_info(repo).private
    assert Path(hf_hub_download(repo, "secret.txt", **hub_ctx.download_kwargs(token=hub_ctx.read_token))).read_bytes()


def test_writes_need_a_write_token_in_the_right_namespace(hub_ctx: HubContext) -> None:
    repo = hub_ctx.repo_id()
    hub_ctx.api().create_repo(repo)
    other_user, other = hub_ctx.new_user(orgs=("acme",))
    upload = {"path_or_fileobj": b"x", "path_in_repo": "x.txt", "repo_id": repo}

    with pytest.raises(HfHubHTTPError) as read_only:
        hub_ctx.api(hub_ctx.read_token).upload_file(**upload)
    assert _status(read_only) == 403
    with pytest.raises(HfHubHTTPError) as read_create:
        hub_ctx.api(hub_ctx.read_token).create_repo(hub_ctx.repo_id())
    assert _status(read_create) == 403
    with pytest.raises(HfHubHTTPError) as wrong_ns:
        hub_ctx.api(other).upload_file(**upload)
    assert _status(wrong_ns) == 403
    with pytest.raises(HfHubHTTPError) as wrong_create:
        hub_ctx.api(other).create_repo(f"{hub_ctx.user}/theirs")
    assert _status(wrong_create) == 403
    with pytest.raises(HfHubHTTPError) as anonymous:
        hub_ctx.api(False).upload_file(**upload)
    assert _status(anonymous) == 401
    assert [c.summary for c in hub_ctx.hub.commits(repo)] == ["initial commit"]

    assert hub_ctx.api(other).create_repo(f"acme/{other_user}-shared").repo_id == f"acme/{other_user}-shared"


def test_typed_not_found_errors(hub_ctx: HubContext) -> None:
    api, repo = hub_ctx.api(), hub_ctx.repo_id()
    with pytest.raises(RepositoryNotFoundError):
        api.model_info(repo)
    with pytest.raises(RepositoryNotFoundError):
        hf_hub_download(repo, "a.txt", **hub_ctx.download_kwargs())
    api.create_repo(repo)
    with pytest.raises(EntryNotFoundError):
        hf_hub_download(repo, "a.txt", **hub_ctx.download_kwargs())
    with pytest.raises(RevisionNotFoundError):
        api.model_info(repo, revision="0" * 40)
    assert not api.file_exists(repo, "a.txt")


# -- faults -----------------------------------------------------------------------------------------------


@pytest.mark.slow  # waits out the client's real retry backoff
@pytest.mark.transfer("lfs")  # asserts the LFS requests
def test_client_retries_preupload_lfs_put_and_429_but_not_the_commit(hub_ctx: HubContext, new_repo: NewRepo) -> None:
    api, repo, hub = new_repo
    hub.inject("503", path="/preupload/", times=2)
    hub.inject("reset", path=r"\.git/info/lfs/objects/batch$", times=1)
    hub.inject("500", method="PUT", path=r"^/_lfs/", times=1)

    api.upload_file(path_or_fileobj=os.urandom(100_000), path_in_repo="a.bin", repo_id=repo)

    assert _statuses(hub_ctx, "POST", "/preupload/") == [503, 503, 200]
    assert _statuses(hub_ctx, "POST", r"/objects/batch$") == [0, 200]  # 0: dropped without a response
    assert _statuses(hub_ctx, "PUT", r"^/_lfs/") == [500, 200]

    hub.reset_log()
    with hub.inject("429", method="GET", path="/resolve/", times=1, retry_after=0) as fault:
        hf_hub_download(repo, "a.bin", **hub_ctx.download_kwargs())
    assert fault.fired == 1 and _statuses(hub_ctx, "GET", "/resolve/") == [429, 200]

    hub.reset_log()
    with hub.inject("503", method="POST", path="/commit/", times=1), pytest.raises(HfHubHTTPError) as err:
        api.upload_file(path_or_fileobj=b"more", path_in_repo="b.txt", repo_id=repo)
    assert _status(err) == 503
    assert _statuses(hub_ctx, "POST", "/commit/") == [503]  # a commit POST is never retried
    assert "b.txt" not in hub.files(repo)


@pytest.mark.transfer("lfs")  # the plain HTTP download
def test_download_resumes_with_range_after_a_mid_body_reset(hub_ctx: HubContext) -> None:
    repo, hub = hub_ctx.repo_id(), hub_ctx.hub
    hub.create_repo(repo, private=True)
    data = os.urandom(24 * MiB)  # > the client's 10 MiB read chunk, so it keeps a prefix and resumes
    hub.upload_bytes(repo, "big.bin", data)
    hub.inject("reset-body", method="GET", path="/resolve/", after_bytes=12 * MiB, times=1)

    path = hf_hub_download(repo, "big.bin", **hub_ctx.download_kwargs())

    assert hashlib.sha256(Path(path).read_bytes()).digest() == hashlib.sha256(data).digest()
    first, second = hub.find_requests("GET", "/resolve/")
    assert (first.status, first.fault, first.bytes_out) == (200, "reset-body", 12 * MiB)
    assert second.status == 206 and second.range is not None
    offset = int(second.range.removeprefix("bytes=").split("-")[0])
    assert 0 < offset <= 12 * MiB and second.bytes_out == len(data) - offset


@pytest.mark.transfer("lfs")  # the plain HTTP download
def test_get_503_is_not_retried_and_slow_body_is_throttled(hub_ctx: HubContext) -> None:
    repo, hub = hub_ctx.repo_id(), hub_ctx.hub
    hub.create_repo(repo)
    hub.upload_bytes(repo, "a.bin", os.urandom(150_000))
    with hub.inject("503", method="GET", path="/resolve/", times=1), pytest.raises(HfHubHTTPError) as err:
        hf_hub_download(repo, "a.bin", **hub_ctx.download_kwargs())
    assert _status(err) == 503 and _statuses(hub_ctx, "GET", "/resolve/") == [503]

    hub.inject("slow", method="GET", path="/resolve/", rate=300_000)
    started = time.monotonic()
    hf_hub_download(repo, "a.bin", **hub_ctx.download_kwargs())
    assert time.monotonic() - started >= 0.45


def test_apply_then_reset_commit_lands_but_the_client_cannot_tell(hub_ctx: HubContext, new_repo: NewRepo) -> None:
    api, repo, hub = new_repo
    hub.inject("apply-then-reset", method="POST", path="/commit/", times=1)
    try:
        api.upload_file(path_or_fileobj=b"payload", path_in_repo="p.txt", repo_id=repo)
    except HfHubHTTPError:
        pytest.fail("a dropped connection must not look like an HTTP answer")
    except Exception as err:  # the HTTP library's protocol error: version-specific type
        lost: Exception = err
    else:
        pytest.fail("the client should not have received a response")
    assert "disconnect" in str(lost).lower() or "closed" in str(lost).lower()
    assert hub.file_bytes(repo, "p.txt") == b"payload"  # ...yet the commit is there
    assert _statuses(hub_ctx, "POST", "/commit/") == [200]


def test_fault_share_is_reproducible_with_a_seed_and_skip_counts(hub_ctx: HubContext) -> None:
    hub = hub_ctx.hub

    def pattern() -> list[int]:
        hub.reset_log()
        for _ in range(30):
            req = urllib.request.Request(
                f"{hub.url}/api/whoami-v2", headers={"Authorization": f"Bearer {hub_ctx.token}"}
            )
            try:
                urllib.request.urlopen(req, timeout=10).close()
            except urllib.error.HTTPError as err:
                err.close()
        return _statuses(hub_ctx, "GET", "/api/whoami-v2")

    with hub.inject("500", path="/api/whoami-v2", share=0.5, seed=7):
        first = pattern()
    with hub.inject("500", path="/api/whoami-v2", share=0.5, seed=7):
        assert pattern() == first
    assert 0 < first.count(500) < 30
    with hub.inject("502", path="/api/whoami-v2", skip=2, times=3):
        assert pattern() == [200, 200, 502, 502, 502] + [200] * 25


# -- commit preconditions ---------------------------------------------------------------------------------


def test_parent_commit_mismatch_is_412(new_repo: NewRepo) -> None:
    api, repo, hub = new_repo
    seen = api.model_info(repo).sha
    hub.upload_bytes(repo, "other.txt", b"someone else committed")

    with pytest.raises(HfHubHTTPError) as err:
        api.create_commit(repo, [CommitOperationAdd("mine.txt", b"m")], commit_message="m", parent_commit=seen)
    assert _status(err) == 412 and "mine.txt" not in hub.files(repo)
    head = api.model_info(repo).sha
    api.create_commit(repo, [CommitOperationAdd("mine.txt", b"m")], commit_message="m", parent_commit=head)
    assert "mine.txt" in hub.files(repo)


def test_commit_rate_limit_answers_429(hub_ctx: HubContext, new_repo: NewRepo) -> None:
    api, repo, hub = new_repo
    hub.set_commit_rate_limit(2)
    for i in range(2):
        api.upload_file(path_or_fileobj=f"{i}".encode(), path_in_repo=f"{i}.txt", repo_id=repo)
    with pytest.raises(HfHubHTTPError) as err:
        api.upload_file(path_or_fileobj=b"3", path_in_repo="3.txt", repo_id=repo)
    assert _status(err) == 429 and int(err.value.response.headers["Retry-After"]) > 0
    assert len(hub.commits(repo)) == 3  # initial + 2
    other = hub_ctx.repo_id()
    api.create_repo(other)
    api.upload_file(path_or_fileobj=b"ok", path_in_repo="ok.txt", repo_id=other)  # the limit is per repo


# -- standalone process + admin API -----------------------------------------------------------------------


@contextlib.contextmanager
def _standalone_hub(tmp_path: Path, *args: str) -> Iterator[tuple[str, RemoteHub]]:
    """``python -m tests.fakes.hub`` in its own process: its URL and the admin client; stopped on exit."""
    ready = tmp_path / "url"
    cmd = [sys.executable, "-m", "tests.fakes.hub", "--port", "0", "--data", str(tmp_path / "data"), *args]
    proc = subprocess.Popen([*cmd, "--ready-file", str(ready)], stdout=subprocess.PIPE, text=True, cwd=ROOT)
    try:
        deadline = time.monotonic() + 15
        while not ready.exists():
            assert proc.poll() is None and time.monotonic() < deadline, "hubserver did not start"
            time.sleep(0.05)
        url = ready.read_text().strip()
        assert proc.stdout is not None and proc.stdout.readline().strip() == url
        yield url, RemoteHub(url)
    finally:
        proc.terminate()
        assert proc.wait(timeout=10) == 0
        assert proc.stdout is not None
        proc.stdout.close()


def test_standalone_server_with_admin_api(hub_ctx: HubContext, tmp_path: Path) -> None:
    tokens = ["--token", "tok:alice:write", "--token", "ro:bob:read:acme"]
    with _standalone_hub(tmp_path, *tokens) as (url, remote):
        assert remote.health()["ok"]

        remote.create_repo("acme/data", repo_type="dataset", private=True)
        sha = remote.upload_bytes("acme/data", "train.tar", b"\0tar", repo_type="dataset")
        assert remote.commits("acme/data", repo_type="dataset")[0]["oid"] == sha
        remote.inject("503", path="/preupload/", times=1)
        with urllib.request.urlopen(f"{url}/_admin/faults") as answer:
            assert len(json.loads(answer.read())["faults"]) == 1
        remote.reset_log()

        kwargs = {"repo_type": "dataset", "endpoint": url, "token": "ro", "cache_dir": tmp_path / "cache"}
        path = hf_hub_download("acme/data", "train.tar", **kwargs)
        assert Path(path).read_bytes() == b"\0tar"
        assert remote.bytes_served("/resolve/") == 0  # an LFS file lives in the Xet CAS: read from there
        assert {r["user"] for r in remote.requests} == {"bob"}
        remote.set_xet(False)  # a Hub without Xet: the plain download
        path = hf_hub_download("acme/data", "train.tar", **kwargs, force_download=True)
        assert Path(path).read_bytes() == b"\0tar" and remote.bytes_served("/resolve/") == 4
        remote.clear_faults()


def test_a_standalone_hub_is_shaped_like_the_in_process_one(tmp_path: Path) -> None:
    """The CAS's link cap and local:// switch, set on the command line and over the admin API."""
    rate, data, other = 4 * MiB, os.urandom(6 * MiB), os.urandom(MiB)
    with _standalone_hub(tmp_path, "--token", "tok:alice:write", "--cas-bandwidth", str(rate)) as (url, remote):
        assert remote.config()["cas_bandwidth"] == rate and remote.config()["cas_over_http"] is True
        for repo, content in (("alice/w", data), ("alice/v", other)):  # huggingface_hub caches a repo's CAS
            remote.create_repo(repo)
            remote.upload_bytes(repo, "w.pt", content)  # stored in the Xet CAS
        kwargs = {"endpoint": url, "token": "tok", "cache_dir": tmp_path / "cache"}

        started = time.monotonic()
        assert Path(hf_hub_download("alice/w", "w.pt", **kwargs)).read_bytes() == data
        assert time.monotonic() - started >= 0.8 * len(data) / rate  # never faster than the link
        assert sum(r["bytes_out"] for r in remote.requests if r["path"].startswith("/cas/xorbs/")) >= len(data)

        remote.set_cas_bandwidth(None)
        remote.set_cas_over_http(False)  # hf_xet opens the Hub's CAS folder itself
        assert remote.config()["cas_bandwidth"] is None and remote.config()["cas_over_http"] is False
        grant = urllib.request.Request(f"{url}/api/models/alice/v/xet-read-token/main")
        grant.add_header("authorization", "Bearer tok")
        with urllib.request.urlopen(grant) as answer:
            assert answer.headers["X-Xet-Cas-Url"] == f"local://{tmp_path / 'data' / 'cas'}"
        remote.reset_log()
        path = hf_hub_download("alice/v", "w.pt", **kwargs)
        assert Path(path).read_bytes() == other
        assert not [r for r in remote.requests if r["path"].startswith("/cas/")]  # no CAS route was used

        remote.set_cas_over_http(True)
        assert remote.config()["cas_over_http"] is True


# -- Xet: the transfer path of the real Hub ------------------------------------------------------------


def test_xet_upload_fills_the_cas_and_downloads_byte_identical(
    hub_ctx: HubContext, new_repo: NewRepo, tmp_path: Path
) -> None:
    api, repo, hub = new_repo
    data = os.urandom(5 * MiB)
    local = tmp_path / "last.pt"
    local.write_bytes(data)

    api.upload_file(path_or_fileobj=local, path_in_repo="weights/last.pt", repo_id=repo)

    assert _statuses(hub_ctx, "GET", r"/xet-write-token/main$") == [200]
    assert not hub.find_requests(path=r"/info/lfs/|^/_lfs/")  # no byte went the LFS way
    xorbs = [p for p in (hub.cas / "xet" / "xorbs" / "xorbs").iterdir() if not p.name.endswith(".tagset")]
    assert xorbs and sum(p.stat().st_size for p in xorbs) >= len(data) // 2  # random bytes: little compression
    entry = hub.files(repo)["weights/last.pt"]
    assert entry.lfs and entry.xet_hash and entry.sha256 == hashlib.sha256(data).hexdigest()
    tree = {e.path: e for e in api.list_repo_tree(repo, recursive=True)}
    assert tree["weights/last.pt"].xet_hash == entry.xet_hash

    hub.reset_log()
    path = hf_hub_download(repo, "weights/last.pt", **hub_ctx.download_kwargs())
    assert Path(path).read_bytes() == data
    (head,) = hub.find_requests("HEAD", "/resolve/")
    assert head.status == 200 and _statuses(hub_ctx, "GET", r"/xet-read-token/") == [200]
    assert hub.bytes_served("/resolve/") == 0  # the bytes came from the CAS, not the resolve URL
    # what a client without Xet gets: the same bytes by a plain GET of the resolve URL
    with urllib.request.urlopen(hf_hub_url(repo, "weights/last.pt", endpoint=hub.url)) as plain:
        assert plain.read() == data


def test_xet_token_errors_are_retried_and_a_short_token_is_refreshed(
    hub_ctx: HubContext, new_repo: NewRepo, tmp_path: Path
) -> None:
    api, repo, hub = new_repo
    hub.set_xet(True, token_ttl=1)  # already "expired" by the client's 60 s safety margin: every use refreshes
    hub.inject("503", path=r"/xet-write-token/", times=1)
    hub.inject("reset", path=r"/xet-read-token/", times=1)
    for i in range(2):
        local = tmp_path / f"epoch_{i}.pt"
        local.write_bytes(os.urandom(MiB))
        api.upload_file(path_or_fileobj=local, path_in_repo=local.name, repo_id=repo)
        path = hf_hub_download(repo, local.name, **hub_ctx.download_kwargs())
        assert Path(path).read_bytes() == local.read_bytes()
    assert _statuses(hub_ctx, "GET", r"/xet-write-token/")[:2] == [503, 200]
    assert len(hub.find_requests("GET", r"/xet-write-token/")) >= 3  # a fresh token for the second upload
    assert _statuses(hub_ctx, "GET", r"/xet-read-token/")[0] == 0


def test_a_cas_write_failure_commits_nothing(new_repo: NewRepo, tmp_path: Path) -> None:
    api, repo, hub = new_repo
    head = hub.head(repo)
    local = tmp_path / "last.pt"
    local.write_bytes(os.urandom(MiB))
    with hub.inject("cas-unwritable", path=r"/xet-write-token/") as fault, pytest.raises(Exception):  # noqa: B017
        api.upload_file(path_or_fileobj=local, path_in_repo="last.pt", repo_id=repo)
    assert fault.fired and hub.head(repo) == head and not hub.find_requests("POST", "/commit/")
    api.upload_file(path_or_fileobj=local, path_in_repo="last.pt", repo_id=repo)  # the CAS is back
    assert hub.file_bytes(repo, "last.pt") == local.read_bytes()


@pytest.mark.transfer("lfs")
def test_a_hub_without_xet_has_no_token_route_and_serves_plain_files(hub_ctx: HubContext, new_repo: NewRepo) -> None:
    repo, hub = new_repo.repo, new_repo.hub
    data = os.urandom(MiB)
    hub.upload_bytes(repo, "data.tar", data)
    assert hub.files(repo)["data.tar"].xet_hash is None
    url = f"{hub.url}/api/models/{repo}/xet-read-token/main"
    with pytest.raises(urllib.error.HTTPError) as err:
        urllib.request.urlopen(urllib.request.Request(url, headers={"Authorization": f"Bearer {hub_ctx.token}"}))
    assert err.value.code == 404
    err.value.close()
    assert Path(hf_hub_download(repo, "data.tar", **hub_ctx.download_kwargs())).read_bytes() == data
    assert "X-Xet-Hash" not in get_hf_file_metadata(hf_hub_url(repo, "data.tar", endpoint=hub.url)).__dict__
