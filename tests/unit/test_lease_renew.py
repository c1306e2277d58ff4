"""The holder's side of the run's lease between boundaries (sync/lease.py, docs/stores.md "The run's lease"), on a
clock the test moves and a Hub whose lease reads are scripted: quiet for half a period, the heartbeat is a small
object in the bucket (the one before it deleted) or a lease commit on the head it read; a lease another took stops
the holder, writing nothing; a token refused stops it too; the heartbeat thread tells a lost run once and ends."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from types import SimpleNamespace
from typing import Any, cast
from unittest import mock

import httpx2
import pytest
from huggingface_hub.errors import BucketNotFoundError, HfHubHTTPError

from entrypoint import hub as hub_module
from entrypoint.errors import LeaseHeldError, LeaseRefusedError, StoreUnreadableError, TakenOverError
from entrypoint.retry import RetryPolicy, describe
from entrypoint.sync import clock
from entrypoint.sync import lease as lease_module
from entrypoint.sync import protocol as p
from tests.fakes.manual_clock import ManualClock

pytestmark = pytest.mark.protocol  # the protocol lane: fast, real tests of the store protocol's code

ME, OTHER = "0000000000002-bbbbbb", "0000000000003-cccccc"
PERIOD = 120.0


class _Bucket:
    bucket_id = "org/ckpt"

    def __init__(self) -> None:
        self.batches: list[tuple[list[tuple[bytes, str]], list[str]]] = []
        self.before_retry: list[Callable[[], None] | None] = []

    def batch(
        self, adds: list[tuple[bytes, str]], deletes: list[str], before_retry: Callable[[], None] | None = None
    ) -> None:
        self.batches.append((adds, deletes))
        self.before_retry.append(before_retry)


def http_error(status: int) -> HfHubHTTPError:
    request = httpx2.Request("POST", "https://hub.test/api/models/org/model/commit/main")
    return HfHubHTTPError(f"{status}: scripted", response=httpx2.Response(status, request=request))


@pytest.fixture
def fake() -> Any:
    moved = ManualClock(1000.0, wall_offset=7.0)  # the wall clock apart from the monotonic one
    with clock.use(moved):
        yield moved


def holder(
    *,
    bucket: _Bucket | None = None,
    reads: Sequence[p.Lease | Exception | None] | None = None,
    slow: float | list[float] = 0.0,
    period: float = PERIOD,
) -> lease_module.RunLease:
    """The holder of run ``run-id`` (attempt ME); its lease reads answer ``reads`` in turn (the last one again; an
    exception is raised), each taking ``slow`` seconds."""
    held = lease_module.RunLease(mock.Mock(), "org/model", "run", period, bucket, machine="vol-1")  # type: ignore[arg-type]
    held.attempt, held.run_id = ME, "run-id"
    answers = list(reads if reads is not None else [p.Lease("run-id", ME, 0.0)])
    held.reads = 0  # type: ignore[attr-defined]
    held.read_deadlines = []  # type: ignore[attr-defined]

    def read(deadline: float | None = None) -> tuple[p.Lease | None, str, float | None]:
        held.reads += 1  # type: ignore[attr-defined]
        held.read_deadlines.append(deadline)  # type: ignore[attr-defined]
        clock.sleep(slow if isinstance(slow, float) else slow.pop(0) if len(slow) > 1 else slow[0])
        answer = answers.pop(0) if len(answers) > 1 else answers[0]
        if isinstance(answer, Exception):
            raise answer
        return answer, f"head{held.reads}", None  # type: ignore[attr-defined]

    held.read = read  # type: ignore[method-assign]
    return held


def api(held: lease_module.RunLease) -> mock.Mock:
    return cast(mock.Mock, held.hub.api)


def commits(held: lease_module.RunLease) -> list[tuple[p.Lease | None, str, str]]:
    """The lease commits sent: the lease, the parent commit, the message."""
    sent: list[tuple[p.Lease | None, str, str]] = []
    for call in api(held).create_commit.call_args_list:
        (repo_id, operations), kwargs = call.args, call.kwargs
        assert repo_id == "org/model" and [op.path_in_repo for op in operations] == [lease_module.LEASE_FILE]
        sent.append((p.Lease.parse(operations[0].path_or_fileobj), kwargs["parent_commit"], kwargs["commit_message"]))
    return sent


# -- renew ---------------------------------------------------------------------------------------------------
def test_a_quiet_holder_beats_in_the_bucket_each_beat_a_new_object_the_one_before_deleted(fake: ManualClock) -> None:
    bucket = _Bucket()
    held = holder(bucket=bucket)
    held._checked_at = fake.now  # a fresh read: no read needed

    held.renew(in_bucket=True)
    fake.now += 60.0
    held._checked_at = fake.now
    held.renew(in_bucket=True)

    beat = "run/run-id/heartbeat/" + ME
    assert bucket.batches == [([(b"{}", f"{beat}-000001")], []), ([(b"{}", f"{beat}-000002")], [f"{beat}-000001"])]
    assert bucket.before_retry == [held.check, held.check], "a beat sent again checks the lease first"
    assert held.quiet() == 0.0, "a beat is a write of this attempt"
    assert commits(held) == [] and held.reads == 0  # type: ignore[attr-defined]


def test_without_a_bucket_the_beat_is_a_lease_commit_on_the_head_it_read(fake: ManualClock) -> None:
    for bucket, in_bucket in ((None, True), (_Bucket(), False)):
        held = holder(bucket=bucket, reads=[p.Lease("run-id", ME, 0.0)])
        held.instance = ("runpod", "7h9k2m4n6p")
        held._checked_at = fake.now

        held.renew(in_bucket=in_bucket)

        renewed = p.Lease(
            "run-id", ME, fake.now + 7.0, PERIOD, machine="vol-1", provider="runpod", instance="7h9k2m4n6p"
        )
        assert commits(held) == [(renewed, "head1", "Renew the run's lease")]
        assert held.quiet() == 0.0
        assert bucket is None or bucket.batches == []


def test_a_beat_is_never_sent_while_the_repo_rate_limits_the_runs_commits(fake: ManualClock) -> None:
    held = holder()
    held.landed()
    fake.now += 70.0
    held._checked_at = fake.now
    held.may_commit = lambda: False

    held.renew(in_bucket=False)

    assert commits(held) == [] and held.reads == 0  # type: ignore[attr-defined]
    assert held.quiet() == 70.0, "no beat landed"


@pytest.mark.parametrize("found", [p.Lease("run-id", OTHER, 0.0), None], ids=["another", "gone"])
def test_a_lease_another_took_or_deleted_stops_the_renewal_and_the_holder_writing_nothing(
    fake: ManualClock, found: p.Lease | None
) -> None:
    held = holder(reads=[found], slow=PERIOD / 4)  # a read that takes a quarter period
    held._checked_at = fake.now  # fresh: only the renewal's own read finds it

    with pytest.raises(TakenOverError) as lost:
        held.renew(in_bucket=False)

    assert commits(held) == [] and held.lost is lost.value
    assert held.reads == 2, "the renewal's read, then the check's"  # type: ignore[attr-defined]
    assert lost.value.message == (
        f"another container (attempt {OTHER}) took this run over after this one (attempt {ME}) was quiet a whole"
        " lease period; this one stops writing and training"
        if found is not None
        else f"the run's lease is gone from org/model (deleted or rewritten by hand): this one (attempt {ME}) cannot"
        " prove it holds the run, and stops writing and training"
    )
    assert lost.value.hint == "leave the other one running; this volume's epochs are kept"


def test_a_lease_another_took_within_the_last_reads_licence_is_not_renewed(fake: ManualClock) -> None:
    held = holder(reads=[p.Lease("run-id", OTHER, 0.0)])
    held._checked_at = fake.now
    held.landed()
    fake.now += 70.0
    held._checked_at = fake.now

    held.renew(in_bucket=False)  # the taker writes only a quarter period after its take: this one stops then

    assert commits(held) == [] and held.quiet() == 70.0 and held.reads == 1  # type: ignore[attr-defined]


def test_a_holder_already_taken_over_renews_nothing(fake: ManualClock) -> None:
    bucket = _Bucket()
    held = holder(bucket=bucket)
    held.lost = TakenOverError("taken over", "leave it")

    with pytest.raises(TakenOverError):
        held.renew(in_bucket=True)
    assert bucket.batches == [] and commits(held) == []


@pytest.mark.parametrize("status", [401, 403])
def test_a_token_that_may_no_longer_commit_the_lease_stops_the_holder(fake: ManualClock, status: int) -> None:
    held = holder()
    held._checked_at = fake.now
    api(held).create_commit.side_effect = http_error(status)

    with pytest.raises(LeaseRefusedError) as refused:
        held.renew(in_bucket=False)

    assert held.lost is refused.value
    assert refused.value.message == (
        f"HF_TOKEN may no longer commit the run's lease to org/model (HTTP {status}): this one stops writing and"
        " training; this volume's epochs are kept"
    )
    assert refused.value.hint == "give HF_TOKEN write access to OUTPUT_REPO"


@pytest.mark.parametrize("status", [412, 429])
def test_a_renewal_the_repo_moved_under_or_rate_limited_is_no_loss(fake: ManualClock, status: int) -> None:
    held = holder()
    held._checked_at = fake.now
    fake.now += 70.0
    held._checked_at = fake.now
    api(held).create_commit.side_effect = http_error(status)

    held.renew(in_bucket=False)

    assert held.lost is None and held.quiet() == 0.0, "a commit of ours moved the repo, or one comes later"
    assert api(held).create_commit.call_count == 1, "a rate limit is not waited out here"


def test_any_other_refusal_of_a_renewal_is_raised_and_no_beat_counted(fake: ManualClock) -> None:
    held = holder()
    held._checked_at = fake.now
    held.landed()
    fake.now += 70.0
    held._checked_at = fake.now
    api(held).create_commit.side_effect = http_error(400)

    with pytest.raises(HfHubHTTPError):
        held.renew(in_bucket=False)
    assert held.quiet() == 70.0 and held.lost is None


# -- tick and keep -------------------------------------------------------------------------------------------
def test_a_tick_checks_the_lease_while_writes_come_and_beats_from_half_a_period_of_quiet(fake: ManualClock) -> None:
    bucket, lost = _Bucket(), cast(list[TakenOverError], [])
    held = holder(bucket=bucket)
    held.landed()
    fake.now += PERIOD / 2 - 1

    assert held.tick(True, lost.append) is True
    assert held.reads == 1 and bucket.batches == [], "a check (the last read is old), no beat"  # type: ignore[attr-defined]
    fake.now += 1.0  # half a period quiet
    assert held.tick(True, lost.append) is True
    assert len(bucket.batches) == 1 and held.quiet() == 0.0
    assert held.tick(False, lost.append) is True
    assert len(bucket.batches) == 1 and commits(held) == [], "just beaten: a check"
    fake.now += PERIOD / 2
    assert held.tick(False, lost.append) is True  # the bucket not opened (or failing): the beat is a lease commit
    assert len(bucket.batches) == 1 and len(commits(held)) == 1 and held.quiet() == 0.0
    assert lost == []


def test_a_tick_that_finds_the_run_taken_tells_it_and_ends_the_heartbeat(fake: ManualClock) -> None:
    held, lost = holder(reads=[p.Lease("run-id", OTHER, 0.0)]), cast(list[TakenOverError], [])

    assert held.tick(True, lost.append) is False
    assert len(lost) == 1 and isinstance(lost[0], TakenOverError) and lost[0] is held.lost


def test_a_tick_whose_read_fails_tries_again_at_the_next(fake: ManualClock, caplog: pytest.LogCaptureFixture) -> None:
    held, lost = holder(), cast(list[TakenOverError], [])

    def unreadable(deadline: float | None = None) -> Any:
        raise ConnectionError("reset by peer")

    held.read = unreadable  # type: ignore[method-assign]
    assert held.tick(False, lost.append) is True and lost == []
    assert "lease: renewing the lease failed (ConnectionError); trying again" in caplog.text


def test_the_heartbeat_thread_ticks_every_eighth_period_and_tells_a_lost_run_once(fake: ManualClock) -> None:
    taker = p.Lease("run-id", OTHER, 0.0)
    bucket = _Bucket()
    held = holder(bucket=bucket, reads=[p.Lease("run-id", ME, 0.0)] * 3 + [taker])
    held.landed()
    asked: list[float] = []
    lost: list[TakenOverError] = []

    def in_bucket() -> bool:
        asked.append(fake.now)
        return True

    held.keep(in_bucket, lost.append)
    assert held._thread is not None and held._thread.daemon, "a heartbeat never holds the process at its exit"
    held._thread.join(10.0)

    assert not held._thread.is_alive() and len(lost) == 1 and lost[0] is held.lost
    assert set(fake.waits) == {PERIOD / 8} and len(asked) == len(fake.waits)
    assert bucket.batches, "quiet half a period meanwhile: it beat in the bucket"


def test_a_released_lease_stops_the_heartbeat_thread_before_its_next_tick(fake: ManualClock) -> None:
    held, asked = holder(), cast(list[float], [])
    held.may_commit = lambda: False  # release commits nothing here
    held.release()

    def in_bucket() -> bool:
        asked.append(fake.now)
        return True

    held.keep(in_bucket, lambda error: None)
    assert held._thread is not None
    held._thread.join(10.0)

    assert not held._thread.is_alive() and asked == [] and fake.waits == [PERIOD / 8]


# -- release -----------------------------------------------------------------------------------------------------
def test_the_holder_releases_its_lease_at_the_end_on_the_head_it_read_within_the_deadline(fake: ManualClock) -> None:
    held = holder(reads=[p.Lease("run-id", ME, 1000.0, PERIOD)])
    deadlines: list[float | None] = []
    read = held.read

    def recorded(deadline: float | None = None) -> tuple[p.Lease | None, str, float | None]:
        deadlines.append(deadline)
        return read(deadline)

    held.read = recorded  # type: ignore[method-assign]
    held.release(1234.0)

    assert deadlines == [1234.0]
    assert commits(held) == [(p.Lease("run-id", ME, 1000.0, PERIOD, released=True), "head1", "Release the run's lease")]
    assert held._stop.is_set(), "the heartbeat stops"


@pytest.mark.parametrize(
    "found",
    [p.Lease("run-id", OTHER, 1000.0), p.Lease("run-id", ME, 1000.0, released=True), None],
    ids=["another-holds-it", "released-already", "gone"],
)
def test_a_lease_this_holder_no_longer_holds_is_not_released(fake: ManualClock, found: p.Lease | None) -> None:
    held = holder(reads=[found])
    held.release()
    assert commits(held) == [] and held.reads == 1  # type: ignore[attr-defined]


@pytest.mark.parametrize("why", ["taken-over", "never-held", "rate-limited"])
def test_a_holder_that_lost_the_run_never_held_it_or_may_not_commit_releases_nothing(
    fake: ManualClock, why: str
) -> None:
    held = holder()
    if why == "taken-over":
        held.lost = TakenOverError("taken over by attempt c", "leave it")
    elif why == "never-held":
        held.attempt = None
    else:
        held.may_commit = lambda: False
    held.release()
    assert commits(held) == [] and held.reads == 0, "not even read"  # type: ignore[attr-defined]
    assert held._stop.is_set()


def test_a_release_that_fails_is_said_and_the_lease_left_to_expire(
    fake: ManualClock, caplog: pytest.LogCaptureFixture
) -> None:
    held = holder()
    api(held).create_commit.side_effect = http_error(412)  # the lease moved meanwhile
    with caplog.at_level(logging.INFO, logger="trainbox"):
        held.release()
    assert [r.getMessage() for r in caplog.records] == [
        f"lease: not released ({describe(api(held).create_commit.side_effect)}); it expires after {PERIOD:.0f} s"
    ]


def test_trainbox_json_names_the_attempt_its_period_and_the_lease_file() -> None:
    held = holder()
    assert held.describe() == {"attempt": ME, "period": PERIOD, "file": ".trainbox/lease.json"}


# -- a lease take refused ----------------------------------------------------------------------------------
@pytest.mark.parametrize("status", [401, 403])
def test_a_token_that_may_not_commit_the_lease_ends_the_start_writing_nothing(fake: ManualClock, status: int) -> None:
    taker = holder()
    with pytest.raises(LeaseRefusedError) as refused:
        taker._refused(http_error(status))
    assert refused.value.message == (
        f"HF_TOKEN may not commit the run's lease to org/model (HTTP {status}): a run is never written without its"
        " lease; nothing written"
    )
    assert refused.value.hint == "give HF_TOKEN write access to OUTPUT_REPO" and fake.now == 1000.0


def test_a_rate_limit_past_the_bound_ends_the_start_retryably_and_another_refusal_is_raised(fake: ManualClock) -> None:
    taker = holder()
    with pytest.raises(LeaseRefusedError) as refused:
        taker._refused(HfHubHTTPError("429: scripted", response=_limited(3600)))
    assert refused.value.message == (
        "org/model rate-limits commits for 3600 s more: the run's lease cannot be taken before; nothing written"
    )
    assert refused.value.hint == "start it again after the Hub's rate limit resets (a retryable exit)"
    assert fake.now == 1000.0 and taker.retry_after == 0.0, "nothing waited"
    error = http_error(400)
    with pytest.raises(HfHubHTTPError) as raised:
        taker._refused(error)
    assert raised.value is error


def test_rate_limits_are_waited_out_while_their_sum_stays_within_the_bound(fake: ManualClock) -> None:
    taker = holder()
    assert taker._refused(HfHubHTTPError("429: scripted", response=_limited(600))) is False, "look again"
    assert fake.now == 1600.0 and taker.retry_after == 600.0, "a reset of exactly the bound, waited out"
    with pytest.raises(LeaseRefusedError):
        taker._refused(HfHubHTTPError("429: scripted", response=_limited(1)))  # 601 s in all: past the bound
    assert fake.now == 1600.0


def _limited(seconds: int) -> httpx2.Response:
    request = httpx2.Request("POST", "https://hub.test/api/models/org/model/commit/main")
    return httpx2.Response(429, headers={"Retry-After": str(seconds)}, request=request)


# -- a taker's first write -----------------------------------------------------------------------------------------
def test_a_taker_writes_only_a_quarter_period_after_its_take_and_a_deadline_before_that_is_a_failed_write(
    fake: ManualClock,
) -> None:
    """The holder taken over may have read its lease just before the take: it writes for a quarter period more."""
    taker = holder()
    taker._checked_at = taker._took_at = fake.now
    taker._writes_from = fake.now + PERIOD / 4

    with pytest.raises(TimeoutError) as waits:
        taker.check(deadline=fake.now + PERIOD / 4 - 1.0)
    assert str(waits.value) == "the run was taken over 0 s ago: its first write waits 30 s more"
    assert fake.now == 1000.0, "nothing waited past the deadline"

    fake.now += 10.0
    with pytest.raises(TimeoutError) as waits:
        taker.check(deadline=fake.now + 5.0)
    assert str(waits.value) == "the run was taken over 10 s ago: its first write waits 20 s more"

    taker.check(deadline=taker._writes_from)  # the wait ends on the deadline: within it
    assert fake.now == 1000.0 + PERIOD / 4 and taker.reads == 1, "waited, then read the lease again"  # type: ignore[attr-defined]


def test_a_taker_less_than_a_second_from_its_first_write_waits_that_fraction(fake: ManualClock) -> None:
    taker = holder()
    taker._checked_at = fake.now
    taker._writes_from = fake.now + 0.5
    taker.check()
    assert fake.now == 1000.5
    taker._writes_from = fake.now  # now: no wait
    taker._checked_at = fake.now
    taker.check()
    assert fake.now == 1000.5 and taker.reads == 0, "a fresh read licenses the write"  # type: ignore[attr-defined]


# -- a check that reads the lease ----------------------------------------------------------------------------------
def test_a_check_reads_the_lease_within_the_writes_deadline_once_its_last_read_is_stale(fake: ManualClock) -> None:
    held = holder()
    held._checked_at = fake.now - PERIOD  # a whole period old
    held.check(deadline=fake.now + 30.0)
    assert held.read_deadlines == [1030.0] and held._checked_at == fake.now  # type: ignore[attr-defined]


@pytest.mark.parametrize("status", [401, 403])
def test_a_token_that_may_no_longer_read_the_lease_stops_the_holder_for_good(fake: ManualClock, status: int) -> None:
    held = holder(reads=[http_error(status), p.Lease("run-id", ME, 0.0)])
    held._checked_at = fake.now - PERIOD
    with pytest.raises(LeaseRefusedError) as refused:
        held.check()
    assert refused.value.message == (
        f"HF_TOKEN may no longer read the run's lease in org/model (HTTP {status}): this one stops writing and"
        " training; this volume's epochs are kept"
    )
    assert refused.value.hint == "give HF_TOKEN write access to OUTPUT_REPO"
    with pytest.raises(LeaseRefusedError):
        held.check()  # never a licence to write again, whatever a later read would say
    assert held.reads == 1  # type: ignore[attr-defined]


@pytest.mark.parametrize("status", [404, 500, 429])
def test_any_other_failed_read_of_the_lease_fails_this_write_only(fake: ManualClock, status: int) -> None:
    error = http_error(status)
    held = holder(reads=[error, p.Lease("run-id", ME, 0.0)])
    held._checked_at = fake.now - PERIOD
    with pytest.raises(HfHubHTTPError) as raised:
        held.check()
    assert raised.value is error and held.lost is None
    held.check()  # the next write reads it again
    assert held.reads == 2  # type: ignore[attr-defined]


def test_a_read_of_the_lease_slower_than_a_quarter_of_the_runs_own_period_is_read_again(
    fake: ManualClock, caplog: pytest.LogCaptureFixture
) -> None:
    """The run's period (LEASE_PERIOD), not the default one, says how old a read may be."""
    held = holder(slow=[40.0, 1.0], period=600.0)
    held._checked_at = fake.now - 600.0
    held.check()
    assert held.reads == 1, "40 s is under a quarter of 600 s"  # type: ignore[attr-defined]

    slow = holder(slow=[160.0, 1.0], period=600.0)
    slow._checked_at = fake.now - 600.0
    with caplog.at_level(logging.INFO, logger="trainbox"):
        slow.check()
    assert slow.reads == 2  # type: ignore[attr-defined]
    assert [r.getMessage() for r in caplog.records] == [
        "lease: its read took over a quarter period (150 s); reading it again"
    ]


