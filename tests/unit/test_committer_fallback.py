"""The committers' turns of the working state (sync/committer.py) on a clock the test moves: the repo takes it
when the bucket keeps failing and gives it back when the bucket answers, each said once to trainbox.json; a
model card the Hub refuses is dropped and said once; a newer attempt stops every write and the job is told once;
a commit whose answer was lost and that landed is settled as landed, not measured. The committer's
turns too: the pause before a failed commit is tried again (short while a flush waits or the bucket counts its way to
the fallback, longer beside training), a bucket that refuses the token handing the working state to the repo at
once, a flush's deadline reaching the lease check, the commit, its confirmation and the tidy, a lost answer
confirmed by the commit id it was sent with, a card refused inside a commit, the staging folder's copies deleted
once no lane holds them, and the thread's loop around ``step``."""

from __future__ import annotations

import logging
import threading
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import pytest

from entrypoint.errors import AccessError, AgentError, StopRequested, TakenOverError
from entrypoint.hub import CardRefusedError, RateLimitedError
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
    """Answers each commit with the next of ``answers`` (an exception is raised), recording every call."""

    def __init__(self, name: str, *answers: object, landed: str | None = None) -> None:
        self.name, self.answers, self.landed_answer = name, list(answers), landed
        self.calls: list[tuple[Any, ...]] = []

    def commit(self, files: list[StagedFile], message: str, *, deadline: float | None, commit_id: str) -> str:
        self.calls.append(("commit", sorted(item.relative for item in files), deadline, commit_id))
        answer = self.answers.pop(0) if self.answers else "sha-1"
        if isinstance(answer, BaseException):
            raise answer
        return str(answer)

    def landed(self, commit_id: str, *, deadline: float | None) -> str | None:
        self.calls.append(("landed", commit_id, deadline))
        return self.landed_answer

    def tidy(self, *, deadline: float | None) -> None:
        self.calls.append(("tidy", deadline))


class _Lease:
    def __init__(self) -> None:
        self.checks: list[float | None] = []

    def check(self, deadline: float | None) -> None:
        self.checks.append(deadline)

    def landed(self) -> None:
        pass


def staged(tmp_path: Path, relative: str) -> StagedFile:
    copy = tmp_path / "staging" / f"{relative.replace('/', '_')}-{len(list(tmp_path.rglob('*')))}"
    copy.parent.mkdir(parents=True, exist_ok=True)
    copy.write_bytes(relative.encode())
    return StagedFile(relative, copy, "a" * 64, None, len(relative), epochs=3, seen_at=1.0)


def item(tmp_path: Path, relative: str, epochs: int | None = None) -> StagedFile:
    copy = tmp_path / "copies" / relative
    copy.parent.mkdir(parents=True, exist_ok=True)
    copy.write_bytes(relative.encode())
    return StagedFile(relative, copy, "a" * 64, None, len(relative), epochs=epochs, seen_at=1.0)


