"""The invariants, judged from the in-memory Hub's ground truth by this module's own small code (it never calls
entrypoint.sync.protocol: a rule broken there cannot blind the judge).

- nothing durable lost: the Hub's newest whole state of a run has at least the epochs a container said were there;
- every snapshot (``epoch_N.pt``) a container said was there stays in a whole state;
- after one period at most one writer of what a reader trusts or what the run keeps: no attempt sends a write a
  whole period after a later one took the lease; a write it sent before and that lands that late (frozen inside its
  call) is inert: it puts only keys of its own attempt, deletes nothing another attempt's manifest names, and no
  reader trusts it (no later manifest names what it put, no container starts from it);
- a holder is taken over only after a whole period of silence (no heartbeat of it landed: a manifest, a heartbeat
  object, a commit; the objects of a batch torn before its manifest landed are none; less a call's latency);
- never a start from less than the Hub holds (a start from scratch while the Hub holds a state; late writes aside:
  those a writer taken over landed past the taker's quarter period, when the taker may already have read);
- never two containers that trained both ending 0;
- each epoch trained at most twice.
"""

from __future__ import annotations

import itertools
import json
import re
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field

from .hub import Server
from .lease_file import PERSON_EDIT

LEASE = ".trainbox/lease.json"
_ATTEMPT = re.compile(r"/(\d{13}-[0-9a-f]{6})[-/]")


class Violation(AssertionError):
    pass


def whole_states(
    bucket: dict[str, bytes], late: set[str] | frozenset[str] = frozenset()
) -> dict[str, list[tuple[int, dict[str, str]]]]:
    """run id → its whole manifests as (epoch, relative path → key): every key named there with its size; none
    that ``late`` holds (landed by a writer taken over)."""
    found: dict[str, list[tuple[int, dict[str, str]]]] = defaultdict(list)
    for key, data in bucket.items():
        if "/manifests/" not in key or key in late:
            continue
        try:
            body = json.loads(data)
            files = {rel: (str(e["key"]), int(e["size"])) for rel, e in body["files"].items()}
            run_id, epoch = str(body["run_id"]), int(body["epoch"])
        except (ValueError, KeyError, TypeError):
            continue
        if all(k in bucket and len(bucket[k]) == size for k, size in files.values()):
            found[run_id].append((epoch, {rel: k for rel, (k, _) in files.items()}))
    return found


# A watcher's period of silence runs from when it saw the last heartbeat: up to one Hub call (there and back,
# faults.Faults.slow each way) after the write landed.
SLACK = 5.0


def _beat_of(what: str) -> str | None:
    """The attempt whose heartbeat a bucket write of the journal is (a manifest or a heartbeat object: what a
    watcher sees move; an object put alone, a batch torn before its manifest landed, shows no one alive)."""
    beat = what.startswith("put ") and ("/manifests/" in what or "/heartbeat/" in what)
    match = _ATTEMPT.search(what) if beat else None
    return match.group(1) if match else None


def _released(files: dict[str, bytes]) -> bool:
    try:
        return bool(json.loads(files[LEASE]).get("released"))
    except (KeyError, ValueError, TypeError, AttributeError):
        return True


def lease_holder(files: dict[str, bytes]) -> str | None:
    try:
        return str(json.loads(files[LEASE])["holder"])
    except (KeyError, ValueError, TypeError):
        return None


