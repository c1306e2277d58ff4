"""The committer's bookkeeping: the commit budget (a token bucket the Hub's 429 empties) and the ledger of
what the Hub holds, on a clock the test moves; what a failed final upload says; a commit whose answer was lost
may have landed, and the next turn asks the store before sending it again."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import cast

import pytest

from entrypoint.sync import committer as c
from entrypoint.sync import ledger as sync_ledger
from entrypoint.sync.job import sync_error
from entrypoint.sync.lane import Lane
from entrypoint.sync.ledger import CommitBudget, Ledger
from entrypoint.sync.staging import StagedFile
from entrypoint.sync.stores import Store as AStore
from entrypoint.sync.uploader import Uploader
from tests.fakes.committers import shared
from tests.fakes.manual_clock import ManualClock

pytestmark = pytest.mark.protocol  # the protocol lane: fast, real tests of the store protocol's code


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> ManualClock:
    fake = ManualClock(1_000_000.0)  # stands in for the ``time`` module inside entrypoint.sync.ledger
    monkeypatch.setattr(sync_ledger, "time", fake)
    return fake


# -- CommitBudget ----------------------------------------------------------------------------------
def spend(budget: CommitBudget, times: int) -> None:
    for _ in range(times):
        assert budget.wait_time() == 0.0
        budget.spend()


def test_a_burst_is_free_then_commits_come_at_the_hourly_rate(clock: ManualClock) -> None:
    budget = CommitBudget(per_hour=360, burst=3)  # one commit every 10 s
    spend(budget, 3)

    assert budget.wait_time() == pytest.approx(10.0)
    clock.advance(4.0)
    assert budget.wait_time() == pytest.approx(6.0)
    clock.advance(6.0)
    spend(budget, 1)
    assert budget.wait_time() == pytest.approx(10.0)


def test_an_idle_hour_refills_no_more_than_the_burst(clock: ManualClock) -> None:
    budget = CommitBudget(per_hour=360, burst=3)
    spend(budget, 3)
    clock.advance(3600.0)

    spend(budget, 3)
    assert budget.wait_time() == pytest.approx(10.0)


def test_commits_of_an_earlier_attempt_in_the_last_hour_still_count(clock: ManualClock) -> None:
    budget = CommitBudget(per_hour=360, burst=3, recent=[clock.now - 60, clock.now - 30])

    spend(budget, 1)
    assert budget.wait_time() == pytest.approx(10.0)
    assert CommitBudget(per_hour=360, burst=3, recent=[clock.now] * 10).wait_time() == pytest.approx(10.0)


def test_a_429_empties_the_budget_and_holds_everything_until_retry_after(clock: ManualClock) -> None:
    budget = CommitBudget(per_hour=3600, burst=20)
    budget.drain(retry_after=120.0)

    assert budget.hold() == pytest.approx(120.0)
    clock.advance(100.0)  # the bucket alone would allow commits again by now
    assert budget.wait_time() == pytest.approx(20.0)
    budget.drain(retry_after=5.0)  # a shorter second answer never shortens the first
    assert budget.hold() == pytest.approx(20.0)
    clock.advance(20.0)
    assert budget.hold() == 0.0 and budget.wait_time() == 0.0


def test_a_429_after_overspending_keeps_the_debt(clock: ManualClock) -> None:
    budget = CommitBudget(per_hour=360, burst=1)
    budget.spend()
    budget.spend()  # a final commit may go over the budget
    budget.drain(retry_after=0.0)

    assert budget.wait_time() == pytest.approx(20.0)  # two commits owed, not reset to zero


# -- Ledger ----------------------------------------------------------------------------------------
def staged(relative: str, sha256: str, git_oid: str | None = None) -> StagedFile:
    return StagedFile(relative, Path("/nonexistent") / relative, sha256, git_oid, 1)


def test_what_is_recorded_survives_a_restart(clock: ManualClock, tmp_path: Path) -> None:
    path = tmp_path / "ledger.json"
    ledger = Ledger(path)
    ledger.record([staged("weights/last.pt", "a" * 64), staged("status.json", "b" * 64, "c" * 40)], head="h1")

    again = Ledger(path)
    assert again.head == "h1"
    assert again.has("weights/last.pt", ["a" * 64])
    assert again.has("status.json", ["c" * 40])  # the git blob id the Hub lists for a small file
    assert not again.has("weights/last.pt", ["d" * 64])  # changed since
    assert not again.has("weights/best.pt", ["a" * 64])  # same bytes, other path
    assert again.commit_times == [clock.now]


def test_a_new_version_replaces_the_old_one(clock: ManualClock, tmp_path: Path) -> None:
    ledger = Ledger(tmp_path / "ledger.json")
    ledger.record([staged("weights/last.pt", "a" * 64)], head="h1")
    ledger.record([staged("weights/last.pt", "d" * 64)], head="h2")

    assert ledger.has("weights/last.pt", ["d" * 64]) and not ledger.has("weights/last.pt", ["a" * 64])
    assert ledger.head == "h2"


def test_commit_times_older_than_an_hour_are_forgotten(clock: ManualClock, tmp_path: Path) -> None:
    path = tmp_path / "ledger.json"
    ledger = Ledger(path)
    ledger.record([staged("a.txt", "1" * 64)], head="h1")
    clock.advance(1800.0)
    ledger.record([staged("b.txt", "2" * 64)], head="h2")
    first = clock.now - 1800.0
    clock.advance(1801.0)

    assert Ledger(path).commit_times == [first + 1800.0]  # the first fell out of the hour on reading
    ledger.record([staged("c.txt", "3" * 64)], head="h3")
    assert ledger.commit_times == [first + 1800.0, clock.now]


@pytest.mark.parametrize("content", [None, "", "{not json", json.dumps({"head": "h", "files": {}})[:-1]])
def test_a_missing_or_torn_ledger_starts_empty(clock: ManualClock, tmp_path: Path, content: str | None) -> None:
    path = tmp_path / "ledger.json"
    if content is not None:
        path.write_text(content)

    ledger = Ledger(path)

    assert ledger.files == {} and ledger.head is None and ledger.commit_times == []


def test_rebuild_starts_over_from_the_hubs_listing(clock: ManualClock, tmp_path: Path) -> None:
    path = tmp_path / "ledger.json"
    ledger = Ledger(path)
    ledger.record([staged("gone.txt", "1" * 64), staged("weights/last.pt", "a" * 64)], head="h1")

    ledger.rebuild({"weights/last.pt": "e" * 64}, head="h9")

    again = Ledger(path)
    assert again.files == {"weights/last.pt": ["e" * 64]} and again.head == "h9"
    assert not again.has("gone.txt", ["1" * 64])


def test_a_flush_that_staged_nothing_names_the_last_snapshot_not_zero_files() -> None:
    def uploader(pending: list[str]) -> Uploader:
        return cast(Uploader, SimpleNamespace(pending=pending, repo_id="org/model", last_error=None))

    assert sync_error(uploader([])).message == "the run's last snapshot is not on org/model (out of time)"
    named = sync_error(uploader(["weights/last.pt"]), " (stopped by a signal)").message
    assert named == "1 file(s) are not on org/model (stopped by a signal): weights/last.pt (out of time)"


# -- a commit whose answer was lost ------------------------------------------------------------------------


class AnsweringStore:
    """A store whose first commit lands but loses its answer (a reset after the Hub wrote it)."""

    name = "org/model"

    def __init__(self, *, lands: bool) -> None:
        self.lands = lands
        self.commits: list[tuple[str, list[str]]] = []  # commit id, files: what reached the store
        self.asked: list[str] = []

    def commit(self, files: Sequence[StagedFile], message: str, *, deadline: float | None, commit_id: str) -> str:
        if not self.commits and self.lands:
            self.commits.append((commit_id, [f.relative for f in files]))
            raise ConnectionError("connection reset")  # landed; the answer is lost
        if not self.lands and not self.asked:
            raise ConnectionError("connection reset")  # never reached the store
        self.commits.append((commit_id, [f.relative for f in files]))
        return f"sha{len(self.commits)}"

    def landed(self, commit_id: str, *, deadline: float | None) -> str | None:
        self.asked.append(commit_id)
        return "sha1" if any(done == commit_id for done, _ in self.commits) else None

    def tidy(self, *, deadline: float | None) -> None:
        return None


def committers(tmp_path: Path, store: AnsweringStore) -> tuple[c.Committers, Lane, StagedFile]:
    lane = Lane(cast(AStore, store), tmp_path, takes=lambda _: True, budget=None)
    up = shared(lane)
    copy = tmp_path / "copy"
    copy.write_bytes(b"weights")
    item = StagedFile("weights/last.pt", copy, "a" * 64, None, 7, epochs=3)
    lane.pending[item.relative] = item
    return c.Committers(cast(c.Shared, up)), lane, item


def test_a_commit_whose_answer_was_lost_but_landed_is_not_sent_again(tmp_path: Path) -> None:
    store = AnsweringStore(lands=True)
    run, lane, item = committers(tmp_path, store)

    assert c.step(run, lane) is None  # the commit landed, its answer was lost
    unconfirmed = lane.unconfirmed
    assert unconfirmed is not None and unconfirmed[1] == [item] and lane.pending and lane.failures == 1
    lane.retry_at = 0.0
    c.step(run, lane)

    assert store.asked == [store.commits[0][0]], "the store was asked about that very commit"
    assert len(store.commits) == 1, "landed once, never sent again"
    assert (lane.pending, lane.unconfirmed, lane.commits, lane.failures) == ({}, None, ["sha1"], 0)
    assert run.up.kept_epochs == 3


def test_a_commit_that_never_landed_is_sent_again(tmp_path: Path) -> None:
    store = AnsweringStore(lands=False)
    run, lane, _ = committers(tmp_path, store)

    c.step(run, lane)
    lane.retry_at = 0.0
    c.step(run, lane)

    assert len(store.asked) == 1 and store.commits and store.commits[0][1] == ["weights/last.pt"]
    assert not lane.pending and lane.unconfirmed is None and lane.commits == ["sha1"]
