# over 500 lines: the snapshot and committer threads share one condition and its state; split, its locking would be too
"""The uploader: a run folder mirrored to its stores, every epoch boundary as one unit, never torn, never lost.

One snapshotter stages each boundary's changed files once (snapshot.py); each store has a lane (lane.py):
the model repo always, a Storage Bucket for the working state when there is one (places.py says who
gets what). Threads, so training never waits for the network: the file watcher wakes the snapshot
thread at each boundary (libreyolo renames ``status.json`` last); one committer thread per lane sends
its store the newest copy of every file it still needs, as one unit. A failed unit is kept and tried
again, carrying anything newer. All shared state sits under ``_changed``. ``flush`` waits, within its
timeout, for every store that must hold the run; ``cut_short`` bounds any flush (SIGTERM).

When the bucket fails ``places.FALLBACK_AFTER`` boundaries in a row for ``fallback_after`` seconds, or
refuses the token, the repo takes the working state, never the snapshots (said once, ``on_storage``) until
the bucket answers again. The run's lease (sync/lease.py) is checked before every write, renewed by every landing.
When the bucket shows that a newer attempt writes the run, nothing more is written anywhere
(``taken_over``, ``on_taken_over``).
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable
from math import inf
from pathlib import Path
from typing import Any

from watchdog.observers.api import BaseObserver

from .. import libreyolo
from ..errors import AccessError, AgentError, StopRequested, TakenOverError
from ..hub import CardRefusedError, Hub, RateLimitedError, new_commit_id
from ..log import logger
from . import places, protocol
from .bucket_store import BucketStore
from .lane import Lane
from .lease import RunLease
from .ledger import CommitBudget
from .snapshot import Snapshotter
from .staging import StagedFile
from .stores import RepoStore
from .watcher import watch

# The model card rides with its boundary's files; huggingface_hub checks it before uploading anything, so a card
# the Hub refuses is dropped (until it changes) and never holds back an epoch.
CARD_FILE = "README.md"
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
        self._changed = threading.Condition()  # pending, failed, snapshots or commits moved
        self.snapshots = Snapshotter(
            run_dir,
            work_dir / "staging",
            changed=self._changed,
            deliver=self._deliver,
            poll_interval=poll_interval,
            before_snapshot=before_snapshot,
            superseded=superseded,
        )
        self.repo = Lane(RepoStore(hub, repo_id), work_dir, takes=places.everything, budget=budget)
        self.bucket = (
            Lane(bucket, work_dir / "bucket", takes=places.everything, budget=places.unlimited_budget())
            if bucket is not None
            else None
        )
        self.routing = places.Routing(self.repo, self.bucket, publish_every)
        self.lanes = self.routing.lanes
        self.taken_over: TakenOverError | None = None
        self.final_publish: dict[str, Any] | None = None  # bucket mode: whether the end's repo commit made it
        self.bucket_complete = False  # the last flush left every file in the bucket
        self.owes_run_id = False  # a new run's id missed the repo at the start: retried beside training, any budget
        self.on_commit = on_commit
        self.on_card = on_card  # told why the Hub refused the card, or None once a card landed
        self.on_storage = on_storage
        self.on_taken_over = on_taken_over
        self.lease = lease  # checked before every write, told of every landing (its heartbeat)
        self.fallback_after = fallback_after  # seconds the bucket must fail (as well as boundaries)
        self.card_refused: str | None = None
        self.poll_interval = poll_interval
        self._discard: list[StagedFile] = []  # copies no lane needs; deleted once no commit reads them
        self._flush_deadlines: list[float] = []
        self._cutoff = inf  # no flush waits past this (SIGTERM: the process must exit)
        self._stopping = threading.Event()
        self._observer: BaseObserver | None = None
        self._threads: list[threading.Thread] = []

    # -- what the job reads ------------------------------------------------------------------
    @property
    def commits(self) -> list[str]:
        """The model repo's commits."""
        return self.repo.commits

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
        with self._changed:
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
        with self._changed:
            return dict(self.snapshots.stager.refused_missing), dict(self.snapshots.stager.torn)

    # -- lifecycle -------------------------------------------------------------------------
    def start(self) -> None:
        self.snapshots.prepare()
        for lane in self.lanes:
            lane.check_ledger()
        self._observer = watch(self.run_dir, self.snapshots.wake)
        targets: list[tuple[Callable[..., None], tuple[Any, ...], str]] = [
            (self.snapshots.run, (self._stopping,), "sync-snapshot"),
            *((self._commit_loop, (lane,), f"sync-commit-{n}") for n, lane in enumerate(self.lanes)),
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
        began = time.monotonic()
        deadline = began + timeout
        with self._changed:
            if final:
                self.routing.to_final()  # bucket mode: the repo takes the final last.pt too
            self.routing.everywhere = everywhere
            ticket = self.snapshots.ask()
            self._flush_deadlines.append(deadline)
            for lane in self.lanes:
                lane.retry_at = 0.0  # someone waits now: no backoff left over from before
                lane.work.set()
        done, restaged = False, False
        try:
            with self._changed:
                while (remaining := min(deadline, self._cutoff) - time.monotonic()) > 0:
                    if self.taken_over is not None:
                        break
                    # Bucket mode, the end: the final last.pt staged again for the repo (after SIGTERM, once
                    # the working state is in); the flush waits for that snapshot then.
                    if self.routing.restage_due(
                        pressed=self._cutoff < inf, boundary_staged=self.snapshots.answered(ticket)
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
                    self._changed.wait(min(remaining, 0.25))
                answered = self.snapshots.answered(ticket)
                left = self._lacking()
        finally:
            with self._changed:
                self._flush_deadlines.remove(deadline)
                self.routing.everywhere = False
        self._account(final, answered)
        if done:
            return True
        if self.taken_over is not None:
            logger.error("sync: nothing more is written: %s", self.taken_over.message)
        elif not answered:
            logger.error("sync: the final snapshot did not finish within %.0f s", timeout)
        if left:
            waited = time.monotonic() - began
            logger.error("sync: %d file(s) not on the Hub after %.0f s: %s", len(left), waited, ", ".join(left[:5]))
        return False

    def cut_short(self, deadline: float) -> None:
        """No flush, running or to come, waits past ``deadline`` (a ``time.monotonic()`` value), and no staging
        starts past it. Safe in a signal handler: it takes no lock."""
        self._cutoff = min(self._cutoff, deadline)
        self.snapshots.cutoff = min(self.snapshots.cutoff, deadline)

    def stop(self, timeout: float = 5.0) -> None:
        """End every thread; waits at most ``timeout`` (a commit in flight is abandoned)."""
        deadline = time.monotonic() + timeout
        self._stopping.set()
        self.snapshots.wake.set()
        for lane in self.lanes:
            lane.work.set()
        if self._observer is not None:
            self._observer.stop()
            self._observer.join(timeout=max(0.0, deadline - time.monotonic()))
        for thread in self._threads:
            thread.join(timeout=max(0.0, deadline - time.monotonic()))

    # -- where files go --------------------------------------------------------------------
    def _deliver(self, staged: list[StagedFile]) -> None:
        """The snapshotter's hand-over (under ``_changed``): each lane that wants a copy holds it."""
        self._discard.extend(self.routing.deliver(staged))

    def _final_left(self) -> dict[str, str]:
        """Under ``_changed``: what the repo's final publish lacks that no commit carries (no time left), and why."""
        return self.routing.final_left(self.snapshots.stager.skipped, self.run_dir / libreyolo.LAST_CHECKPOINT)

    def _account(self, final: bool, answered: bool) -> None:
        if self.bucket is None or not final:
            return
        said = self.final_publish
        with self._changed:
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

    def _fall_back(self, why: str) -> None:
        """The bucket keeps failing: the repo takes the working state at every boundary."""
        assert self.bucket is not None
        with self._changed:
            if not self.routing.fall_back(why):
                return
            self.snapshots.again(places.final_restaged)  # last.pt staged again, for the repo this time
        logger.warning(
            "bucket: %s failed %d boundaries in a row for %.0f s (%s); the working state (not the snapshots) goes to"
            " %s as commits until it answers",
            self.bucket.name,
            self.bucket.failures,
            time.monotonic() - (self.bucket.failing_since or time.monotonic()),
            why,
            self.repo_id,
        )
        _tell(self.on_storage, {"mode": "repo", "fallback": True, "why": why}, "storage")

    def _bucket_back(self) -> None:
        assert self.bucket is not None
        with self._changed:
            dropped = self.routing.back()
            if dropped is None:
                return
            self._discard.extend(dropped)
        logger.info("bucket: %s answers again; the working state goes there", self.bucket.name)
        _tell(self.on_storage, {"mode": "bucket", "fallback": False, "why": None}, "storage")

    def lost_run(self, error: TakenOverError) -> None:
        """A newer attempt writes the run: nothing more is written anywhere, and the job is told."""
        with self._changed:
            first = self.taken_over is None
            self.taken_over = error
            self._changed.notify_all()
        if not first:
            return
        logger.error("sync: %s", error)
        if self.on_taken_over is not None:
            self.on_taken_over(error)

    # -- the committers --------------------------------------------------------------------
    def _commit_loop(self, lane: Lane) -> None:
        """One lane's committer. No error ends it: it is reported and tried again."""
        while not self._stopping.is_set():
            try:
                self._drop_discarded()
                wait = self._time_to_commit(lane)
                if wait is None or wait > 0:
                    lane.work.wait(self.poll_interval if wait is None else min(wait, self.poll_interval))
                    lane.work.clear()
                    continue
                with self._changed:
                    lane.busy = True
                ok = self._commit_pending(lane)
            except TakenOverError as error:
                self.lost_run(error)
                ok = True
            except Exception as error:
                ok = False
                lane.last_error = f"{type(error).__name__}: {error}"
                logger.warning("sync: the committer of %s hit %s; trying again", lane.name, lane.last_error)
            self._after_try(lane, ok)
            with self._changed:
                lane.busy = False
                self._changed.notify_all()

    def _after_try(self, lane: Lane, ok: bool) -> None:
        lane.failures = 0 if ok else lane.failures + 1
        lane.failing_since = None if ok else lane.failing_since or time.monotonic()
        if not ok:
            # Short retries while someone waits on a flush, or while the bucket counts its way to the
            # fallback (each try carries the newest boundary); longer ones beside training.
            counting = lane is self.bucket and self.fallback is None
            pause = min(1.0 if self._flush_deadline() is not None or counting else 60.0, 2.0**lane.failures)
            lane.retry_at = time.monotonic() + pause
        if lane is not self.bucket:
            return
        failing_for = time.monotonic() - (lane.failing_since or time.monotonic())
        if not ok and protocol.fall_back(lane.failures, failing_for, bool(lane.denied_at), self.fallback_after):
            self._fall_back(" ".join((lane.last_error or "no answer").split())[:200])
        elif ok and lane.commits and self.fallback is not None:
            self._bucket_back()
        if ok:
            lane.denied_at = 0.0

    def _flush_deadline(self) -> float | None:
        with self._changed:
            return min(max(self._flush_deadlines), self._cutoff) if self._flush_deadlines else None

    def _time_to_commit(self, lane: Lane) -> float | None:
        """Seconds before the lane's next commit may start; None when there is nothing to commit."""
        with self._changed:
            if not lane.pending or self.taken_over is not None:
                return None
        wait = max(0.0, lane.retry_at - time.monotonic())
        if self._flush_deadline() is not None or (lane is self.repo and self.owes_run_id):
            return max(wait, lane.budget.hold())  # a final upload spends over budget, not over a 429
        return max(wait, lane.budget.wait_time())

    def _drop_discarded(self) -> None:
        with self._changed:
            done: list[StagedFile] = []
            kept: list[StagedFile] = []
            for item in self._discard:
                (kept if any(lane.holds(item) for lane in self.lanes) else done).append(item)
            self._discard = kept
        for item in done:
            with contextlib.suppress(OSError):
                item.path.unlink()

    def _commit_pending(self, lane: Lane) -> bool:
        deadline = self._flush_deadline()
        if lane.unconfirmed is not None:
            self._confirm_earlier(lane, deadline)
        with self._changed:
            batch = list(lane.pending.values())
            lane.in_flight = batch
        if not batch:
            return True
        names = sorted(item.relative for item in batch)
        message = f"{'Final state' if deadline is not None else 'Epoch boundary'}: {', '.join(names[:6])}"
        if len(names) > 6:
            message += f" and {len(names) - 6} more"
        commit_id = new_commit_id()
        if self.lease is not None:
            self.lease.check(deadline)  # another container took the run: TakenOverError, nothing written
        try:
            sha = lane.store.commit(batch, message, deadline=deadline, commit_id=commit_id)
        except CardRefusedError as error:
            # huggingface_hub checks the card before uploading anything: nothing landed, no commit spent. The
            # card is dropped until it changes, never retried as is; the rest goes at once without it.
            self._refuse_card(lane, [item for item in batch if item.relative == CARD_FILE], str(error))
            self._settle(lane, [item for item in batch if item.relative != CARD_FILE], committed=False)
            return True
        except Exception as error:  # kept pending: the next try carries it, with anything newer
            self._settle(lane, batch, committed=False)
            plain = isinstance(error, (AgentError, RateLimitedError))
            lane.last_error = str(error) if plain else f"{type(error).__name__}: {error}"
            if isinstance(error, RateLimitedError):
                lane.budget.drain(error.retry_after)  # quiet until the Hub allows commits again
            elif isinstance(error, AccessError):
                lane.denied_at = time.monotonic()
            else:
                lane.unconfirmed = (commit_id, batch)  # no answer is not a no: it may have landed
            logger.warning("sync: %s: commit failed: %s (kept for the next try)", lane.name, lane.last_error)
            return False
        self._landed(lane, batch, sha)
        try:
            if self.lease is not None:
                self.lease.check(deadline)  # deletes too only while this attempt holds the run
            lane.store.tidy(deadline=deadline)
        except TakenOverError:
            raise
        except Exception as error:  # what landed stays landed: tidied after the next boundary instead
            logger.warning("sync: %s: tidying up failed (%s); tried again after the next boundary", lane.name, error)
        return True

    def _refuse_card(self, lane: Lane, batch: list[StagedFile], why: str) -> None:
        """The Hub refused this README.md: drop it (a later card, changed, is tried again) and say why once."""
        if why != self.card_refused:
            logger.warning("sync: the Hub refused the model card (README.md), the rest is uploaded: %s", why)
        self.card_refused = why  # before the card leaves `pending`: a flush waiting on it then sees why
        _tell(self.on_card, why, "card")
        with self._changed:
            for item in batch:
                if lane.pending.get(item.relative) is item:
                    del lane.pending[item.relative]
                    self._discard.append(item)
            lane.in_flight = []
            self._changed.notify_all()

    def _confirm_earlier(self, lane: Lane, deadline: float | None) -> None:
        """A commit that failed without an answer may have landed: then it is done, not redone."""
        assert lane.unconfirmed is not None
        commit_id, batch = lane.unconfirmed
        sha = lane.store.landed(commit_id, deadline=deadline)
        lane.unconfirmed = None
        if sha is not None:
            with self._changed:
                lane.in_flight = batch
            self._landed(lane, batch, sha, measured=False)

    def _landed(self, lane: Lane, batch: list[StagedFile], sha: str, *, measured: bool = True) -> None:
        if self.card_refused is not None and any(item.relative == CARD_FILE for item in batch):
            self.card_refused = None  # before the batch leaves `pending`, like a refusal
            _tell(self.on_card, None, "card")
        self._settle(lane, batch, committed=True)
        self.owes_run_id &= lane is not self.repo  # trainbox.json, pending since the start, went with a repo commit
        if self.lease is not None:
            self.lease.landed()
        lane.budget.spend()
        lane.commits.append(sha)
        lane.last_error = None
        if measured and batch:
            lane.latencies.append(time.monotonic() - min(item.seen_at for item in batch))
        names = sorted(item.relative for item in batch)
        label = sha[:8] if lane is self.repo else sha.rsplit("/", 1)[-1]
        logger.info("sync: %s → %s@%s", ", ".join(names[:4]) + (" …" if len(names) > 4 else ""), lane.name, label)
        try:
            lane.ledger.record(batch, sha)
        except OSError as error:  # only a restart's shortcut is lost: the store has the files
            logger.warning("sync: cannot save the upload ledger (%s); a restart checks the Hub again", error)
        if self.on_commit is not None and lane is self.routing.working:
            try:  # the log line and the card: never a reason to stop uploading
                self.on_commit(sha, names)
            except Exception:
                logger.exception("sync: after-commit hook failed")

    def _settle(self, lane: Lane, batch: list[StagedFile], *, committed: bool) -> None:
        """After a commit attempt: drop what it delivered; copies no lane holds any more go."""
        with self._changed:
            lane.in_flight = []
            for item in batch:
                current = lane.pending.get(item.relative) is item
                if current and committed:
                    del lane.pending[item.relative]
                if committed or not current:
                    self._discard.append(item)
            self._changed.notify_all()


def _tell(hook: Callable[[Any], None] | None, news: Any, what: str) -> None:
    """trainbox.json is told; the upload goes on whatever the hook does (a stop excepted)."""
    if hook is not None:
        try:
            hook(news)
        except StopRequested:
            raise
        except Exception:
            logger.exception("sync: %s hook failed", what)