# -- a holder provably gone ------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("machine", "named", "locked", "gone"),
    [
        ("vol-1", "vol-1", True, True),
        ("vol-1", "vol-1", False, False),  # the lock is another process's: the holder may run on this volume
        ("vol-1", "vol-2", True, False),
        (None, None, True, False),  # no volume id: nothing proves anything
    ],
)
def test_a_holder_on_this_volume_is_gone_only_when_this_process_holds_the_volumes_lock(
    machine: str | None, named: str | None, locked: bool, gone: bool
) -> None:
    mine = lease_module.RunLease(
        mock.Mock(), "org/model", "run", PERIOD, None, machine=machine, volume_locked=lambda: locked
    )
    assert lease_module._same_volume(mine, p.Lease("run-id", OTHER, 0.0, machine=named)) is gone


def test_the_provider_is_asked_about_the_holders_instance_for_what_is_left_of_the_watch_at_most(
    fake: ManualClock, caplog: pytest.LogCaptureFixture
) -> None:
    asked: list[tuple[str | None, float]] = []

    def ended(lease: p.Lease, within: float) -> str | None:
        asked.append((lease.instance, within))
        if lease.instance == "broken":
            raise ConnectionError("connection refused")
        return "destroyed" if lease.instance == "gone-1" else None

    mine = lease_module.RunLease(mock.Mock(), "org/model", "run", PERIOD, None, holder_ended=ended)
    mine.attempt = ME
    placed = p.Lease("run-id", OTHER, 0.0, 300.0, provider="vast", instance="gone-1")
    assert lease_module._holder_ended(mine, placed, p.Watch(since=fake.now - 100.0, token="t")) == "destroyed"
    assert lease_module._holder_ended(mine, placed, None) == "destroyed"
    assert asked == [("gone-1", 200.0), ("gone-1", 300.0)], "the lease's own period, less what was watched"

    asked.clear()
    for unasked in (
        p.Lease("run-id", OTHER, 0.0),  # names no instance
        p.Lease("run-id", OTHER, 0.0, released=True, instance="gone-1"),
        p.Lease("run-id", ME, 0.0, instance="gone-1"),  # this attempt's own
    ):
        assert lease_module._holder_ended(mine, unasked, None) is None
    assert asked == []

    with caplog.at_level(logging.INFO, logger="trainbox"):
        assert lease_module._holder_ended(mine, p.Lease("run-id", OTHER, 0.0, instance="broken"), None) is None
    assert [r.getMessage() for r in caplog.records] == [
        "lease: cannot tell whether broken still runs (ConnectionError)"
    ]


