"""Checkpoint sync: every epoch boundary of a run folder on the Hub, never torn, never lost.

LibreYOLO writes its checkpoints in place, then renames ``status.json`` last: that rename is the
moment the epoch's files are complete. The uploader works in two threads so training never
waits for the network:

* the snapshotter reacts to each boundary (watchdog event, or a stat poll for volumes where
  inotify is silent): it copies every changed file into a private staging folder, checks it
  (``.pt``: complete archive that loads without running code; text: scrubbed of secrets) and
  records it as pending, newest version per path;
* the committer, the one thread that talks to the Hub after ``start``, turns everything
  pending into one commit, within the Hub's commit budget (a 429 empties it until the server's
  ``Retry-After``). A slow commit means the next one carries several boundaries: the newest
  state wins and no stale commit is queued. It owns the ledger of what the Hub holds (sha256
  per path, survives restarts) and the deletion of staged copies; ``flush`` only asks it and
  waits, within its deadline. No error ends it: it is reported and tried again.

A file that cannot be staged (a full disk, an I/O error) stays pending and failed until a
later snapshot stages it: ``flush`` never says the Hub has everything while one is missing.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from watchdog.events import (
    EVENT_TYPE_CLOSED_NO_WRITE,
    EVENT_TYPE_OPENED,
    FileSystemEvent,
    FileSystemEventHandler,
)
from watchdog.observers import Observer
from watchdog.observers.api import BaseObserver

from .. import libreyolo
from ..errors import AccessError, AgentError, StopRequested, SyncError
from ..hub import CardRefusedError, Hub, RateLimitedError, new_commit_id
from ..log import contains_secret, logger, longest_secret, redact_bytes
from ..state import STATE_FILE, write_json_atomic
from . import checkpoint

if TYPE_CHECKING:
    from .bucket import CommitTarget
    from .places import TwoPlaces

BOUNDARY_FILE = libreyolo.STATUS_FILE
# The model card rides with its boundary's files; huggingface_hub checks it before uploading anything, so a card
# the Hub refuses is dropped (until it changes) and never holds back an epoch.
CARD_FILE = "README.md"
POLL_INTERVAL = 1.0
# The Hub allows 128 commits per hour per repo; leave room for people and other tools.
COMMITS_PER_HOUR = 100
COMMIT_BURST = 20
_COPY_CHUNK = 4 * 1024 * 1024
# Stands for the whole run folder in ``pending`` when a snapshot failed before it could list it.
_UNREAD = "(run folder not read)"
# A trainer whose pid is not visible counts as ended only after this long without an epoch.
SILENCE = 15 * 60.0


def _skip(relative: str) -> bool:
    """Temporary and hidden files are never part of a snapshot."""
    name = relative.rsplit("/", 1)[-1]
    return name.startswith(".") or name.endswith((".tmp", ".part", ".lock", ".incomplete"))


@dataclass(frozen=True)
class StagedFile:
    relative: str
    path: Path  # the private copy that gets uploaded
    sha256: str
    git_oid: str | None  # the id the Hub shows for a file it keeps in git (checkpoints go to LFS)
    size: int

    @property
    def ids(self) -> list[str]:
        return [self.sha256] if self.git_oid is None else [self.sha256, self.git_oid]


@dataclass(frozen=True)
class _Signature:
    size: int
    mtime_ns: int
    inode: int

    @classmethod
    def of(cls, path: Path) -> _Signature:
        stat = path.stat()
        return cls(stat.st_size, stat.st_mtime_ns, stat.st_ino)


class Ledger:
    """What the Hub already holds: ``path → ids`` (sha256, git blob id), persisted in the workspace."""

    def __init__(self, path: Path) -> None:
        self.path = path
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError):
            data = {}
        self.files: dict[str, list[str]] = {key: list(value) for key, value in data.get("files", {}).items()}
        self.head: str | None = data.get("head")
        self.commit_times: list[float] = [t for t in data.get("commit_times", []) if time.time() - t < 3600]

    def has(self, relative: str, ids: list[str]) -> bool:
        return bool(set(self.files.get(relative, ())) & set(ids))

    def record(self, files: list[StagedFile], head: str) -> None:
        for staged in files:
            self.files[staged.relative] = staged.ids
        self.head = head
        self.commit_times = [t for t in self.commit_times if time.time() - t < 3600] + [time.time()]
        self._save()

    def rebuild(self, remote: dict[str, str], head: str | None) -> None:
        """Start over from what the Hub lists (``path → sha256 or git blob id``)."""
        self.files = {relative: [oid] for relative, oid in remote.items()}
        self.head = head
        self._save()

    def _save(self) -> None:
        write_json_atomic(self.path, {"head": self.head, "files": self.files, "commit_times": self.commit_times})


class CommitBudget:
    """A token bucket: bursts of ``burst`` commits, refilled at ``per_hour``."""

    def __init__(
        self, per_hour: int = COMMITS_PER_HOUR, burst: int = COMMIT_BURST, recent: Iterable[float] = ()
    ) -> None:
        self.rate = per_hour / 3600.0
        self.burst = burst
        self.tokens = float(burst)
        self.updated = time.monotonic()
        self.held_until = 0.0
        for _ in recent:  # commits of an earlier attempt in the last hour still count
            self.tokens = max(0.0, self.tokens - 1)

    def _refill(self) -> None:
        now = time.monotonic()
        self.tokens = min(self.burst, self.tokens + (now - self.updated) * self.rate)
        self.updated = now

    def wait_time(self) -> float:
        self._refill()
        own = 0.0 if self.tokens >= 1 else (1 - self.tokens) / self.rate
        return max(own, self.hold())

    def hold(self) -> float:
        """Seconds the server asked us to wait (429 Retry-After); even a final commit waits."""
        return max(0.0, self.held_until - time.monotonic())

    def drain(self, retry_after: float) -> None:
        """The Hub said 429: nothing left to spend, and nothing at all before ``retry_after``."""
        self._refill()
        self.tokens = min(self.tokens, 0.0)
        self.held_until = max(self.held_until, time.monotonic() + retry_after)

    def spend(self) -> None:
        self._refill()
        self.tokens -= 1


_READ_ONLY_EVENTS = frozenset({EVENT_TYPE_OPENED, EVENT_TYPE_CLOSED_NO_WRITE})


class _BoundaryHandler(FileSystemEventHandler):
    """Runs on watchdog's thread: it only signals, never does I/O."""

    def __init__(self, wake: threading.Event) -> None:
        self.wake = wake

    def on_any_event(self, event: FileSystemEvent) -> None:
        if event.event_type in _READ_ONLY_EVENTS:  # a reader (the dashboard, trainbox status) changes nothing
            return
        target = getattr(event, "dest_path", "") or event.src_path
        if os.path.basename(os.fsdecode(target)) in {BOUNDARY_FILE, STATE_FILE}:
            self.wake.set()