class Run:
    """Committers of a repo lane and a bucket lane, bucket mode, with every hook recorded; ``repo``, ``bucket``: the
    stores' scripted answers."""

    def __init__(self, tmp_path: Path, repo: _Store | None = None, bucket: _Store | None = None) -> None:
        self.repo_store, self.bucket_store = repo or _Store("org/model"), bucket or _Store("org/ckpt")
        self.repo = Lane(cast(Store, self.repo_store), tmp_path / "repo", takes=lambda _: True, budget=None)
        self.bucket = Lane(cast(Store, self.bucket_store), tmp_path / "bucket", takes=lambda _: True, budget=None)
        self.routing = places.Routing(self.repo, self.bucket, 3600.0)
        self.again: list[Any] = []
        self.storage: list[dict[str, Any]] = []
        self.cards: list[str | None] = []
        self.lost: list[TakenOverError] = []
        self.lease = _Lease()
        self.up = shared(
            self.repo,
            self.bucket,
            routing=self.routing,
            snapshots=SimpleNamespace(again=self.again.append, answered=lambda _ticket: True),
            on_card=self.cards.append,
            on_storage=self.storage.append,
            on_taken_over=self.lost.append,
            lease=self.lease,
            cutoff=9000.0,
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


def test_a_commit_refused_as_taken_over_loses_the_run_and_keeps_its_files_unlanded(
    tmp_path: Path, fake: ManualClock
) -> None:
    refused = TakenOverError("the repo moved: attempt b took the run", "leave it")
    run = Run(tmp_path, bucket=_Store("org/ckpt", refused))
    last = run.bucket.pending["weights/last.pt"] = staged(tmp_path, "weights/last.pt")
    assert c.step(run.committers, run.bucket) is None
    assert run.lost == [refused] and run.up.taken_over is not None, "the job is told: it ends 71"
    assert run.bucket.pending == {"weights/last.pt": last} and run.bucket.in_flight == [], "nothing taken as landed"
    assert run.bucket.commits == [] and run.bucket.busy is False
    assert run.bucket.retry_at == 0.0 and run.bucket.failures == 0, "no failure to retry: the run is another's"


def test_an_error_escaping_a_turn_is_the_lanes_last_error_tried_again_after_a_pause(
    tmp_path: Path, fake: ManualClock, caplog: pytest.LogCaptureFixture
) -> None:
    run = Run(tmp_path)
    run.bucket.pending = {"weights/last.pt": staged(tmp_path, "weights/last.pt")}

    def broken(deadline: float | None) -> None:
        raise OSError("disk gone")

    run.lease.check = broken  # type: ignore[method-assign]
    with caplog.at_level(logging.INFO, logger="trainbox"):
        assert c.step(run.committers, run.bucket) is None
    assert run.bucket.last_error == "OSError: disk gone" and run.bucket_store.calls == []
    assert run.bucket.failures == 1 and run.bucket.retry_at == fake.now + 1.0 and run.bucket.busy is False
    assert run.lost == [] and run.up.taken_over is None
    said = [r.getMessage() for r in caplog.records]
    assert said == ["sync: the committer of org/ckpt hit OSError: disk gone; trying again"]


def test_a_landed_commit_is_a_heartbeat_clears_the_lanes_error_and_says_what_went_where(
    tmp_path: Path, fake: ManualClock, caplog: pytest.LogCaptureFixture
) -> None:
    run = Run(
        tmp_path,
        bucket=_Store("org/ckpt", "run/r/manifests/a-000002.json"),
        repo=_Store("org/model", "0123456789abcdef"),
    )
    run.up.card_refused, run.bucket.last_error = "YAML metadata error: license", "HTTP 503"
    told: list[tuple[str, list[str]]] = []
    run.up.on_commit = lambda sha, names: told.append((sha, names))
    run.bucket.pending = {"weights/last.pt": staged(tmp_path, "weights/last.pt")}  # 3 epochs, seen at 1.0
    fake.now = 11.0
    with caplog.at_level(logging.INFO, logger="trainbox"):
        assert c.step(run.committers, run.bucket) is None
    assert run.bucket.commits == ["run/r/manifests/a-000002.json"] and run.bucket.last_error is None
    assert list(run.bucket.latencies) == [10.0], "from when its oldest file was seen"
    assert run.up.kept_epochs == 3, "a start elsewhere resumes from these epochs"
    assert run.up.card_refused == "YAML metadata error: license" and run.cards == [], "no card in it: still refused"
    assert run.up.owes_run_id is False, "a bucket commit owes nothing to the repo"
    assert [r.getMessage() for r in caplog.records] == ["sync: weights/last.pt → org/ckpt@a-000002.json"]
    assert told == [("run/r/manifests/a-000002.json", ["weights/last.pt"])], "the working store's commits are told"

    run.up.owes_run_id, run.up.kept_epochs = True, 0  # trainbox.json is owed to the repo: a repo commit carries it
    run.repo.pending = {
        "README.md": staged(tmp_path, "README.md"),
        "weights/epoch_4.pt": item(tmp_path, "weights/epoch_4.pt", epochs=None),
    }
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="trainbox"):
        assert c.step(run.committers, run.repo) is None
    assert run.up.card_refused is None and run.cards == [None], "the card that landed is no longer refused"
    assert run.up.owes_run_id is False and run.up.kept_epochs == 0, "a snapshot of unknown epochs counts none"
    assert [r.getMessage() for r in caplog.records] == ["sync: README.md, weights/epoch_4.pt → org/model@01234567"]
    assert len(told) == 1, "the repo beside the bucket: not the working state's store"


