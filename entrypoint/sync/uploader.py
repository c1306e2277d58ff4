"""The uploader: a run folder mirrored to its stores, every epoch boundary as one unit, never torn, never lost.

One snapshotter stages each boundary's changed files once (snapshot.py); each store has a lane (lane.py):
the model repo always, a Storage Bucket for the working state when there is one (places.py says who
gets what). Threads, so training never waits for the network: the file watcher wakes the snapshot
thread at each boundary (libreyolo renames ``status.json`` last); one committer thread per lane
(committer.py) sends its store the newest copy of every file it still needs, as one unit. A failed unit
is kept and tried again, carrying anything newer. All shared state sits under ``changed``. ``flush`` waits, within its
timeout, for every store that must hold the run; ``cut_short`` bounds any flush (SIGTERM).

When the bucket fails ``places.FALLBACK_AFTER`` boundaries in a row for ``fallback_after`` seconds, or
refuses the token, the repo takes the working state, never the snapshots (said once, ``on_storage``) until
the bucket answers again. The run's lease (sync/lease.py) is checked before every write, renewed by every landing.
When the bucket shows that a newer attempt writes the run, nothing more is written anywhere
(``taken_over``, ``on_taken_over``).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from math import inf
from pathlib import Path
from typing import Any

from watchdog.observers.api import BaseObserver

from .. import libreyolo
from ..errors import TakenOverError
from ..hub import Hub
from ..log import logger
from . import clock, places
from .bucket_store import BucketStore
from .committer import Committers
from .lane import Lane
from .lease import RunLease
from .ledger import CommitBudget
from .snapshot import Snapshotter
from .stores import RepoStore
from .watcher import watch

POLL_INTERVAL = 1.0


class Uploader:
    """Mirrors ``run_dir`` into ``repo_id`` (and ``bucket``): ``start``, let it run beside training,
    ``flush``, ``stop``."""

    def __init__(
        self,
        hub: Hub,
        repo_id: str,
        run_dir: Path,
        work_dir: Path,
        *,
        poll_interval: float = POLL_INTERVAL,
        budget: CommitBudget | None = None,
        before_snapshot: Callable[[], None] | None = None,
        superseded: Callable[[str], bool] | None = None,
        on_commit: Callable[[str, list[str]], None] | None = None,
        on_card: Callable[[str | None], None] | None = None,
        bucket: BucketStore | None = None,
        publish_every: float | None = None,
        on_storage: Callable[[dict[str, Any]], None] | None = None,
        on_taken_over: Callable[[TakenOverError], None] | None = None,
        lease: RunLease | None = None,
        fallback_after: float = 0.0,
    ) -> None:
        self.repo_id = repo_id
        self.run_dir = run_dir
        self.changed = threading.Condition()  # pending, failed, snapshots or commits moved
        self.committers = Committers(self)
        self.snapshots = Snapshotter(
            run_dir,
            work_dir / "staging",
            changed=self.changed,
            deliver=self.committers.deliver,
            poll_interval=poll_interval,
            before_snapshot=before_snapshot,
            superseded=superseded,
        )
        moved = (lambda deadline: lease.check(deadline, force=True)) if lease is not None else None
        self.repo = Lane(RepoStore(hub, repo_id, moved), work_dir, takes=places.everything, budget=budget)
        self.bucket = (
            Lane(bucket, work_dir / "bucket", takes=places.everything, budget=places.unlimited_budget())
            if bucket is not None
            else None
        )
        self.routing = places.Routing(self.repo, self.bucket, publish_every)
        self.lanes = self.routing.lanes
        self.commits = self.repo.commits  # the model repo's commits
        self.taken_over: TakenOverError | None = None
        self.final_publish: dict[str, Any] | None = None  # bucket mode: whether the end's repo commit made it
        self.bucket_complete = False  # the last flush left every file in the bucket
        self.kept_epochs = 0  # the most completed epochs of a checkpoint a store holds (the dashboard logs up to it)
        self.owes_run_id = False  # a new run's id missed the repo at the start: retried beside training, any budget
        self.on_commit = on_commit
        self.on_card = on_card  # told why the Hub refused the card, or None once a card landed
        self.on_storage = on_storage
        self.on_taken_over = on_taken_over
        self.lease = lease  # checked before every write, told of every landing (its heartbeat)
        if lease is not None and bucket is not None:
            bucket.before_write = lambda deadline: lease.check(deadline)
        self.fallback_after = fallback_after  # seconds the bucket must fail (as well as boundaries)
        self.card_refused: str | None = None
        self.poll_interval = poll_interval
        self.flush_deadlines: list[float] = []
        self.cutoff = inf  # no flush waits past this (SIGTERM: the process must exit)
        self.stopping = threading.Event()
        self._observer: BaseObserver | None = None
        self._threads: list[threading.Thread] = []

    # -- what the job reads ------------------------------------------------------------------
    @property
    def fallback(self) -> str | None:
        """Why the repo holds the working state instead of the bucket (None: it does not)."""
        return self.routing.fallback

    @property
    def latencies(self) -> Any:
        return self.routing.working.latencies

    @property
    def pending(self) -> list[str]:
        """Everything the stores that must hold the run lack: staged and waiting, or failed to stage."""
        with self.changed:
            return self._lacking()

    def _lacking(self) -> list[str]:
        required = set().union(*(lane.pending for lane in self.routing.required()))
        return sorted(required | set(self.snapshots.stager.failed) | set(self._final_left()))

    @property
    def last_error(self) -> str | None:
        errors = [lane.last_error for lane in self.routing.required()] + [self.snapshots.stager.last_error]
        return next((error for error in errors if error), None)

    def refusals(self) -> tuple[dict[str, str], dict[str, str]]:
        """Checkpoints refused whole (only this volume holds them), and torn ones (worth nothing): path → why."""
        with self.changed:
            return dict(self.snapshots.stager.refused_missing), dict(self.snapshots.stager.torn)

    # -- lifecycle -------------------------------------------------------------------------
    def start(self) -> None:
        self.snapshots.prepare()
        for lane in self.lanes:
            lane.check_ledger()
        self._observer = watch(self.run_dir, self.snapshots.wake)
        targets: list[tuple[Callable[..., None], tuple[Any, ...], str]] = [
            (self.snapshots.run, (self.stopping,), "sync-snapshot"),
            *((self.committers.run, (lane,), f"sync-commit-{n}") for n, lane in enumerate(self.lanes)),
        ]
        for target, args, name in targets:
            thread = threading.Thread(target=target, args=args, name=name, daemon=True)
            thread.start()
            self._threads.append(thread)

    def snapshot(self) -> list[str]:
        return self.snapshots.snapshot()

    def notify(self) -> None:
        """Something changed (trainbox.json saved): take a snapshot soon."""
        self.snapshots.wake.set()

    def flush(self, timeout: float, *, final: bool = True, everywhere: bool = False) -> bool:
        """Snapshot now and have every store that must hold the run get everything pending; True when
        they have it all. Returns by ``timeout`` whatever the threads are doing. ``final``: the end of
        the run, when the repo also gets the final ``last.pt`` (bucket mode); ``everywhere``: wait for
        the repo's milestones too (trainbox.json on the repo at a run's first start)."""
        began = clock.monotonic()
        deadline = began + timeout
        with self.changed:
            if final:
                self.routing.to_final()  # bucket mode: the repo takes the final last.pt too
            self.routing.everywhere = everywhere
            ticket = self.snapshots.ask()
            if final and self.bucket is not None:
                self.routing.final_ticket = ticket  # the repo's milestones wait for the end's own snapshot
            self.flush_deadlines.append(deadline)
            for lane in self.lanes:
                lane.retry_at = 0.0  # someone waits now: no backoff left over from before
                lane.work.set()
        done, restaged = False, False
        try:
            with self.changed:
                while (remaining := min(deadline, self.cutoff) - clock.monotonic()) > 0:
                    if self.taken_over is not None:
                        break
                    # Bucket mode, the end: the final last.pt staged again for the repo (after SIGTERM, once
                    # the working state is in); the flush waits for that snapshot then.
                    if self.routing.restage_due(
                        pressed=self.cutoff < inf, boundary_staged=self.snapshots.answered(ticket)
                    ):
                        ticket = self.snapshots.again(places.final_restaged)
                    if self.snapshots.answered(ticket):
                        required = self.routing.required()
                        waiting = [lane for lane in required if lane.pending or lane.busy]
                        if not waiting and not self.snapshots.stager.failed:
                            done = not self._final_left()  # else no time was left to stage it: nothing comes
                            break
                        # A refused token or a rate limit longer than our time: no use waiting on that lane (a
                        # refused bucket: the repo takes over); the others still get their time.
                        hopeless = [
                            lane
                            for lane in waiting
                            if (lane.denied_at > began and lane is not self.bucket) or lane.budget.hold() > remaining
                        ]
                        if waiting and len(hopeless) == len(waiting):
                            break
                        waiting = [lane for lane in waiting if lane not in hopeless]
                        if not waiting:
                            # Only files that could not be staged, nothing to commit to free room: one that
                            # still cannot be staged after one more try (disk full) will not be by waiting.
                            if restaged:
                                break
                            restaged = True
                            ticket = self.snapshots.ask()
                            continue
                        for lane in waiting:
                            lane.work.set()
                    self.changed.wait(min(remaining, 0.25))
                answered = self.snapshots.answered(ticket)
                left = self._lacking()
        finally:
            with self.changed:
                self.flush_deadlines.remove(deadline)
                self.routing.everywhere = False
                self.routing.final_ticket = 0
        self._account(final, answered)
        if done:
            return True
        if self.taken_over is not None:
            logger.error("sync: nothing more is written: %s", self.taken_over.message)
        elif not answered:
            logger.error("sync: the final snapshot did not finish within %.0f s", timeout)
        if left:
            waited = clock.monotonic() - began
            logger.error("sync: %d file(s) not on the Hub after %.0f s: %s", len(left), waited, ", ".join(left[:5]))
        return False

    def cut_short(self, deadline: float) -> None:
        """No flush, running or to come, waits past ``deadline`` (a ``clock.monotonic()`` value), and no staging
        starts past it. Safe in a signal handler: it takes no lock."""
        self.cutoff = min(self.cutoff, deadline)
        self.snapshots.cutoff = min(self.snapshots.cutoff, deadline)

    def stop(self, timeout: float = 5.0) -> None:
        """End every thread; waits at most ``timeout`` (a commit in flight is abandoned)."""
        deadline = clock.monotonic() + timeout
        self.stopping.set()
        self.snapshots.wake.set()
        for lane in self.lanes:
            lane.work.set()
        if self._observer is not None:
            self._observer.stop()
            self._observer.join(timeout=max(0.0, deadline - clock.monotonic()))
        for thread in self._threads:
            thread.join(timeout=max(0.0, deadline - clock.monotonic()))

    # -- where files go --------------------------------------------------------------------
    def _final_left(self) -> dict[str, str]:
        """Under ``changed``: what the repo's final publish lacks that no commit carries (no time left), and why."""
        return self.routing.final_left(self.snapshots.stager.skipped, self.run_dir / libreyolo.LAST_CHECKPOINT)

    def _account(self, final: bool, answered: bool) -> None:
        if self.bucket is None or not final:
            return
        said = self.final_publish
        with self.changed:
            skipped, seen = self._final_left(), answered or self.bucket_complete  # the volume was read to the end
            self.bucket_complete, self.final_publish = self.routing.final_outcome(
                seen, self.snapshots.stager.failed, skipped
            )
        if not self.final_publish["done"] and self.taken_over is None and self.final_publish != said:
            why = "; ".join(f"{name}: {reason}" for name, reason in skipped.items())
            logger.warning(
                "bucket: the final publish to %s did not finish (%s); the bucket %s holds the run",
                self.repo_id,
                why or self.repo.last_error or "out of time",
                self.bucket.name,
            )
