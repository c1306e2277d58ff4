"""The stores without a network: the bucket's layout and manifests, the order of attempts, where each file
goes (bucket mode, its fallback to the repo, the final publish), and the run id kept in trainbox.json."""

from __future__ import annotations

from pathlib import Path
from typing import Any, cast

import pytest

from entrypoint.state import RunState
from entrypoint.sync import places
from entrypoint.sync.bucket import Manifest, RunFolder, new_attempt, newest_attempt
from entrypoint.sync.lane import Lane
from entrypoint.sync.staging import StagedFile

FOLDER = RunFolder(cast(Any, None), "run-a", "0123456789abcdef")
ATTEMPT = "1796000000000-abcdef"


def manifest(files: dict[str, dict[str, Any]], **extra: Any) -> Manifest:
    fields = {
        "key": FOLDER.manifest_key(ATTEMPT, 1),
        "run_id": FOLDER.run_id,
        "run_name": FOLDER.run_name,
        "attempt": ATTEMPT,
        "seq": 1,
        "commit": "c1",
        "epoch": 3,
        "written_at": 1.0,
        "files": files,
    } | extra
    return Manifest(**fields)


def entry(key: str, size: int = 10) -> dict[str, Any]:
    return {"key": key, "sha256": "ab" * 32, "size": size, "epoch": 3}


# -- the layout ------------------------------------------------------------------------------------
def test_every_key_names_its_run_id_and_attempt_and_no_boundary_reuses_one() -> None:
    a = FOLDER.object_key(ATTEMPT, "ab" * 32, "weights/last.pt")
    b = FOLDER.object_key(ATTEMPT, "cd" * 32, "weights/last.pt")
    assert a != b and a.startswith("run-a/0123456789abcdef/objects/") and a.endswith("/weights/last.pt")
    assert FOLDER.attempt_of(a) == ATTEMPT
    assert FOLDER.manifest_key(ATTEMPT, 1) != FOLDER.manifest_key(ATTEMPT, 2)
    assert FOLDER.attempt_of(FOLDER.manifest_key(ATTEMPT, 7)) == ATTEMPT
    # What is not ours (another run id, another layout, a file someone put there) belongs to no attempt.
    for other in ("run-a/manifest.json", "run-a/ffff/objects/x/y", "run-a/0123456789abcdef/notes.txt"):
        assert FOLDER.attempt_of(other) is None


def test_attempts_are_ordered_by_start_and_a_new_one_comes_after_every_one_seen() -> None:
    keys = [FOLDER.manifest_key("1796000000000-aaaaaa", 3), FOLDER.manifest_key("1796000000500-bbbbbb", 1)]
    assert newest_attempt(keys, FOLDER) == "1796000000500-bbbbbb"
    ahead = "9999999999998-000000"  # a writer whose clock ran far ahead
    assert new_attempt(after=ahead) > ahead
    assert new_attempt(after=None) != new_attempt(after=None)


def test_a_manifest_round_trips_and_anything_else_is_not_one() -> None:
    original = manifest({"weights/last.pt": entry("run-a/k/objects/a/b/weights/last.pt")})
    assert Manifest.parse(original.key, original.to_bytes()) == original
    other_format = original.to_bytes().replace(b'"format": 2', b'"format": 9')
    for data in (b"", b"[]", b'{"format": 1, "files": {}}', other_format):
        assert Manifest.parse(original.key, data) is None


def test_a_manifest_is_whole_only_when_every_object_is_there_with_its_size() -> None:
    m = manifest({"a": entry("k/a", 10), "b": entry("k/b", 20)})
    assert m.whole({"k/a": 10, "k/b": 20})
    assert not m.whole({"k/a": 10})  # one missing: a batch cut short
    assert not m.whole({"k/a": 10, "k/b": 19})  # one of another size


# -- where files go --------------------------------------------------------------------------------
class _Store:
    name = "store"


def lanes(tmp_path: Path) -> tuple[Lane, Lane, places.Routing]:
    repo = Lane(cast(Any, _Store()), tmp_path / "repo", takes=places.everything, budget=None)
    bucket = Lane(cast(Any, _Store()), tmp_path / "bucket", takes=places.everything, budget=places.unlimited_budget())
    return repo, bucket, places.Routing(repo, bucket, publish_every=600)