# -- reading the lease -----------------------------------------------------------------------------------------
def test_the_lease_is_read_at_the_repos_head_with_the_heads_time_and_a_404_is_no_lease(
    fake: ManualClock, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    modified = datetime(2026, 12, 7, 10, 0, tzinfo=UTC)
    api = mock.Mock(endpoint="https://hub.test")
    api.repo_info.side_effect = [http_error(503), SimpleNamespace(sha="abc123", last_modified=modified)] + [
        SimpleNamespace(sha="def456", last_modified=None)
    ] * 3
    held_lease = p.Lease("run-id", OTHER, 5.0)
    answers = [httpx2.Response(200, content=held_lease.to_bytes()), httpx2.Response(404)]
    asked: list[tuple[str, dict[str, str]]] = []

    def get(url: str, *, headers: dict[str, str], timeout: float) -> httpx2.Response:
        asked.append((url, headers))
        assert timeout == 30, "a read of the lease never hangs on a frozen connection"
        response = answers.pop(0)
        response.request = httpx2.Request("GET", url)
        return response

    monkeypatch.setattr(lease_module, "get_session", lambda: SimpleNamespace(get=get))
    monkeypatch.setattr(
        hub_module, "RetryPolicy", lambda **kw: RetryPolicy(**{**kw, "sleep": fake.sleep, "clock": fake.monotonic})
    )
    reader = lease_module.RunLease(SimpleNamespace(api=api, token="hf_secret"), "org/model", "run", PERIOD, None)  # type: ignore[arg-type]

    with caplog.at_level(logging.INFO, logger="trainbox"):
        assert reader.read() == (held_lease, "abc123", modified.timestamp())
    assert caplog.records[0].getMessage().startswith("reading org/model: HTTP 503")
    assert asked[0][0] == "https://hub.test/org/model/resolve/abc123/.trainbox/lease.json"
    assert asked[0][1]["authorization"] == "Bearer hf_secret"
    assert reader.read() == (None, "def456", None), "no lease file at that head"
    assert [call.args for call in api.repo_info.call_args_list] == [("org/model",)] * 3

    api.repo_info.side_effect = [http_error(503)]
    with pytest.raises(HfHubHTTPError):
        reader.read(deadline=fake.now + 0.5)  # a retry would start past the deadline: not started
    assert fake.now == 1001.0, "only the first retry's pause was slept"

    api.repo_info.side_effect = None
    api.repo_info.return_value = SimpleNamespace(sha="aaa")  # no last_modified: its time unknown
    answers[:] = [httpx2.Response(503), httpx2.Response(404)]
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="trainbox"):
        assert reader.read() == (None, "aaa", None)
    assert caplog.records[0].getMessage().startswith("reading the run's lease in org/model: HTTP 503")
    answers[:] = [httpx2.Response(503)]
    with pytest.raises(HfHubHTTPError):
        reader.read(deadline=fake.now + 0.5)

    anonymous = lease_module.RunLease(SimpleNamespace(api=api, token=None), "org/model", "run", PERIOD, None)  # type: ignore[arg-type]
    answers[:] = [httpx2.Response(404)]
    anonymous.read()
    assert "authorization" not in asked[-1][1], "no token: none sent, not the machine's own"


