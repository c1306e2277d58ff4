"""A deterministic simulation of the store protocol: an in-memory bucket and repo with the Hub's semantics, and
agents that take every decision from entrypoint/sync/protocol.py, under a seeded scheduler.

The bucket's batches are not transactional (a prefix may land, an answer may be lost), its listings may fail
or come back partial; the repo's commits carry ``parent_commit`` and answer 412 when the head moved. Agents
(one to three at a time) are killed at any step, every call may fail or time out, calls may be slow (time
jumps while an agent waits), clocks are up to ±30 s off. After every step the world checks the invariants
(``World.check``); a violation raises ``Violation`` with a short replay of the history.

``Rules`` switches each new rule back to the one it replaced, so a named history (one per ordering of the
issue) can be shown to fail under the old rule and pass under the new.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any

from entrypoint.sync import protocol as p

PERIOD = p.LEASE_PERIOD
FALLBACK_SECONDS = PERIOD / 2
SAVE_PERIOD = 2
TARGET = 10  # epochs of the run


class Violation(AssertionError):
    pass


@dataclass(frozen=True)
class Rules:
    """The new rules (all True); each False reproduces the old rule it replaced."""

    carry: bool = True  # 1: a new attempt's manifests carry earlier snapshots forward
    unreadable_not_empty: bool = True  # 2: a failed or partial bucket read is not an empty bucket
    careful_delete: bool = True  # 2: delete only on a complete listing, never a state with more epochs
    lease: bool = True  # 3, 4, 5: one writer by lease
    fallback_by_time: bool = True  # 6: the bucket must fail for a while; the repo never takes snapshots


OLD = Rules(False, False, False, False, False)


class Failed(Exception):
    """A call that failed (a 5xx, a timeout: whether it applied is not known to the caller)."""


class Conflict(Exception):
    """A repo commit whose parent moved: 412."""


@dataclass
class Faults:
    """How often each call fails; ``script`` overrides: a list of (call, outcome) taken in order for that call
    (``"ok"``, ``"fail"``, ``"lost"``: applied then failed, ``"torn"``: a batch's prefix applied,
    ``"partial"``: a listing cut short)."""

    rng: random.Random
    rate: float = 0.08
    script: dict[str, list[str]] = field(default_factory=dict)

    def outcome(self, call: str) -> str:
        queued = self.script.get(call)
        if queued:
            return queued.pop(0)
        roll = self.rng.random()
        if roll < self.rate * 0.5:
            return "fail"
        if roll < self.rate * 0.75:
            return "lost"
        if roll < self.rate:
            return "torn" if call == "batch" else "partial" if call == "list" else "fail"
        return "ok"


@dataclass
class Volume:
    name: str
    epochs: int = 0
    snapshots: set[int] = field(default_factory=set)


class World:
    """The bucket, the repo, the clock, the record of what agents were told, and the invariants."""

    def __init__(self, seed: int, rules: Rules = Rules(), *, bucket: bool = True, rate: float = 0.08) -> None:
        self.seed = seed
        self.rng = random.Random(seed)
        self.rules = rules
        self.faults = Faults(self.rng, rate)
        self.bucket_on = bucket
        self.now = 1_000_000.0
        self.bucket: dict[str, int] = {}  # key → size
        self.bodies: dict[str, p.Manifest] = {}  # manifest key → its content
        self.repo: dict[str, Any] = {}  # "lease", "run_id", "epochs" (trainbox.json), "last" (epochs), "snapshots"
        self.head = 0
        self.head_at = self.now  # the Hub's clock at the newest commit
        self.durable: dict[str, int] = {}  # agent → the most epochs it was told are on the Hub
        self.durable_snapshots: set[int] = set()
        self.takes: list[tuple[float, str]] = []  # (time, agent) a lease was taken (old rules: a first write)
        self.beats: list[tuple[float, str]] = []  # (time, agent) of writes that landed: heartbeats seen
        self.judged: list[tuple[float, str]] = []  # (time, agent) a take was decided (old rules: a first write)
        self.writes: list[tuple[float, str]] = []
        self.log: list[str] = []
        self.steps = 0
        self.fallbacks: list[tuple[str, float]] = []  # (agent, failing for) when an agent fell back

    # -- the stores ------------------------------------------------------------------------------
    def repo_read(self) -> tuple[dict[str, Any], int]:
        if self.faults.outcome("repo_read") in ("fail", "lost"):
            raise Failed("repo read")
        return dict(self.repo), self.head

    def repo_commit(self, changes: dict[str, Any], parent: int | None) -> int:
        outcome = self.faults.outcome("commit")
        if outcome == "fail":
            raise Failed("commit")
        if parent is not None and parent != self.head:
            raise Conflict()
        self.repo.update(changes)
        self.head += 1
        self.head_at = self.now
        if outcome == "lost":
            raise Failed("commit answer lost")
        return self.head

    def batch(
        self, add: list[tuple[str, int]], bodies: dict[str, p.Manifest], delete: frozenset[str] | set[str] = frozenset()
    ) -> None:
        outcome = self.faults.outcome("batch")
        if outcome == "fail":
            raise Failed("batch")
        ops: list[tuple[str, int | None]] = [*add, *((key, None) for key in sorted(delete))]
        if outcome == "torn":
            ops = ops[: self.rng.randrange(len(ops) + 1)]
        for key, size in ops:
            if size is None:
                self.bucket.pop(key, None)
                self.bodies.pop(key, None)
            else:
                self.bucket[key] = size
                if key in bodies:
                    self.bodies[key] = bodies[key]
        if outcome in ("torn", "lost"):
            raise Failed("batch cut short")

    def listing(self) -> p.Listing:
        outcome = self.faults.outcome("list")
        if outcome in ("fail", "lost"):
            return p.Listing(p.Read.FAILED)
        if outcome == "partial":
            kept = {k: v for k, v in self.bucket.items() if self.rng.random() < 0.5}
            return p.Listing(p.Read.PARTIAL, kept)
        return p.Listing(p.Read.COMPLETE, dict(self.bucket))

    # -- what is on the Hub ------------------------------------------------------------------------
    def whole(self) -> list[p.Manifest]:
        run_id = self.repo.get("run_id")
        return p.newest_whole(self.bodies.values(), self.bucket, str(run_id))

    def hub_epochs(self) -> int:
        whole = self.whole()
        return max(whole[0].epoch if whole else 0, int(self.repo.get("last") or 0))

    # -- invariants ----------------------------------------------------------------------------
    def say(self, line: str) -> None:
        self.log.append(f"{self.steps:4d} t={self.now - 1_000_000:7.1f} {line}")

    def fail(self, why: str) -> None:
        replay = "\n".join(self.log[-25:])
        raise Violation(f"seed {self.seed}, step {self.steps}: {why}\nreplay (last steps):\n{replay}")

    def check(self) -> None:
        told = max(self.durable.values(), default=0)
        if self.hub_epochs() < told:
            self.fail(f"the Hub's newest whole state has {self.hub_epochs()} epochs, an agent was told {told}")
        whole = self.whole()
        newest = whole[0] if whole else None
        for epoch in sorted(self.durable_snapshots):
            name = f"weights/epoch_{epoch}.pt"
            if newest is None or name not in newest.files:
                self.fail(f"the durable snapshot {name} is no longer named by the newest whole manifest")
        if self.repo.get("snapshots"):
            self.fail(f"the repo took snapshots {sorted(self.repo['snapshots'])}")
        for agent, failing_for in self.fallbacks:
            if failing_for < FALLBACK_SECONDS - 2 * p.CLOCK_SKEW:
                self.fail(f"{agent} fell back to the repo after the bucket failed for only {failing_for:.0f} s")


class Agent:
    """One container: its volume, its clock, its attempt, driven one step at a time by the scheduler."""

    def __init__(self, world: World, name: str, volume: Volume, skew: float) -> None:
        self.world, self.name, self.volume, self.skew = world, name, volume, skew
        self.rules = world.rules
        self.phase = "lease"
        self.attempt = ""
        self.run_id: str | None = None
        self.run_known = False  # the repo knew the run before this start
        self.take: tuple[dict[str, Any], int | None] = ({}, None)
        self.judged_at: float | None = None
        self.took_over = False  # the lease was taken from a holder that had not released it
        self.writes_from = 0.0  # (its clock) no write before this
        self.watch: p.Watch | None = None
        self.read_since: float | None = None
        self.base: dict[str, dict[str, Any]] = {}
        self.known: dict[str, p.Manifest] = {}
        self.learned = False
        self.current: p.Manifest | None = None
        self.seq = 0
        self.uploaded: dict[str, str] = {}  # relative → key this attempt uploaded
        self.failures = 0
        self.failing_since: float | None = None
        self.fallback = False
        self.exit: int | None = None
        self.trained = False  # an epoch waits for its boundary
        self.last_write: float | None = None
        self.checked_at: float | None = None  # when a read of the lease last named this attempt
        self.beat_at = 0.0  # when this holder last renewed (its clock)
        self.beats = 0

    @property
    def clock(self) -> float:
        return self.world.now + self.skew

    def end(self, code: int, why: str) -> None:
        """An exit; one that stops a holder (71) is fair only when it was silent a lease period before."""
        w = self.world
        self.phase, self.exit = "ended", code
        w.say(f"{self.name} exits {code}: {why}")
        others = [(judged, a) for judged, a in w.judged if a != self.name]
        if code == 71 and others:
            judged, holder = others[-1]
            before = [t for t, a in w.beats if a == self.name and t <= judged]
            if before and judged - max(before) < PERIOD - 2 * p.CLOCK_SKEW:
                w.fail(
                    f"{holder} took the run {judged - max(before):.0f} s after {self.name} last wrote: stopped alive"
                )

    def step(self) -> None:
        getattr(self, f"_{self.phase}")()

    # -- taking the run --------------------------------------------------------------------------
    def _beat(self, repo: dict[str, Any], head: int) -> p.Beat | None:
        lease = repo.get("lease")
        if lease is None:
            return p.Beat(str(head))
        if self.world.bucket_on:
            listing = self.world.listing()
            if not listing.complete:
                return None
            mine = [
                k for k in listing.sizes if f"/manifests/{lease.holder}-" in k or f"/heartbeat/{lease.holder}-" in k
            ]
            newest = ",".join(sorted(mine))
            return p.Beat(f"{head}|{newest}", self.world.head_at if not mine else None)
        return p.Beat(str(head), self.world.head_at)  # the Hub's time of the newest commit

    def _lease(self) -> None:
        """Read the lease and judge it; a take is committed at the next step (another agent may go between)."""
        w = self.world
        try:
            repo, head = w.repo_read()
        except Failed:
            return
        self.run_known = "run_id" in repo
        if not self.rules.lease:  # the old rules: the run id minted when the repo names none, nothing else
            self.run_id = str(repo.get("run_id") or f"run-{self.name}")
            self.attempt = f"{self.clock:016.3f}-{self.name}"
            self.take = ({} if self.run_known else {"run_id": self.run_id}, None)
            self.phase = "taking"
            return
        beat = self._beat(repo, head)
        if beat is None:
            return
        lease: p.Lease | None = repo.get("lease")
        if not self.attempt:
            after = float(lease.holder.split("-")[0]) + 0.001 if lease else 0.0  # later than the holder's
            self.attempt = f"{max(self.clock, after):016.3f}-{self.name}"
        verdict, self.watch = p.judge_lease(lease, self.attempt, beat, self.clock, self.watch)
        w.say(f"{self.name} judges the lease {lease and lease.holder}: {verdict.value}")
        if verdict is p.Verdict.HELD:
            return self.end(72, "another container holds this run")
        if verdict is p.Verdict.WATCH:
            return
        self.run_id = lease.run_id if lease else str(repo.get("run_id") or f"run-{self.name}")
        if verdict is p.Verdict.MINE:
            return self._holding()
        if lease is not None and self.attempt <= lease.holder:  # later than the attempt it takes over from
            after = float(lease.holder.split("-")[0]) + 0.001
            self.attempt = f"{max(self.clock, after):016.3f}-{self.name}"
        taken = p.Lease(self.run_id, self.attempt, self.clock)
        self.judged_at = w.now
        self.took_over = lease is not None and not lease.released
        self.take = ({"lease": taken} | ({} if self.run_known else {"run_id": self.run_id}), head)
        self.phase = "taking"

    def _taking(self) -> None:
        changes, head = self.take
        try:
            if changes:
                self.world.repo_commit(changes, head)
        except Conflict:  # the head moved: look again
            self.watch, self.phase = None, "lease"
            return
        except Failed:  # landed or not: the next read says
            self.phase = "lease"
            return
        if not self.rules.lease:
            self.phase = "resume"
            return
        self._holding()

    def _holding(self) -> None:
        self.beat_at = self.checked_at = self.clock
        if self.took_over:  # a holder that may not know yet writes for at most a quarter period: let it finish
            self.writes_from = self.clock + PERIOD / 4
        self.world.takes.append((self.world.now, self.name))
        self.world.judged.append((self.world.now if self.judged_at is None else self.judged_at, self.name))
        self.world.say(f"{self.name} holds the run {self.run_id} as {self.attempt}")
        self.phase = "resume"

    # -- resume ----------------------------------------------------------------------------------
    def _resume(self) -> None:
        w = self.world
        if self.read_since is None:
            self.read_since = self.clock
        try:
            repo, _ = w.repo_read()
        except Failed:
            return
        epochs = self.volume.epochs
        if w.bucket_on:
            listing = w.listing()
            decision = p.bucket_read(listing.read, self.clock - self.read_since, self.run_known, 60.0)
            if not self.rules.unreadable_not_empty and not listing.complete:
                decision, listing = p.BucketRead.USE, p.Listing(p.Read.COMPLETE, {})
            if decision is p.BucketRead.RETRY:
                return
            if decision is p.BucketRead.REFUSE:
                return self.end(73, "the bucket cannot be read and the run has epochs")
            manifests = [w.bodies[k] for k in listing.sizes if k in w.bodies]
            whole = p.newest_whole(manifests, listing.sizes, str(self.run_id))
            if whole:
                epochs = max(epochs, whole[0].epoch)
        epochs = max(epochs, int(repo.get("last") or 0))
        told = max(w.durable.values(), default=0)
        holder = repo.get("lease") is not None and repo["lease"].holder == self.attempt
        if epochs < told and self.rules.lease and holder:
            w.fail(f"{self.name} resumes at epoch {epochs}, below the durable {told}")
        if epochs < told:  # the old rules: record it, the history then fails on what it deletes
            w.say(f"{self.name} resumes at {epochs} below the durable {told}")
        if epochs != self.volume.epochs:  # from a store: the volume takes last.pt (not the snapshots)
            self.volume.epochs = epochs
        w.say(f"{self.name} resumes at epoch {epochs}")
        self.phase = "train"

    # -- training ----------------------------------------------------------------------------------
    def _train(self) -> None:
        if self.rules.lease and self.clock - self.beat_at >= PERIOD / 2:
            return self._heartbeat()
        if self.volume.epochs >= TARGET and not self.trained:
            return self._finish()
        if not self.trained:
            self.volume.epochs += 1
            if self.volume.epochs % SAVE_PERIOD == 0:
                self.volume.snapshots.add(self.volume.epochs)
            self.trained = True
            return
        self._boundary()

    def _holds(self) -> bool:
        """Before writing (as lease.RunLease.check): the lease read within a quarter period names this attempt
        (a taker waits a whole period of silence, so one that took it is seen before it could matter)."""
        if not self.rules.lease:
            return True
        if self.clock < self.writes_from:
            return False
        if self.checked_at is not None and self.clock - self.checked_at < PERIOD / 4:
            return True
        try:
            repo, _ = self.world.repo_read()
        except Failed:
            return False
        lease = repo.get("lease")
        if lease is not None and lease.holder == self.attempt and lease.released:
            self.end(0, "done (its release had landed)")
            return False
        if not p.may_write(lease, self.attempt, None):
            self.end(71, "another container took the run over")
            return False
        self.checked_at = self.clock
        return True

    def _commit(self, changes: dict[str, Any], *, lease: bool = False) -> bool:
        """A repo commit of the holder. A working-state commit goes as it is (the check before it fences it); a
        lease commit (a renewal, the release) with ``parent_commit`` the head it read the lease at: 412 when
        the repo moved, and the lease is looked at again next time."""
        w = self.world
        parent = None
        if lease and self.rules.lease:
            try:
                repo, parent = w.repo_read()
            except Failed:
                return False
            held = repo.get("lease")
            if held is not None and held.holder != self.attempt:
                self.end(71, "another container took the run over")
                return False
        try:
            self._wrote()
            w.repo_commit(changes, parent)
        except (Conflict, Failed):
            return False
        return True

    def _heartbeat(self) -> None:
        """A holder renews its lease without a commit per boundary: a small object in the bucket; in repo
        mode (no bucket, or its fallback) a lease commit when no boundary commit renewed it."""
        w = self.world
        if not self._holds():
            return
        self.beats += 1
        if w.bucket_on and not self.fallback:
            key = f"run/{self.run_id}/heartbeat/{self.attempt}-{self.beats:06d}"
            old = {k for k in w.bucket if f"/heartbeat/{self.attempt}-" in k}
            try:
                self._wrote()
                w.batch([(key, 1)], {}, old)
            except Failed:
                return
        elif not self._commit({"lease": p.Lease(str(self.run_id), self.attempt, self.clock)}, lease=True):
            return
        self._beat_seen()

    def _beat_seen(self) -> None:
        self.beat_at = self.clock
        self.world.beats.append((self.world.now, self.name))

    def _wrote(self) -> None:
        """About to write: after one lease period, only the newest taker of the run writes."""
        w = self.world
        if not self.rules.lease and self.last_write is None:
            w.takes.append((w.now, self.name))
            w.judged.append((w.now, self.name))
        taken_at, holder = w.takes[-1] if w.takes else (w.now, self.name)
        if holder != self.name and w.now > taken_at + PERIOD:
            w.fail(f"{self.name} writes {w.now - taken_at:.0f} s after {holder} took the run")
        w.writes.append((w.now, self.name))
        self.last_write = w.now

    def _boundary(self) -> None:
        w = self.world
        if not self._holds():
            return
        epoch = self.volume.epochs
        if not w.bucket_on or self.fallback:
            self._to_repo(epoch)
            if not w.bucket_on:
                return
        self._to_bucket(epoch)

    def _to_repo(self, epoch: int) -> None:
        w = self.world
        changes: dict[str, Any] = {"last": epoch, "epochs": epoch}
        if not self.rules.fallback_by_time and w.bucket_on:
            changes["snapshots"] = set(w.repo.get("snapshots") or set()) | self.volume.snapshots
        if not self._commit(changes):
            return
        self._beat_seen()
        w.durable[self.name] = max(w.durable.get(self.name, 0), epoch)
        if not w.bucket_on:
            self.trained = False
        w.say(f"{self.name} commits epoch {epoch} to the repo")

    def _learn(self) -> bool:
        """Before its first boundary (as BucketStore._learn), after any wait a take-over asks: every manifest
        of the folder, and the newest whole one's files to carry forward. False: the listing failed."""
        if self.learned:
            return True
        w = self.world
        listing = w.listing()
        if not listing.complete:
            return False
        self.known = {k: w.bodies[k] for k in listing.sizes if k in w.bodies}
        whole = p.newest_whole(self.known.values(), listing.sizes, str(self.run_id))
        self.base = dict(whole[0].files) if whole and self.rules.carry else {}
        self.learned = True
        return True

    def _to_bucket(self, epoch: int) -> None:
        w = self.world
        if not self._learn():
            self._bucket_failed()
            return
        prefix = f"run/{self.run_id}"
        written: dict[str, dict[str, Any]] = {}
        add: list[tuple[str, int]] = []
        files = {p.LAST: epoch} | {f"weights/epoch_{n}.pt": n for n in self.volume.snapshots}
        for relative, of_epoch in files.items():
            key = f"{prefix}/objects/{self.attempt}/{relative}@{of_epoch}"
            written[relative] = {"key": key, "sha256": key, "size": of_epoch + 1, "epoch": of_epoch}
            if self.uploaded.get(relative) != key:
                add.append((key, of_epoch + 1))
        previous = self.current.files if self.current else {}
        self.seq += 1
        manifest = p.Manifest(
            key=f"{prefix}/manifests/{self.attempt}-{self.seq:06d}.json",
            run_id=str(self.run_id),
            run_name="run",
            attempt=self.attempt,
            seq=self.seq,
            commit="",
            epoch=epoch,
            written_at=self.clock,
            files=p.next_files(self.base, previous, written),
        )
        self.known[manifest.key] = manifest
        try:
            self._wrote()
            w.batch([*add, (manifest.key, 1)], {manifest.key: manifest})
        except Failed:
            self._bucket_failed()
            return
        self.uploaded.update({relative: entry["key"] for relative, entry in written.items()})
        self.current = manifest
        self._beat_seen()
        self.failures, self.failing_since = 0, None
        if self.fallback:
            self.fallback = False
        self.trained = False
        w.durable[self.name] = max(w.durable.get(self.name, 0), epoch)
        w.durable_snapshots |= {e["epoch"] for r, e in manifest.files.items() if p.is_snapshot(r)}
        w.say(f"{self.name} lands epoch {epoch} in the bucket ({manifest.key.rsplit('/', 1)[-1]})")
        self._tidy()

    def _bucket_failed(self) -> None:
        self.failures += 1
        if self.failing_since is None:
            self.failing_since = self.clock
        failing_for = self.clock - self.failing_since
        if self.rules.fallback_by_time:
            falls = p.fall_back(self.failures, failing_for, False, FALLBACK_SECONDS)
        else:
            falls = self.failures >= p.FALLBACK_BOUNDARIES
        if falls and not self.fallback:
            self.fallback = True
            self.world.fallbacks.append((self.name, failing_for + 2 * p.CLOCK_SKEW))
            self.world.say(f"{self.name} falls back to the repo after {self.failures} failures, {failing_for:.0f} s")

    def _tidy(self) -> None:
        w = self.world
        assert self.current is not None
        listing = w.listing()
        if not self.rules.careful_delete and listing.read is p.Read.FAILED:
            return
        prefix = f"run/{self.run_id}/"

        def attempt_of(key: str) -> str | None:
            if not key.startswith(prefix):
                return None
            rest = key[len(prefix) :]
            if rest.startswith("manifests/"):
                return rest.split("/", 1)[1].rsplit("-", 1)[0]
            return rest.split("/")[1]

        newer = max((a for k in listing.sizes if "/manifests/" in k and (a := attempt_of(k))), default=None)
        if newer is not None and newer > self.attempt:
            return self.end(71, f"a newer attempt {newer} writes the run")
        if self.rules.careful_delete:
            unknown = [k for k in listing.sizes if "/manifests/" in k and k not in self.known and k in w.bodies]
            if unknown and w.faults.outcome("read") == "ok":  # another attempt's manifests, read now
                self.known.update({k: w.bodies[k] for k in unknown})
            known = {k: m for k, m in w.bodies.items() if k in self.known}
            doomed = p.deletable(listing, self.current, known, self.attempt, attempt_of, holder=self._holds())
        else:
            keep = self.current.keys() | {self.current.key}
            doomed = {k for k in listing.sizes if k not in keep and (attempt_of(k) or "~") <= self.attempt}
        if doomed:
            try:
                self._wrote()
                w.batch([], {}, doomed)
            except Failed:
                pass

    def _finish(self) -> None:
        if not self.rules.lease:
            return self.end(0, "done")
        released = p.Lease(str(self.run_id), self.attempt, self.clock, released=True)
        if not self._holds():
            return
        # Once, best effort: an unreleased lease expires (a watcher waits one period).
        self._commit({"lease": released}, lease=True)
        self.end(0, "done")

    def _ended(self) -> None:
        pass


