"""The store protocol's fences as decisions (sync/protocol.py), apart from any I/O: a contradicted listing, a lease
absent while the stores hold a state, another machine's timestamp, a refused lease commit, a holder provably gone.
tests/integration/test_protocol_orderings.py drives the same fences with the real agent against the test Hub."""

from __future__ import annotations

import json
from hashlib import sha256
from pathlib import Path
from unittest import mock

import httpx2
import pytest
from huggingface_hub.errors import HfHubHTTPError

from entrypoint import variables
from entrypoint.errors import LeaseRefusedError, StoreUnreadableError, TakenOverError
from entrypoint.state import STATE_FILE
from entrypoint.sync import clock, read, volume_lock
from entrypoint.sync import lease as lease_module
from entrypoint.sync import protocol as p
from tests.fakes.manual_clock import ManualClock

pytestmark = pytest.mark.protocol  # the protocol lane: fast, real tests of the store protocol's code

ME, OTHER = "0000000000002-bbbbbb", "0000000000001-aaaaaa"
LEASE = p.Lease("run", OTHER, taken_at=1000.0, period=120.0)


# -- a listing that contradicts what is known (ordering 1) -------------------------------------------------
def test_an_empty_listing_of_a_folder_where_a_key_is_known_is_a_failed_read() -> None:
    assert p.listing_read({}, ["run/id/manifests/x-000001.json"]) is p.Read.FAILED
    assert p.listing_read({}, []) is p.Read.COMPLETE, "a folder nothing is known of may be empty"
    assert p.listing_read({"run/id/a": 1}, ["run/id/b"]) is p.Read.COMPLETE  # another's tidy may have deleted b


def test_a_failed_read_at_resume_is_retried_then_refused_never_taken_for_empty() -> None:
    assert p.bucket_read(p.Read.FAILED, 10.0, True, 60.0) is p.BucketRead.RETRY
    assert p.bucket_read(p.Read.FAILED, 60.0, True, 60.0) is p.BucketRead.REFUSE


# -- a lease deleted or rewritten by hand (ordering 6) -----------------------------------------------------
def test_an_absent_lease_while_the_stores_hold_a_state_is_watched_a_period_not_taken() -> None:
    beat = p.Beat("head|run/id/manifests/x-000003.json", writes=True)
    verdict, watch = p.judge_lease(None, ME, beat, 0.0, None, state_held=True, period=120.0)
    assert verdict is p.Verdict.WATCH and watch is not None
    assert p.judge_lease(None, ME, beat, 119.0, watch, state_held=True, period=120.0)[0] is p.Verdict.WATCH
    moved = p.Beat("head|run/id/manifests/x-000004.json", writes=True)
    assert p.judge_lease(None, ME, moved, 60.0, watch, state_held=True, period=120.0)[0] is p.Verdict.HELD
    assert p.judge_lease(None, ME, beat, 120.0, watch, state_held=True, period=120.0)[0] is p.Verdict.TAKE


def test_an_absent_lease_on_a_new_run_is_taken_at_once() -> None:
    assert p.judge_lease(None, ME, p.Beat("head"), 0.0, None)[0] is p.Verdict.TAKE


def test_a_holder_whose_lease_is_gone_may_not_write() -> None:
    assert not p.may_write(None, ME, None, leased=True)
    assert not p.may_write(p.Lease("run", OTHER, 0.0), ME, None, leased=True), "rewritten to name another"
    assert p.may_write(p.Lease("run", ME, 0.0), ME, None, leased=True)