class Uploader:
    """Mirrors ``run_dir`` into ``repo_id``: start, let it run beside training, ``flush``, ``stop``."""

    def __init__(
        self,
        hub: Hub | CommitTarget,  # the model repo, or a Storage Bucket (bucket.py)
        repo_id: str,
        run_dir: Path,
        work_dir: Path,
        *,
        secrets: Callable[[], list[str]] | None = None,
        budget: CommitBudget | None = None,
        poll_interval: float = POLL_INTERVAL,
        on_commit: Callable[[str, list[str]], None] | None = None,
        before_snapshot: Callable[[], None] | None = None,
        superseded: Callable[[str], bool] | None = None,
        on_card: Callable[[str | None], None] | None = None,
        select: Callable[[str], bool] | None = None,
    ) -> None:
        self.hub = hub
        self.select = select  # which files of the run folder go (None: all); places.py widens it at the end
        self.repo_id = repo_id
        self.run_dir = run_dir
        self.staging = work_dir / "staging"
        self.ledger = Ledger(work_dir / "ledger.json")
        self.budget = budget or CommitBudget(recent=self.ledger.commit_times)
        self.poll_interval = poll_interval
        self.on_commit = on_commit
        # Told why the Hub refused the card (its YAML check), or None once a card landed.
        self.on_card = on_card
        self.card_refused: str | None = None
        # Lets the agent bring trainbox.json up to date, so a boundary's commit carries it.
        self.before_snapshot = before_snapshot
        # Files already on the volume at start that the Hub holds in a newer version (the run
        # resumed from the Hub): they are uploaded only once training writes them again.
        self._superseded = superseded
        self._seen: dict[str, _Signature] = {}
        self._pending: dict[str, StagedFile] = {}
        self._failed: dict[str, str] = {}  # could not be staged (disk full, I/O error): path → why
        self._discard: list[StagedFile] = []  # replaced copies; the committer deletes them
        self._in_flight: set[int] = set()  # ids of the staged files a commit is reading now
        # Marks the last commit that failed without a clear "no": it may have landed.
        self._unconfirmed: tuple[str, list[StagedFile]] | None = None
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)  # pending, failed, snapshots or commits moved
        self._snapshot_lock = threading.Lock()
        self._snapshots_asked = 0
        self._snapshots_done = 0
        self._flush_deadlines: list[float] = []
        self._wake = threading.Event()
        self._work = threading.Event()
        self._stopping = threading.Event()
        self._retry_at = 0.0
        self._failures = 0
        self._denied_at = 0.0  # when the Hub last refused the token
        self._cutoff = float("inf")  # no flush waits past this (SIGTERM: the process must exit)
        self._boundary_signature: _Signature | None = None
        self._observer: BaseObserver | None = None
        self._threads: list[threading.Thread] = []
        self.commits: list[str] = []
        self.latencies: deque[float] = deque(maxlen=1000)
        self.last_error: str | None = None
        self.refused: list[str] = []  # checkpoints not uploaded because they were torn or unsafe
        # Refused and not uploaded since in a valid version: the Hub lacks part of the run.
        self.refused_missing: dict[str, str] = {}
        self._boundary_seen_at: float | None = None

    # -- lifecycle -------------------------------------------------------------------------
    def start(self) -> None:
        self.run_dir.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(self.staging, ignore_errors=True)
        self.staging.mkdir(parents=True)
        self._check_ledger()
        if self._superseded is not None:
            self._hold_superseded(self._superseded)
        try:
            self._observer = Observer()
            self._observer.schedule(_BoundaryHandler(self._wake), str(self.run_dir), recursive=False)
            self._observer.start()
        except OSError as error:  # no inotify (limits, some volumes): polling alone still works
            logger.warning("file events unavailable (%s): polling the run folder", error)
            self._observer = None
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

    # -- the snapshotter -------------------------------------------------------------------
    def _snapshot_loop(self) -> None:
        while not self._stopping.is_set():
            woken = self._wake.wait(self.poll_interval)
            self._wake.clear()
            if self._stopping.is_set():
                return
            with self._changed:
                asked = self._snapshots_asked
            if woken or asked > self._snapshots_done or self._boundary_moved():
                try:
                    self.snapshot()
                except Exception as error:  # the uploader must never take the run down
                    logger.warning("sync: snapshot failed: %s", error)
                    self._stage_failed(_UNREAD, f"the snapshot failed: {type(error).__name__}: {error}")
                finally:
                    with self._changed:
                        self._snapshots_done = max(self._snapshots_done, asked)
                        self._changed.notify_all()

    def _boundary_moved(self) -> bool:
        """The polling fallback: has status.json been replaced since we last looked?"""
        try:
            signature = _Signature.of(self.run_dir / BOUNDARY_FILE)
        except OSError:
            return False
        if signature == self._boundary_signature:
            return False
        self._boundary_signature = signature
        return True

    def _hold_superseded(self, superseded: Callable[[str], bool]) -> None:
        """Mark files the Hub holds newer as seen, so an older volume never overwrites them."""
        held = []
        for path, relative in self._files():
            if superseded(relative):
                with contextlib.suppress(OSError):
                    self._seen[relative] = _Signature.of(path)
                    held.append(relative)
        if held:
            logger.info("sync: %d older file(s) on this volume stay off the Hub until written again", len(held))

    def _files(self) -> list[tuple[Path, str]]:
        found = []
        for path in sorted(self.run_dir.rglob("*")):
            relative = path.relative_to(self.run_dir).as_posix()
            if path.is_file() and not path.is_symlink() and not _skip(relative):
                if self.select is not None and not self.select(relative):
                    continue
                found.append((path, relative))
        return found

    def snapshot(self) -> list[str]:
        """Stage every file changed since the last snapshot; return their relative paths."""
        if self.before_snapshot is not None:
            try:
                self.before_snapshot()
            except Exception as error:  # the hook is a courtesy; the snapshot matters
                logger.debug("sync: before-snapshot hook failed: %s", error)
        with self._snapshot_lock:
            seen_at = time.monotonic()
            with contextlib.suppress(OSError):
                self._boundary_signature = _Signature.of(self.run_dir / BOUNDARY_FILE)
            staged: list[StagedFile] = []
            present = set()
            for path, relative in self._files():
                present.add(relative)
                try:
                    signature = _Signature.of(path)
                except OSError:
                    continue
                if self._seen.get(relative) == signature:
                    continue
                try:
                    result = self._stage(path, relative, signature)
                except Exception as error:  # any failure to stage: pending and failed, never dropped
                    self._stage_failed(relative, f"cannot stage {relative}: {type(error).__name__}: {error}")
                    continue
                if result is not None:
                    staged.append(result)
            with self._changed:
                # deleted since (or read now, for a failed snapshot): nothing left to upload
                for gone in set(self._failed) - present:
                    del self._failed[gone]
                for item in staged:
                    replaced = self._pending.get(item.relative)
                    if replaced is not None:
                        self._discard.append(replaced)
                    self._pending[item.relative] = item
                if staged:
                    self._boundary_seen_at = self._boundary_seen_at or seen_at
                self._changed.notify_all()
            if staged:
                self._work.set()
            return [item.relative for item in staged]

    def _stage_failed(self, relative: str, reason: str) -> None:
        logger.warning("sync: %s", reason)
        with self._changed:
            self._failed[relative] = reason
        self.last_error = reason

    def _stage(self, path: Path, relative: str, signature: _Signature) -> StagedFile | None:
        target = self.staging / f"{len(self.commits)}-{time.monotonic_ns()}-{path.name}"
        digest = hashlib.sha256()
        git = hashlib.sha1()  # git's blob id, for text files the Hub keeps in git
        is_checkpoint = path.suffix == ".pt"
        holds_secret = False
        try:
            with path.open("rb") as source, target.open("wb") as copy:
                if is_checkpoint:
                    # A binary cannot be scrubbed without breaking it: look for secrets while copying
                    # (chunks overlap by a secret's length, so none hides across a boundary).
                    overlap, tail = max(0, longest_secret() - 1), b""
                    while chunk := source.read(_COPY_CHUNK):
                        digest.update(chunk)
                        copy.write(chunk)
                        holds_secret = holds_secret or contains_secret(tail + chunk)
                        tail = chunk[-overlap:] if overlap else b""
                else:
                    data = redact_bytes(source.read())  # text files may echo a secret
                    digest.update(data)
                    git.update(b"blob %d\0" % len(data) + data)
                    copy.write(data)
            unchanged = _Signature.of(path) == signature
        except OSError as error:
            with contextlib.suppress(OSError):
                target.unlink(missing_ok=True)
            if not path.exists():
                logger.debug("sync: %s vanished while copied (%s)", relative, error)
                return None
            # Disk full, I/O error: the file is not on its way to the Hub. It stays pending (and
            # failed) and is tried again at the next snapshot.
            reason = f"cannot stage {relative}: {error}"
            logger.warning("sync: %s", reason)
            with self._changed:
                self._failed[relative] = reason
            self.last_error = reason
            return None
        with self._changed:
            self._failed.pop(relative, None)
        if not unchanged:
            # Written while we copied: the next boundary brings the finished version.
            target.unlink(missing_ok=True)
            return None
        if is_checkpoint:
            try:
                if holds_secret:
                    raise checkpoint.InvalidCheckpoint("it contains a secret value")
                checkpoint.inspect(target)
            except checkpoint.InvalidCheckpoint as error:
                logger.warning("sync: not uploading %s: %s", relative, error)
                self.refused.append(relative)
                with self._changed:
                    self.refused_missing[relative] = str(error)
                target.unlink(missing_ok=True)
                return None
            except BaseException:  # could not be checked: failed (by the caller), and no copy left behind
                target.unlink(missing_ok=True)
                raise
            with self._changed:
                self.refused_missing.pop(relative, None)
        self._seen[relative] = signature
        staged = StagedFile(
            relative=relative,
            path=target,
            sha256=digest.hexdigest(),
            git_oid=None if is_checkpoint else git.hexdigest(),
            size=target.stat().st_size,
        )
        if self.ledger.has(relative, staged.ids):
            target.unlink(missing_ok=True)
            return None
        return staged

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