def test_a_lost_answer_that_landed_is_settled_as_landed_and_not_measured(tmp_path: Path, fake: ManualClock) -> None:
    run = Run(tmp_path)
    store = _Store("org/model", landed="sha-landed")
    run.repo.store = cast(Store, store)
    last = item(tmp_path, "weights/last.pt", epochs=6)
    run.repo.pending = {last.relative: last}
    run.repo.unconfirmed = ("commit-1", [last])

    run.committers._confirm_earlier(run.repo, 7000.0)

    assert store.calls == [("landed", "commit-1", 7000.0)], "asked about that commit, within the deadline"
    assert (unconfirmed(run.repo), run.repo.pending, run.repo.commits) == (None, {}, ["sha-landed"])
    assert list(run.repo.latencies) == [], "its latency is not known: not measured"
    assert run.repo.in_flight == [] and run.committers._discard == [last]

    store.landed_answer = None
    run.repo.unconfirmed = ("commit-2", [last])
    run.committers._confirm_earlier(run.repo, None)
    assert store.calls[-1] == ("landed", "commit-2", None) and unconfirmed(run.repo) is None
    assert run.repo.commits == ["sha-landed"], "not landed: sent again by the next commit"


# -- the pause before a failed commit is tried again ------------------------------------------------------------
def test_a_failed_commit_beside_training_waits_longer_each_time_up_to_a_minute(
    tmp_path: Path, fake: ManualClock
) -> None:
    run = Run(tmp_path)
    run.committers._after_try(run.repo, ok=True)
    assert run.repo.retry_at == 0.0, "a commit that landed is not held back"
    pauses = []
    for _ in range(8):
        run.committers._after_try(run.repo, ok=False)
        pauses.append(run.repo.retry_at - fake.now)
    assert pauses == [2.0, 4.0, 8.0, 16.0, 32.0, 60.0, 60.0, 60.0]
    assert run.repo.failing_since == 5000.0 and run.repo.failures == 8


def test_a_failed_commit_is_tried_again_within_a_second_while_a_flush_waits(tmp_path: Path, fake: ManualClock) -> None:
    run = Run(tmp_path)
    run.up.flush_deadlines = [5100.0]
    for _ in range(4):
        run.committers._after_try(run.repo, ok=False)
        assert run.repo.retry_at - fake.now == 1.0, "someone waits on it: short retries"


def test_the_bucket_retries_within_a_second_while_it_counts_its_way_to_the_fallback_then_longer(
    tmp_path: Path, fake: ManualClock
) -> None:
    run = Run(tmp_path)
    run.committers._after_try(run.bucket, ok=False)
    assert run.bucket.retry_at - fake.now == 1.0, "each try carries the newest boundary"
    run.up.fallback = "HTTP 503"  # the repo holds the working state: the bucket is tried beside training
    for expected in (4.0, 8.0):
        run.committers._after_try(run.bucket, ok=False)
        assert run.bucket.retry_at - fake.now == expected


def test_a_lane_due_in_half_a_second_waits_it_out_and_then_commits(tmp_path: Path, fake: ManualClock) -> None:
    run = Run(tmp_path)
    run.bucket.pending = {"weights/last.pt": staged(tmp_path, "weights/last.pt")}
    run.bucket.retry_at = fake.now + 0.5
    assert c.step(run.committers, run.bucket) == 0.5, "the turn asks for the rest of the pause"
    assert run.bucket_store.calls == [], "nothing sent before its time"
    fake.now += 0.5
    assert c.step(run.committers, run.bucket) is None and run.bucket_store.calls[0][0] == "commit"


# -- a bucket that refuses the token -------------------------------------------------------------------------------
def test_a_bucket_refusing_the_token_hands_the_working_state_to_the_repo_at_once_and_is_forgiven_once_it_answers(
    tmp_path: Path, fake: ManualClock
) -> None:
    run = Run(tmp_path, bucket=_Store("org/ckpt", AccessError("HTTP 403 on the bucket", "give the token write")))
    run.bucket.pending = {"weights/last.pt": staged(tmp_path, "weights/last.pt")}

    assert c.step(run.committers, run.bucket) is None
    assert run.bucket.denied_at == 5000.0 and run.bucket.unconfirmed is None, "a refusal is a clear no"
    assert run.routing.fallback == "HTTP 403 on the bucket — give the token write", "one failure, no wait"

    run.up.fallback = run.routing.fallback
    fake.now = run.bucket.retry_at
    run.bucket_store.answers = ["m/attempt-000002.json"]
    assert c.step(run.committers, run.bucket) is None
    assert run.bucket.denied_at == 0.0, "the refusal is forgotten once the bucket answers"
    assert run.routing.fallback is None, "and the working state goes back to it"