# -- another machine's clock (ordering 7) --------------------------------------------------------------
@pytest.mark.parametrize("skew", [0.0, 10 * 3600.0])
def test_another_machines_timestamp_alone_never_proves_expiry(skew: float) -> None:
    """A heartbeat whose writer's clock says it is hours old (a clock fast or slow by far more than
    CLOCK_SKEW) is watched on this machine's clock like any other: a live holder is never taken over."""
    old = p.Beat("head|beat-1", at=1000.0 - skew)
    verdict, watch = p.judge_lease(LEASE, ME, old, 1000.0 + LEASE.period + 3 * p.CLOCK_SKEW, None)
    assert verdict is p.Verdict.WATCH
    moved = p.Beat("head|beat-2", at=1000.0 - skew)
    assert p.judge_lease(LEASE, ME, moved, 1001.0, watch)[0] is p.Verdict.HELD


# -- a refused lease commit (orderings 4 and 8) -------------------------------------------------------------
@pytest.mark.parametrize("status", [401, 403])
def test_a_token_refused_on_the_lease_ends_the_start(status: int) -> None:
    assert p.lease_refused(status, None, 0.0) is p.LeaseAnswer.END


def test_a_rate_limited_lease_is_waited_out_within_a_bound_then_ends() -> None:
    assert p.lease_refused(429, 55.0, 0.0) is p.LeaseAnswer.WAIT
    assert p.lease_refused(429, None, 0.0) is p.LeaseAnswer.WAIT
    assert p.lease_refused(429, 3600.0, 0.0) is p.LeaseAnswer.END, "an hour's reset: end, retryable"
    assert p.lease_refused(429, 60.0, p.LEASE_RATE_LIMIT_WAIT - 30.0) is p.LeaseAnswer.END
    assert p.lease_refused(412, None, 0.0) is p.LeaseAnswer.LOOK_AGAIN
    bound = p.LEASE_RATE_LIMIT_WAIT
    assert p.lease_refused(429, None, bound - 60.0) is p.LeaseAnswer.WAIT, "no reset said: a minute, to the bound"
    assert p.lease_refused(429, None, bound - 59.0) is p.LeaseAnswer.END
    assert p.lease_refused(429, 10.0, bound - 10.0) is p.LeaseAnswer.WAIT, "a wait ending on the bound is within it"


# -- the bucket's fallback -------------------------------------------------------------------------------------
def test_the_repo_takes_the_working_state_after_three_failed_boundaries_over_the_fallback_time_or_a_refused_token() -> (
    None
):
    assert p.fall_back(p.FALLBACK_BOUNDARIES, 60.0, False, 60.0), "three boundaries, for the whole fallback time"
    assert not p.fall_back(p.FALLBACK_BOUNDARIES - 1, 3600.0, False, 60.0), "long, but not three boundaries"
    assert not p.fall_back(p.FALLBACK_BOUNDARIES, 59.0, False, 60.0), "three boundaries, but not long"
    assert p.fall_back(1, 0.0, True, 60.0), "a refused token: at once"


# -- a holder provably gone (ordering 3) ----------------------------------------------------------------
def test_a_lease_naming_this_volume_whose_lock_is_free_is_taken_at_once() -> None:
    lease = p.Lease("run", OTHER, 0.0, machine="vol-1")
    assert p.judge_lease(lease, ME, p.Beat("head"), 0.0, None, holder_gone=True)[0] is p.Verdict.TAKE
    assert p.judge_lease(lease, ME, p.Beat("head"), 0.0, None)[0] is p.Verdict.WATCH


def test_the_lease_keeps_its_machine_and_reads_a_lease_without_one() -> None:
    lease = p.Lease("run", ME, 5.0, machine="vol-1")
    assert p.Lease.parse(lease.to_bytes()) == lease
    placed = p.Lease("run", ME, 5.0, machine="vol-1", provider="runpod", instance="7h9k2m4n6p")
    assert p.Lease.parse(placed.to_bytes()) == placed
    plain = p.Lease("run", ME, 5.0)
    assert p.Lease.parse(plain.to_bytes()) == plain