@dataclass
class Oracle:
    server: Server
    period: float
    told: dict[str, int] = field(default_factory=dict)  # run id → most epochs a container said are on the Hub
    snapshots: dict[str, set[str]] = field(default_factory=dict)  # run id → snapshots said to be there
    trained: dict[tuple[str, int], int] = field(default_factory=lambda: defaultdict(int))
    trainers: set[str] = field(default_factory=set)  # the containers that trained an epoch
    log: list[str] = field(default_factory=list)
    seed: int = 0
    only: set[str] | None = None  # the invariants judged (None: all); a history may show one alone
    attempts: dict[str, str] = field(default_factory=dict)  # container → the attempt it runs (said at its start)
    late: set[str] = field(default_factory=set)  # keys landed by a writer a period after a later one took the run
    # keys landed by a writer past the quarter period after a later one took the run: the taker reads its state
    # only after that quarter period, so it may not have seen them (a batch frozen in its call lands inert)
    unread: set[str] = field(default_factory=set)
    _seen: int = -1
    _judged: int = 0  # journal entries the one-writer rule judged
    _landed: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))  # attempt → its bucket beats
    _indexed: int = 0  # journal entries indexed in ``_landed``

    def fail(self, why: str) -> None:
        replay = "\n".join(self.log[-30:])
        raise Violation(f"seed {self.seed}: {why}\nreplay (last events):\n{replay}")

    def durable(self, run_id: str, epochs: int, snapshots: list[str]) -> None:
        self.told[run_id] = max(self.told.get(run_id, 0), epochs)
        self.snapshots.setdefault(run_id, set()).update(snapshots)

    def start(self, who: str, run_id: str, epochs: int, attempt: str | None = None) -> None:
        """A container resumes from ``epochs``: never fewer than a whole state the Hub holds (of any run id: one
        run's containers never mint a second one while the first has a state), never from one only a late write
        of a writer taken over holds."""
        if attempt is not None:
            self.attempts[who] = attempt
        held = max((e for s in whole_states(self.server.bucket, self.late).values() for e, _ in s), default=0)
        readable = whole_states(self.server.bucket, self.late | self.unread)
        least = max((e for s in readable.values() for e, _ in s), default=0)
        if self._judges("start-from-less") and epochs < least:
            self.fail(f"{who} starts run {run_id} from {epochs} epochs while the Hub holds a state of {least}")
        if self.late and self._judges("one-writer") and epochs > held:
            self.fail(f"{who} starts run {run_id} from {epochs} epochs: a state only a writer taken over landed")

    def train(self, who: str, run_id: str, epoch: int) -> None:
        self.trainers.add(who)
        self.trained[(run_id, epoch)] += 1
        if self._judges("trained-twice") and self.trained[(run_id, epoch)] > 2:
            self.fail(f"epoch {epoch} of run {run_id} trained a third time")

    def check(self) -> None:
        """After every step that changed the Hub."""
        version = len(self.server.journal)
        if version == self._seen:
            return
        self._seen = version
        states = whole_states(self.server.bucket)
        for run_id, told in self.told.items():
            best = max((e for e, _ in states.get(run_id, [])), default=0)
            if self._judges("durable") and best < told:
                self.fail(f"run {run_id}: the Hub's newest whole state has {best} epochs, a container was told {told}")
            for name in sorted(self.snapshots.get(run_id, ())) if self._judges("snapshots") else ():
                if not any(name in files for _, files in states.get(run_id, [])):
                    self.fail(f"run {run_id}: the snapshot {name} said to be on the Hub is in no whole state")
        self._one_writer()

    def _one_writer(self) -> None:
        journal = self.server.journal
        for n in range(self._indexed, len(journal)):  # the bucket writes landed since the last step, by attempt
            at, _, what = journal[n]
            attempt = _beat_of(what)
            if attempt is not None:
                self._landed[attempt].append(at)
        self._indexed = len(journal)
        takes: list[tuple[float, str]] = []  # (true time, holder) of each commit that changed the holder
        beats: dict[str, list[float]] = defaultdict(list)  # holder → its lease commits (true time)

        def writes(attempt: str) -> Iterable[float]:  # when its writes landed (true time)
            return itertools.chain(self._landed.get(attempt, ()), beats.get(attempt, ()))

        previous, released = None, True
        for commit in self.server.commits:
            holder = lease_holder(commit.files) if commit.message != PERSON_EDIT else None  # a person takes nothing
            if holder is not None and holder != previous:
                takes.append((commit.at, holder))
                held = sorted(w for w in writes(previous or "") if w <= commit.at)
                quiet = _silence(held, commit.at, self.period)
                silent = self._judges("silence")
                if silent and previous is not None and not released and quiet < self.period - SLACK:
                    self.fail(f"{holder} took the run from {previous}, whose last write landed {quiet:.0f} s before")
                if silent and previous is None:  # no lease (never committed, deleted, unreadable): was anyone writing?
                    for other in sorted({*self._landed, *beats}):
                        last = max((w for w in writes(other) if w < commit.at), default=-1e9)
                        if other != holder and commit.at - last < self.period - SLACK and not self._let_go(other):
                            self.fail(f"{holder} took the run while {other} wrote {commit.at - last:.0f} s before")
            if holder is not None:
                beats[holder].append(commit.at)
            previous, released = holder, _released(commit.files) if holder is not None else True
        if self._judges("one-writer"):
            self._writers(takes)

    def _writers(self, takes: list[tuple[float, str]]) -> None:
        """The bucket writes since the last step, each judged by when its call began (``Server.sent``: what licensed
        it) and when it landed."""
        journal = self.server.journal
        for n in range(self._judged, len(journal)):
            at, who, what = journal[n]
            op, _, key = what.partition(" ")
            writer = self.attempts.get(who)
            if op not in ("put", "del") or writer is None:
                continue
            sent = self.server.sent.get(n, at)
            for taken, holder in takes:
                if holder != writer and holder > writer and sent - taken > self.period:
                    self.fail(f"attempt {writer} wrote {key} {sent - taken:.0f} s after {holder} took the lease")
            taken_before = [at - taken for taken, holder in takes if holder != writer and holder > writer]
            if op == "put" and any(since > self.period / 4 for since in taken_before):
                self.unread.add(key)
            if any(since > self.period for since in taken_before):
                self._inert(writer, op, key)
            elif op == "put" and "/manifests/" in key and self.late:
                self._trusts_no_late_write(key)
        self._judged = len(journal)

    def _inert(self, writer: str, op: str, key: str) -> None:
        """A write ``writer`` sent before it was taken over, landed a period after the take: its own keys only,
        nothing another attempt's manifest names deleted."""
        if op == "put":
            if f"/{writer}/" not in key and f"/{writer}-" not in key:
                self.fail(f"attempt {writer}, taken over, landed {key}: not a key of its own attempt")
            self.late.add(key)
            return
        for manifest, data in self.server.bucket.items():
            if "/manifests/" in manifest and f"/{writer}-" not in manifest and key in _named(data):
                self.fail(f"attempt {writer}, taken over, deleted {key}, which {manifest} names")

    def _trusts_no_late_write(self, key: str) -> None:
        """A manifest landed in the protocol's time names nothing a writer taken over landed late."""
        trusted = _named(self.server.bucket.get(key, b"")) & self.late
        if trusted:
            self.fail(f"{key} names {sorted(trusted)[0]}, which a writer taken over landed late: trusted")

    def _judges(self, invariant: str) -> bool:
        return self.only is None or invariant in self.only

    def _let_go(self, attempt: str) -> bool:
        """``attempt`` released the lease (it ended)."""
        return any(lease_holder(c.files) == attempt and _released(c.files) for c in self.server.commits)

    def end(self, exits: dict[str, int | None]) -> None:
        """Of the containers that trained, one at most ends 0 (one that finds the run done trains nothing)."""
        done = sorted(who for who, code in exits.items() if code == 0 and who in self.trainers)
        if self._judges("two-end-0") and len(done) > 1:
            self.fail(f"two containers that trained ended 0: {', '.join(done)} ({exits})")


def _named(data: bytes) -> set[str]:
    """The keys a manifest names (none when it is not one)."""
    try:
        return {str(entry["key"]) for entry in json.loads(data)["files"].values()}
    except (ValueError, KeyError, TypeError, AttributeError):
        return set()


def _silence(held: list[float], take: float, period: float) -> float:
    """The longest quiet of the holder's writes (``held``, true times) that ends in the last quarter period
    before the take (``take``): the taker judged on reads before its commit, and a write of the holder inside
    that quarter period, licensed by a lease read that still named it, is the protocol's (the holder stops
    within a quarter period of the take, and the taker writes only after it)."""
    cutoff = take - period / 4
    points = [max((w for w in held if w <= cutoff), default=-1e9), *(w for w in held if w > cutoff), take]
    return max(b - a for a, b in itertools.pairwise(points))
