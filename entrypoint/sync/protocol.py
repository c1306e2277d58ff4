"""The store protocol's decisions, apart from any I/O: what the stores answered goes in, what to do comes out.

Nothing here reads a clock or a store: times (``now``, each on the caller's own clock) and store answers
(a ``Listing`` that is complete, failed or possibly partial; manifests; the run's ``Lease``) are inputs.
The I/O side (bucket_store.py, lease.py, read.py, uploader.py, job.py) only carries the decisions out, and
tests/unit/test_protocol_sim.py checks them over many generated histories against the protocol's invariants.

The rules:

- **Resume**: a bucket that cannot be read is not an empty bucket. Its read is tried again within
  ``RESUME_READ_DEADLINE``; if it still fails and the repo knows the run (it may have epochs), the start ends
  (``StoreUnreadableError``, exit 73) writing nothing.
- **Carry forward**: an attempt's manifests keep naming, by key, every file of the run that the newest whole
  manifest at its start named and its own volume does not hold (the ``epoch_N.pt`` snapshots of earlier
  attempts): never uploaded again, never deleted.
- **A listing contradicted is a failed read** (``listing_read``): an empty answer (a 404 included) for a folder
  in which a key is known to exist is never an empty folder.
- **Delete only on complete knowledge**: a key goes only when a complete listing shows the holder's own newest
  manifest whole, no manifest there references the key that is not known and older, and no state there has
  more epochs than that manifest. A failed or partial listing deletes nothing.
- **One writer, by lease** (``judge_lease``, ``may_write``, ``lease_refused``): see lease.py for where the lease
  lives. No decision on another machine's timestamp alone; an absent lease while the stores hold a state is
  watched like a live one; a refused lease commit (429, 401, 403) is never a licence to write.
- **Fallback by time and count**: the repo takes the working state only when the bucket has failed for at
  least ``fallback_seconds`` and ``FALLBACK_BOUNDARIES`` boundaries, or refused the token; then only
  ``last.pt`` and the small files, never the ``epoch_N.pt`` snapshots.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

MANIFEST_FORMAT = 2
LEASE_FORMAT = 1
# One lease period: how long a watcher waits for a quiet holder's heartbeat before taking the run over, so a
# container relaunched after a preemption (the old one gone without a word) waits at most this long. Two
# minutes: several boundaries of even a small run, a bucket's fallback (half of it) inside it, and short
# beside the minutes a relaunch takes anyway.
LEASE_PERIOD = 120.0
# The longest period a lease may name (settings refuse a longer LEASE_PERIOD): a lease file naming more, or
# none finite (a person's edit), is no lease at all. Trusted, it would keep a watcher (and a taker's first
# write) waiting that long, billing.
LEASE_PERIOD_MAX = 24 * 3600.0
# Each machine's clock is trusted to be within this of true time; two of them differ by up to twice it.
CLOCK_SKEW = 30.0
# Failed bucket boundaries in a row, and for at least half a lease period, before the repo takes the working
# state: a short outage (tries a second apart) is waited out, and the repo's commits then renew the lease
# before a watcher could judge the holder gone.
FALLBACK_BOUNDARIES = 3
# How long a resume tries to read the bucket before it decides the bucket cannot be read.
RESUME_READ_DEADLINE = 60.0
_SNAPSHOT = re.compile(r"^weights/epoch_(\d+)\.pt$")  # libreyolo.EPOCH_CHECKPOINT, kept import-free
LAST = "weights/last.pt"


def is_snapshot(relative: str) -> bool:
    """An ``epoch_N.pt`` snapshot (LibreYOLO's ``save_period``): kept in the bucket, never sent to the repo
    as a working state."""
    return _SNAPSHOT.match(relative) is not None


class Read(Enum):
    """How a store's listing came back."""

    COMPLETE = "complete"
    FAILED = "failed"  # an error: nothing is known
    PARTIAL = "partial"  # cut short (a page missing, a deadline): what it shows is true, what it lacks is unknown


@dataclass(frozen=True)
class Listing:
    """A listing of a run's bucket folder: ``key → size`` of its files, and whether it is complete."""

    read: Read
    sizes: Mapping[str, int] = field(default_factory=dict)

    @property
    def complete(self) -> bool:
        return self.read is Read.COMPLETE


@dataclass(frozen=True)
class Manifest:
    """One boundary of a run in its bucket: ``files`` maps each relative path to its object
    (``key``, ``sha256``, ``size``, ``epoch``); ``key`` is where this manifest itself lies."""

    key: str
    run_id: str
    run_name: str
    attempt: str
    seq: int
    commit: str
    epoch: int
    written_at: float
    files: dict[str, dict[str, Any]]

    def to_bytes(self) -> bytes:
        body = {
            "format": MANIFEST_FORMAT,
            "run_id": self.run_id,
            "run_name": self.run_name,
            "attempt": self.attempt,
            "seq": self.seq,
            "commit": self.commit,
            "epoch": self.epoch,
            "written_at": self.written_at,
            "files": self.files,
        }
        return json.dumps(body, indent=1, sort_keys=True).encode()

    @classmethod
    def parse(cls, key: str, data: bytes) -> Manifest | None:
        """The manifest in ``data``, or None when it is not one of ours (unreadable, another format)."""
        try:
            body = json.loads(data)
            files = body["files"]
            entries = {
                str(rel): {
                    "key": str(e["key"]),
                    "sha256": str(e["sha256"]),
                    "size": int(e["size"]),
                    "epoch": int(e.get("epoch") or 0),
                }
                for rel, e in files.items()
            }
            if body.get("format") != MANIFEST_FORMAT:
                return None
            return cls(
                key=key,
                run_id=str(body["run_id"]),
                run_name=str(body["run_name"]),
                attempt=str(body["attempt"]),
                seq=int(body["seq"]),
                commit=str(body["commit"]),
                epoch=int(body["epoch"]),
                written_at=float(body["written_at"]),
                files=entries,
            )
        except (ValueError, KeyError, TypeError, AttributeError):
            return None

    def keys(self) -> set[str]:
        return {entry["key"] for entry in self.files.values()}

    def whole(self, sizes: Mapping[str, int]) -> bool:
        """Every object this manifest names is in the bucket with its size (``sizes``: key → size)."""
        return all(sizes.get(entry["key"]) == entry["size"] for entry in self.files.values())

    @property
    def order(self) -> tuple[int, str, int]:
        """The most epochs first, then the newest attempt, then its newest boundary."""
        return (self.epoch, self.attempt, self.seq)


# -- resume ---------------------------------------------------------------------------------------
class BucketRead(Enum):
    """What a resume does with the bucket's answer."""

    USE = "use"  # a complete read: its whole manifests (maybe none) are what the bucket holds
    RETRY = "retry"  # failed or partial: read again
    REFUSE = "refuse"  # still unreadable and the run has epochs: end with exit 73, writing nothing
    WITHOUT = "without"  # still unreadable, but nothing of the run can be in it: go on with the volume and repo


def listing_read(sizes: Mapping[str, object], known: Iterable[str]) -> Read:
    """How a listing of a folder came back, judged against what is known of it: an empty answer (a 404
    included) for a folder in which a key is known to exist (a manifest read there, a file a manifest names, a
    listing that showed it) contradicts what is known: a failed read, never an empty folder. Nothing is deleted
    on it, and nothing dropped from a manifest."""
    return Read.FAILED if not sizes and any(True for _ in known) else Read.COMPLETE


def bucket_read(read: Read, waited: float, run_known: bool, deadline: float = RESUME_READ_DEADLINE) -> BucketRead:
    """After a read of the bucket at resume: a failed or partial one is never taken for an empty bucket.
    ``run_known``: the repo knew the run before this start (its run id, an earlier holder's lease): its
    epochs may be in the bucket alone (the repo's copy is a milestone old)."""
    if read is Read.COMPLETE:
        return BucketRead.USE
    if waited < deadline:
        return BucketRead.RETRY
    return BucketRead.REFUSE if run_known else BucketRead.WITHOUT


def newest_whole(
    manifests: Iterable[Manifest], sizes: Mapping[str, int], run_id: str, holder: str | None = None
) -> list[Manifest]:
    """This run's whole manifests, the most epochs first: what a resume may take (never a torn one, never
    another run's), of the lease holder's chain only (``trusted``)."""
    whole = trusted([m for m in manifests if m.run_id == run_id and m.whole(sizes)], holder)
    return sorted(whole, key=lambda m: m.order, reverse=True)


def trusted(manifests: Iterable[Manifest], holder: str | None) -> list[Manifest]:
    """The manifests of the lease holder's attempt chain (``holder``: the attempt the lease named when this one
    took it; None: no lease, all of them): the holder's own when it wrote any, else those of the attempts before
    it. Never a later attempt's (it wrote without the lease), never an older one's beside the holder's (written
    late, by a holder taken over while frozen)."""
    found = list(manifests)
    if holder is None:
        return found
    chain = [m for m in found if m.attempt <= holder]
    return [m for m in chain if m.attempt == holder] or chain


# -- what a manifest names ----------------------------------------------------------------------
def next_files(
    base: Mapping[str, dict[str, Any]],
    previous: Mapping[str, dict[str, Any]],
    written: Mapping[str, dict[str, Any]],
) -> dict[str, dict[str, Any]]:
    """A new manifest's files: what the newest whole manifest at this attempt's start named (``base``: earlier
    attempts' snapshots the volume may no longer hold, carried by key), under this attempt's earlier boundary
    (``previous``), under this boundary's files (``written``)."""
    return {**base, **previous, **written}


# -- deletion -------------------------------------------------------------------------------------
def deletable(
    listing: Listing,
    newest: Manifest,
    known: Mapping[str, Manifest],
    me: str,
    attempt_of: Callable[[str], str | None],
    *,
    holder: bool,
) -> set[str]:
    """The keys this attempt may delete after its boundary ``newest`` landed; ``known``: the manifests whose
    content it knows (its own, the ones it read at its start), by key. Nothing unless the listing is complete,
    this attempt holds the lease, ``newest`` is whole in it and every manifest there is known (an unknown one
    may name any key: manifests carry earlier attempts' files forward). Kept: what ``newest`` names; every
    manifest with more epochs than ``newest``, or of a newer attempt, and what it names; keys of no attempt."""
    if not listing.complete or not holder or newest.key not in listing.sizes or not newest.whole(listing.sizes):
        return set()
    keep = newest.keys() | {newest.key}
    for key in listing.sizes:
        if "/manifests/" not in key or attempt_of(key) is None:
            continue
        body = known.get(key)
        if body is None:
            return set()
        if body.epoch > newest.epoch or body.attempt > me:
            keep |= body.keys() | {key}
    return {key for key in listing.sizes if key not in keep and (attempt_of(key) or "~") <= me}


# -- the lease ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Lease:
    """The run's lease, a small file in the model repo, committed with ``parent_commit`` (a compare-and-swap):
    the attempt that may write the run, since when (``taken_at``, on its own clock), for how long a silence
    (``period``), and whether it let go (``released``: it ended)."""

    run_id: str
    holder: str
    taken_at: float
    period: float = LEASE_PERIOD
    released: bool = False
    # Where the holder runs: its volume's id (and host), so a container started again on that volume (whose
    # lock the kernel dropped with the holder) knows the holder is gone without waiting a period.
    machine: str | None = None
    # The holder's instance at its provider (``provider``: "vast" or "runpod"; ``instance``: its id, never a
    # key), so a relaunch elsewhere may ask that provider whether the instance still runs.
    provider: str | None = None
    instance: str | None = None

    def to_bytes(self) -> bytes:
        body = {
            "format": LEASE_FORMAT,
            "run_id": self.run_id,
            "holder": self.holder,
            "taken_at": self.taken_at,
            "period": self.period,
            "released": self.released,
        }
        for name in ("machine", "provider", "instance"):
            if getattr(self, name) is not None:
                body[name] = getattr(self, name)
        return json.dumps(body, indent=1, sort_keys=True).encode()

    @classmethod
    def parse(cls, data: bytes) -> Lease | None:
        try:
            body = json.loads(data)
            if body.get("format") != LEASE_FORMAT:
                return None
            period = float(body.get("period") or LEASE_PERIOD)
            taken_at = float(body["taken_at"])
            if not 0 < period <= LEASE_PERIOD_MAX or not math.isfinite(taken_at):
                return None
            return cls(
                run_id=str(body["run_id"]),
                holder=str(body["holder"]),
                taken_at=taken_at,
                period=period,
                released=bool(body.get("released", False)),
                machine=str(body["machine"]) if body.get("machine") else None,
                provider=str(body["provider"]) if body.get("provider") else None,
                instance=str(body["instance"]) if body.get("instance") else None,
            )
        except (ValueError, KeyError, TypeError, AttributeError):
            return None


@dataclass(frozen=True)
class Beat:
    """What shows a holder alive: ``token`` changes whenever it writes (its newest manifest in the bucket, the
    repo's head: its boundary commits in repo mode); ``at``: when it last wrote, on the writer's clock or the
    Hub's (None: unknown)."""

    token: str
    at: float | None = None
    writes: bool = False  # the bucket shows writes of the run (a state the stores hold)


@dataclass(frozen=True)
class Watch:
    """A live-looking lease being watched: since when (the watcher's clock) and the heartbeat seen then."""

    since: float
    token: str


class Verdict(Enum):
    MINE = "mine"  # this attempt holds it
    TAKE = "take"  # none, released, or expired: take it (a compare-and-swap; a 412 means look again)
    WATCH = "watch"  # a holder whose heartbeat is fresh: look again later
    HELD = "held"  # its heartbeat moved while watched: another container holds this run (exit 72)


def judge_lease(
    lease: Lease | None,
    me: str,
    beat: Beat,
    now: float,
    watch: Watch | None,
    *,
    state_held: bool = False,
    holder_gone: bool = False,
    period: float = LEASE_PERIOD,
) -> tuple[Verdict, Watch | None]:
    """Whether this attempt may take the run. No decision rests on another machine's clock: a live-looking
    lease is watched on this machine's clock alone (``now``): if the heartbeat moves within one period, the
    holder lives (HELD); if not, it has expired (TAKE). A lease absent or unreadable while the stores hold a
    state of the run (``state_held``: a person deleted or rewrote the file, a read that lost it) is no free
    take either: the stores are watched the same way first. ``holder_gone``: the holder is provably gone
    (the lease names this machine's volume and this process holds that volume's lock, which the kernel dropped
    with the holder; or the holder's provider says the instance the lease names no longer runs): taken at
    once. ``period``: the silence waited without a lease to read it from."""
    if lease is None and not state_held:
        return Verdict.TAKE, None
    if lease is not None and lease.released:
        return Verdict.TAKE, None
    if lease is not None and lease.holder == me:
        return Verdict.MINE, None
    if lease is not None and holder_gone:
        return Verdict.TAKE, None
    period = lease.period if lease is not None else period
    if watch is None:
        return Verdict.WATCH, Watch(now, beat.token)
    if beat.token != watch.token:
        return Verdict.HELD, watch
    if now - watch.since >= period:
        return Verdict.TAKE, watch
    return Verdict.WATCH, watch


def watch_unbroken(last_look: float | None, looked: float, period: float = LEASE_PERIOD) -> bool:
    """A watch counts the holder's silence only over looks less than a quarter period apart (``last_look``: when
    the last judged look ended, None before the first; ``looked``: when this one began; this process's monotonic
    clock). A gap (the watcher frozen or slowed between its looks, or in a look not judged) is time it did not
    watch: the holder's writes meanwhile are seen only by the next look, and one listing answering 404 for the
    holder's manifests then would show a silence the holder never kept. The watch starts again."""
    return last_look is None or looked - last_look < period / 4


def may_write(lease: Lease | None, me: str, newest_attempt: str | None, *, leased: bool = False) -> bool:
    """At a boundary, before writing anything: this attempt still holds the run (the repo's lease names it, and
    the bucket shows no newer attempt). A lease it released is no longer its own; with ``leased`` (this attempt
    committed its lease), an absent lease is not its own either (deleted by hand, or another's take)."""
    if lease is None and leased:
        return False
    if lease is not None and (lease.holder != me or lease.released):
        return False
    return newest_attempt is None or newest_attempt <= me


def lease_read_fresh(began: float, now: float, period: float = LEASE_PERIOD) -> bool:
    """A read of the lease that named this attempt licenses writes only while less than a quarter period has
    passed since the read began (``began``, ``now``: this process's monotonic clock). A taker takes only after
    that read and writes from a quarter period after its take, so a write within it lands before the taker's;
    a read frozen or slowed longer (the head read, then the lease at that head long after) is read again."""
    return now - began < period / 4


class LeaseAnswer(Enum):
    """What to do when the repo refuses a lease commit."""

    LOOK_AGAIN = "look-again"  # 412: the repo moved; read the lease again and judge again
    WAIT = "wait"  # 429: wait out the Hub's reset, then take again; never a licence to write
    END = "end"  # 401/403, or a rate limit longer than an attempt may wait: end, writing nothing


# The longest a Hub's rate limit on the lease is waited out before the start ends (a retryable exit): a
# commit quota resets within the hour; waiting longer bills a machine that cannot write.
LEASE_RATE_LIMIT_WAIT = 600.0


def lease_refused(status: int | None, reset: float | None, waited: float) -> LeaseAnswer:
    """A lease commit answered ``status``: 412 is a compare-and-swap lost; 429 is waited out (``reset``: what
    the Hub's RateLimit or Retry-After said, ``waited``: already waited) within ``LEASE_RATE_LIMIT_WAIT``; 401
    and 403 are a token that may not write the run. None of them lets the attempt write unleased."""
    if status == 412:
        return LeaseAnswer.LOOK_AGAIN
    if status == 429 and waited + (reset if reset is not None else 60.0) <= LEASE_RATE_LIMIT_WAIT:
        return LeaseAnswer.WAIT
    return LeaseAnswer.END


# -- fallback ---------------------------------------------------------------------------------------
def fall_back(failures: int, failing_for: float, denied: bool, fallback_seconds: float) -> bool:
    """The bucket has failed long enough (time *and* boundaries), or refused the token: the repo takes the
    working state."""
    return denied or (failures >= FALLBACK_BOUNDARIES and failing_for >= fallback_seconds)


def repo_takes_in_fallback(relative: str) -> bool:
    """While the repo holds the working state: ``last.pt`` and the small files, never a snapshot."""
    return not is_snapshot(relative)