# -- a reader trusts the lease holder's chain (ordering 5) ---------------------------------------------------
def manifest(attempt: str, epoch: int) -> p.Manifest:
    files = {"weights/last.pt": {"key": f"k/{attempt}/{epoch}", "sha256": "s", "size": 1, "epoch": epoch}}
    return p.Manifest(f"m/{attempt}-{epoch:06d}.json", "run", "r", attempt, epoch, "c", epoch, 0.0, files)


def test_a_reader_trusts_the_holders_chain_never_a_late_or_unleased_write() -> None:
    late = manifest("0000000000001-aaaaaa", 7)  # a holder taken over while frozen: its batch landed late
    holder = manifest("0000000000002-bbbbbb", 6)
    unleased = manifest("0000000000003-cccccc", 9)  # wrote without the lease
    sizes = {entry["key"]: 1 for m in (late, holder, unleased) for entry in m.files.values()}
    found = p.newest_whole([late, holder, unleased], sizes, "run", holder.attempt)
    assert found == [holder]
    assert p.newest_whole([late], sizes, "run", holder.attempt) == [late], "before the holder wrote: its chain"
    assert p.newest_whole([late, holder, unleased], sizes, "run")[0] == unleased, "no lease: all of them"


def test_a_volume_keeps_its_id_and_its_lock_is_known_held_only_while_held(tmp_path: Path) -> None:
    first = volume_lock.volume_id(tmp_path / "a")
    assert first is not None and volume_lock.volume_id(tmp_path / "a") == first
    assert volume_lock.volume_id(tmp_path / "b") not in (None, first)
    lock = volume_lock.lock_path(tmp_path / "a", "run")
    assert not volume_lock.is_held(lock)
    with volume_lock.held(lock, "run"):
        assert volume_lock.is_held(lock)
    assert not volume_lock.is_held(lock), "a holder gone: its lock is no longer this process's"


# -- a holder frozen between reading the head and the lease at that head (ordering 5b) ---------------------
def test_a_lease_read_licenses_writes_for_a_quarter_period_from_when_it_began() -> None:
    assert p.lease_read_fresh(began=100.0, now=100.0 + 29.0, period=120.0)
    assert not p.lease_read_fresh(began=100.0, now=100.0 + 30.0, period=120.0), "a taker writes from a quarter on"
    assert not p.lease_read_fresh(began=100.0, now=100.0 + 3 * 120.0, period=120.0), "frozen mid-read"


def _holder(reads: list[tuple[float, p.Lease | None]], fake: ManualClock) -> tuple[lease_module.RunLease, list[float]]:
    """A holder whose lease reads take (seconds, answer) in turn; the times each read began."""
    held = lease_module.RunLease(mock.Mock(), "org/model", "run", 120.0, None)
    held.attempt, held.run_id = ME, "run"
    began: list[float] = []

    def read(deadline: float | None = None) -> tuple[p.Lease | None, str, float | None]:
        began.append(fake.now)
        seconds, answer = reads.pop(0)
        fake.now += seconds
        return answer, "head", None

    held.read = read  # type: ignore[method-assign]
    return held, began


def test_a_lease_read_frozen_past_a_quarter_period_is_read_again_and_sees_the_taker() -> None:
    # The head read before a freeze of three periods still names this attempt; read again, the lease is the
    # taker's: this one stops, and nothing of it is written.
    fake = ManualClock()
    mine, taker = p.Lease("run", ME, 0.0), p.Lease("run", "0000000000003-cccccc", 0.0)
    with clock.use(fake):
        held, began = _holder([(3 * 120.0, mine), (1.0, taker)], fake)
        with pytest.raises(TakenOverError):
            held.check(force=True)
    assert began == [1000.0, 1360.0]


def test_a_bucket_write_long_after_the_last_lease_read_reads_it_first() -> None:
    fake = ManualClock()
    mine = p.Lease("run", ME, 0.0)
    with clock.use(fake):
        held, began = _holder([(1.0, mine), (1.0, mine)], fake)
        held.check(force=True)
        held.check()  # fresh: no read
        assert began == [1000.0]
        fake.now += 29.0  # 30 s since the read began: a quarter period
        held.check()
        assert began == [1000.0, 1030.0]