def staged(relative: str, tmp_path: Path) -> StagedFile:
    return StagedFile(relative, tmp_path / relative.replace("/", "-"), "ab" * 32, None, 1)


def test_the_bucket_takes_every_file_and_the_repo_milestones_then_the_final_last_pt(tmp_path: Path) -> None:
    repo, bucket, routing = lanes(tmp_path)
    files = [staged(name, tmp_path) for name in ("weights/last.pt", "weights/epoch_3.pt", "weights/best.pt", "a.txt")]
    assert routing.deliver(files) == []  # every copy is held by a lane
    assert set(bucket.pending) == {"weights/last.pt", "weights/epoch_3.pt", "weights/best.pt", "a.txt"}
    assert set(repo.pending) == {"weights/best.pt", "a.txt"}
    assert routing.working is bucket and routing.required() == [bucket]
    assert routing.to_final() and not routing.to_final()
    assert repo.takes("weights/last.pt") and not repo.takes("weights/epoch_3.pt")
    assert routing.required() == [bucket, repo]
    assert repo.budget.burst == 1  # a milestone per PUBLISH_EVERY


def test_the_fallback_gives_the_repo_the_working_state_and_coming_back_takes_it_away(tmp_path: Path) -> None:
    repo, bucket, routing = lanes(tmp_path)
    assert routing.fall_back("HTTP 503") and not routing.fall_back("again")
    assert routing.working is repo and routing.required() == [repo] and repo.takes("weights/last.pt")
    assert not repo.takes("weights/epoch_3.pt"), "a snapshot waits for the bucket, never goes to the repo"
    assert repo.budget.burst > 1  # a commit per boundary, within the Hub's hourly limit
    routing.deliver([staged("weights/last.pt", tmp_path), staged("metrics.jsonl", tmp_path)])
    dropped = routing.back()
    assert dropped is not None and [item.relative for item in dropped] == ["weights/last.pt"]
    assert routing.back() is None and routing.working is bucket and set(repo.pending) == {"metrics.jsonl"}


def test_without_a_bucket_the_repo_takes_everything(tmp_path: Path) -> None:
    repo = Lane(cast(Any, _Store()), tmp_path / "repo", takes=places.everything, budget=None)
    routing = places.Routing(repo, None, publish_every=600)
    assert routing.working is repo and routing.required() == [repo]
    assert not routing.to_final() and not routing.fall_back("x") and routing.back() is None


# -- the run id ------------------------------------------------------------------------------------
def test_a_run_id_is_minted_once_kept_on_the_volume_and_learnt_from_the_repo(tmp_path: Path) -> None:
    state = RunState(tmp_path, "run-a")
    assert state.identity.run_id is None
    assert state.identity.ensure_run_id() and not state.identity.ensure_run_id()
    minted = state.identity.run_id
    again = RunState.load(tmp_path, "run-a")  # the same volume: the same run
    assert again.identity.run_id == minted and not again.identity.ensure_run_id()

    fresh = RunState(tmp_path / "fresh", "run-a")  # a new volume learns it from the repo's trainbox.json
    fresh.history.adopt({"run_name": "run-a", "run_id": minted, "attempts": []})
    assert fresh.identity.run_id == minted and not fresh.identity.ensure_run_id()
    kept = RunState.load(tmp_path, "run-a")  # the volume's own id wins over another the repo names
    kept.history.adopt({"run_name": "run-a", "run_id": "ffffffffffffffff"})
    assert kept.identity.run_id == minted


@pytest.mark.parametrize("bad", [None, 7, "", "short", "not hex!" * 3, "x" * 100])
def test_a_run_id_that_is_not_one_is_ignored(tmp_path: Path, bad: object) -> None:
    state = RunState(tmp_path, "run-a", {"run_id": bad})
    assert state.identity.run_id is None
    state.history.adopt({"run_id": bad})
    assert state.identity.run_id is None


def test_a_node_other_than_0_takes_node_0s_run_id(tmp_path: Path) -> None:
    state = RunState(tmp_path, "run-a", {"run_id": "aaaaaaaaaaaaaaaa"})
    state.identity.follow_run_id({"run_id": "bbbbbbbbbbbbbbbb"})
    assert state.identity.run_id == "bbbbbbbbbbbbbbbb"
    state.identity.follow_run_id(None)  # node 0 has published none yet
    assert state.identity.run_id == "bbbbbbbbbbbbbbbb"