def run_history(seed: int, rules: Rules = Rules(), *, steps: int = 160) -> World:
    """One generated history: agents started, killed and relaunched at random, faults on every call, time
    jumps (slow calls, lease expiry), clocks ±30 s apart. Raises ``Violation``."""
    rng = random.Random(seed ^ 0x5EED)
    world = World(seed, rules, bucket=rng.random() < 0.8, rate=rng.choice([0.0, 0.05, 0.15, 0.3]))
    agents: list[Agent] = []
    volumes: list[Volume] = []
    for world.steps in range(steps):
        alive = [a for a in agents if a.phase != "ended"]
        if len(alive) < 3 and len(agents) < 8 and (not alive or rng.random() < 0.05):
            reuse = [v for v in volumes if not any(a.volume is v for a in alive)]
            volume = rng.choice(reuse) if reuse and rng.random() < 0.5 else Volume(f"v{len(volumes)}")
            if volume not in volumes:
                volumes.append(volume)
            agent = Agent(world, f"a{len(agents)}", volume, rng.uniform(-p.CLOCK_SKEW, p.CLOCK_SKEW))
            agents.append(agent)
            world.say(f"{agent.name} starts on {volume.name}")
            continue
        if alive and rng.random() < 0.03:
            victim = rng.choice(alive)
            victim.phase, victim.exit = "ended", -9
            world.say(f"{victim.name} is killed")
        elif alive:
            rng.choice(alive).step()
        world.now += rng.choice([0.5, 1.0, 2.0, 5.0, 5.0, 20.0, 90.0])
        world.check()
    return world