# -- a bucket that cannot be read at resume (sync/read.py) -------------------------------------------------
class _Folder:
    """A run folder whose reads fail ``failing`` times, then answer with no whole boundary."""

    label = "hf://buckets/org/b/run/id"

    def __init__(self, failing: int) -> None:
        self.failing, self.reads = failing, 0

    def whole_manifests(self) -> list[p.Manifest]:
        self.reads += 1
        if self.reads <= self.failing:
            raise ConnectionError("reset by peer")
        return []

    def other_runs(self) -> list[str]:
        return []


def _sources(folder: _Folder, fake: ManualClock, **kwargs: object) -> list[object]:
    with clock.use(fake):
        return list(read.bucket_sources(folder, began=fake.now, **kwargs))  # type: ignore[arg-type]


def test_a_bucket_read_failing_at_resume_is_read_again_in_short_pauses_until_it_answers() -> None:
    fake, folder = ManualClock(), _Folder(failing=2)
    assert _sources(folder, fake, run_known=True, read_for=60.0) == [] and folder.reads == 3
    assert fake.now == 1000.0 + 2 * 5.0, "a pause of a tenth of the deadline, five seconds at most"
    fake, folder = ManualClock(), _Folder(failing=1)
    _sources(folder, fake, run_known=False, read_for=30.0)
    assert fake.now == 1003.0
    fake, folder = ManualClock(), _Folder(failing=1)
    _sources(folder, fake, run_known=False, read_for=2.0)
    assert fake.now == 1000.5, "half a second at least"


def test_a_bucket_unreadable_past_the_deadline_refuses_a_known_run_and_goes_on_for_a_new_one() -> None:
    with pytest.raises(StoreUnreadableError) as refused:
        _sources(_Folder(failing=99), ManualClock(), run_known=True, read_for=30.0)
    assert refused.value.message == (
        "cannot read hf://buckets/org/b/run/id for 30 s (ConnectionError), and the run's newest"
        " epochs may be there alone: not starting over, nothing written"
    )
    assert refused.value.hint == "start it again once the bucket answers (a retryable exit)"
    fake, folder = ManualClock(), _Folder(failing=99)
    assert _sources(folder, fake, run_known=False, read_for=30.0) == [] and fake.now >= 1030.0
    fake, folder = ManualClock(), _Folder(failing=99)
    assert _sources(folder, fake, run_known=None, read_for=30.0) == [] and folder.reads == 1, "a reader only looks"


class _Bucket:
    """A bucket folder holding one whole boundary whose trainbox.json is ``state`` (``size``: what its manifest
    says of it)."""

    bucket_id, run_name, run_id, label = "org/b", "run", "id", "hf://buckets/org/b/run/id"

    def __init__(self, state: bytes, size: object) -> None:
        self.state, self.bucket = state, self
        entry = {"key": "run/id/o/trainbox.json", "sha256": sha256(state).hexdigest(), "size": size, "epoch": 3}
        self.manifest = p.Manifest("run/id/manifests/m.json", "id", "run", ME, 1, "c", 3, 0.0, {STATE_FILE: entry})

    def whole_manifests(self) -> list[p.Manifest]:
        return [self.manifest]

    def download(self, wanted: dict[str, Path]) -> None:
        for local in wanted.values():
            local.parent.mkdir(parents=True, exist_ok=True)
            local.write_bytes(self.state)