def training_finished(run_dir: Path, *, now: float | None = None) -> bool:
    """LibreYOLO's status.json says the run ended, or its trainer is gone and the run is silent.

    A missing pid alone proves nothing: ``trainbox sync`` may run as a sidecar in another PID
    namespace, where the trainer's pid does not exist. So a vanished pid ends the sync only once
    status.json has also gone without an update for longer than its epochs take (``SILENCE``
    at least)."""
    path = run_dir / BOUNDARY_FILE
    try:
        status = json.loads(path.read_text())
        age = (time.time() if now is None else now) - path.stat().st_mtime
    except (OSError, ValueError):
        return False
    if status.get("state") in {"completed", "failed"}:
        return True
    pid = status.get("pid")
    if not isinstance(pid, int):
        return False
    try:
        os.kill(pid, 0)
        return False  # alive here (or a process of another namespace with that pid: keep syncing)
    except ProcessLookupError:
        pass
    except PermissionError:
        return False
    # Killed without a word (SIGKILL, OOM) or another namespace: wait out the longest quiet spell.
    return age > _quiet_spell(status)


def boundary_signature(run_dir: Path) -> tuple[int, int, int] | None:
    """status.json as it is now (size, mtime, inode); None when absent."""
    try:
        found = _Signature.of(run_dir / BOUNDARY_FILE)
    except OSError:
        return None
    return found.size, found.mtime_ns, found.inode