# -- the orderings, each a named history ----------------------------------------------------
def _until(world: World, agents: list[Agent], done: Any, dt: float = 5.0, limit: int = 400) -> None:
    """Step ``agents`` in turn (time moving ``dt`` per step), checking the invariants, until ``done()``."""
    for n in range(limit):
        if done():
            return
        world.steps += 1
        agents[n % len(agents)].step()
        world.now += dt
        world.check()
    raise AssertionError(f"seed {world.seed}: the history never reached its end\n" + "\n".join(world.log[-20:]))


def _landed(agent: Agent, epoch: int) -> Any:
    return lambda: agent.current is not None and agent.current.epoch >= epoch


def _ended(*agents: Agent) -> Any:
    return lambda: all(a.phase == "ended" for a in agents)


def ordering_1(rules: Rules) -> World:
    """A new volume resuming from the bucket keeps the snapshots (epoch_N.pt) earlier attempts made."""
    w = World(1, rules, rate=0.0)
    a = Agent(w, "a", Volume("v1"), 0.0)
    _until(w, [a], _landed(a, 4))
    a.phase = "ended"  # killed -9: the machine is gone
    b = Agent(w, "b", Volume("v2"), 20.0)
    _until(w, [b], _landed(b, 6), dt=10.0)
    return w