def test_a_bucket_states_trainbox_json_is_read_within_its_bound_and_never_over_it(tmp_path: Path) -> None:
    state = json.dumps({"run_name": "run", "phase": "training"}).encode()
    assert read.bucket_state(_Bucket(state, len(state)), tmp_path, max_bytes=len(state)) == json.loads(state)  # type: ignore[arg-type]
    assert read.bucket_state(_Bucket(state, len(state)), tmp_path / "a") == json.loads(state)  # type: ignore[arg-type]
    over = _Bucket(state, len(state))  # its manifest tells its true size: over the bound, it is never downloaded
    assert read.bucket_state(over, tmp_path / "o", max_bytes=len(state) - 1) is None  # type: ignore[arg-type]
    assert not (tmp_path / "o").exists()
    for size in (len(state) + 1, None, "12"):  # over the bound, or a size the manifest does not give as bytes
        assert read.bucket_state(_Bucket(state, size), tmp_path / "b", max_bytes=len(state)) is None  # type: ignore[arg-type]
    assert read.bucket_state(_Bucket(b"[1, 2]", 6), tmp_path / "c") is None, "not a JSON object"  # type: ignore[arg-type]


# -- a lease commit refused (sync/lease.py) ----------------------------------------------------------------
def _refused(status: int, headers: dict[str, str] | None = None) -> HfHubHTTPError:
    request = httpx2.Request("POST", "https://hub.test/api/models/org/model/commit/main")
    return HfHubHTTPError("scripted", response=httpx2.Response(status, headers=headers or {}, request=request))


def test_a_rate_limited_lease_take_waits_out_the_reset_then_looks_again_and_ends_past_the_bound() -> None:
    fake = ManualClock()
    with clock.use(fake):
        taker = lease_module.RunLease(mock.Mock(), "org/model", "run", 120.0, None)
        assert taker._refused(_refused(429, {"Retry-After": "90"})) is False  # look again, after the reset
        assert (fake.now, taker.retry_after) == (1090.0, 90.0)
        assert taker._refused(_refused(429)) is False and fake.now == 1150.0, "no reset said: a minute"
        assert taker.retry_after == 90.0, "the longest wait asked for"
        assert taker._refused(_refused(412)) is False and fake.now == 1150.0, "the repo moved: read again at once"
        with pytest.raises(LeaseRefusedError) as refused:
            taker._refused(_refused(429, {"Retry-After": "500"}))  # 150 s waited: 650 s is past the bound
    assert refused.value.message.startswith("org/model rate-limits commits for 500 s more")
    assert fake.now == 1150.0, "past the bound, nothing more is waited"


# -- the files other machines read: a manifest and the lease, byte for byte -----------------------------------
def test_a_manifest_and_a_lease_are_written_as_every_version_of_the_agent_reads_them() -> None:
    written = p.Manifest(
        key="run/id/manifests/a-000002.json",
        run_id="id",
        run_name="run",
        attempt="a",
        seq=2,
        commit="c",
        epoch=5,
        written_at=12.5,
        files={"weights/last.pt": {"key": "k", "sha256": "s", "size": 3, "epoch": 5}},
    )
    assert written.to_bytes() == (
        b'{\n "attempt": "a",\n "commit": "c",\n "epoch": 5,\n "files": {\n  "weights/last.pt": {\n   "epoch": 5,\n'
        b'   "key": "k",\n   "sha256": "s",\n   "size": 3\n  }\n },\n "format": 2,\n "run_id": "id",\n'
        b' "run_name": "run",\n "seq": 2,\n "written_at": 12.5\n}'
    )
    lease = p.Lease("id", ME, 5.0, 60.0, released=True, machine="vol-1", provider="vast", instance="42")
    assert json.loads(lease.to_bytes()) == {
        "format": 1,
        "run_id": "id",
        "holder": ME,
        "taken_at": 5.0,
        "period": 60.0,
        "released": True,
        "machine": "vol-1",
        "provider": "vast",
        "instance": "42",
    }
    assert lease.to_bytes().startswith(b'{\n "format": 1,\n "holder": ') and lease.to_bytes().endswith(b"\n}")