def run_ended(run_dir: Path, found: tuple[int, int, int] | None, began: float) -> bool:
    """``training_finished`` for a sync that started at ``began`` (monotonic) and found status.json as
    ``found``: an end written before the sync started may be an earlier attempt's, which a restarted
    trainer has not rewritten yet; it counts only once status.json stays unchanged for a quiet spell."""
    if not training_finished(run_dir):
        return False
    if boundary_signature(run_dir) != found:
        return True  # written since the sync started: this run's own word
    try:
        status = json.loads((run_dir / BOUNDARY_FILE).read_text())
    except (OSError, ValueError):
        return False
    return time.monotonic() - began > _quiet_spell(status if isinstance(status, dict) else {})


def _quiet_spell(status: dict[str, object]) -> float:
    """How long a live trainer may leave status.json alone: three epochs, at least SILENCE."""
    epoch = max(
        (v for v in (status.get("mean_epoch_seconds"), status.get("epoch_seconds")) if isinstance(v, (int, float))),
        default=0.0,
    )
    return max(SILENCE, 3 * float(epoch))


def sync_error(uploader: Uploader | TwoPlaces) -> SyncError:
    return SyncError(
        f"{len(uploader.pending)} file(s) could not be uploaded to {uploader.repo_id}: {uploader.last_error}",
        "they are still in the run folder; rerun `trainbox sync <run folder>` once the Hub is reachable",
    )