def ordering_2(rules: Rules) -> World:
    """A bucket that cannot be read at resume is not an empty bucket: no fresh start, nothing deleted (73)."""
    w = World(2, rules, rate=0.0)
    a = Agent(w, "a", Volume("v1"), 0.0)
    _until(w, [a], _landed(a, 3))
    a.phase = "ended"
    b = Agent(w, "b", Volume("v2"), 0.0)
    _until(w, [b], lambda: b.phase == "resume", dt=10.0)
    w.faults.script["list"] = ["fail"] * 1000  # every read of the bucket fails from here
    _until(w, [b], lambda: b.phase != "resume")
    w.faults.script["list"] = []
    _until(w, [b], lambda: b.phase == "ended" or _landed(b, 1)())
    _until(w, [b], lambda: b.phase == "ended" or (b.current is not None and b.trained))
    assert b.exit == 73 and b.last_write is None, "b started over instead of ending with 73, writing nothing"
    return w


def ordering_3(rules: Rules) -> World:
    """A second container started on a live run ends (72) writing nothing; the first one finishes."""
    w = World(3, rules, rate=0.0)
    a = Agent(w, "a", Volume("v1"), 0.0)
    _until(w, [a], _landed(a, 2))
    b = Agent(w, "b", Volume("v2"), -25.0)
    _until(w, [a, b], lambda: b.phase == "ended" or b.current is not None)
    if b.phase != "ended":
        b.phase = "ended"  # it wrote one boundary and died
    _until(w, [a], _ended(a))
    assert a.exit == 0 and b.exit == 72 and b.last_write is None
    return w