def test_a_manifest_is_read_with_its_fields_typed_and_anything_else_is_not_ours() -> None:
    body = {
        "format": 2,
        "run_id": 7,
        "run_name": "run",
        "attempt": "a",
        "seq": "3",
        "commit": "c",
        "epoch": "5",
        "written_at": "12.5",
        "files": {
            "metrics.jsonl": {"key": "k1", "sha256": "s1", "size": "9"},
            "weights/last.pt": {"key": "k2", "sha256": "s2", "size": 4, "epoch": 5},
        },
    }
    read_back = p.Manifest.parse("m/key.json", json.dumps(body).encode())
    assert read_back == p.Manifest(
        key="m/key.json",
        run_id="7",
        run_name="run",
        attempt="a",
        seq=3,
        commit="c",
        epoch=5,
        written_at=12.5,
        files={
            "metrics.jsonl": {"key": "k1", "sha256": "s1", "size": 9, "epoch": 0},
            "weights/last.pt": {"key": "k2", "sha256": "s2", "size": 4, "epoch": 5},
        },
    )
    assert read_back.keys() == {"k1", "k2"}
    for broken in (
        b"not json",
        b"[]",
        json.dumps({**body, "format": 1}).encode(),
        json.dumps({k: v for k, v in body.items() if k != "format"}).encode(),
        json.dumps({**body, "files": []}).encode(),
        json.dumps({**body, "files": {"a": {"key": "k"}}}).encode(),
        json.dumps({**body, "files": {"a": {"key": "k", "sha256": "s", "size": "big"}}}).encode(),
        *(json.dumps({k: v for k, v in body.items() if k != gone}).encode() for gone in body if gone != "format"),
        json.dumps({**body, "seq": None}).encode(),
        json.dumps({**body, "written_at": "noon"}).encode(),
    ):
        assert p.Manifest.parse("m/key.json", broken) is None, broken


def test_a_lease_is_read_with_its_defaults_and_anything_else_is_not_a_lease() -> None:
    assert p.Lease.parse(json.dumps({"format": 1, "run_id": 7, "holder": ME, "taken_at": "5"}).encode()) == p.Lease(
        "7", ME, 5.0, p.LEASE_PERIOD, released=False
    )
    empty = {"format": 1, "run_id": "r", "holder": ME, "taken_at": 5, "period": 0, "machine": "", "provider": ""}
    assert p.Lease.parse(json.dumps({**empty, "released": 1, "instance": ""}).encode()) == p.Lease(
        "r", ME, 5.0, p.LEASE_PERIOD, released=True
    )
    for broken in (
        b"not json",
        b"[]",
        json.dumps({**empty, "format": 2}).encode(),
        json.dumps({"format": 1, "holder": ME, "taken_at": 5}).encode(),
        json.dumps({"format": 1, "run_id": "r", "taken_at": 5}).encode(),
        json.dumps({"format": 1, "run_id": "r", "holder": ME}).encode(),
        json.dumps({**empty, "taken_at": "noon"}).encode(),
        json.dumps({**empty, "period": "long"}).encode(),
    ):
        assert p.Lease.parse(broken) is None, broken


def test_a_lease_naming_a_period_no_run_may_set_is_no_lease() -> None:
    """A person's edit (a year, Infinity, a negative period) trusted would keep a watcher, and a taker's first
    write, waiting that long: read as no lease, the run's writes in the stores are watched on this start's own
    period instead (judge_lease's state_held)."""
    body = {"format": 1, "run_id": "r", "holder": OTHER, "taken_at": 5.0}
    day = p.LEASE_PERIOD_MAX
    assert day == variables.MAX_LEASE_PERIOD, "the longest LEASE_PERIOD the settings take"
    assert p.Lease.parse(json.dumps({**body, "period": day}).encode()) == p.Lease("r", OTHER, 5.0, day)
    assert p.Lease.parse(json.dumps({**body, "period": 0.5}).encode()) == p.Lease("r", OTHER, 5.0, 0.5)
    for absurd in (day + 1, 365 * day, -5.0, float("inf"), float("-inf"), float("nan")):
        assert p.Lease.parse(json.dumps({**body, "period": absurd}).encode()) is None, absurd
    for when in (float("inf"), float("nan")):
        assert p.Lease.parse(json.dumps({**body, "taken_at": when}).encode()) is None, when
    assert p.Lease.parse(b'{"format": 1, "run_id": "r", "holder": "h", "taken_at": 5, "period": Infinity}') is None