# -- the holder's heartbeat as a watcher sees it -------------------------------------------------------------
class _Listed:
    """A bucket whose listings answer ``found`` (``prefix → keys``) or raise ``error``."""

    bucket_id = "org/ckpt"

    def __init__(self, found: dict[str, list[str]] | None = None, error: Exception | None = None) -> None:
        self.found, self.error = found or {}, error
        self.asked: list[tuple[str, bool]] = []

    def listing(self, prefix: str, *, recursive: bool = True) -> dict[str, int]:
        self.asked.append((prefix, recursive))
        if self.error is not None:
            raise self.error
        return dict.fromkeys(self.found.get(prefix, []), 1)


def test_a_holders_heartbeat_is_the_repos_head_and_its_writes_in_the_bucket(fake: ManualClock) -> None:
    no_bucket = holder()
    assert no_bucket._beat(None, "head", 1234.0, "run-id") == p.Beat("head", 1234.0)

    beat, manifest = f"run/run-id/heartbeat/{OTHER}-000003", f"run/run-id/manifests/{OTHER}-000002.json"
    earlier = f"run/run-id/manifests/{ME}-000001.json"
    bucket = _Listed({"run/run-id/heartbeat": [beat], "run/run-id/manifests": [manifest, earlier]})
    watcher = holder(bucket=cast(Any, bucket))
    lease = p.Lease("run-id", OTHER, 0.0)

    assert watcher._beat(lease, "head", 1234.0, "ignored") == p.Beat(f"head|{beat},{manifest}", None, writes=True)
    assert bucket.asked == [("run/run-id/heartbeat", False), ("run/run-id/manifests", False)]
    assert watcher._beat(None, "head", 1234.0, "run-id") == p.Beat(
        f"head|{beat},{earlier},{manifest}", None, writes=True
    ), "without a lease: any attempt's writes"
    quiet = holder(bucket=cast(Any, _Listed()))
    assert quiet._beat(lease, "head", 1234.0, "run-id") == p.Beat("head|", 1234.0, writes=False), "the head's time"


