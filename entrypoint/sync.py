"""Checkpoint sync: every epoch boundary of a run folder on the Hub, never torn, never lost.

LibreYOLO writes its checkpoints in place, then renames ``status.json`` last: that rename is the
moment the epoch's files are complete. The uploader works in two threads so training never
waits for the network:

* the snapshotter reacts to each boundary (watchdog event, or a stat poll for volumes where
  inotify is silent): it copies every changed file into a private staging folder, checks it
  (``.pt``: complete archive that loads without running code; text: scrubbed of secrets) and
  records it as pending, newest version per path;
* the committer turns everything pending into one commit, within the Hub's commit budget. A
  slow commit means the next one carries several boundaries: the newest state wins and no
  stale commit is queued. A ledger of what the Hub holds (sha256 per path) survives restarts.
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
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from watchdog.events import FileSystemEvent, FileSystemEventHandler
from watchdog.observers import Observer

from . import checkpoint
from .errors import AgentError, SyncError
from .hub import Hub
from .log import contains_secret, logger, longest_secret, redact_bytes
from .state import STATE_FILE, write_json_atomic

BOUNDARY_FILE = "status.json"
POLL_INTERVAL = 1.0
# The Hub allows 128 commits per hour per repo; leave room for people and other tools.
COMMITS_PER_HOUR = 100
COMMIT_BURST = 20
_COPY_CHUNK = 4 * 1024 * 1024


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

    def __init__(self, per_hour: int = COMMITS_PER_HOUR, burst: int = COMMIT_BURST, recent: list[float] = ()) -> None:
        self.rate = per_hour / 3600.0
        self.burst = burst
        self.tokens = float(burst)
        self.updated = time.monotonic()
        for _ in recent:  # commits of an earlier attempt in the last hour still count
            self.tokens = max(0.0, self.tokens - 1)

    def _refill(self) -> None:
        now = time.monotonic()
        self.tokens = min(self.burst, self.tokens + (now - self.updated) * self.rate)
        self.updated = now

    def wait_time(self) -> float:
        self._refill()
        return 0.0 if self.tokens >= 1 else (1 - self.tokens) / self.rate

    def spend(self) -> None:
        self._refill()
        self.tokens -= 1


class _BoundaryHandler(FileSystemEventHandler):
    """Runs on watchdog's thread: it only signals, never does I/O."""

    def __init__(self, wake: threading.Event) -> None:
        self.wake = wake

    def on_any_event(self, event: FileSystemEvent) -> None:
        target = getattr(event, "dest_path", "") or event.src_path
        if os.path.basename(os.fsdecode(target)) in {BOUNDARY_FILE, STATE_FILE}:
            self.wake.set()


