"""The committers' turns of the working state (sync/committer.py) on a clock the test moves: the repo takes it
when the bucket keeps failing and gives it back when the bucket answers, each said once to trainbox.json; a
model card the Hub refuses is dropped and said once; a newer attempt stops every write and the job is told once;
a commit whose answer was lost and that landed is settled as landed, not measured."""

from __future__ import annotations

import logging
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import pytest

from entrypoint.errors import StopRequested, TakenOverError
from entrypoint.sync import clock, places
from entrypoint.sync import committer as c
from entrypoint.sync.lane import Lane
from entrypoint.sync.staging import StagedFile
from entrypoint.sync.stores import Store
from tests.fakes.committers import shared
from tests.fakes.manual_clock import ManualClock

pytestmark = pytest.mark.protocol  # the protocol lane: fast, real tests of the store protocol's code


@pytest.fixture
def fake() -> Any:
    moved = ManualClock(5000.0)
    with clock.use(moved):
        yield moved


class _Store:
    def __init__(self, name: str, landed: str | None = None) -> None:
        self.name, self.answer = name, landed
        self.asked: list[tuple[str, float | None]] = []

    def landed(self, commit_id: str, *, deadline: float | None) -> str | None:
        self.asked.append((commit_id, deadline))
        return self.answer


def item(tmp_path: Path, relative: str, epochs: int | None = None) -> StagedFile:
    copy = tmp_path / "copies" / relative
    copy.parent.mkdir(parents=True, exist_ok=True)
    copy.write_bytes(relative.encode())
    return StagedFile(relative, copy, "a" * 64, None, len(relative), epochs=epochs, seen_at=1.0)


class Run:
    """Committers of a repo lane and a bucket lane, bucket mode, with every hook recorded."""

    def __init__(self, tmp_path: Path) -> None:
        self.repo = Lane(cast(Store, _Store("org/model")), tmp_path / "repo", takes=lambda _: True, budget=None)
        self.bucket = Lane(cast(Store, _Store("org/ckpt")), tmp_path / "bucket", takes=lambda _: True, budget=None)
        self.routing = places.Routing(self.repo, self.bucket, 3600.0)
        self.again: list[Any] = []
        self.storage: list[dict[str, Any]] = []
        self.cards: list[str | None] = []
        self.lost: list[TakenOverError] = []
        self.up = shared(
            self.repo,
            self.bucket,
            routing=self.routing,
            snapshots=SimpleNamespace(again=self.again.append, answered=lambda _ticket: True),
            on_card=self.cards.append,
            on_storage=self.storage.append,
            on_taken_over=self.lost.append,
        )
        self.committers = c.Committers(cast(c.Shared, self.up))


def fallback_of(run: Run) -> str | None:
    return run.routing.fallback


def unconfirmed(lane: Lane) -> tuple[str, list[StagedFile]] | None:
    return lane.unconfirmed


def failing_since(lane: Lane) -> float | None:
    return lane.failing_since


# -- the bucket keeps failing: the repo takes the working state ----------------------------------------------
def test_a_failing_bucket_hands_the_working_state_to_the_repo_once_and_says_so(
    tmp_path: Path, fake: ManualClock, caplog: pytest.LogCaptureFixture
) -> None:
    run = Run(tmp_path)
    assert not run.repo.takes("weights/last.pt"), "bucket mode: the repo takes milestones only"
    run.bucket.failures, run.bucket.failing_since = 3, fake.now - 90.0

    with caplog.at_level(logging.INFO, logger="trainbox"):
        run.committers._fall_back("HTTP 503 Service Unavailable")

    assert run.routing.fallback == "HTTP 503 Service Unavailable" and run.routing.working is run.repo
    assert run.repo.takes("weights/last.pt") and not run.repo.takes("weights/epoch_5.pt"), "never a snapshot"
    assert run.again == [places.final_restaged], "last.pt staged again, for the repo"
    assert run.storage == [{"mode": "repo", "fallback": True, "why": "HTTP 503 Service Unavailable"}]
    said = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert said == [
        "bucket: org/ckpt failed 3 boundaries in a row for 90 s (HTTP 503 Service Unavailable); the working state"
        " (not the snapshots) goes to org/model as commits until it answers"
    ]

    caplog.clear()
    run.committers._fall_back("again")  # still failing: nothing changes, nothing said again
    assert run.routing.fallback == "HTTP 503 Service Unavailable" and len(run.again) == 1 and len(run.storage) == 1
    assert not caplog.records


def test_the_bucket_answering_again_takes_the_working_state_back_and_drops_what_the_repo_no_longer_takes(
    tmp_path: Path, fake: ManualClock, caplog: pytest.LogCaptureFixture
) -> None:
    run = Run(tmp_path)
    run.committers._bucket_back()  # never fell back: nothing to say
    assert run.storage == [] and run.committers._discard == []
    run.bucket.failures, run.bucket.failing_since = 3, fake.now - 90.0
    run.committers._fall_back("reset")
    last, card = item(tmp_path, "weights/last.pt", epochs=4), item(tmp_path, "README.md")
    run.repo.pending = {last.relative: last, card.relative: card}
    caplog.clear()

    with caplog.at_level(logging.INFO, logger="trainbox"):
        run.committers._bucket_back()

    assert run.routing.fallback is None and run.routing.working is run.bucket
    assert run.repo.pending == {"README.md": card}, "a milestone stays the repo's"
    assert run.committers._discard == [last], "the repo's working copy is no longer needed"
    assert not run.repo.takes("weights/last.pt")
    assert run.storage[-1] == {"mode": "bucket", "fallback": False, "why": None} and len(run.storage) == 2
    assert [r.getMessage() for r in caplog.records] == ["bucket: org/ckpt answers again; the working state goes there"]
    run.committers._bucket_back()
    assert len(run.storage) == 2, "said once"