def test_a_bucket_not_there_is_no_write_and_one_that_fails_is_no_look(
    fake: ManualClock, caplog: pytest.LogCaptureFixture
) -> None:
    response = httpx2.Response(404, request=httpx2.Request("GET", "https://hub.test/api/buckets/org/ckpt/tree"))
    missing = holder(bucket=cast(Any, _Listed(error=BucketNotFoundError("404: no bucket", response=response))))
    assert missing._beat(None, "head", 1234.0, "run-id") == p.Beat("head", 1234.0)
    failing = holder(bucket=cast(Any, _Listed(error=http_error(503))))
    with caplog.at_level(logging.INFO, logger="trainbox"):
        assert failing._beat(None, "head", 1234.0, "run-id") is None
    assert [r.getMessage() for r in caplog.records] == [
        "lease: cannot read hf://buckets/org/ckpt/run/run-id now (HTTP 503); looking again"
    ]


# -- the take ------------------------------------------------------------------------------------------------
def test_a_take_commits_this_attempts_lease_on_the_head_it_read_and_says_whom_it_takes_from(
    fake: ManualClock, caplog: pytest.LogCaptureFixture
) -> None:
    taker = holder()
    taker.instance = ("vast", "42")
    quiet = p.Lease("run-id", OTHER, 0.0, 300.0, machine="vol-9")
    with caplog.at_level(logging.INFO, logger="trainbox"):
        assert taker._take("run-id", "head7", quiet)
        assert taker._take("run-id", "head8", p.Lease("run-id", OTHER, 0.0, instance="9"), ended="destroyed")
        assert taker._take("run-id", "head9", p.Lease("run-id", OTHER, 0.0, machine="vol-1"))
        assert taker._take("run-id", "head10", None)
        assert taker._take("run-id", "head11", p.Lease("run-id", OTHER, 0.0, released=True))
    mine = p.Lease("run-id", ME, fake.now + 7.0, PERIOD, machine="vol-1", provider="vast", instance="42")
    assert commits(taker) == [(mine, f"head{n}", "Take the run's lease") for n in range(7, 12)]
    assert [r.getMessage() for r in caplog.records] == [
        f"lease: attempt {OTHER} of run run was quiet a whole lease period (300 s): taking the run over",
        f"lease: attempt {OTHER} held run run on destroyed: taken over at once",
        f"lease: attempt {OTHER} of run run was quiet a whole lease period (120 s): taking the run over",
    ], "a volume whose lock this process does not hold is no proof: the period was waited"