def ordering_4(rules: Rules) -> World:
    """Without a bucket (every boundary a repo commit), a second container is refused (72) too."""
    w = World(4, rules, bucket=False, rate=0.0)
    a = Agent(w, "a", Volume("v1"), 0.0)
    _until(w, [a], lambda: int(w.repo.get("last") or 0) >= 2)
    b = Agent(w, "b", Volume("v2"), 25.0)
    _until(w, [a, b], _ended(a, b), dt=10.0)
    assert a.exit == 0 and b.exit == 72 and b.last_write is None
    return w


def ordering_5(rules: Rules) -> World:
    """Two containers started together on a new run: one takes it (one run id), the other ends (72)."""
    w = World(5, rules, rate=0.0)
    a = Agent(w, "a", Volume("v1"), 10.0)
    b = Agent(w, "b", Volume("v2"), -10.0)
    _until(w, [a, b], _ended(a, b), dt=3.0)
    assert {a.exit, b.exit} == {0, 72}
    return w


def ordering_6(rules: Rules) -> World:
    """A short bucket outage (three failed boundaries in seconds) is waited out: no fallback, no epoch_N.pt in
    the repo."""
    w = World(6, rules, rate=0.0)
    a = Agent(w, "a", Volume("v1"), 0.0)
    _until(w, [a], _landed(a, 2), dt=1.0)
    w.faults.script["batch"] = ["fail"] * 3
    _until(w, [a], _landed(a, 6), dt=1.0)
    assert not a.fallback
    return w


NAMED = {
    "1-snapshots-carried-forward": (ordering_1, Rules(carry=False)),
    "2-unreadable-bucket-is-not-empty": (ordering_2, Rules(unreadable_not_empty=False, careful_delete=False)),
    "3-second-container-on-a-live-run": (ordering_3, Rules(lease=False)),
    "4-second-container-in-repo-mode": (ordering_4, Rules(lease=False)),
    "5-two-containers-start-together": (ordering_5, Rules(lease=False)),
    "6-short-outage-no-snapshots-in-repo": (ordering_6, Rules(fallback_by_time=False)),
}
