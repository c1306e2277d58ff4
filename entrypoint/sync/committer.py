"""The committers: one thread per lane sends its store the newest copy of every file it still needs, as one
unit; a failed unit is kept and tried again, carrying anything newer. They share the uploader's state under
its condition (``Uploader.changed``), hold the copies no lane needs until no commit reads them, turn the
repo to the working state when the bucket keeps failing (and back), and stop every write once a newer
attempt writes the run.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

from ..errors import AccessError, AgentError, StopRequested, TakenOverError
from ..hub import CardRefusedError, RateLimitedError, new_commit_id
from ..log import logger
from . import clock, places, protocol
from .lane import Lane
from .staging import StagedFile

if TYPE_CHECKING:
    import threading

    from .lease import RunLease
    from .snapshot import Snapshotter

# The model card rides with its boundary's files; huggingface_hub checks it before uploading anything, so a card
# the Hub refuses is dropped (until it changes) and never holds back an epoch.
CARD_FILE = "README.md"


class Shared(Protocol):
    """What the committers share with the uploader (uploader.py's ``Uploader``), under its ``changed``."""

    changed: threading.Condition
    stopping: threading.Event
    flush_deadlines: list[float]
    cutoff: float
    repo_id: str
    repo: Lane
    bucket: Lane | None
    lanes: list[Lane]
    routing: places.Routing
    snapshots: Snapshotter
    lease: RunLease | None
    taken_over: TakenOverError | None
    owes_run_id: bool
    kept_epochs: int
    card_refused: str | None
    on_commit: Callable[[str, list[str]], None] | None
    on_card: Callable[[str | None], None] | None
    on_storage: Callable[[dict[str, Any]], None] | None
    on_taken_over: Callable[[TakenOverError], None] | None
    poll_interval: float
    fallback_after: float

    @property
    def fallback(self) -> str | None: ...


class Committers:
    """The lanes' committers of ``up``; ``deliver`` is the snapshotter's hand-over."""

    def __init__(self, up: Shared) -> None:
        self.up = up
        self._discard: list[StagedFile] = []  # copies no lane needs; deleted once no commit reads them

    def deliver(self, staged: list[StagedFile]) -> None:
        """The snapshotter's hand-over (under ``changed``): each lane that wants a copy holds it."""
        self._discard.extend(self.up.routing.deliver(staged))

    def run(self, lane: Lane) -> None:
        """One lane's committer. No error ends it: it is reported and tried again."""
        while not self.up.stopping.is_set():
            wait = step(self, lane)
            if wait is not None:
                clock.wait(lane.work, wait)
                lane.work.clear()

    def _after_try(self, lane: Lane, ok: bool) -> None:
        lane.failures = 0 if ok else lane.failures + 1
        lane.failing_since = None if ok else lane.failing_since or clock.monotonic()
        if not ok:
            # Short retries while someone waits on a flush, or while the bucket counts its way to the
            # fallback (each try carries the newest boundary); longer ones beside training.
            counting = lane is self.up.bucket and self.up.fallback is None
            pause = min(1.0 if self._flush_deadline() is not None or counting else 60.0, 2.0**lane.failures)
            lane.retry_at = clock.monotonic() + pause
        if lane is not self.up.bucket:
            return
        failing_for = clock.monotonic() - (lane.failing_since or clock.monotonic())
        if not ok and protocol.fall_back(lane.failures, failing_for, bool(lane.denied_at), self.up.fallback_after):
            self._fall_back(" ".join((lane.last_error or "no answer").split())[:200])
        elif ok and lane.commits and self.up.fallback is not None:
            self._bucket_back()
        if ok:
            lane.denied_at = 0.0

    def _flush_deadline(self) -> float | None:
        with self.up.changed:
            return min(max(self.up.flush_deadlines), self.up.cutoff) if self.up.flush_deadlines else None

    def _time_to_commit(self, lane: Lane) -> float | None:
        """Seconds before the lane's next commit may start; None when there is nothing to commit."""
        with self.up.changed:
            if not lane.pending or self.up.taken_over is not None:
                return None
            routing = self.up.routing
            if lane is self.up.repo and routing.repo_holds(self.up.snapshots.answered(routing.final_ticket)):
                return None  # the end's snapshot stages newer milestones: one commit of the newest, not two
        wait = max(0.0, lane.retry_at - clock.monotonic())
        if self._flush_deadline() is not None or (lane is self.up.repo and self.up.owes_run_id):
            return max(wait, lane.budget.hold())  # a final upload spends over budget, not over a 429
        return max(wait, lane.budget.wait_time())

    def _drop_discarded(self) -> None:
        with self.up.changed:
            done: list[StagedFile] = []
            kept: list[StagedFile] = []
            for item in self._discard:
                (kept if any(lane.holds(item) for lane in self.up.lanes) else done).append(item)
            self._discard = kept
        for item in done:
            with contextlib.suppress(OSError):
                item.path.unlink()

    def _commit_pending(self, lane: Lane) -> bool:
        deadline = self._flush_deadline()
        if lane.unconfirmed is not None:
            self._confirm_earlier(lane, deadline)
        with self.up.changed:
            batch = list(lane.pending.values())
            lane.in_flight = batch
        if not batch:
            return True
        names = sorted(item.relative for item in batch)
        message = f"{'Final state' if deadline is not None else 'Epoch boundary'}: {', '.join(names[:6])}"
        if len(names) > 6:
            message += f" and {len(names) - 6} more"
        commit_id = new_commit_id()
        if self.up.lease is not None:
            self.up.lease.check(deadline)  # another container took the run: TakenOverError, nothing written
        try:
            sha = lane.store.commit(batch, message, deadline=deadline, commit_id=commit_id)
        except CardRefusedError as error:
            # huggingface_hub checks the card before uploading anything: nothing landed, no commit spent. The
            # card is dropped until it changes, never retried as is; the rest goes at once without it.
            self._refuse_card(lane, [item for item in batch if item.relative == CARD_FILE], str(error))
            self._settle(lane, [item for item in batch if item.relative != CARD_FILE], committed=False)
            return True
        except TakenOverError:  # a late commit refused (412) and the lease another's: nothing more written
            self._settle(lane, batch, committed=False)
            raise
        except Exception as error:  # kept pending: the next try carries it, with anything newer
            self._settle(lane, batch, committed=False)
            plain = isinstance(error, (AgentError, RateLimitedError))
            lane.last_error = str(error) if plain else f"{type(error).__name__}: {error}"
            if isinstance(error, RateLimitedError):
                lane.budget.drain(error.retry_after)  # quiet until the Hub allows commits again
            elif isinstance(error, AccessError):
                lane.denied_at = clock.monotonic()
            else:
                lane.unconfirmed = (commit_id, batch)  # no answer is not a no: it may have landed
            logger.warning("sync: %s: commit failed: %s (kept for the next try)", lane.name, lane.last_error)
            return False
        self._landed(lane, batch, sha)
        try:
            if self.up.lease is not None:
                self.up.lease.check(deadline)  # deletes too only while this attempt holds the run
            lane.store.tidy(deadline=deadline)
        except TakenOverError:
            raise
        except Exception as error:  # what landed stays landed: tidied after the next boundary instead
            logger.warning("sync: %s: tidying up failed (%s); tried again after the next boundary", lane.name, error)
        return True

    def _refuse_card(self, lane: Lane, batch: list[StagedFile], why: str) -> None:
        """The Hub refused this README.md: drop it (a later card, changed, is tried again) and say why once."""
        if why != self.up.card_refused:
            logger.warning("sync: the Hub refused the model card (README.md), the rest is uploaded: %s", why)
        self.up.card_refused = why  # before the card leaves `pending`: a flush waiting on it then sees why
        _tell(self.up.on_card, why, "card")
        with self.up.changed:
            for item in batch:
                if lane.pending.get(item.relative) is item:
                    del lane.pending[item.relative]
                    self._discard.append(item)
            lane.in_flight = []
            self.up.changed.notify_all()

    def _confirm_earlier(self, lane: Lane, deadline: float | None) -> None:
        """A commit that failed without an answer may have landed: then it is done, not redone."""
        assert lane.unconfirmed is not None
        commit_id, batch = lane.unconfirmed
        sha = lane.store.landed(commit_id, deadline=deadline)
        lane.unconfirmed = None
        if sha is not None:
            with self.up.changed:
                lane.in_flight = batch
            self._landed(lane, batch, sha, measured=False)

    def _landed(self, lane: Lane, batch: list[StagedFile], sha: str, *, measured: bool = True) -> None:
        if self.up.card_refused is not None and any(item.relative == CARD_FILE for item in batch):
            self.up.card_refused = None  # before the batch leaves `pending`, like a refusal
            _tell(self.up.on_card, None, "card")
        self._settle(lane, batch, committed=True)
        self.up.owes_run_id &= (
            lane is not self.up.repo
        )  # trainbox.json, pending since the start, went with a repo commit
        if self.up.lease is not None:
            self.up.lease.landed()
        lane.budget.spend()
        lane.commits.append(sha)
        lane.last_error = None
        if measured and batch:
            lane.latencies.append(clock.monotonic() - min(item.seen_at for item in batch))
        resumable = (item.epochs or 0 for item in batch if places.working_state_only(item.relative))
        self.up.kept_epochs = max([self.up.kept_epochs, *resumable])  # a start elsewhere resumes from here
        names = sorted(item.relative for item in batch)
        label = sha[:8] if lane is self.up.repo else sha.rsplit("/", 1)[-1]
        logger.info("sync: %s → %s@%s", ", ".join(names[:4]) + (" …" if len(names) > 4 else ""), lane.name, label)
        try:
            lane.ledger.record(batch, sha)
        except OSError as error:  # only a restart's shortcut is lost: the store has the files
            logger.warning("sync: cannot save the upload ledger (%s); a restart checks the Hub again", error)
        if self.up.on_commit is not None and lane is self.up.routing.working:
            try:  # the log line and the card: never a reason to stop uploading
                self.up.on_commit(sha, names)
            except Exception:
                logger.exception("sync: after-commit hook failed")

    def _settle(self, lane: Lane, batch: list[StagedFile], *, committed: bool) -> None:
        """After a commit attempt: drop what it delivered; copies no lane holds any more go."""
        with self.up.changed:
            lane.in_flight = []
            for item in batch:
                current = lane.pending.get(item.relative) is item
                if current and committed:
                    del lane.pending[item.relative]
                if committed or not current:
                    self._discard.append(item)
            self.up.changed.notify_all()

    def _fall_back(self, why: str) -> None:
        """The bucket keeps failing: the repo takes the working state at every boundary."""
        assert self.up.bucket is not None
        with self.up.changed:
            if not self.up.routing.fall_back(why):
                return
            self.up.snapshots.again(places.final_restaged)  # last.pt staged again, for the repo this time
        logger.warning(
            "bucket: %s failed %d boundaries in a row for %.0f s (%s); the working state (not the snapshots) goes to"
            " %s as commits until it answers",
            self.up.bucket.name,
            self.up.bucket.failures,
            clock.monotonic() - (self.up.bucket.failing_since or clock.monotonic()),
            why,
            self.up.repo_id,
        )
        _tell(self.up.on_storage, {"mode": "repo", "fallback": True, "why": why}, "storage")

    def _bucket_back(self) -> None:
        assert self.up.bucket is not None
        with self.up.changed:
            dropped = self.up.routing.back()
            if dropped is None:
                return
            self._discard.extend(dropped)
        logger.info("bucket: %s answers again; the working state goes there", self.up.bucket.name)
        _tell(self.up.on_storage, {"mode": "bucket", "fallback": False, "why": None}, "storage")

    def lost_run(self, error: TakenOverError) -> None:
        """A newer attempt writes the run: nothing more is written anywhere, and the job is told."""
        with self.up.changed:
            first = self.up.taken_over is None
            self.up.taken_over = error
            self.up.changed.notify_all()
        if not first:
            return
        logger.error("sync: %s", error)
        if self.up.on_taken_over is not None:
            self.up.on_taken_over(error)


def step(committers: Committers, lane: Lane) -> float | None:
    """One turn of the lane's committer: one try when one is due (None), else the seconds to wait first.
    The thread calls it in a loop; the protocol's simulation calls it from its scheduler."""
    try:
        committers._drop_discarded()
        wait = committers._time_to_commit(lane)
        if wait is None or wait > 0:
            return committers.up.poll_interval if wait is None else min(wait, committers.up.poll_interval)
        with committers.up.changed:
            lane.busy = True
        ok = committers._commit_pending(lane)
    except TakenOverError as error:
        committers.lost_run(error)
        ok = True
    except Exception as error:
        ok = False
        lane.last_error = f"{type(error).__name__}: {error}"
        logger.warning("sync: the committer of %s hit %s; trying again", lane.name, lane.last_error)
    committers._after_try(lane, ok)
    with committers.up.changed:
        lane.busy = False
        committers.up.changed.notify_all()
    return None


def _tell(hook: Callable[[Any], None] | None, news: Any, what: str) -> None:
    """trainbox.json is told; the upload goes on whatever the hook does (a stop excepted)."""
    if hook is not None:
        try:
            hook(news)
        except StopRequested:
            raise
        except Exception:
            logger.exception("sync: %s hook failed", what)
