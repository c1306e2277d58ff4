"""The dataset stage against the local Hub, with the real client and the real `trainbox` process.

Every error of the stage, public and private repos, a pinned revision, the cache, a connection reset
mid-download and a restart mid-download, both transports, and one `trainbox run` that trains on a Hub
dataset end to end. The module runs with the Hub in Xet mode (the tar is Xet-backed and streamed from
the CAS) and in LFS mode (a plain HTTP stream); see tests/conftest.py.

The data check at the end of the stage runs the stand-in libreyolo's doctor (tests/fakes/libreyolo.py:
no finding, no torch to import); the contract tests run libreyolo's own, and read its findings.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import signal
import tarfile
import time
from pathlib import Path

import pytest

from entrypoint import errors
from tests.fakes import libreyolo as fake_libreyolo
from tests.hubfixtures import HubContext
from tests.support import Result, make_dataset, run_trainbox, start_trainbox, trainbox_env

pytestmark = pytest.mark.slow  # every test here runs the agent, or its dataset stage in-process

# What the dataset check uses; nothing is trained in `fetch`. A small model and few epochs: the disk check sizes
# the run's checkpoints from them, and a test must not need gigabytes free on the machine running it.
FAST_ARGS = "model=LibreYOLO9t.pt epochs=2 imgsz=64"
TRAIN_ARGS = "model=LibreYOLO9t.pt pretrained=false imgsz=128 epochs=2 workers=0"


def pack(source: Path, target: Path, *, extra: dict[str, bytes] | None = None, gz: bool = False) -> Path:
    """``source`` as one tar (the guide's `tar cf my-dataset.tar my-dataset/`), plus ``extra`` members."""
    with tarfile.open(target, "w:gz" if gz else "w") as archive:
        archive.add(source, arcname=source.name)
        for name, data in (extra or {}).items():
            member = tarfile.TarInfo(name)
            member.size = len(data)
            archive.addfile(member, io.BytesIO(data))
    return target


def dataset_tar(tmp_path: Path, name: str = "cones", **kwargs: object) -> Path:
    root = tmp_path / "src" / name
    make_dataset(root)
    return pack(root, tmp_path / "src" / f"{name}.tar", **kwargs)  # type: ignore[arg-type]


def publish(ctx: HubContext, files: dict[str, Path | bytes], *, private: bool = False, repo: str | None = None) -> str:
    repo = repo or ctx.repo_id("data")
    if not ctx.hub.repo_exists(repo, repo_type="dataset"):
        ctx.hub.create_repo(repo, repo_type="dataset", private=private)
    ctx.hub.commit(repo, files, repo_type="dataset", message="dataset")  # type: ignore[arg-type]
    return repo


@pytest.fixture(autouse=True)
def doctor(request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The stand-in's doctor checks the data, in this process and (``dataset_env``) in the agents it starts;
    a contract test keeps libreyolo's own."""
    if request.node.get_closest_marker("contract") is None:
        monkeypatch.setenv("TRAINBOX_LIBREYOLO", str(fake_libreyolo.install(tmp_path / "stand-in")))


def dataset_env(workdir: Path, **env: str) -> dict[str, str]:
    """``trainbox_env``, with the libreyolo ``doctor`` chose for this test."""
    chosen = os.environ.get("TRAINBOX_LIBREYOLO")
    return trainbox_env(workdir, **env) | ({"TRAINBOX_LIBREYOLO": chosen} if chosen else {})


def fetch(workdir: Path, repo: str, **env: str) -> Result:
    return run_trainbox("fetch", "--json", env=dataset_env(workdir, DATASET_REPO=repo, RUN_ARGS=FAST_ARGS, **env))


def left_behind(workdir: Path) -> list[str]:
    """What a failed fetch left in the dataset area: nothing but the repo's ref notes may remain."""
    hub_data = workdir / "data" / "hub"
    if not hub_data.exists():
        return []
    found = []
    for path in hub_data.rglob("*"):
        relative = path.relative_to(hub_data)
        if path.is_file() and "refs" in relative.parts:
            continue
        if path.is_file() or (path.is_dir() and not any(path.iterdir())):
            found.append(str(relative))
    return found


def assert_ready(result: Result, token: str | None = None) -> dict:
    assert result.returncode == 0, result.output[-3000:]
    if token:
        assert token not in result.output
    found = json.loads(result.stdout)
    data_yaml = Path(found["data_yaml"])
    config = data_yaml.read_text()
    assert f"path: {Path(found['root']) / 'cones'}" in config  # the data.yaml points at the extracted folder
    assert (Path(found["root"]) / "cones" / "images" / "train" / "000.png").is_file()
    return found


def assert_downloaded(ctx: HubContext, size: int) -> None:
    """The tar came whole the way of this transfer mode: from the Xet CAS, or over the resolve URL."""
    if ctx.xet:
        assert ctx.hub.find_requests(method="GET", path="/xet-read-token/"), "the Xet CAS was not used"
        assert ctx.hub.bytes_served("/resolve/") == 0
    else:
        assert ctx.hub.bytes_served("/resolve/") == size


# -- success paths ------------------------------------------------------------------------------
def test_public_dataset_is_fetched_then_served_from_the_volume(hub_ctx: HubContext, tmp_path: Path) -> None:
    repo = publish(hub_ctx, {"cones.tar": dataset_tar(tmp_path), "README.md": b"# cones\n"})
    workdir = tmp_path / "work"

    found = assert_ready(fetch(workdir, repo))
    assert found["revision"] == hub_ctx.hub.head(repo, repo_type="dataset")
    entry = Path(found["data_yaml"]).parent
    assert entry.name.startswith(found["revision"])
    assert not list((workdir / "data" / "hub").rglob("*.staging")) and not list((workdir / "data").rglob("*.part"))
    assert_downloaded(hub_ctx, (tmp_path / "src" / "cones.tar").stat().st_size)

    # A restart on the same volume: the marker is trusted, not one byte of the tar is downloaded.
    hub_ctx.hub.reset_log()
    again = fetch(workdir, repo)
    assert assert_ready(again)["data_yaml"] == found["data_yaml"]
    assert hub_ctx.hub.find_requests(path="/resolve/|/xet-read-token/") == []
    assert "nothing downloaded" in again.stderr and "doctor" not in again.stderr

    # A dataset whose marker is gone (a restart cut the last step short) is fetched again, not trusted.
    (entry / ".trainbox-ready.json").unlink()
    hub_ctx.hub.reset_log()
    assert_ready(fetch(workdir, repo))
    assert_downloaded(hub_ctx, (tmp_path / "src" / "cones.tar").stat().st_size)


def test_private_dataset_at_a_pinned_tag(hub_ctx: HubContext, tmp_path: Path) -> None:
    repo = publish(hub_ctx, {"cones.tar": dataset_tar(tmp_path)}, private=True)
    hub_ctx.hub.create_tag(repo, "v1", repo_type="dataset")
    tagged = hub_ctx.hub.head(repo, repo_type="dataset", revision="v1")
    # main moves on to different data; the run asks for v1.
    publish(hub_ctx, {"cones.tar": dataset_tar(tmp_path / "v2", extra={"cones/v2.txt": b"v2"})}, repo=repo)
    workdir = tmp_path / "work"

    result = fetch(workdir, repo, HF_TOKEN=hub_ctx.read_token, DATASET_REVISION="v1")
    found = assert_ready(result, hub_ctx.read_token)
    assert found["revision"] == tagged != hub_ctx.hub.head(repo, repo_type="dataset")
    assert not (Path(found["root"]) / "cones" / "v2.txt").exists()
    assert f"@v1 is commit {tagged}" in result.stderr
    for path in workdir.rglob("*"):
        if path.is_file() and path.stat().st_size < 1_000_000:
            assert hub_ctx.read_token.encode() not in path.read_bytes(), path


def test_gzipped_tar_chosen_by_dataset_file_and_the_download_then_extract_path(
    hub_ctx: HubContext, tmp_path: Path
) -> None:
    from entrypoint import settings
    from entrypoint.dataset import fetch as dataset_hub

    gz = dataset_tar(tmp_path, gz=True)
    repo = publish(hub_ctx, {"packed/cones.tar.gz": gz, "old.tar": b"not even a tar"})
    workdir = tmp_path / "work"
    # The transport xet-backed files take (hf_hub_download, then the same safe extraction).
    env = dataset_env(workdir, DATASET_REPO=repo, DATASET_FILE="packed/cones.tar.gz", RUN_ARGS=FAST_ARGS)
    prepared = dataset_hub.prepare(settings.from_env(env), stream=False)
    assert prepared.revision == hub_ctx.hub.head(repo, repo_type="dataset")
    assert (prepared.root / "cones" / "labels" / "val" / "000.txt").is_file()
    assert f"path: {prepared.root / 'cones'}" in prepared.data_yaml.read_text()
    assert not (workdir / "data" / "hub" / ".downloads").exists() or not any(
        (workdir / "data" / "hub" / ".downloads").iterdir()
    )
    assert_downloaded(hub_ctx, gz.stat().st_size)


@pytest.mark.transfer("xet")  # an error path: the transport is covered above
def test_several_data_yamls_need_data_yaml(hub_ctx: HubContext, tmp_path: Path) -> None:
    extra = {"cones/copy/data.yaml": b"train: x\nval: x\nnames: [a]\n"}
    repo = publish(hub_ctx, {"cones.tar": dataset_tar(tmp_path, extra=extra)})
    workdir = tmp_path / "work"
    result = fetch(workdir, repo)
    assert result.returncode == errors.AmbiguousDataYamlError.exit_code, result.output[-2000:]
    assert "cones/copy/data.yaml" in result.stderr and "DATA_YAML" in result.stderr
    assert left_behind(workdir) == []
    assert_ready(fetch(workdir, repo, DATA_YAML="cones/data.yaml"))


@pytest.mark.transfer("xet")  # nothing is downloaded
def test_plan_sizes_the_disk_from_the_hub_without_downloading(hub_ctx: HubContext, tmp_path: Path) -> None:
    from entrypoint import dataset, settings

    tar = dataset_tar(tmp_path)
    repo = publish(hub_ctx, {"cones.tar": tar}, private=True)
    env = dataset_env(
        tmp_path / "work", DATASET_REPO=repo, HF_TOKEN=hub_ctx.read_token, RUN_ARGS="model=LibreYOLO9s.pt epochs=100"
    )
    fields, lines = dataset.disk_report(settings.from_env(env))
    assert fields["archive_bytes"] == tar.stat().st_size
    # tar + extracted + 15 checkpoints of YOLO9-s (last, best, every 10th epoch, upload copies), +30 %
    assert 2e9 < fields["required_bytes"] < 3e9 and fields["model"] == "LibreYOLO9s.pt"
    # the disk to rent, as the templates say: 2.5x the tar + 30 GB
    assert fields["recommended_disk_gb"] == 31 and "rent at least 31 GB" in "\n".join(lines)
    # `trainbox plan` sizes the dataset from that tar too: its images estimated, and said so
    from entrypoint.report import plan

    report, _ = plan.report(settings.from_env(env), plan.Options(gpu="L4"))
    assert report["dataset"]["images"] >= 1 and f"{repo}: the tar is" in report["dataset"]["basis"]
    assert report["estimate"]["images"] == report["dataset"]["images"]
    assert hub_ctx.hub.find_requests(method="GET", path="/resolve/") == []


def test_an_unreachable_hub_falls_back_to_the_commit_already_on_the_volume(hub_ctx: HubContext, tmp_path: Path) -> None:
    from entrypoint.dataset import fetch as dataset_hub
    from entrypoint.errors import DatasetError
    from entrypoint.hub import Hub

    repo = publish(hub_ctx, {"cones.tar": dataset_tar(tmp_path)})
    workdir = tmp_path / "work"
    found = assert_ready(fetch(workdir, repo))
    store = workdir / "data" / "hub" / repo.replace("/", "--")
    waits: list[float] = []
    # Nothing listens on port 9 of this host: every attempt is refused, as in a Hub outage.
    offline = Hub(token=None, endpoint="http://127.0.0.1:9")
    sha = dataset_hub.resolve_revision(offline, repo, "main", store, sleep=waits.append)
    assert sha == found["revision"] and len(waits) > 1  # retried first, then fell back
    with pytest.raises(DatasetError, match="cannot reach the Hub"):
        dataset_hub.resolve_revision(offline, repo, "other-branch", store, sleep=waits.append)


# -- interrupted downloads ------------------------------------------------------------------------
def big_dataset(tmp_path: Path) -> Path:
    """A dataset tar of a few MB (random padding), so a download can be cut in the middle."""
    return dataset_tar(tmp_path, extra={"cones/extras/blob.bin": os.urandom(6 * 1024 * 1024)})


@pytest.mark.transfer("lfs")  # the plain HTTP stream (Xet: the tests below)
def test_connection_reset_mid_download_resumes_with_range(hub_ctx: HubContext, tmp_path: Path) -> None:
    tar = big_dataset(tmp_path)
    size = tar.stat().st_size
    repo = publish(hub_ctx, {"cones.tar": tar})
    cut = size // 3
    hub_ctx.hub.inject("reset-body", method="GET", path="/resolve/", times=1, after_bytes=cut)

    result = fetch(tmp_path / "work", repo)
    assert_ready(result)
    gets = hub_ctx.hub.find_requests(method="GET", path="/resolve/")
    assert [request.range for request in gets] == [None, f"bytes={cut}-"]
    assert hub_ctx.hub.bytes_served("/resolve/") == size  # not one byte twice
    assert f"resuming at byte {cut}" in result.stderr


@pytest.mark.transfer("lfs")  # the plain HTTP stream (Xet: the tests below)
def test_restart_after_a_kill_mid_download_continues_from_the_partial_file(hub_ctx: HubContext, tmp_path: Path) -> None:
    tar = big_dataset(tmp_path)
    size = tar.stat().st_size
    repo = publish(hub_ctx, {"cones.tar": tar})
    workdir = tmp_path / "work"
    env = dataset_env(workdir, DATASET_REPO=repo, RUN_ARGS=FAST_ARGS)
    slow = hub_ctx.hub.inject("slow", method="GET", path="/resolve/", rate=2 * 1024 * 1024)

    process = start_trainbox("fetch", env=env)
    downloads = workdir / "data" / "hub" / ".downloads"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and process.poll() is None:
        parts = list(downloads.glob("*.part")) if downloads.exists() else []
        if parts and parts[0].stat().st_size >= size // 4:
            break
        time.sleep(0.05)
    process.send_signal(signal.SIGKILL)  # the machine goes away mid-download
    process.communicate(timeout=30)  # reaps it and closes its pipes
    (partial,) = downloads.glob("*.part")
    kept = partial.stat().st_size
    assert 0 < kept < size
    assert not list((workdir / "data" / "hub").glob("*/*--cones.tar"))  # no half dataset looks ready

    slow.remove()
    hub_ctx.hub.reset_log()
    result = run_trainbox("fetch", "--json", env=env)
    assert_ready(result)
    (get,) = hub_ctx.hub.find_requests(method="GET", path="/resolve/")
    assert get.range == f"bytes={kept}-"
    assert hub_ctx.hub.bytes_served("/resolve/") == size - kept
    assert not partial.exists()


def test_a_stopped_download_is_kept_and_the_next_start_continues_it(
    hub_ctx: HubContext, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from entrypoint import settings
    from entrypoint.dataset import extract
    from entrypoint.dataset import fetch as dataset_hub

    # Bigger than the bytes in flight between download and extraction (~17 MB), so the stop lands mid-download.
    tar = dataset_tar(tmp_path, extra={"cones/extras/blob.bin": os.urandom(48 * 1024 * 1024)})
    size = tar.stat().st_size
    repo = publish(hub_ctx, {"cones.tar": tar})
    env = dataset_env(tmp_path / "work", DATASET_REPO=repo, RUN_ARGS=FAST_ARGS)
    extract_all = extract.extract

    def stopped_at_a_quarter(chunks: object, *args: object, **kwargs: object) -> object:
        def until_stopped() -> object:
            got = 0
            for chunk in chunks:  # type: ignore[attr-defined]
                yield chunk
                got += len(chunk)
                if got >= size // 4:  # what the SIGTERM handler does to the stage in progress
                    raise errors.PreemptedError("received SIGTERM: the machine is being taken back")

        return extract_all(until_stopped(), *args, **kwargs)

    monkeypatch.setattr(extract, "extract", stopped_at_a_quarter)
    with pytest.raises(errors.PreemptedError):
        dataset_hub.prepare(settings.from_env(env))
    (partial,) = (tmp_path / "work" / "data" / "hub" / ".downloads").glob("*.part")
    kept = partial.stat().st_size
    assert size // 4 <= kept < size, "the bytes of the stopped download were not kept"

    monkeypatch.setattr(extract, "extract", extract_all)
    starts: list[int] = []
    xet_stream = dataset_hub.xet_stream_dataset_file

    def watched(hub: object, remote: object, start: int = 0, **kwargs: object) -> object:
        starts.append(start)
        return xet_stream(hub, remote, start, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(dataset_hub, "xet_stream_dataset_file", watched)
    hub_ctx.hub.reset_log()
    prepared = dataset_hub.prepare(settings.from_env(env))
    assert (prepared.root / "cones" / "extras" / "blob.bin").stat().st_size == 48 * 1024 * 1024
    assert not partial.exists()
    if hub_ctx.xet:
        assert starts == [kept] and hub_ctx.hub.bytes_served("/resolve/") == 0
    else:
        (get,) = hub_ctx.hub.find_requests(method="GET", path="/resolve/")
        assert get.range == f"bytes={kept}-" and hub_ctx.hub.bytes_served("/resolve/") == size - kept


@pytest.mark.transfer("xet")
def test_a_stalled_xet_download_is_retried_then_continued_over_http(
    hub_ctx: HubContext, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    from entrypoint import settings
    from entrypoint.dataset import fetch as dataset_hub
    from entrypoint.dataset import hub_reads

    tar = big_dataset(tmp_path)
    repo = publish(hub_ctx, {"cones.tar": tar})
    monkeypatch.setattr(hub_reads, "XET_STALL_S", 1.0)  # a minute in production
    hub_ctx.hub.inject("slow", method="GET", path="/xet-read-token/", rate=1)  # the CAS never answers
    env = dataset_env(tmp_path / "work", DATASET_REPO=repo, RUN_ARGS=FAST_ARGS)
    with caplog.at_level("WARNING", logger="trainbox"):
        prepared = dataset_hub.prepare(settings.from_env(env))
    assert (prepared.root / "cones" / "images" / "train" / "000.png").is_file()
    assert "trying once more" in caplog.text and "continuing over plain HTTP" in caplog.text
    assert hub_ctx.hub.bytes_served("/resolve/") == tar.stat().st_size


@pytest.mark.contract  # libreyolo's doctor, started by the agent, writes nothing under $HOME either
@pytest.mark.transfer("xet")
def test_the_agents_hugging_face_state_lives_on_the_volume(hub_ctx: HubContext, tmp_path: Path) -> None:
    repo = publish(hub_ctx, {"cones.tar": dataset_tar(tmp_path)})
    workdir, home = tmp_path / "work", tmp_path / "home"
    home.mkdir()
    env = dataset_env(workdir, DATASET_REPO=repo, RUN_ARGS=FAST_ARGS, HOME=str(home))
    for name in ("HF_HOME", "HF_HUB_CACHE", "HF_XET_CACHE", "XDG_CACHE_HOME"):
        env.pop(name, None)
    assert_ready(run_trainbox("fetch", "--json", env=env))
    assert hub_ctx.hub.find_requests(method="GET", path="/xet-read-token/")  # hf_xet did the transfer
    assert list(home.rglob("*")) == []  # nothing under $HOME/.cache (nor anywhere in $HOME)
    assert (workdir / ".cache" / "huggingface" / "xet").is_dir()


def test_a_corrupt_partial_file_fails_the_checksum_and_is_not_reused(hub_ctx: HubContext, tmp_path: Path) -> None:
    tar = big_dataset(tmp_path)
    data = tar.read_bytes()
    repo = publish(hub_ctx, {"cones.tar": tar})
    workdir = tmp_path / "work"
    # What an earlier, interrupted run left: the first half of the tar, one byte of the padding flipped
    # (a damaged disk block: the tar structure still parses, only the checksum can tell).
    kept = bytearray(data[: len(data) // 2])
    kept[-1000] ^= 0xFF
    downloads = workdir / "data" / "hub" / ".downloads"
    downloads.mkdir(parents=True)
    partial = downloads / f"{hashlib.sha256(data).hexdigest()}.part"
    partial.write_bytes(kept)

    result = fetch(workdir, repo)
    assert result.returncode == errors.CorruptArchiveError.exit_code, result.output[-2000:]
    assert "checksum" in result.stderr
    assert not partial.exists() and left_behind(workdir) == []
    assert_ready(fetch(workdir, repo))  # the next start downloads it whole


# -- every error, each with its own message and exit code -----------------------------------------
@pytest.mark.transfer("xet")  # an error path: the transport is covered above
def test_repo_not_found(hub_ctx: HubContext, tmp_path: Path) -> None:
    result = fetch(tmp_path / "work", f"{hub_ctx.user}/no-such-data", HF_TOKEN=hub_ctx.token)
    assert result.returncode == errors.DatasetNotFoundError.exit_code, result.output[-2000:]
    assert "not found" in result.stderr and "DATASET_REPO" in result.stderr
    assert hub_ctx.token not in result.output


@pytest.mark.transfer("xet")  # an error path: the transport is covered above
def test_private_repo_without_a_token_or_with_a_bad_one(hub_ctx: HubContext, tmp_path: Path) -> None:
    repo = publish(hub_ctx, {"cones.tar": dataset_tar(tmp_path)}, private=True)
    anonymous = fetch(tmp_path / "work", repo)
    assert anonymous.returncode == errors.DatasetAccessError.exit_code, anonymous.output[-2000:]
    assert "HF_TOKEN is not set" in anonymous.stderr

    bad = "hf_" + "x" * 30
    refused = fetch(tmp_path / "work", repo, HF_TOKEN=bad)
    assert refused.returncode == errors.DatasetAccessError.exit_code, refused.output[-2000:]
    assert "refused HF_TOKEN" in refused.stderr and bad not in refused.output

    _, stranger = hub_ctx.new_user()  # a valid token of someone who cannot see the repo
    hidden = fetch(tmp_path / "work", repo, HF_TOKEN=stranger)
    assert hidden.returncode == errors.DatasetNotFoundError.exit_code, hidden.output[-2000:]
    assert left_behind(tmp_path / "work") == []


@pytest.mark.transfer("xet")  # an error path: the transport is covered above
def test_revision_not_found(hub_ctx: HubContext, tmp_path: Path) -> None:
    repo = publish(hub_ctx, {"cones.tar": dataset_tar(tmp_path)})
    result = fetch(tmp_path / "work", repo, DATASET_REVISION="v9")
    assert result.returncode == errors.RevisionNotFoundError.exit_code, result.output[-2000:]
    assert "'v9'" in result.stderr and "DATASET_REVISION" in result.stderr


@pytest.mark.parametrize(
    ("files", "env", "code", "words"),
    [
        ({"README.md": b"# none\n"}, {}, errors.NoArchiveError.exit_code, "no .tar, .tar.gz or .zip"),
        ({"a.tar": b"a", "b.tar.gz": b"b"}, {}, errors.AmbiguousArchiveError.exit_code, "a.tar, b.tar.gz"),
        ({"a.tar": b"a"}, {"DATASET_FILE": "c.tar"}, errors.NoArchiveError.exit_code, "c.tar is not in"),
    ],
    ids=["no-tar", "several-tars", "missing-dataset-file"],
)
@pytest.mark.transfer("xet")  # an error path: the transport is covered above
def test_archive_choice_errors(
    hub_ctx: HubContext, tmp_path: Path, files: dict[str, bytes], env: dict[str, str], code: int, words: str
) -> None:
    repo = publish(hub_ctx, files)  # type: ignore[arg-type]
    result = fetch(tmp_path / "work", repo, **env)
    assert result.returncode == code, result.output[-2000:]
    assert words in result.stderr
    assert hub_ctx.hub.find_requests(method="GET", path="/resolve/") == []


@pytest.mark.transfer("xet")  # an error path: the transport is covered above
def test_truncated_tar(hub_ctx: HubContext, tmp_path: Path) -> None:
    whole = dataset_tar(tmp_path).read_bytes()
    repo = publish(hub_ctx, {"cones.tar": whole[: len(whole) // 2]})
    workdir = tmp_path / "work"
    result = fetch(workdir, repo)
    assert result.returncode == errors.CorruptArchiveError.exit_code, result.output[-2000:]
    assert "truncated" in result.stderr
    assert left_behind(workdir) == []


@pytest.mark.transfer("xet")  # an error path: the transport is covered above
def test_refused_member_is_named_and_nothing_is_left(hub_ctx: HubContext, tmp_path: Path) -> None:
    tar = dataset_tar(tmp_path, extra={"../../escaped.txt": b"pwned"})
    repo = publish(hub_ctx, {"cones.tar": tar})
    workdir = tmp_path / "work"
    result = fetch(workdir, repo)
    assert result.returncode == errors.UnsafeArchiveError.exit_code, result.output[-2000:]
    assert "'../../escaped.txt'" in result.stderr
    assert left_behind(workdir) == []
    assert not list(tmp_path.rglob("escaped.txt"))


@pytest.mark.transfer("xet")  # an error path: the transport is covered above
def test_disk_too_small_stops_before_downloading(hub_ctx: HubContext, tmp_path: Path) -> None:
    repo = publish(hub_ctx, {"cones.tar": dataset_tar(tmp_path)})
    # A run that keeps a checkpoint of the biggest model every epoch for a million epochs needs petabytes.
    huge = "model=LibreYOLO9x.pt epochs=1000000 save_period=1"
    result = run_trainbox("fetch", env=dataset_env(tmp_path / "work", DATASET_REPO=repo, RUN_ARGS=huge))
    assert result.returncode == errors.DiskSpaceError.exit_code, result.output[-2000:]
    assert "GB free" in result.stderr and "rent a disk of at least" in result.stderr
    assert hub_ctx.hub.find_requests(method="GET", path="/resolve/") == []


@pytest.mark.transfer("xet")  # an error path: the transport is covered above
def test_no_data_yaml(hub_ctx: HubContext, tmp_path: Path) -> None:
    root = tmp_path / "src" / "cones"
    make_dataset(root).unlink()
    repo = publish(hub_ctx, {"cones.tar": pack(root, tmp_path / "src" / "cones.tar")})
    workdir = tmp_path / "work"
    result = fetch(workdir, repo)
    assert result.returncode == errors.DataYamlNotFoundError.exit_code, result.output[-2000:]
    assert "no data.yaml" in result.stderr
    assert left_behind(workdir) == []


@pytest.mark.contract  # libreyolo doctor's report, read by the agent
@pytest.mark.transfer("xet")  # an error path: the transport is covered above
def test_doctor_errors_stop_the_stage(hub_ctx: HubContext, tmp_path: Path) -> None:
    root = tmp_path / "src" / "cones"
    make_dataset(root)
    (root / "labels" / "train" / "000.txt").write_text("0 0.5 0.5\n")  # a row doctor reads as malformed
    repo = publish(hub_ctx, {"cones.tar": pack(root, tmp_path / "src" / "cones.tar")})
    workdir = tmp_path / "work"
    result = fetch(workdir, repo)
    assert result.returncode == errors.DatasetInvalidError.exit_code, result.output[-2000:]
    assert "malformed label line" in result.stderr
    assert "(cones/labels/train/000.txt)" in result.stderr  # the dataset's own path, not the volume's staging folder
    assert left_behind(workdir) == []


# -- the whole job ----------------------------------------------------------------------------------
@pytest.mark.contract  # a real training leaves nothing in $HOME: what the agent passes to libreyolo
@pytest.mark.transfer("xet")  # the transfers are covered in both modes above; this one trains
def test_run_trains_on_a_private_hub_dataset(hub_ctx: HubContext, tmp_path: Path) -> None:
    repo = publish(hub_ctx, {"cones.tar": dataset_tar(tmp_path)}, private=True)
    workdir, home = tmp_path / "work", tmp_path / "home"
    home.mkdir()
    env = dataset_env(workdir, DATASET_REPO=repo, HF_TOKEN=hub_ctx.token, GPUS="cpu", RUN_ARGS=TRAIN_ARGS)
    env["OUTPUT_REPO"] = output = hub_ctx.repo_id("trained")
    for name in ("HF_HOME", "HF_HUB_CACHE", "HF_XET_CACHE", "XDG_CACHE_HOME"):
        env.pop(name, None)  # the agent's own defaults: its Hugging Face state on the volume
    result = run_trainbox("run", env=env | {"HOME": str(home)})
    assert result.returncode == 0, result.output[-3000:]
    assert hub_ctx.token not in result.output
    assert hub_ctx.hub.files(output)["weights/last.pt"].xet_hash  # uploaded through Xet
    assert not (home / ".cache").exists(), sorted(str(p) for p in home.rglob("*"))[:20]
    assert (workdir / ".cache" / "huggingface" / "xet").is_dir()

    (state_file,) = (workdir / "runs").glob("*/trainbox.json")
    state = json.loads(state_file.read_text())
    assert state["phase"] == "done"
    assert state["dataset"]["revision"] == hub_ctx.hub.head(repo, repo_type="dataset")
    assert state["dataset"]["source"].startswith(f"{repo}@")
    weights = state_file.parent / "weights"
    assert (weights / "best.pt").stat().st_size > 0 and (weights / "last.pt").stat().st_size > 0
    assert hub_ctx.token not in state_file.read_text()


# -- a local tar goes through the same safe extraction and cache -----------------------------------
def test_local_tar_is_extracted_safely_and_cached(tmp_path: Path) -> None:
    workdir = tmp_path / "work"
    env = dataset_env(workdir, DATASET_REPO=str(dataset_tar(tmp_path)), RUN_ARGS=FAST_ARGS)
    assert_ready(run_trainbox("fetch", "--json", env=env))
    again = run_trainbox("fetch", "--json", env=env)
    assert_ready(again)
    assert "already extracted" in again.stderr and "doctor" not in again.stderr

    evil = tmp_path / "evil.txt"
    hostile = dataset_tar(tmp_path / "hostile", extra={str(evil): b"pwned"})
    result = run_trainbox("fetch", env=dataset_env(workdir, DATASET_REPO=str(hostile), RUN_ARGS=FAST_ARGS))
    assert result.returncode == errors.UnsafeArchiveError.exit_code, result.output[-2000:]
    assert f"'{evil}'" in result.stderr and "absolute" in result.stderr
    assert not evil.exists() and not list((workdir / "data" / "local").glob(".*staging"))