def test_the_bucket_takes_the_working_state_back_only_after_a_commit_of_its_own_landed(
    tmp_path: Path, fake: ManualClock
) -> None:
    run = Run(tmp_path)
    run.committers._fall_back("HTTP 503")
    run.up.fallback = run.routing.fallback
    run.repo.commits.append("sha-of-the-repo")
    run.committers._after_try(run.repo, ok=True)
    assert run.routing.fallback == "HTTP 503", "the repo's commit says nothing of the bucket"
    run.committers._after_try(run.bucket, ok=True)
    assert run.routing.fallback == "HTTP 503", "a bucket try with nothing landed proves nothing"


# -- a flush's deadline reaches every call the commit makes --------------------------------------------------------
def test_a_flush_hands_its_deadline_to_the_lease_check_the_confirmation_the_commit_and_the_tidy(
    tmp_path: Path, fake: ManualClock
) -> None:
    run = Run(tmp_path)
    run.up.flush_deadlines = [5200.0, 5300.0]
    last = staged(tmp_path, "weights/last.pt")
    run.repo.pending = {last.relative: last}
    run.repo.unconfirmed = ("lost-commit", [last])

    assert run.committers._commit_pending(run.repo)

    assert run.lease.checks == [5300.0, 5300.0], "before the commit and before the tidy"
    assert [call[0] for call in run.repo_store.calls] == ["landed", "commit", "tidy"]
    assert run.repo_store.calls[0] == ("landed", "lost-commit", 5300.0)
    assert run.repo_store.calls[1][2] == 5300.0 and run.repo_store.calls[2] == ("tidy", 5300.0)

    run.up.flush_deadlines, run.up.cutoff = [9500.0], 9000.0
    run.repo.pending = {last.relative: staged(tmp_path, "weights/last.pt")}
    run.committers._commit_pending(run.repo)
    assert run.repo_store.calls[-2][2] == 9000.0, "never past the cutoff"

    run.up.flush_deadlines = []
    run.repo.pending = {last.relative: staged(tmp_path, "weights/last.pt")}
    run.committers._commit_pending(run.repo)
    assert run.repo_store.calls[-2][2] is None and run.lease.checks[-1] is None, "beside training: no deadline"


def test_a_final_upload_spends_over_the_budget_but_a_boundary_of_the_working_store_waits_for_it(
    tmp_path: Path, fake: ManualClock
) -> None:
    run = Run(tmp_path)
    last = staged(tmp_path, "weights/last.pt")
    run.bucket.pending = {last.relative: last}
    run.repo.pending = {last.relative: last}
    for lane in (run.repo, run.bucket):
        lane.budget = cast(Any, SimpleNamespace(hold=lambda: 0.0, wait_time=lambda: 30.0))
    run.up.owes_run_id = True  # trainbox.json still owed to the repo
    assert run.committers._time_to_commit(run.repo) == 0.0, "the run id goes to the repo over budget"
    assert run.committers._time_to_commit(run.bucket) == 30.0, "the repo's debt is not the bucket's"


# -- a commit's answer lost, a card refused --------------------------------------------------------------------------
def test_a_lost_answer_is_kept_with_the_commit_id_it_was_sent_with_and_confirmed_by_it(
    tmp_path: Path, fake: ManualClock
) -> None:
    run = Run(tmp_path, repo=_Store("org/model", ConnectionError("reset by peer"), landed="sha-landed"))
    last = staged(tmp_path, "weights/last.pt")
    run.repo.pending = {last.relative: last}

    assert not run.committers._commit_pending(run.repo)
    sent_with = run.repo_store.calls[0][3]
    assert isinstance(sent_with, str) and len(sent_with) >= 16
    assert run.repo.unconfirmed == (sent_with, [last]) and run.repo.last_error == "ConnectionError: reset by peer"
    assert run.repo.pending == {last.relative: last}, "kept for the next try"

    run.committers._commit_pending(run.repo)
    assert run.repo_store.calls[1] == ("landed", sent_with, None), "asked about that very commit"
    assert run.repo.commits == ["sha-landed"] and run.repo.pending == {}, "it landed: not sent again"
    assert [call[0] for call in run.repo_store.calls] == ["commit", "landed"]


