"""Where staged copies are sent ahead (entrypoint/xet/ahead.py) and when a commit may name what was sent:
only to the repo that takes the folder's commits and never while a bucket takes them; twins in one
upload; and a commit takes a copy only when the child sent exactly that copy, whole. The child is a
stand-in here (tests/integration/test_xet_ahead.py runs the real one)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

import pytest
from huggingface_hub import CommitOperationAdd

from entrypoint.xet import ahead as xetahead
from entrypoint.xet import child as xetchild

REPO = xetahead.Destination("org/run", "http://hub.invalid", "hf_token_of_the_test")
OTHER = xetahead.Destination("org/other", "http://hub.invalid", "hf_token_of_the_test")
BIG = 2 * 1024 * 1024


class FakeSession:
    started: ClassVar[list[FakeSession]] = []

    def __init__(self, destination: xetahead.Destination) -> None:
        self.destination = destination
        self.open, self.fed, self.abandoned = True, False, False
        self.sent: list[dict[str, Any]] = []
        self.reply: dict[str, Any] | Exception = {"files": {}}
        FakeSession.started.append(self)

    def send(self, command: dict[str, Any]) -> None:
        self.sent.append(command)

    def close_locked(self) -> None:
        if self.open:
            self.open = False
            self.send({"close": True})

    def abandon(self) -> None:
        self.abandoned, self.open = True, False

    def answer(self, deadline: float | None) -> dict[str, Any]:
        if isinstance(self.reply, Exception):
            raise self.reply
        return self.reply


@pytest.fixture(autouse=True)
def fake_children(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    FakeSession.started = []
    monkeypatch.setattr(xetahead, "_Session", FakeSession)
    monkeypatch.setattr(xetchild, "CHILD_MIN_BYTES", BIG)

    def lfs(operations: list[CommitOperationAdd], repo_id: str, **_: Any) -> None:
        for op in operations:
            op._upload_mode, op._should_ignore = "lfs", False

    monkeypatch.setattr(xetahead, "_upload_modes", lfs)
    xetahead.forget()
    yield
    xetahead.forget()


def _staged(folder: Path, name: str, size: int = BIG) -> Path:
    folder.mkdir(exist_ok=True)
    path = folder / name
    path.write_bytes(os.urandom(size))
    return path


def test_nothing_is_sent_ahead_before_the_folder_has_a_repo(tmp_path: Path) -> None:
    assert xetahead.feed(_staged(tmp_path / "staging", "1-last.pt"), BIG) is None
    assert FakeSession.started == []


def test_small_copies_go_the_usual_way(tmp_path: Path) -> None:
    staging = tmp_path / "staging"
    xetahead.repo_took([_staged(staging, "0-status.json", 10)], REPO)
    assert xetahead.feed(_staged(staging, "1-last.pt", BIG - 1), BIG - 1) is None


def test_a_bucket_that_takes_the_folder_stops_sending_ahead_to_the_repo(tmp_path: Path) -> None:
    staging = tmp_path / "staging"
    xetahead.repo_took([_staged(staging, "0-status.json", 10)], REPO)
    feed = xetahead.feed(_staged(staging, "1-last.pt"), BIG)
    assert feed is not None
    feed.done(BIG, "ab" * 32)
    xetahead.take([_commit_of(staging / "1-last.pt")], REPO.repo_id, endpoint=REPO.endpoint, token=REPO.token)
    xetahead.repo_took([staging / "1-last.pt"], REPO)  # landed: the next boundary's child waits already
    assert len(FakeSession.started) == 2
    waiting = FakeSession.started[-1]
    assert waiting.open and not waiting.fed

    xetahead.bucket_took([_staged(staging, "2-trainbox.json", 10)])

    assert waiting.abandoned, "a child waiting for copies that will not come is stopped"
    assert xetahead.feed(_staged(staging, "3-last.pt"), BIG) is None
    xetahead.repo_took([staging / "0-status.json"], REPO)  # a milestone commit to the repo: still the bucket's
    assert xetahead.feed(_staged(staging, "4-last.pt"), BIG) is None


def test_the_large_copies_of_a_boundary_share_one_upload(tmp_path: Path) -> None:
    staging = tmp_path / "staging"
    xetahead.repo_took([_staged(staging, "0-status.json", 10)], REPO)
    best, last = _staged(staging, "1-best.pt"), _staged(staging, "2-last.pt")
    for path in (best, last):
        feed = xetahead.feed(path, BIG)
        assert feed is not None
        feed.cleared(BIG // 2)
        feed.done(BIG, "ab" * 32)
    (session,) = FakeSession.started
    assert [next(iter(c)) for c in session.sent] == ["file", "upto", "end", "file", "upto", "end"]
    assert session.sent[0] == {"file": str(best)} and session.sent[3] == {"file": str(last)}


def _commit_of(path: Path) -> CommitOperationAdd:
    return CommitOperationAdd(path_in_repo="weights/last.pt", path_or_fileobj=str(path))


def test_a_commit_takes_a_copy_only_when_the_child_sent_exactly_that_copy(tmp_path: Path) -> None:
    import hashlib

    staging = tmp_path / "staging"
    xetahead.repo_took([_staged(staging, "0-status.json", 10)], REPO)
    right, wrong, short = (_staged(staging, f"{n}-last.pt") for n in (1, 2, 3))
    shas = {path: hashlib.sha256(path.read_bytes()).hexdigest() for path in (right, wrong, short)}
    for path in (right, wrong, short):
        feed = xetahead.feed(path, BIG)
        assert feed is not None
        feed.done(BIG, shas[path])
    (session,) = FakeSession.started
    session.reply = {
        "files": {
            str(right): {"sha256": shas[right], "size": BIG},
            str(wrong): {"sha256": "00" * 32, "size": BIG},  # not the bytes the copy holds
            str(short): {"short": BIG // 3},
        }
    }
    ops = [_commit_of(path) for path in (right, wrong, short)]

    taken = xetahead.take(ops, REPO.repo_id, endpoint=REPO.endpoint, token=REPO.token)

    assert taken == [ops[0]]
    assert ops[0]._is_uploaded and ops[0].upload_info.sha256.hex() == shas[right]
    assert not ops[1]._is_uploaded and not ops[2]._is_uploaded, "left to the usual upload"
    assert not session.open, "claimed: the child finishes"


def test_a_commit_never_takes_a_copy_sent_elsewhere_dropped_or_not_whole(tmp_path: Path) -> None:
    staging = tmp_path / "staging"
    xetahead.repo_took([_staged(staging, "0-status.json", 10)], REPO)
    dropped, growing = _staged(staging, "1-best.pt"), _staged(staging, "2-last.pt")
    first = xetahead.feed(dropped, BIG)
    second = xetahead.feed(growing, BIG)
    assert first is not None and second is not None
    first.cleared(100)
    first.drop()  # a secret in it
    second.cleared(100)  # still being copied
    (session,) = FakeSession.started
    session.reply = {"files": {str(dropped): {"sha256": "x", "size": BIG}}}

    assert (
        xetahead.take([_commit_of(dropped), _commit_of(growing)], REPO.repo_id, endpoint=REPO.endpoint, token=None)
        == []
    )
    assert xetahead.take([_commit_of(growing)], OTHER.repo_id, endpoint=OTHER.endpoint, token=OTHER.token) == []
    assert session.open, "nothing claimed: the session still takes copies"


def test_a_deadline_reached_while_the_child_finishes_is_a_timeout(tmp_path: Path) -> None:
    staging = tmp_path / "staging"
    xetahead.repo_took([_staged(staging, "0-status.json", 10)], REPO)
    path = _staged(staging, "1-last.pt")
    feed = xetahead.feed(path, BIG)
    assert feed is not None
    feed.done(BIG, "ab" * 32)
    FakeSession.started[0].reply = TimeoutError("not in time")
    with pytest.raises(TimeoutError):
        xetahead.take([_commit_of(path)], REPO.repo_id, endpoint=REPO.endpoint, token=REPO.token, deadline=0.0)