# -- what a holder may delete after its boundary landed ----------------------------------------------------------
A1, A2, A3 = "0000000000001-aaaaaa", "0000000000002-bbbbbb", "0000000000003-cccccc"


def boundary(attempt: str, seq: int, epoch: int, *objects: str) -> p.Manifest:
    files = {f"f{n}": {"key": key, "sha256": "s", "size": 1, "epoch": epoch} for n, key in enumerate(objects)}
    return p.Manifest(f"r/id/manifests/{attempt}-{seq:06d}.json", "id", "r", attempt, seq, "c", epoch, 0.0, files)


def attempt_of(key: str) -> str | None:
    for attempt in (A1, A2, A3):
        if f"/{attempt}" in key:
            return attempt
    return None


def test_a_holder_deletes_its_superseded_boundaries_and_older_attempts_files_and_nothing_else() -> None:
    older = boundary(A1, 4, 3, f"r/id/objects/{A1}/x", f"r/id/objects/{A1}/carried")
    mine_before = boundary(A2, 1, 4, f"r/id/objects/{A2}/old", f"r/id/objects/{A1}/carried")
    newest = boundary(A2, 2, 5, f"r/id/objects/{A2}/new", f"r/id/objects/{A1}/carried")
    known = {m.key: m for m in (older, mine_before, newest)}
    sizes = {key: 1 for m in known.values() for key in (m.key, *m.keys())}
    sizes |= {"r/id/heartbeat/unattributed": 1, f"r/id/objects/{A3}/a-newer-attempts": 1}
    listing = p.Listing(p.Read.COMPLETE, sizes)

    assert p.deletable(listing, newest, known, A2, attempt_of, holder=True) == {
        older.key,
        f"r/id/objects/{A1}/x",
        mine_before.key,
        f"r/id/objects/{A2}/old",
    }, "never what the newest names, a key of no attempt, or a newer attempt's"


def test_nothing_is_deleted_on_a_listing_or_a_boundary_that_proves_less() -> None:
    newest = boundary(A2, 2, 5, f"r/id/objects/{A2}/new")
    old = boundary(A2, 1, 4, f"r/id/objects/{A2}/old")
    known = {m.key: m for m in (old, newest)}
    sizes = {key: 1 for m in known.values() for key in (m.key, *m.keys())}
    full = p.Listing(p.Read.COMPLETE, sizes)
    assert p.deletable(full, newest, known, A2, attempt_of, holder=True) == {old.key, f"r/id/objects/{A2}/old"}

    assert p.deletable(p.Listing(p.Read.PARTIAL, sizes), newest, known, A2, attempt_of, holder=True) == set()
    assert p.deletable(p.Listing(p.Read.FAILED, sizes), newest, known, A2, attempt_of, holder=True) == set()
    assert p.deletable(full, newest, known, A2, attempt_of, holder=False) == set(), "not the lease's holder"
    unlanded = {k: v for k, v in sizes.items() if k != newest.key}
    assert p.deletable(p.Listing(p.Read.COMPLETE, unlanded), newest, known, A2, attempt_of, holder=True) == set()
    torn = {**sizes, f"r/id/objects/{A2}/new": 0}
    assert p.deletable(p.Listing(p.Read.COMPLETE, torn), newest, known, A2, attempt_of, holder=True) == set()
    stranger = boundary(A1, 9, 2, f"r/id/objects/{A1}/y")
    unknown = {**sizes, stranger.key: 1, f"r/id/objects/{A1}/y": 1}  # a manifest this attempt never read
    assert p.deletable(p.Listing(p.Read.COMPLETE, unknown), newest, known, A2, attempt_of, holder=True) == set()