def test_a_429_is_a_clear_no_that_quiets_the_lane_and_an_agent_error_is_said_plainly(
    tmp_path: Path, fake: ManualClock
) -> None:
    run = Run(
        tmp_path, repo=_Store("org/model", RateLimitedError("HTTP 429 on commits", 120.0), AgentError("HTTP 500"))
    )
    run.repo.pending = {"weights/last.pt": staged(tmp_path, "weights/last.pt")}
    assert not run.committers._commit_pending(run.repo)
    assert run.repo.unconfirmed is None and run.repo.last_error == "HTTP 429 on commits", "refused: it did not land"
    assert run.repo.budget.wait_time() >= 119.0, "quiet until the Hub allows commits again"
    assert run.repo.denied_at == 0.0

    assert not run.committers._commit_pending(run.repo)
    assert run.repo.last_error == "HTTP 500", "an error of ours is said as it is, without its type"
    assert run.repo.unconfirmed is not None, "no answer is not a no"


def test_a_card_refused_inside_a_commit_is_dropped_and_the_rest_goes_at_once(tmp_path: Path, fake: ManualClock) -> None:
    run = Run(tmp_path, repo=_Store("org/model", CardRefusedError("YAML metadata error: license")))
    card, metrics = staged(tmp_path, "README.md"), staged(tmp_path, "metrics.jsonl")
    run.repo.pending = {card.relative: card, metrics.relative: metrics}

    assert run.committers._commit_pending(run.repo), "not a failure: no retry pause"
    assert run.repo.pending == {"metrics.jsonl": metrics}, "the rest stays pending, to go at once"
    assert run.up.card_refused == "YAML metadata error: license"
    assert run.repo.in_flight == [] and run.committers._discard == [card]
    assert run.repo.commits == [] and run.repo.unconfirmed is None

    assert run.committers._commit_pending(run.repo)
    assert run.repo_store.calls[-2][1] == ["metrics.jsonl"] and run.repo.pending == {}


# -- the staging folder ----------------------------------------------------------------------------------------------
def test_copies_no_lane_holds_are_deleted_and_one_already_gone_is_no_error(tmp_path: Path, fake: ManualClock) -> None:
    run = Run(tmp_path)
    held, superseded, gone = (staged(tmp_path, name) for name in ("weights/last.pt", "weights/last.pt", "a.json"))
    run.bucket.pending = {held.relative: held}
    run.committers._discard = [held, superseded, gone]
    gone.path.unlink()

    run.committers._drop_discarded()

    assert held.path.exists() and not superseded.path.exists()
    assert run.committers._discard == [held], "kept until no lane holds it"


def test_a_failed_commit_lets_go_of_the_copies_a_newer_one_superseded_and_keeps_the_current_ones(
    tmp_path: Path, fake: ManualClock
) -> None:
    run = Run(tmp_path)
    older, current = staged(tmp_path, "weights/last.pt"), staged(tmp_path, "metrics.jsonl")
    newer = staged(tmp_path, "weights/last.pt")
    run.repo.pending = {newer.relative: newer, current.relative: current}
    run.committers._settle(run.repo, [older, current], committed=False)
    assert run.committers._discard == [older] and run.repo.pending == {newer.relative: newer, current.relative: current}


# -- the thread's loop -------------------------------------------------------------------------------------------------
def test_the_committer_thread_waits_the_turn_step_asks_for_and_stops_when_told(
    tmp_path: Path, fake: ManualClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    run = Run(tmp_path)
    turns = iter([2.5, None, 0.75])

    def one_turn(_committers: c.Committers, lane: Lane) -> float | None:
        wait = next(turns, None)
        if wait == 0.75:
            run.up.stopping.set()
        lane.work.set()
        return wait

    monkeypatch.setattr(c, "step", one_turn)
    worker = threading.Thread(target=run.committers.run, args=(run.repo,), daemon=True)
    worker.start()
    worker.join(5.0)
    assert not worker.is_alive(), "a stop ends the loop"
    assert fake.waits == [2.5, 0.75], "a turn that committed goes again at once"
    assert not run.repo.work.is_set(), "the work flag is cleared after each wait"