def test_a_take_on_this_volume_whose_lock_it_holds_says_so(fake: ManualClock, caplog: pytest.LogCaptureFixture) -> None:
    taker = holder()
    taker.volume_locked = lambda: True
    with caplog.at_level(logging.INFO, logger="trainbox"):
        assert taker._take("run-id", "head1", p.Lease("run-id", OTHER, 0.0, machine="vol-1"))
    assert [r.getMessage() for r in caplog.records] == [
        f"lease: attempt {OTHER} of run run ran on this volume, whose lock it no longer holds: taking the run over"
    ]


@pytest.mark.parametrize("status", [412, 429])
def test_a_lease_commit_answered_412_or_429_is_never_retried_as_is(
    fake: ManualClock, status: int, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(
        hub_module, "RetryPolicy", lambda **kw: RetryPolicy(**{**kw, "sleep": fake.sleep, "clock": fake.monotonic})
    )
    taker = holder()
    api(taker).create_commit.side_effect = (
        http_error(status) if status == 412 else HfHubHTTPError("429: scripted", response=_limited(3600))
    )
    with pytest.raises(HfHubHTTPError):
        taker._commit(b"{}", "head1", "Take the run's lease")
    assert api(taker).create_commit.call_count == 1 and fake.now == 1000.0
    api(taker).create_commit.side_effect = [http_error(503), None]
    with caplog.at_level(logging.INFO, logger="trainbox"):
        taker._commit(b"{}", "head1", "Take the run's lease")  # a 503 is: the compare-and-swap makes it safe
    assert caplog.records[-1].getMessage().startswith("committing the run's lease to org/model: HTTP 503")
    assert api(taker).create_commit.call_count == 3 and fake.now == 1001.0


def test_a_take_the_repo_moved_under_is_looked_at_again_and_the_lease_names_the_runs_own_period(
    fake: ManualClock, caplog: pytest.LogCaptureFixture
) -> None:
    taker = holder(period=600.0)
    api(taker).create_commit.side_effect = [http_error(412), None]
    with caplog.at_level(logging.INFO, logger="trainbox"):
        assert not taker._take("run-id", "head1", None), "the repo moved: read the lease again"
    assert [r.getMessage() for r in caplog.records] == [
        "lease: the repo moved while the lease was taken; reading it again"
    ]
    assert taker._take("run-id", "head2", None)
    assert commits(taker)[-1][0] == p.Lease("run-id", ME, fake.now + 7.0, 600.0, machine="vol-1")


# -- acquire: watch, take, or end -----------------------------------------------------------------------------
def slept(fake: ManualClock) -> tuple[list[float], Callable[[float], None]]:
    pauses: list[float] = []

    def sleep(seconds: float) -> None:
        pauses.append(seconds)
        fake.sleep(seconds)

    return pauses, sleep


@pytest.mark.parametrize(("period", "pause"), [(240.0, 10.0), (60.0, 5.0)])
def test_a_holders_bucket_that_never_answers_ends_the_start_after_three_periods(
    fake: ManualClock, period: float, pause: float
) -> None:
    watcher = holder(
        bucket=cast(Any, _Listed(error=http_error(503))), reads=[p.Lease("run-id", OTHER, 0.0)], period=period
    )
    pauses, sleep = slept(fake)
    with pytest.raises(StoreUnreadableError) as ended:
        watcher.acquire("run-id", sleep=sleep)
    assert ended.value.message == "cannot tell whether another container holds run run: its bucket does not answer"
    assert ended.value.hint == "start it again once the bucket answers"
    assert set(pauses) == {pause} and fake.now - 1000.0 == 3 * period + pause, "past three periods, not at them"
    assert commits(watcher) == []


def test_a_live_holders_heartbeat_that_moves_ends_this_start_and_a_quiet_one_is_taken_after_its_period(
    fake: ManualClock, caplog: pytest.LogCaptureFixture
) -> None:
    lease = p.Lease("run-id", OTHER, 0.0, 300.0)
    moving = holder(reads=[lease])
    heads = iter(range(100))
    moving.read = lambda deadline=None: (lease, f"head{next(heads)}", None)  # type: ignore[method-assign]
    with pytest.raises(LeaseHeldError) as held:
        moving.acquire("run-id", sleep=fake.sleep)
    assert held.value.message == (
        f"another container holds run run (attempt {OTHER}; its heartbeat moved while this one watched): this one"
        " writes nothing and ends"
    )
    assert held.value.hint == "do not start it again while that one runs; it is not a failure of this run"

    fake.now = 1000.0
    quiet = holder(reads=[lease])
    quiet.read = lambda deadline=None: (lease, "head1", None)  # type: ignore[method-assign]
    pauses, sleep = slept(fake)
    with caplog.at_level(logging.INFO, logger="trainbox"):
        assert quiet.acquire("run-id", sleep=sleep) == "run-id"
    assert fake.now - 1000.0 == 300.0, "the lease's own period, on this machine's clock"
    assert set(pauses) == {10.0} and quiet.took_from == OTHER and quiet.attempt is not None and quiet.attempt > OTHER
    said = [r.getMessage() for r in caplog.records if "watching" in r.getMessage()]
    assert said[:2] == [
        f"lease: attempt {OTHER} holds run run; watching its heartbeat (taken over if quiet 300 s more)",
        f"lease: attempt {OTHER} holds run run; watching its heartbeat (taken over if quiet 270 s more)",
    ], "said every 30 s"
    assert quiet._writes_from == fake.now + 300.0 / 4, "its first write waits out the holder's last licence"
    assert commits(quiet)[0][1] == "head1" and commits(quiet)[0][0] is not None


def test_a_lease_absent_while_the_bucket_holds_the_runs_writes_is_watched_before_it_is_taken(
    fake: ManualClock, caplog: pytest.LogCaptureFixture
) -> None:
    writes = _Listed({"run/run-id/manifests": [f"run/run-id/manifests/{OTHER}-000004.json"]})
    taker = holder(bucket=cast(Any, writes), reads=[None])
    taker.read = lambda deadline=None: (None, "head1", None)  # type: ignore[method-assign]
    taker.attempt = None
    with caplog.at_level(logging.INFO, logger="trainbox"):
        assert taker.acquire("run-id", sleep=fake.sleep, run_known=True) == "run-id"
    assert fake.now - 1000.0 == PERIOD, "the bucket watched a whole period first"
    assert "lease: no lease names a holder of run run; watching its heartbeat" in caplog.text
    assert taker._writes_from == 0.0 and taker.took_from is None, "no holder to wait out"

    fake.now = 1000.0
    fresh = holder(bucket=cast(Any, _Listed()), reads=[None])
    assert fresh.acquire("run-id", sleep=fake.sleep, run_known=False) == "run-id" and fake.now == 1000.0


def test_a_holder_provably_gone_is_taken_over_at_once(fake: ManualClock, caplog: pytest.LogCaptureFixture) -> None:
    on_this_volume = holder(reads=[p.Lease("run-id", OTHER, 0.0, machine="vol-1")])
    on_this_volume.volume_locked = lambda: True
    assert on_this_volume.acquire("run-id", sleep=fake.sleep) == "run-id" and fake.now == 1000.0
    assert on_this_volume._writes_from == 0.0, "its holder died with this volume's lock: nothing of it still writes"

    elsewhere = holder(reads=[p.Lease("run-id", OTHER, 0.0, provider="vast", instance="42")])
    elsewhere.holder_ended = lambda lease, within: "destroyed"
    assert elsewhere.acquire("run-id", sleep=fake.sleep) == "run-id" and fake.now == 1000.0
    assert elsewhere._writes_from == fake.now + PERIOD / 4, "a stopped host may still make its final upload"


def test_a_released_lease_or_this_attempts_own_is_no_wait(fake: ManualClock) -> None:
    released = holder(reads=[p.Lease("other-run", OTHER, 0.0, released=True)])
    assert released.acquire("run-id", sleep=fake.sleep) == "other-run", "the run the lease names"
    assert fake.now == 1000.0 and released._writes_from == 0.0 and released.took_from == OTHER
    mine = holder(reads=[p.Lease("run-id", ME, 0.0)])
    assert mine.acquire("run-id", sleep=fake.sleep) == "run-id" and commits(mine) == [] and mine.took_from is None


def test_a_lease_deleted_by_hand_while_its_holder_writes_ends_this_start_as_held(fake: ManualClock) -> None:
    """No lease to name the holder, but its writes in the bucket move while this one watches: exit 72, no crash."""
    writes = _Listed({"run/run-id/manifests": [f"run/run-id/manifests/{OTHER}-000004.json"]})
    watcher = holder(bucket=cast(Any, writes), reads=[None])
    looks = iter(range(5, 100))

    def moving(deadline: float | None = None) -> tuple[p.Lease | None, str, float | None]:
        writes.found["run/run-id/manifests"] = [f"run/run-id/manifests/{OTHER}-{next(looks):06d}.json"]
        return None, "head1", None

    watcher.read = moving  # type: ignore[method-assign]
    with pytest.raises(LeaseHeldError) as held:
        watcher.acquire("run-id", sleep=fake.sleep, run_known=True)
    assert held.value.message == (
        "another container holds run run (no lease names it; its heartbeat moved while this one watched): this one"
        " writes nothing and ends"
    )
    assert commits(watcher) == []


def test_a_taker_whose_clock_is_behind_the_holders_still_takes_with_a_later_attempt(fake: ManualClock) -> None:
    ahead = "0000099999999-aaaaaa"  # written by a machine whose clock was a day ahead of this one's
    taker = holder(reads=[p.Lease("run-id", ahead, 0.0, released=True)])  # its attempt drawn at an earlier look
    assert taker.acquire("run-id", sleep=fake.sleep) == "run-id"
    assert taker.attempt is not None and taker.attempt > ahead, "its manifests sort after the holder's"