class Uploader:
    """Mirrors ``run_dir`` into ``repo_id``: start, let it run beside training, ``flush``, ``stop``."""

    def __init__(
        self,
        hub: Hub,
        repo_id: str,
        run_dir: Path,
        work_dir: Path,
        *,
        secrets: Callable[[], list[str]] | None = None,
        budget: CommitBudget | None = None,
        poll_interval: float = POLL_INTERVAL,
        on_commit: Callable[[str, list[str]], None] | None = None,
        before_snapshot: Callable[[], None] | None = None,
    ) -> None:
        self.hub = hub
        self.repo_id = repo_id
        self.run_dir = run_dir
        self.staging = work_dir / "staging"
        self.ledger = Ledger(work_dir / "ledger.json")
        self.budget = budget or CommitBudget(recent=self.ledger.commit_times)
        self.poll_interval = poll_interval
        self.on_commit = on_commit
        # Lets the agent bring trainbox.json up to date, so a boundary's commit carries it.
        self.before_snapshot = before_snapshot
        self._in_flight: set[int] = set()  # ids of the staged files a commit is reading now
        self._seen: dict[str, _Signature] = {}
        self._pending: dict[str, StagedFile] = {}
        self._lock = threading.Lock()
        self._snapshot_lock = threading.Lock()
        self._wake = threading.Event()
        self._work = threading.Event()
        self._stopping = threading.Event()
        self._committing = threading.Lock()
        self._boundary_signature: _Signature | None = None
        self._observer: Observer | None = None
        self._threads: list[threading.Thread] = []
        self.commits: list[str] = []
        self.latencies: deque[float] = deque(maxlen=1000)
        self.last_error: str | None = None
        self.refused: list[str] = []  # checkpoints not uploaded because they were torn or unsafe
        self._boundary_seen_at: float | None = None

    # -- lifecycle -------------------------------------------------------------------------
    def start(self) -> None:
        self.run_dir.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(self.staging, ignore_errors=True)
        self.staging.mkdir(parents=True)
        self._check_ledger()
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
        """Snapshot now and commit everything pending; True when the Hub has it all."""
        deadline = time.monotonic() + timeout
        self.snapshot()
        while (remaining := deadline - time.monotonic()) > 0:
            # Waits for a commit in flight: it may carry part of what is pending.
            if not self._committing.acquire(timeout=remaining):
                break
            try:
                if not self.pending:
                    return True
                self._commit_pending(final=True, deadline=deadline)
            finally:
                self._committing.release()
            if not self.pending:
                return True
            time.sleep(min(1.0, max(0.0, deadline - time.monotonic())))
        left = self.pending
        if not left:
            return True
        logger.error("sync: %d file(s) not on the Hub after %.0f s: %s", len(left), timeout, ", ".join(left[:5]))
        return False

    def stop(self) -> None:
        self._stopping.set()
        self._wake.set()
        self._work.set()
        if self._observer is not None:
            self._observer.stop()
            self._observer.join(timeout=5)
        for thread in self._threads:
            thread.join(timeout=5)

    # -- the snapshotter -------------------------------------------------------------------
    def _snapshot_loop(self) -> None:
        while not self._stopping.is_set():
            woken = self._wake.wait(self.poll_interval)
            self._wake.clear()
            if self._stopping.is_set():
                return
            if woken or self._boundary_moved():
                try:
                    self.snapshot()
                except Exception as error:  # the uploader must never take the run down
                    logger.warning("sync: snapshot failed: %s", error)

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
            for path in sorted(self.run_dir.rglob("*")):
                relative = path.relative_to(self.run_dir).as_posix()
                if not path.is_file() or path.is_symlink() or _skip(relative):
                    continue
                try:
                    signature = _Signature.of(path)
                except OSError:
                    continue
                if self._seen.get(relative) == signature:
                    continue
                result = self._stage(path, relative, signature)
                if result is not None:
                    staged.append(result)
            if staged:
                with self._lock:
                    for item in staged:
                        replaced = self._pending.get(item.relative)
                        # A copy a commit is reading stays; the committer removes it afterwards.
                        if replaced is not None and id(replaced) not in self._in_flight:
                            with contextlib.suppress(OSError):
                                replaced.path.unlink()
                        self._pending[item.relative] = item
                    self._boundary_seen_at = self._boundary_seen_at or seen_at
                self._work.set()
            return [item.relative for item in staged]

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
            logger.debug("sync: %s vanished while copied (%s)", relative, error)
            target.unlink(missing_ok=True)
            return None
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
                target.unlink(missing_ok=True)
                return None
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
        failures = 0
        while not self._stopping.is_set():
            self._work.wait(self.poll_interval)
            self._work.clear()
            if self._stopping.is_set():
                return
            with self._lock:
                if not self._pending:
                    continue
            pause = self.budget.wait_time()
            if pause > 0:
                # Over budget: keep absorbing boundaries; the newest state goes in one commit.
                self._stopping.wait(min(pause, 60.0))
                self._work.set()
                continue
            with self._committing:
                ok = self._commit_pending(final=False, deadline=None)
            failures = 0 if ok else failures + 1
            if not ok:
                self._stopping.wait(min(60.0, 2.0**failures))
                self._work.set()

    def _commit_pending(self, *, final: bool, deadline: float | None) -> bool:
        with self._lock:
            batch = list(self._pending.values())
            self._in_flight = {id(item) for item in batch}
            boundary_at = self._boundary_seen_at
            self._boundary_seen_at = None
        if not batch:
            return True
        names = sorted(item.relative for item in batch)
        message = f"{'Final state' if final else 'Epoch boundary'}: {', '.join(names[:6])}"
        if len(names) > 6:
            message += f" and {len(names) - 6} more"
        sha: str | None = None
        try:
            sha = self.hub.commit(
                self.repo_id, [(item.relative, item.path) for item in batch], message, deadline=deadline
            )
        except Exception as error:  # kept pending: the next try carries it, with anything newer
            self.last_error = str(error) if isinstance(error, AgentError) else f"{type(error).__name__}: {error}"
            logger.warning("sync: commit failed: %s (kept for the next try)", self.last_error)
        finally:
            self._settle(batch, committed=sha is not None, boundary_at=boundary_at)
        if sha is None:
            return False
        self.budget.spend()
        self.ledger.record(batch, sha)
        self.commits.append(sha)
        self.last_error = None
        if boundary_at is not None:
            self.latencies.append(time.monotonic() - boundary_at)
        logger.info("sync: %s → %s@%s", ", ".join(names[:4]) + (" …" if len(names) > 4 else ""), self.repo_id, sha[:8])
        if self.on_commit is not None:
            self.on_commit(sha, names)
        return True

    def _settle(self, batch: list[StagedFile], *, committed: bool, boundary_at: float | None) -> None:
        """After a commit attempt: drop what it delivered and the copies superseded meanwhile."""
        with self._lock:
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

    def _check_ledger(self) -> None:
        """Trust the ledger only if the Hub is still where we left it; else relearn it from the Hub."""
        try:
            head = self.hub.head(self.repo_id)
            if head == self.ledger.head:
                return
            remote = {} if head is None else self.hub.remote_ids(self.repo_id)
        except Exception as error:
            logger.warning("sync: cannot read %s (%s); every file will be checked again", self.repo_id, error)
            self.ledger.rebuild({}, None)
            return
        if self.ledger.head is not None:
            logger.info("sync: %s changed since the last upload; relearning what it holds", self.repo_id)
        self.ledger.rebuild(remote, head)

    @property
    def pending(self) -> list[str]:
        with self._lock:
            return sorted(self._pending)


def training_finished(run_dir: Path) -> bool:
    """LibreYOLO's status.json says the run ended, or its process is gone."""
    try:
        status = json.loads((run_dir / BOUNDARY_FILE).read_text())
    except (OSError, ValueError):
        return False
    if status.get("state") in {"completed", "failed"}:
        return True
    pid = status.get("pid")
    if isinstance(pid, int):
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True  # killed without a word (SIGKILL, OOM): status.json still says running
        except PermissionError:
            pass
    return False


def sync_error(uploader: Uploader) -> SyncError:
    return SyncError(
        f"{len(uploader.pending)} file(s) could not be uploaded to {uploader.repo_id}: {uploader.last_error}",
        "they are still in the run folder; rerun `trainbox sync <run folder>` once the Hub is reachable",
    )