def test_the_bucket_falls_back_after_three_failed_boundaries_over_the_fallback_time_and_back_on_a_commit(
    tmp_path: Path, fake: ManualClock
) -> None:
    run = Run(tmp_path)
    for _ in range(3):
        run.committers._after_try(run.bucket, ok=False)
        assert run.routing.fallback is None, "three boundaries, but not yet for the fallback time"
    fake.now += 60.0
    run.bucket.last_error = "HTTP 503\n   Service   Unavailable"
    run.committers._after_try(run.bucket, ok=False)
    assert run.routing.fallback == "HTTP 503 Service Unavailable", "its error, on one line"
    run.committers._after_try(run.bucket, ok=True)
    assert run.routing.fallback is not None, "a try with no commit landed proves nothing"
    run.bucket.commits.append("m/x-000002.json")
    run.up.fallback = run.routing.fallback
    run.committers._after_try(run.bucket, ok=True)
    assert (fallback_of(run), run.bucket.failures, failing_since(run.bucket)) == (None, 0, None)


# -- a model card the Hub refuses ----------------------------------------------------------------------------
def test_a_refused_card_is_dropped_said_once_and_told_to_trainbox_json(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    run = Run(tmp_path)
    card, last = item(tmp_path, "README.md"), item(tmp_path, "weights/last.pt")
    run.repo.pending = {card.relative: card, last.relative: last}
    run.repo.in_flight = [card, last]

    with caplog.at_level(logging.INFO, logger="trainbox"):
        run.committers._refuse_card(run.repo, [card], "YAML metadata error: license")

    assert run.repo.pending == {"weights/last.pt": last}, "the rest stays to go"
    assert run.repo.in_flight == [] and run.committers._discard == [card]
    assert run.up.card_refused == "YAML metadata error: license" and run.cards == ["YAML metadata error: license"]
    assert [r.getMessage() for r in caplog.records] == [
        "sync: the Hub refused the model card (README.md), the rest is uploaded: YAML metadata error: license"
    ]

    newer = item(tmp_path, "README.md")
    run.repo.pending[newer.relative] = newer
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="trainbox"):
        run.committers._refuse_card(run.repo, [card], "YAML metadata error: license")  # the old one, again
    assert run.repo.pending["README.md"] is newer, "a card changed since is kept, to be tried"
    assert not caplog.records, "the same refusal is said once"
    assert run.cards == ["YAML metadata error: license"] * 2
    with caplog.at_level(logging.INFO, logger="trainbox"):
        run.committers._refuse_card(run.repo, [newer], "another reason")
    assert "another reason" in caplog.text and "README.md" not in run.repo.pending


def test_a_hook_that_fails_never_stops_the_upload_but_a_stop_does(caplog: pytest.LogCaptureFixture) -> None:
    def broken(_: object) -> None:
        raise ValueError("disk full")

    def stop(_: object) -> None:
        raise StopRequested("SIGTERM")

    c._tell(None, {"mode": "repo"}, "storage")
    with caplog.at_level(logging.INFO, logger="trainbox"):
        c._tell(broken, {"mode": "repo"}, "storage")
    assert [r.getMessage() for r in caplog.records] == ["sync: storage hook failed"]
    with pytest.raises(StopRequested):
        c._tell(stop, None, "card")


# -- a newer attempt writes the run ------------------------------------------------------------------------
def test_a_run_taken_over_stops_every_write_and_the_job_is_told_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    run = Run(tmp_path)
    first, second = TakenOverError("taken over by attempt b", "leave it"), TakenOverError("again", "leave it")

    with caplog.at_level(logging.INFO, logger="trainbox"):
        run.committers.lost_run(first)
        run.committers.lost_run(second)

    assert run.up.taken_over is not None and run.lost == [first]
    assert [r.getMessage() for r in caplog.records] == ["sync: taken over by attempt b — leave it"]
    assert run.committers._time_to_commit(run.repo) is None, "nothing more is committed"


def test_a_lost_answer_that_landed_is_settled_as_landed_and_not_measured(tmp_path: Path, fake: ManualClock) -> None:
    run = Run(tmp_path)
    store = _Store("org/model", landed="sha-landed")
    run.repo.store = cast(Store, store)
    last = item(tmp_path, "weights/last.pt", epochs=6)
    run.repo.pending = {last.relative: last}
    run.repo.unconfirmed = ("commit-1", [last])

    run.committers._confirm_earlier(run.repo, 7000.0)

    assert store.asked == [("commit-1", 7000.0)], "asked about that commit, within the deadline"
    assert (unconfirmed(run.repo), run.repo.pending, run.repo.commits) == (None, {}, ["sha-landed"])
    assert list(run.repo.latencies) == [], "its latency is not known: not measured"
    assert run.repo.in_flight == [] and run.committers._discard == [last]

    store.answer = None
    run.repo.unconfirmed = ("commit-2", [last])
    run.committers._confirm_earlier(run.repo, None)
    assert store.asked[-1] == ("commit-2", None) and unconfirmed(run.repo) is None
    assert run.repo.commits == ["sha-landed"], "not landed: sent again by the next commit"
