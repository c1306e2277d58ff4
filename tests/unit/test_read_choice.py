"""What the read side (sync/read.py) picks from OUTPUT_REPO: which trainbox.json a resume reads (the repo's, or the
newer one of the bucket it names), whether the repo holds a newer epoch than the volume (``trainbox sync`` on an
older volume keeps the repo's files), and what the repo's files say before a download. A Hub stand-in that
answers the three calls the read side makes (head, list_files, download) over files held in memory; stand-in
checkpoints (tests/fakes/libreyolo.py), no training."""

from __future__ import annotations

import hashlib
import json
import logging
import shutil
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import pytest

from entrypoint.hub import Hub
from entrypoint.state import STATE_FILE
from entrypoint.sync import read
from entrypoint.sync.bucket import Bucket, RunFolder
from entrypoint.sync.protocol import Manifest
from tests.fakes import libreyolo as fake_libreyolo

pytestmark = pytest.mark.protocol  # the protocol lane: fast, real tests of the store protocol's code

REPO = "org/model"


class _Hub:
    """OUTPUT_REPO's files at its head (``None``: no repo): each listed with its LFS sha256 when it is a checkpoint."""

    def __init__(self, files: dict[str, bytes] | None) -> None:
        self.files = files
        self.calls: list[tuple[Any, ...]] = []

    def head(self, repo_id: str) -> str | None:
        self.calls.append(("head", repo_id))
        return None if self.files is None or repo_id != REPO else "c0ffee"  # only OUTPUT_REPO is there

    def list_files(self, repo_id: str, revision: str | None = None) -> list[Any]:
        self.calls.append(("list", repo_id, revision))
        assert self.files is not None and repo_id == REPO, "a repo that does not exist is never listed"
        return [
            SimpleNamespace(
                path=name,
                lfs=SimpleNamespace(sha256=hashlib.sha256(data).hexdigest()) if name.endswith(".pt") else None,
            )
            for name, data in self.files.items()
        ]

    def download(self, repo_id: str, filename: str, target_dir: Path, revision: str | None = None) -> Path:
        self.calls.append(("download", repo_id, filename, target_dir, revision))
        assert self.files is not None and repo_id == REPO
        path = target_dir / filename
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(self.files[filename])
        return path


def hub(files: dict[str, bytes] | None) -> Any:
    return _Hub(files)


def checkpoint(epochs: int) -> bytes:
    return fake_libreyolo._checkpoint(epochs, 30)


def volume(run_dir: Path, epochs: int) -> Path:
    last = run_dir / "weights" / "last.pt"
    last.parent.mkdir(parents=True, exist_ok=True)
    last.write_bytes(checkpoint(epochs))
    return last


def state(**values: Any) -> bytes:
    return json.dumps(values).encode()


# -- RepoSource ---------------------------------------------------------------------------------------------
def test_the_repos_names_say_a_snapshots_epochs_and_its_lfs_sha_says_whether_the_volume_holds_it(
    tmp_path: Path,
) -> None:
    files = {"weights/last.pt": checkpoint(4), "weights/epoch_12.pt": checkpoint(12), "status.json": b"{}"}
    repo_hub = hub(files)
    source = read.RepoSource(cast(Hub, repo_hub), REPO, {e.path: e for e in repo_hub.list_files(REPO)}, "abc")

    assert (source.hub, source.repo_id, source.revision, source.label) == (repo_hub, REPO, "abc", "on the Hub")
    assert sorted(source.names()) == sorted(files)
    assert source.epochs_hint("weights/epoch_12.pt") == 12
    assert source.epochs_hint("weights/last.pt") is None, "last.pt: its epochs are known only once read"
    assert source.epochs_hint("weights/epoch_12.pt.tmp") is None
    same = volume(tmp_path / "run", 4)
    assert source.same_as("weights/last.pt", same)
    assert not source.same_as("weights/epoch_12.pt", same), "other bytes"
    assert not source.same_as("weights/last.pt", tmp_path / "absent.pt"), "nothing on the volume"
    (tmp_path / "status.json").write_bytes(b"{}")
    assert not source.same_as("status.json", tmp_path / "status.json"), "a file kept in git: no sha256 listed"
    assert not source.same_as("weights/best.pt", same), "not in the repo"

    fetched = source.fetch("weights/epoch_12.pt", tmp_path / "scratch")
    assert fetched == tmp_path / "scratch" / "repo" / "weights" / "epoch_12.pt"
    assert repo_hub.calls[-1] == ("download", REPO, "weights/epoch_12.pt", tmp_path / "scratch" / "repo", "abc")


