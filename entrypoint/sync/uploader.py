"""The uploader: a run folder mirrored to the Hub, every epoch boundary in one commit, never torn, never lost."""

from __future__ import annotations

import contextlib
import shutil
import threading
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from watchdog.observers.api import BaseObserver

from ..errors import AccessError, AgentError, StopRequested, SyncError
from ..hub import CardRefusedError, Hub, RateLimitedError, new_commit_id
from ..log import logger
from .ledger import CommitBudget
from .snapshot import Snapshotter
from .staging import StagedFile
from .watcher import watch

if TYPE_CHECKING:
    from .bucket import CommitTarget
    from .places import TwoPlaces

# The model card rides with its boundary's files; huggingface_hub checks it before uploading anything, so a card
# the Hub refuses is dropped (until it changes) and never holds back an epoch.
CARD_FILE = "README.md"
POLL_INTERVAL = 1.0


class Uploader(Snapshotter):
    """Mirrors ``run_dir`` into ``repo_id``: ``start``, let it run beside training, ``flush``, ``stop``.

    LibreYOLO writes its checkpoints in place, then renames ``status.json`` last: that rename is the
    moment the epoch's files are complete. Two threads, so training never waits for the network:

    * ``sync-snapshot`` (the ``Snapshotter`` side) reacts to each boundary (the watcher's file event, or a
      stat poll every ``poll_interval`` for volumes where inotify is silent): it copies every changed file
      into a private staging folder, checks it (``.pt``: complete archive that loads without running code;
      text: scrubbed of secrets) and records it as pending, newest version per path;
    * ``sync-commit``, the one thread that talks to the Hub after ``start``, turns everything pending
      into one commit, within the Hub's commit budget (a 429 empties it until the server's
      ``Retry-After``). A slow commit means the next one carries several boundaries: the newest
      state wins and no stale commit is queued. It owns the ledger of what the Hub holds (sha256
      per path, survives restarts) and the deletion of staged copies. No error ends it: it is
      reported and tried again.

    What the threads share sits under one lock, ``_lock`` (``_changed``, its condition, is notified
    whenever pending, failed, snapshots or commits moved); ``_snapshot_lock`` keeps snapshots apart.
    Events: ``_wake`` (snapshot now: a boundary, ``notify``, a flush), ``_work`` (something for the
    committer), ``_stopping``. ``flush`` only asks the threads and waits, within its timeout and any
    ``cut_short`` deadline; it says True only when the Hub holds everything: a file that could not be
    staged stays pending and failed until a later snapshot stages it. ``stop`` tells both threads and
    the watcher to end and waits for them at most its timeout: a commit in flight is abandoned (the
    threads are daemons; it lands or not, and the next ``start`` checks the Hub's head against the ledger).
    """

    def __init__(
        self,
        hub: Hub | CommitTarget,  # the model repo, or a Storage Bucket (bucket.py)
        repo_id: str,
        run_dir: Path,
        work_dir: Path,
        *,
        budget: CommitBudget | None = None,
        poll_interval: float = POLL_INTERVAL,
        on_commit: Callable[[str, list[str]], None] | None = None,
        before_snapshot: Callable[[], None] | None = None,
        superseded: Callable[[str], bool] | None = None,
        on_card: Callable[[str | None], None] | None = None,
        select: Callable[[str], bool] | None = None,
    ) -> None:
        super().__init__(
            run_dir,
            work_dir,
            poll_interval=poll_interval,
            before_snapshot=before_snapshot,
            superseded=superseded,
            select=select,
        )
        self.hub = hub
        self.repo_id = repo_id
        self.budget = budget or CommitBudget(recent=self.ledger.commit_times)
        self.on_commit = on_commit
        # Told why the Hub refused the card (its YAML check), or None once a card landed.
        self.on_card = on_card
        self.card_refused: str | None = None
        self._in_flight: set[int] = set()  # ids of the staged files a commit is reading now
        # Marks the last commit that failed without a clear "no": it may have landed.
        self._unconfirmed: tuple[str, list[StagedFile]] | None = None
        self._flush_deadlines: list[float] = []
        self._retry_at = 0.0
        self._failures = 0
        self._denied_at = 0.0  # when the Hub last refused the token
        self._cutoff = float("inf")  # no flush waits past this (SIGTERM: the process must exit)
        self._observer: BaseObserver | None = None
        self._threads: list[threading.Thread] = []
        self.latencies: deque[float] = deque(maxlen=1000)

    # -- lifecycle -------------------------------------------------------------------------
    def start(self) -> None:
        self.run_dir.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(self.staging, ignore_errors=True)
        self.staging.mkdir(parents=True)
        self._check_ledger()
        if self._superseded is not None:
            self._hold_superseded(self._superseded)
        self._observer = watch(self.run_dir, self._wake)
        for target, name in ((self._snapshot_loop, "sync-snapshot"), (self._commit_loop, "sync-commit")):
            thread = threading.Thread(target=target, name=name, daemon=True)
            thread.start()
            self._threads.append(thread)

    def notify(self) -> None:
        """Something changed (trainbox.json saved): take a snapshot soon."""
        self._wake.set()

    def flush(self, timeout: float) -> bool:
        """Snapshot now and have the committer commit everything pending; True when the Hub
        has it all. Returns by ``timeout`` whatever the threads are doing."""
        began = time.monotonic()
        deadline = began + timeout
        with self._changed:
            self._snapshots_asked += 1
            asked = self._snapshots_asked
            self._flush_deadlines.append(deadline)
            self._retry_at = 0.0  # someone waits now: no backoff left over from before
        restaged = False
        try:
            self._wake.set()
            with self._changed:
                while (remaining := min(deadline, self._cutoff) - time.monotonic()) > 0:
                    if self._snapshots_done >= asked:
                        if not self._pending and not self._failed:
                            return True
                        if self._denied_at > began or self.budget.hold() > remaining:
                            break  # a refused token or a rate limit longer than our time: no use waiting
                        if self._failed and not self._pending:
                            # Nothing left to commit, so no staged copy will free room: a file that
                            # still cannot be staged after one more try (disk full) will not be by waiting.
                            if restaged:
                                break
                            restaged = True
                            self._snapshots_asked += 1
                            asked = self._snapshots_asked
                            self._wake.set()
                            continue
                        self._work.set()
                    self._changed.wait(min(remaining, 0.25))
                left = sorted(set(self._pending) | set(self._failed))
                if self._snapshots_done < asked:
                    logger.error("sync: the final snapshot did not finish within %.0f s", timeout)
                elif not left:
                    return True
        finally:
            with self._changed:
                self._flush_deadlines.remove(deadline)
        if left:
            logger.error("sync: %d file(s) not on the Hub after %.0f s: %s", len(left), timeout, ", ".join(left[:5]))
        return False

    def cut_short(self, deadline: float) -> None:
        """No flush, running or to come, waits past ``deadline`` (a ``time.monotonic()`` value).
        Safe in a signal handler: it takes no lock."""
        self._cutoff = min(self._cutoff, deadline)

    def stop(self, timeout: float = 5.0) -> None:
        """End both threads; waits at most ``timeout`` (a commit in flight is abandoned)."""
        deadline = time.monotonic() + timeout
        self._stopping.set()
        self._wake.set()
        self._work.set()
        if self._observer is not None:
            self._observer.stop()
            self._observer.join(timeout=max(0.0, deadline - time.monotonic()))
        for thread in self._threads:
            thread.join(timeout=max(0.0, deadline - time.monotonic()))

    # -- the committer ---------------------------------------------------------------------
    def _commit_loop(self) -> None:
        """The one thread that commits. No error ends it: it is reported and tried again."""
        while not self._stopping.is_set():
            try:
                self._drop_discarded()
                wait = self._time_to_commit()
                if wait is None or wait > 0:
                    self._work.wait(self.poll_interval if wait is None else min(wait, self.poll_interval))
                    self._work.clear()
                    continue
                ok = self._commit_pending()
            except Exception as error:
                ok = False
                self.last_error = f"{type(error).__name__}: {error}"
                logger.warning("sync: the committer hit %s; trying again", self.last_error)
            self._failures = 0 if ok else self._failures + 1
            if not ok:
                # Short retries while someone waits on a flush; longer ones beside training.
                pause = min(1.0 if self._flush_deadline() is not None else 60.0, 2.0**self._failures)
                self._retry_at = time.monotonic() + pause
            with self._changed:
                self._changed.notify_all()

    def _flush_deadline(self) -> float | None:
        with self._lock:
            return min(max(self._flush_deadlines), self._cutoff) if self._flush_deadlines else None

    def _time_to_commit(self) -> float | None:
        """Seconds before the next commit may start; None when there is nothing to commit."""
        with self._lock:
            if not self._pending:
                return None
        wait = max(0.0, self._retry_at - time.monotonic())
        if self._flush_deadline() is not None:
            return max(wait, self.budget.hold())  # a final upload spends over budget, not over a 429
        return max(wait, self.budget.wait_time())

    def _drop_discarded(self) -> None:
        with self._lock:
            done = [item for item in self._discard if id(item) not in self._in_flight]
            self._discard = [item for item in self._discard if id(item) in self._in_flight]
        for item in done:
            with contextlib.suppress(OSError):
                item.path.unlink()

    def _commit_pending(self) -> bool:
        deadline = self._flush_deadline()
        if self._unconfirmed is not None:
            self._confirm_earlier(deadline)
        with self._lock:
            batch = list(self._pending.values())
            self._in_flight = {id(item) for item in batch}
            boundary_at = self._boundary_seen_at
            self._boundary_seen_at = None
        if not batch:
            return True
        names = sorted(item.relative for item in batch)
        message = f"{'Final state' if deadline is not None else 'Epoch boundary'}: {', '.join(names[:6])}"
        if len(names) > 6:
            message += f" and {len(names) - 6} more"
        commit_id = new_commit_id()
        try:
            sha = self.hub.commit(
                self.repo_id,
                [(item.relative, item.path) for item in batch],
                message,
                deadline=deadline,
                commit_id=commit_id,
            )
        except CardRefusedError as error:
            # huggingface_hub checks the card before uploading anything: nothing landed, no commit spent. The
            # card is dropped until it changes, never retried as is; the rest goes at once without it.
            self._refuse_card([item for item in batch if item.relative == CARD_FILE], str(error))
            rest = [item for item in batch if item.relative != CARD_FILE]
            if rest:
                self._settle(rest, committed=False, boundary_at=boundary_at)  # the loop comes back at once
            return True
        except Exception as error:  # kept pending: the next try carries it, with anything newer
            self._settle(batch, committed=False, boundary_at=boundary_at)
            plain = isinstance(error, (AgentError, RateLimitedError))
            self.last_error = str(error) if plain else f"{type(error).__name__}: {error}"
            if isinstance(error, RateLimitedError):
                self.budget.drain(error.retry_after)  # quiet until the Hub allows commits again
            elif isinstance(error, AccessError):
                self._denied_at = time.monotonic()
            else:
                self._unconfirmed = (commit_id, batch)  # no answer is not a no: it may have landed
            logger.warning("sync: commit failed: %s (kept for the next try)", self.last_error)
            return False
        self._landed(batch, sha, boundary_at)
        return True

    def _refuse_card(self, batch: list[StagedFile], why: str) -> None:
        """The Hub refused this README.md: drop it (a later card, changed, is tried again) and say why once."""
        if why != self.card_refused:
            logger.warning("sync: the Hub refused the model card (README.md), the rest is uploaded: %s", why)
        self.card_refused = why  # before the card leaves `pending`: a flush waiting on it then sees why
        self._tell_card(why)
        with self._changed:
            self._in_flight = set()
            for item in batch:
                if self._pending.get(item.relative) is item:
                    del self._pending[item.relative]
                with contextlib.suppress(OSError):
                    item.path.unlink()
            self._changed.notify_all()

    def _tell_card(self, refused: str | None) -> None:
        if self.on_card is not None:
            try:
                self.on_card(refused)
            except StopRequested:
                raise
            except Exception:
                logger.exception("sync: card hook failed")

    def _confirm_earlier(self, deadline: float | None) -> None:
        """A commit that failed without an answer may have landed: then it is done, not redone."""
        assert self._unconfirmed is not None
        commit_id, batch = self._unconfirmed
        sha = self.hub.landed(self.repo_id, commit_id, deadline=deadline)
        self._unconfirmed = None
        if sha is not None:
            with self._lock:
                self._in_flight = {id(item) for item in batch}
            self._landed(batch, sha, None)

    def _landed(self, batch: list[StagedFile], sha: str, boundary_at: float | None) -> None:
        if self.card_refused is not None and any(item.relative == CARD_FILE for item in batch):
            self.card_refused = None  # before the batch leaves `pending`, like a refusal
            self._tell_card(None)
        self._settle(batch, committed=True, boundary_at=boundary_at)
        self.budget.spend()
        self.commits.append(sha)
        self.last_error = None
        if boundary_at is not None:
            self.latencies.append(time.monotonic() - boundary_at)
        names = sorted(item.relative for item in batch)
        logger.info("sync: %s → %s@%s", ", ".join(names[:4]) + (" …" if len(names) > 4 else ""), self.repo_id, sha[:8])
        try:
            self.ledger.record(batch, sha)
        except OSError as error:  # only a restart's shortcut is lost: the Hub has the files
            logger.warning("sync: cannot save the upload ledger (%s); a restart checks the Hub again", error)
        if self.on_commit is not None:
            try:  # the log line and the card: never a reason to stop uploading
                self.on_commit(sha, names)
            except Exception:
                logger.exception("sync: after-commit hook failed")

    def _settle(self, batch: list[StagedFile], *, committed: bool, boundary_at: float | None) -> None:
        """After a commit attempt: drop what it delivered and the copies superseded meanwhile."""
        with self._changed:
            self._in_flight = set()
            if not committed:
                self._boundary_seen_at = self._boundary_seen_at or boundary_at
            for item in batch:
                current = self._pending.get(item.relative) is item
                if current and committed:
                    del self._pending[item.relative]
                if committed or not current:
                    with contextlib.suppress(OSError):
                        item.path.unlink()
            self._changed.notify_all()

    def _check_ledger(self) -> None:
        """Trust the ledger only if the Hub is still where we left it; else relearn it from the Hub."""
        try:
            head = self.hub.head(self.repo_id)
            if head == self.ledger.head:
                return
            remote = {} if head is None else self.hub.remote_ids(self.repo_id)
        except StopRequested:  # raised by the signal handler in this (main) thread: the job must stop
            raise
        except Exception as error:
            logger.warning("sync: cannot read %s (%s); every file will be checked again", self.repo_id, error)
            remote, head = {}, None
        if self.ledger.head is not None:
            logger.info("sync: %s changed since the last upload; relearning what it holds", self.repo_id)
        try:
            self.ledger.rebuild(remote, head)
        except OSError as error:
            logger.warning("sync: cannot save the upload ledger (%s)", error)

    @property
    def pending(self) -> list[str]:
        """Everything not yet on the Hub: staged and waiting, or failed to stage."""
        with self._lock:
            return sorted(set(self._pending) | set(self._failed))

    @property
    def failed(self) -> dict[str, str]:
        with self._lock:
            return dict(self._failed)


def sync_error(uploader: Uploader | TwoPlaces) -> SyncError:
    return SyncError(
        f"{len(uploader.pending)} file(s) could not be uploaded to {uploader.repo_id}: {uploader.last_error}",
        "they are still in the run folder; rerun `trainbox sync <run folder>` once the Hub is reachable",
    )