def test_a_boundary_of_more_epochs_or_of_a_newer_attempt_is_kept_with_what_it_names() -> None:
    newest = boundary(A2, 3, 5, f"r/id/objects/{A2}/new")
    more_epochs = boundary(A1, 7, 6, f"r/id/objects/{A1}/e6")  # an older attempt's, further along
    same_epochs = boundary(A1, 6, 5, f"r/id/objects/{A1}/e5")
    newer = boundary(A3, 1, 1, f"r/id/objects/{A3}/n")
    known = {m.key: m for m in (newest, more_epochs, same_epochs, newer)}
    sizes = {key: 1 for m in known.values() for key in (m.key, *m.keys())}
    found = p.deletable(p.Listing(p.Read.COMPLETE, sizes), newest, known, A2, attempt_of, holder=True)
    assert found == {same_epochs.key, f"r/id/objects/{A1}/e5"}


# -- a watch, a snapshot, a write's licence ------------------------------------------------------------------------
def test_a_watch_counts_only_over_looks_less_than_a_quarter_period_apart() -> None:
    assert p.watch_unbroken(None, 500.0)
    assert p.watch_unbroken(100.0, 100.0 + p.LEASE_PERIOD / 4 - 0.1)
    assert not p.watch_unbroken(100.0, 100.0 + p.LEASE_PERIOD / 4)
    assert p.watch_unbroken(100.0, 129.0, period=200.0) and not p.watch_unbroken(100.0, 150.0, period=200.0)


@pytest.mark.parametrize(
    ("relative", "snapshot"),
    [("weights/epoch_12.pt", True), ("weights/last.pt", False), ("weights/best.pt", False), ("metrics.jsonl", False)],
)
def test_only_an_epoch_n_pt_is_a_snapshot(relative: str, snapshot: bool) -> None:
    assert p.is_snapshot(relative) is snapshot


def test_a_watched_lease_expires_after_its_own_period_on_this_machines_clock() -> None:
    lease = p.Lease("run", OTHER, taken_at=1000.0, period=300.0)
    watch = p.Watch(since=5000.0, token="t")
    assert p.judge_lease(lease, ME, p.Beat("t"), 5000.0 + 299.0, watch, period=60.0)[0] is p.Verdict.WATCH
    assert p.judge_lease(lease, ME, p.Beat("t"), 5000.0 + 300.0, watch, period=60.0)[0] is p.Verdict.TAKE
    absent = p.judge_lease(None, ME, p.Beat("t", writes=True), 5000.0 + 60.0, watch, state_held=True, period=60.0)
    assert absent[0] is p.Verdict.TAKE, "no lease to read the period from: the run's own"


def test_a_holder_writes_while_no_newer_attempt_shows_and_its_lease_names_it() -> None:
    assert p.may_write(None, ME, None), "no lease committed (the repo refused it earlier): the bucket decides"
    assert p.may_write(p.Lease("run", ME, 0.0), ME, ME), "its own boundaries"
    assert not p.may_write(p.Lease("run", ME, 0.0), ME, "0000000000009-zzzzzz")


def test_a_resume_never_takes_another_runs_boundary_nor_a_torn_one() -> None:
    mine, torn = boundary(A1, 1, 3, "r/id/objects/a"), boundary(A1, 2, 4, "r/id/objects/b")
    other = p.Manifest("r/other/manifests/x.json", "other", "r", A1, 1, "c", 9, 0.0, dict(mine.files))
    sizes = {"r/id/objects/a": 1}  # b was never uploaded whole
    assert p.newest_whole([torn, other, mine], sizes, "id") == [mine]