# -- hub_newer: trainbox sync on an older volume -------------------------------------------------------------
def test_a_repo_holding_a_newer_epoch_than_the_volume_keeps_its_files_but_trainbox_json(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    run_dir, work = tmp_path / "run", tmp_path / "volume" / "work"  # not made yet
    volume(run_dir, 3)
    files = {"weights/last.pt": checkpoint(5), "metrics.jsonl": b"{}\n", STATE_FILE: state(run_name="r")}

    with caplog.at_level(logging.INFO, logger="trainbox"):
        kept = read.hub_newer(cast(Hub, repo_hub := hub(files)), REPO, run_dir, work)

    assert kept == frozenset({"weights/last.pt", "metrics.jsonl"}), "trainbox.json is the volume's to write"
    assert (
        "sync: org/model holds epoch 5, this volume only 3: its older files stay off the Hub until written again"
        in caplog.text
    )
    downloads = [call[3] for call in repo_hub.calls if call[0] == "download"]
    assert downloads and all(work in target.parents for target in downloads), "read into a scratch on the volume"
    assert list(work.iterdir()) == [], "its scratch is gone"


@pytest.mark.parametrize(
    ("on_volume", "in_repo"), [(5, 5), (6, 5), (5, None)], ids=["same-epoch", "volume-newer", "repo-without-last"]
)
def test_a_repo_no_newer_than_the_volume_keeps_nothing_from_it(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, on_volume: int, in_repo: int | None
) -> None:
    run_dir, work = tmp_path / "run", tmp_path / "work"
    volume(run_dir, on_volume)
    files = {STATE_FILE: state(run_name="r"), "README.md": b"# model"}
    if in_repo is not None:
        files["weights/last.pt"] = checkpoint(in_repo) + b"\n"  # other bytes than the volume's: downloaded, read
    assert read.hub_newer(cast(Hub, hub(files)), REPO, run_dir, work) == frozenset()
    assert list(work.iterdir()) == [] and "corrupt" not in caplog.text, "read whole, and no newer"


def test_a_repo_whose_last_pt_is_the_volumes_is_not_downloaded_and_not_newer(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    volume(run_dir, 2)
    repo_hub = hub({"weights/last.pt": checkpoint(2)})
    assert read.hub_newer(cast(Hub, repo_hub), REPO, run_dir, tmp_path / "work") == frozenset()
    assert not [call for call in repo_hub.calls if call[0] == "download"]


def test_an_empty_volume_takes_any_epoch_of_the_repo_as_newer_and_no_repo_as_nothing(tmp_path: Path) -> None:
    files = {"weights/last.pt": checkpoint(1), STATE_FILE: state()}
    assert read.hub_newer(cast(Hub, hub(files)), REPO, tmp_path / "run", tmp_path / "v" / "w") == {"weights/last.pt"}
    none = hub(None)
    assert read.hub_newer(cast(Hub, none), REPO, tmp_path / "run", tmp_path / "w2") == frozenset()
    assert none.calls == [("head", REPO)] and not (tmp_path / "w2").exists()


# -- remote_state --------------------------------------------------------------------------------------------
def test_the_repos_trainbox_json_is_read_when_it_holds_one(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    assert read.remote_state(cast(Hub, hub(None)), REPO, tmp_path) is None, "no repo yet"
    assert read.remote_names(cast(Hub, hub(None)), REPO) == set()
    assert read.remote_state(cast(Hub, hub({"README.md": b"#"})), REPO, tmp_path) is None, "a repo of no run"
    held = hub({STATE_FILE: state(run_id="abc", phase="training"), "README.md": b"#"})
    assert read.remote_names(cast(Hub, held), REPO) == {STATE_FILE, "README.md"}
    assert read.remote_state(cast(Hub, held), REPO, tmp_path / "s") == {"run_id": "abc", "phase": "training"}
    assert held.calls[-1] == ("download", REPO, STATE_FILE, tmp_path / "s", None)
    listed = hub({STATE_FILE: state(run_id="abc")})
    assert read.remote_state(cast(Hub, listed), REPO, tmp_path / "n", names={STATE_FILE}) == {"run_id": "abc"}
    assert [call[0] for call in listed.calls] == ["download"], "the names given: no listing"
    assert read.remote_state(cast(Hub, listed), REPO, tmp_path / "n", names={"README.md"}) is None
    for torn in (b"{not json", b"[1, 2]"):
        assert read.remote_state(cast(Hub, hub({STATE_FILE: torn})), REPO, tmp_path / "t") is None
    assert "resume: trainbox.json in org/model is unreadable; ignoring its history" in caplog.text


# -- newest_state: the repo's trainbox.json, or its bucket's newer one ----------------------------------------
class _BucketState:
    """bucket_state as newest_state calls it: the folders asked (bucket, run name, run id, a scratch there), and
    ``answer``, the bucket's trainbox.json."""

    def __init__(self) -> None:
        self.asked: list[tuple[str, str, str, Path]] = []
        self.answer: dict[str, Any] | None = None

    def __call__(self, folder: RunFolder, scratch: Path, **_: Any) -> dict[str, Any] | None:
        self.asked.append((folder.bucket.bucket_id, folder.run_name, folder.run_id, scratch.parent))
        return self.answer


@pytest.fixture
def in_bucket(monkeypatch: pytest.MonkeyPatch) -> _BucketState:
    stand_in = _BucketState()
    monkeypatch.setattr(read, "bucket_state", stand_in)
    return stand_in


def newest(tmp_path: Path, repo_state: dict[str, Any]) -> dict[str, Any] | None:
    return read.newest_state(
        cast(Hub, hub({STATE_FILE: json.dumps(repo_state).encode()})), REPO, tmp_path / "volume" / "w"
    )


BUCKETED = {"storage": {"mode": "bucket", "bucket": "org/ckpt"}, "run_name": "run-a", "run_id": "1234abcd"}


@pytest.mark.parametrize(
    ("repo_at", "bucket_at", "wins"),
    [("2026-12-07T10:00:00", "2026-12-07T11:00:00", "bucket"), ("2026-12-07T12:00:00", "2026-12-07T11:00:00", "repo")],
)
def test_a_resume_reads_the_newer_of_the_repos_and_its_buckets_trainbox_json(
    tmp_path: Path, in_bucket: _BucketState, repo_at: str, bucket_at: str, wins: str
) -> None:
    in_bucket.answer = {**BUCKETED, "updated_at": bucket_at, "from": "bucket"}

    found = newest(tmp_path, {**BUCKETED, "updated_at": repo_at, "from": "repo"})

    assert found is not None and found["from"] == wins
    assert in_bucket.asked == [("org/ckpt", "run-a", "1234abcd", tmp_path / "volume" / "w")], (
        "the run's folder, read on the volume"
    )
    assert list((tmp_path / "volume" / "w").iterdir()) == [], "its scratch is gone"


def test_a_bucket_without_a_state_leaves_the_repos(tmp_path: Path, in_bucket: _BucketState) -> None:
    repo_state = {**BUCKETED, "updated_at": "2026-12-07T10:00:00"}
    assert newest(tmp_path, repo_state) == repo_state and len(in_bucket.asked) == 1


@pytest.mark.parametrize("undated", ["repo", "bucket"])
def test_an_undated_state_loses_to_a_dated_one(tmp_path: Path, in_bucket: _BucketState, undated: str) -> None:
    dated = {"updated_at": "2026-12-07T10:00:00"}
    in_bucket.answer = {**BUCKETED, "from": "bucket", **(dated if undated == "repo" else {})}
    found = newest(tmp_path, {**BUCKETED, "from": "repo", **(dated if undated == "bucket" else {})})
    assert found is not None and found["from"] != undated


@pytest.mark.parametrize(
    "repo_state",
    [
        {"run_name": "run-a", "run_id": "1234abcd"},  # no bucket: the repo is the working store
        {**BUCKETED, "storage": {"mode": "repo", "bucket": None}},
        {**BUCKETED, "storage": "org/ckpt"},  # not an object
        {**BUCKETED, "run_id": None},
        {**BUCKETED, "run_name": ""},
    ],
    ids=["no-storage", "no-bucket", "storage-not-an-object", "no-run-id", "no-run-name"],
)
def test_a_state_that_names_no_bucket_of_a_known_run_is_the_repos_own(
    tmp_path: Path, in_bucket: _BucketState, repo_state: dict[str, Any]
) -> None:
    in_bucket.answer = {"from": "bucket", "updated_at": "9999"}
    assert newest(tmp_path, repo_state) == repo_state and in_bucket.asked == [], "no bucket read"


def test_no_repo_no_state(tmp_path: Path, in_bucket: _BucketState) -> None:
    assert read.newest_state(cast(Hub, hub(None)), REPO, tmp_path / "volume" / "w") is None and in_bucket.asked == []
    assert list((tmp_path / "volume" / "w").iterdir()) == []


# -- the read's own folders: one already there, a scratch already gone ------------------------------------------
def test_a_volume_checkpoint_that_records_no_epoch_takes_the_repos_first_epoch_as_newer(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    volume(run_dir, 0)  # a checkpoint saved before its first epoch completed
    files = {"weights/last.pt": checkpoint(1), STATE_FILE: state()}
    assert read.hub_newer(cast(Hub, hub(files)), REPO, run_dir, tmp_path / "work") == {"weights/last.pt"}


def test_the_reads_run_again_in_a_work_folder_already_there(tmp_path: Path, in_bucket: _BucketState) -> None:
    work = tmp_path / "volume" / "w"
    (work / "kept").mkdir(parents=True)  # an earlier attempt's work folder, with its files
    files = {"weights/last.pt": checkpoint(4), STATE_FILE: state(**BUCKETED, updated_at="2026-12-07T10:00:00")}
    for _ in range(2):
        assert read.hub_newer(cast(Hub, hub(files)), REPO, tmp_path / "run", work) == {"weights/last.pt"}
        found = read.newest_state(cast(Hub, hub(files)), REPO, work)
        assert found is not None and found["run_id"] == "1234abcd"
    assert [path.name for path in work.iterdir()] == ["kept"], "only the scratch folders go"


def test_a_scratch_folder_already_gone_when_the_read_ends_leaves_its_answer_standing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, in_bucket: _BucketState
) -> None:
    """A cleaner of the volume (or a person) removed the read's scratch folder: its removal fails, the read
    stands."""
    work = tmp_path / "w"
    in_bucket.answer = {**BUCKETED, "updated_at": "2026-12-07T11:00:00", "from": "bucket"}
    real_bucket_state = in_bucket.__call__

    def bucket_state_then_cleaned(folder: RunFolder, scratch: Path, **options: Any) -> dict[str, Any] | None:
        answer = real_bucket_state(folder, scratch, **options)
        shutil.rmtree(scratch)
        return answer

    monkeypatch.setattr(read, "bucket_state", bucket_state_then_cleaned)
    repo_state = {**BUCKETED, "updated_at": "2026-12-07T10:00:00", "from": "repo"}
    found = read.newest_state(cast(Hub, hub({STATE_FILE: json.dumps(repo_state).encode()})), REPO, work)
    assert found is not None and found["from"] == "bucket"

    real_newest_in = read.newest_in

    def newest_in_then_cleaned(source: Any, scratch: Path, *args: Any, **options: Any) -> Any:
        found = real_newest_in(source, scratch, *args, **options)
        shutil.rmtree(scratch)
        return found

    monkeypatch.setattr(read, "newest_in", newest_in_then_cleaned)
    files = {"weights/last.pt": checkpoint(4)}
    assert read.hub_newer(cast(Hub, hub(files)), REPO, tmp_path / "run", work) == {"weights/last.pt"}


def test_the_buckets_trainbox_json_is_read_through_the_repos_hub(tmp_path: Path, in_bucket: _BucketState) -> None:
    seen: list[object] = []
    real = in_bucket.__call__
    repo_hub = hub({STATE_FILE: json.dumps({**BUCKETED, "updated_at": "1"}).encode()})

    def recording(folder: RunFolder, scratch: Path, **options: Any) -> dict[str, Any] | None:
        seen.append(folder.bucket.hub)
        return real(folder, scratch, **options)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(read, "bucket_state", recording)
        read.newest_state(cast(Hub, repo_hub), REPO, tmp_path / "w")
    assert seen == [repo_hub], "the same client, its token and endpoint"


def boundary(run_id: str, epoch: int, files: dict[str, dict[str, Any]]) -> Manifest:
    """Attempt a's first boundary of run ``run_id`` in the bucket, naming ``files``."""
    return Manifest(f"run/{run_id}/manifests/a-000001.json", run_id, "run", "a", 1, "c", epoch, 0.0, files)


# -- BucketSource: what a boundary's manifest says of a file ------------------------------------------------------
def test_a_boundarys_manifest_says_each_files_epochs_and_whether_the_volume_holds_its_bytes(tmp_path: Path) -> None:
    on_volume = volume(tmp_path / "run", 6)
    other = checkpoint(7)
    manifest = boundary(
        "1234abcd",
        7,
        {
            "weights/last.pt": {"key": "k1", "sha256": hashlib.sha256(on_volume.read_bytes()).hexdigest(), "epoch": 6},
            "weights/epoch_7.pt": {"key": "k2", "sha256": hashlib.sha256(other).hexdigest(), "epoch": 7},
            "metrics.jsonl": {"key": "k3", "sha256": "0" * 64},  # no epoch of its own
        },
    )
    source = read.BucketSource(RunFolder(Bucket(cast(Hub, hub(None)), "org/ckpt"), "run", "1234abcd"), manifest)

    assert [source.epochs_hint(name) for name in source.names()] == [6, 7, 0]
    assert source.same_as("weights/last.pt", on_volume), "the volume's bytes: not downloaded again"
    assert not source.same_as("weights/epoch_7.pt", on_volume), "other bytes: downloaded"
    assert not source.same_as("weights/last.pt", tmp_path / "run" / "weights" / "missing.pt")


# -- restore_history: the run's rows and best weights come along -----------------------------------------------
@pytest.mark.parametrize("volume_state", ["new", "there"])
def test_a_stores_history_is_restored_into_a_run_folder_new_or_already_there(tmp_path: Path, volume_state: str) -> None:
    run_dir = tmp_path / "volume" / "runs" / "run"  # on a new volume, not even its parent yet
    if volume_state == "there":
        (run_dir / "weights").mkdir(parents=True)
        (run_dir / "metrics.jsonl").write_text('{"epoch": 1}\n')
    files = {"metrics.jsonl": b'{"epoch": 1}\n{"epoch": 2}\n', "weights/best.pt": checkpoint(2), "other.txt": b"x"}
    repo_hub = hub(files)
    source = read.RepoSource(cast(Hub, repo_hub), REPO, {entry.path: entry for entry in repo_hub.list_files(REPO)})

    read.restore_history(source, run_dir, tmp_path / "scratch")

    assert (run_dir / "metrics.jsonl").read_bytes() == files["metrics.jsonl"]
    assert (run_dir / "weights" / "best.pt").read_bytes() == files["weights/best.pt"]
    assert not (run_dir / "other.txt").exists(), "only the run's history"


def test_a_downloaded_object_is_used_only_when_its_size_and_sha256_are_the_manifests(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    good, bad = checkpoint(5), bytearray(checkpoint(5))
    bad[-1] ^= 0xFF  # the same size, other bytes (a torn or tampered object)
    objects = {"k-good": good, "k-bad": bytes(bad), "k-short": good[:-1]}

    def download_bucket_files(bucket_id: str, files: list[tuple[str, Path]], **_: Any) -> None:
        for key, local in files:
            local.write_bytes(objects[key])

    bucket = Bucket(cast(Hub, SimpleNamespace(api=SimpleNamespace(download_bucket_files=download_bucket_files))), "b")
    entry = {"sha256": hashlib.sha256(good).hexdigest(), "size": len(good), "epoch": 5}
    manifest = boundary(
        "id",
        5,
        {
            "weights/last.pt": {**entry, "key": "k-good"},
            "weights/epoch_5.pt": {**entry, "key": "k-bad"},
            "weights/best.pt": {**entry, "key": "k-short"},
        },
    )
    source = read.BucketSource(RunFolder(bucket, "run", "id"), manifest)

    with caplog.at_level(logging.INFO, logger="trainbox"):
        fetched = [
            source.fetch(name, tmp_path) for name in ("weights/last.pt", "weights/epoch_5.pt", "weights/best.pt")
        ]

    assert fetched[0] is not None and fetched[0].read_bytes() == good and fetched[1:] == [None, None]
    said = [r.getMessage() for r in caplog.records]
    assert said == [
        f"resume: weights/{name} in hf://buckets/b/run/id (epoch 5) does not match its manifest; not using it"
        for name in ("epoch_5.pt", "best.pt")
    ]


# -- newest_in: which of a store's checkpoints a resume takes ------------------------------------------------------
class _Source:
    """A store's checkpoints: ``name → (epochs its name or manifest says, bytes)``; records every fetch."""

    label = "in the test store"

    def __init__(self, files: dict[str, tuple[int | None, bytes]], local_bytes: bytes | None = None) -> None:
        self.files, self.local_bytes, self.fetched = files, local_bytes, cast(list[str], [])

    def names(self) -> list[str]:
        return list(self.files)

    def epochs_hint(self, name: str) -> int | None:
        return self.files[name][0]

    def same_as(self, name: str, local: Path) -> bool:
        return local.is_file() and local.read_bytes() == self.files[name][1]

    def fetch(self, name: str, scratch: Path) -> Path | None:
        self.fetched.append(name)
        data = self.files[name][1]
        if not data:
            return None  # not whole against its manifest
        path = scratch / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        return path


def test_a_stores_newest_checkpoint_is_its_last_pt_of_unknown_epochs_first_then_the_most_epochs(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    source = _Source(
        {
            "weights/epoch_3.pt": (3, checkpoint(3)),
            "weights/epoch_12.pt": (12, b"not a checkpoint"),
            "weights/last.pt": (None, b""),  # a download that does not match its manifest
            "weights/epoch_9.pt": (9, checkpoint(9)),  # "epoch_9" sorts after "epoch_10" as a name
            "weights/epoch_10.pt": (10, checkpoint(10)),
            "weights/epoch_2.pt": (2, checkpoint(2)),
        }
    )
    with caplog.at_level(logging.INFO, logger="trainbox"):
        found = read.newest_in(source, tmp_path, 2)

    assert found is not None and found[1].completed_epochs == 10
    assert source.fetched == ["weights/last.pt", "weights/epoch_12.pt", "weights/epoch_10.pt"], "newest first"
    said = [r.getMessage() for r in caplog.records]
    assert said[0] == "resume: weights/last.pt in the test store is corrupt; trying the next newest checkpoint"
    assert said[-1] == "resume: weights/epoch_10.pt in the test store has 10 epochs"


def test_a_checkpoint_no_newer_than_the_volume_is_never_downloaded(tmp_path: Path) -> None:
    source = _Source({"weights/epoch_4.pt": (4, checkpoint(4)), "weights/epoch_3.pt": (3, checkpoint(3))})
    assert read.newest_in(source, tmp_path, 4) is None and source.fetched == []
    unnamed = _Source({"weights/last.pt": (None, checkpoint(4))})  # its epochs known only once read
    assert read.newest_in(unnamed, tmp_path, 4) is None and unnamed.fetched == ["weights/last.pt"]


def test_the_volumes_own_last_pt_is_skipped_or_with_local_counts_taken_without_a_download(tmp_path: Path) -> None:
    local = volume(tmp_path / "run", 6)
    files = {"weights/last.pt": (6, local.read_bytes()), "weights/epoch_3.pt": (3, checkpoint(3))}

    skipped = _Source(dict(files))
    found = read.newest_in(skipped, tmp_path / "s1", 2, local)
    assert found is not None and found[1].completed_epochs == 3, "the volume's bytes were judged already"
    assert skipped.fetched == ["weights/epoch_3.pt"]

    counted = _Source(dict(files))  # several machines: the stores alone, the volume's copy saves a download
    found = read.newest_in(counted, tmp_path / "s2", 2, local, local_counts=True)
    assert found == (local, found[1]) and found[1].completed_epochs == 6 and counted.fetched == []

    # The repo's last.pt says no epochs before it is read: the volume's copy, read, is no newer; a snapshot is.
    unnamed = {"weights/last.pt": (None, local.read_bytes()), "weights/epoch_8.pt": (8, checkpoint(8))}
    not_newer = _Source(dict(unnamed))
    found = read.newest_in(not_newer, tmp_path / "s3", 6, local, local_counts=True)
    assert found is not None and found[1].completed_epochs == 8 and not_newer.fetched == ["weights/epoch_8.pt"]
    del unnamed["weights/epoch_8.pt"]
    assert read.newest_in(_Source(unnamed), tmp_path / "s4", 6, local, local_counts=True) is None


# -- find_newest: the repo's side of a resume ----------------------------------------------------------------------
def test_a_resume_takes_the_repos_newer_checkpoint_with_its_history_and_names_the_repos_files(tmp_path: Path) -> None:
    run_dir, work = tmp_path / "run", tmp_path / "work"
    volume(run_dir, 3)
    work.mkdir()
    files = {"weights/last.pt": checkpoint(5), "metrics.jsonl": b'{"epoch": 5}\n', "README.md": b"# m"}
    repo_hub = hub(files)

    found = read.find_newest(run_dir, work, hub=cast(Hub, repo_hub), repo_id=REPO)

    assert found is not None and (found.source, found.epochs) == ("hub", 5)
    assert found.path == run_dir / "weights" / "last.pt" and found.path.read_bytes() == files["weights/last.pt"]
    assert found.hub_files == frozenset(files) and (run_dir / "metrics.jsonl").read_bytes() == files["metrics.jsonl"]
    assert ("head", REPO) in repo_hub.calls and ("list", REPO, None) in repo_hub.calls
    assert list(work.iterdir()) == [], "its scratch is gone"


def test_a_resume_restores_the_history_it_is_asked_for_and_no_other(tmp_path: Path) -> None:
    run_dir, work = tmp_path / "run", tmp_path / "work"
    work.mkdir()
    files = {"weights/last.pt": checkpoint(5), "metrics.jsonl": b'{"epoch": 5}\n', "console.log": b"epoch 5\n"}
    found = read.find_newest(run_dir, work, hub=cast(Hub, hub(files)), repo_id=REPO, history=("console.log",))
    assert found is not None and (run_dir / "console.log").read_bytes() == b"epoch 5\n"
    assert not (run_dir / "metrics.jsonl").exists(), "only the history named"


def test_several_machines_read_the_repo_at_node_0s_commit_and_a_repo_no_newer_keeps_the_volume(tmp_path: Path) -> None:
    run_dir, work = tmp_path / "run", tmp_path / "work"
    local = volume(run_dir, 4)
    work.mkdir()
    same = hub({"weights/last.pt": local.read_bytes()})
    found = read.find_newest(run_dir, work, volume=False, hub=cast(Hub, same), repo_id=REPO, revision="abc")
    assert found is not None and (found.source, found.epochs) == ("hub", 4), "the stores alone: the repo's epochs"
    assert ("list", REPO, "abc") in same.calls and ("head", REPO) not in same.calls
    assert [call for call in same.calls if call[0] == "download"] == [], "the volume's bytes stand in for it"
    at_commit = hub({"weights/last.pt": checkpoint(6)})
    found = read.find_newest(run_dir, work, volume=False, hub=cast(Hub, at_commit), repo_id=REPO, revision="abc")
    assert found is not None and (found.source, found.epochs) == ("hub", 6)
    assert [call[4] for call in at_commit.calls if call[0] == "download"] == ["abc"], "at node 0's commit"

    older = hub({"weights/last.pt": checkpoint(2)})
    kept = read.find_newest(run_dir, work, hub=cast(Hub, older), repo_id=REPO)
    assert kept is not None and (kept.source, kept.epochs) == ("volume", 6), "the volume now holds epoch 6"
    assert read.find_newest(run_dir, work, hub=cast(Hub, hub(None)), repo_id=REPO) is not None, "no repo yet"
    assert read.find_newest(tmp_path / "empty", work, hub=cast(Hub, hub(None)), repo_id=REPO) is None


def test_an_empty_volume_resumes_from_the_repos_first_epoch(tmp_path: Path) -> None:
    work = tmp_path / "work"
    work.mkdir()
    found = read.find_newest(
        tmp_path / "run", work, hub=cast(Hub, hub({"weights/last.pt": checkpoint(1)})), repo_id=REPO
    )
    assert found is not None and (found.source, found.epochs) == ("hub", 1), "one epoch is one epoch not retrained"
