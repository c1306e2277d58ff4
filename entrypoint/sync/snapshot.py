"""The snapshotter: each epoch boundary's changed files staged once (one private copy, one hash, one check),
then handed to the uploader, which gives each store the copies it needs.

Staging runs under the shutdown clock: past ``cutoff`` (SIGTERM: the process must exit) no copy starts;
what is left unstaged is listed in ``failed`` (the stores lack it), and a file asked for again (``again``:
the repo's final last.pt) is not staged when the time left is shorter than the copy would take (``skipped``).
"""

from __future__ import annotations

import contextlib
import math
import shutil
import threading
import time
from collections.abc import Callable
from pathlib import Path

from .. import libreyolo
from ..log import logger
from .staging import Signature, StagedFile, Stager, skipped
from .watcher import BOUNDARY_FILE

# Stands for the whole run folder in ``failed`` when a snapshot failed before it could list it.
UNREAD = "(run folder not read)"
# A checkpoint ahead of its row gets one more pass: libreyolo writes the row right after the weights.
_BOUNDARY_PASSES = 2
LATE = "not staged: no time left before the exit"


class Snapshotter:
    """Stages the run folder's changed files and hands them to ``deliver``.

    ``changed`` is the uploader's condition: the ``stager``'s ``failed``, ``refused_missing``, ``torn`` and the
    snapshot counts are read and written under it, and ``deliver`` is called holding it. ``snapshot`` runs on the
    snapshot thread (``_snapshot_loop``), or in the caller's thread while none runs: ``_snapshot_lock`` keeps two
    from interleaving. A file that cannot be staged (a full disk, an I/O error) stays in ``stager.failed``
    until a later snapshot stages it.
    """

    def __init__(
        self,
        run_dir: Path,
        staging: Path,
        *,
        changed: threading.Condition,
        deliver: Callable[[list[StagedFile]], None],
        poll_interval: float,
        before_snapshot: Callable[[], None] | None = None,
        superseded: Callable[[str], bool] | None = None,
    ) -> None:
        self.run_dir = run_dir
        self.staging = staging
        self.changed = changed
        self.deliver = deliver
        self.poll_interval = poll_interval
        # Lets the agent bring trainbox.json up to date, so a boundary's commit carries it.
        self.before_snapshot = before_snapshot
        # Files already on the volume at start that the Hub holds in a newer version (the run
        # resumed from the Hub): they are uploaded only once training writes them again.
        self.superseded = superseded
        self.wake = threading.Event()  # a boundary, or someone waits on a snapshot
        self.stager = Stager(staging, changed)  # what could not be staged, and why: ``stager.failed`` and the like
        self.cutoff = math.inf  # no copy starts past it (a time.monotonic() value); set from a signal handler
        self._again: Callable[[str], bool] | None = None  # what a store wants staged again (under ``changed``)
        self._snapshot_lock = threading.Lock()
        self._asked = 0
        self._done = 0
        self._boundary_signature: Signature | None = None

    # -- what the uploader asks ------------------------------------------------------------
    def prepare(self) -> None:
        """A fresh staging folder; the files the Hub holds newer marked seen."""
        self.run_dir.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(self.staging, ignore_errors=True)
        self.staging.mkdir(parents=True)
        if self.superseded is not None:
            self._hold_superseded(self.superseded)

    def ask(self) -> int:
        """A snapshot wanted (under ``changed``): the ticket ``answered`` takes."""
        self._asked += 1
        self.wake.set()
        return self._asked

    def answered(self, ticket: int) -> bool:
        """The snapshot asked as ``ticket`` (or a later one) has run (under ``changed``)."""
        return self._done >= ticket

    def again(self, wanted: Callable[[str], bool]) -> int:
        """Under ``changed``: stage the unchanged files ``wanted`` picks again at the next snapshot, after its
        boundary's own files and only with the time the clock leaves (another store takes them now); the
        ticket ``answered`` takes. It never waits for a snapshot under way."""
        earlier = self._again
        self._again = wanted if earlier is None else (lambda relative: earlier(relative) or wanted(relative))
        return self.ask()

    # -- the snapshot thread ---------------------------------------------------------------
    def run(self, stopping: threading.Event) -> None:
        """The snapshot thread: a snapshot at each wake (a boundary, someone waiting), until ``stopping``."""
        self._snapshot_loop(stopping)

    def _snapshot_loop(self, stopping: threading.Event) -> None:
        while not stopping.is_set():
            woken = self.wake.wait(self.poll_interval)
            self.wake.clear()
            if stopping.is_set():
                return
            with self.changed:
                asked = self._asked
            if woken or asked > self._done or self._boundary_moved():
                try:
                    self.snapshot()
                except Exception as error:  # the uploader must never take the run down
                    logger.warning("sync: snapshot failed: %s", error)
                    self.stager.failed_to_stage(UNREAD, f"the snapshot failed: {type(error).__name__}: {error}")
                finally:
                    with self.changed:
                        self._done = max(self._done, asked)
                        self.changed.notify_all()

    def _boundary_moved(self) -> bool:
        """The polling fallback: has status.json been replaced since we last looked?"""
        try:
            signature = Signature.of(self.run_dir / BOUNDARY_FILE)
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
                    self.stager.seen[relative] = Signature.of(path)
                    held.append(relative)
        if held:
            logger.info("sync: %d older file(s) on this volume stay off the Hub until written again", len(held))

    def _files(self) -> list[tuple[Path, str]]:
        found = []
        for path in sorted(self.run_dir.rglob("*")):
            relative = path.relative_to(self.run_dir).as_posix()
            if path.is_file() and not path.is_symlink() and not skipped(relative):
                found.append((path, relative))
        return found

    def snapshot(self) -> list[str]:
        """Stage every file changed since the last snapshot and deliver them; return their paths.

        A snapshot is one epoch boundary: a checkpoint newer than the metrics.jsonl it goes with was
        written by the boundary in progress (libreyolo writes the weights first, the row after). One
        more pass takes that boundary whole if its row came meanwhile; otherwise the checkpoint waits
        for the next snapshot, and, if the row never comes (the trainer cut off), stays off the Hub:
        resume redoes an epoch that was never recorded, so the Hub's copy is the last recorded one."""
        if self.before_snapshot is not None:
            try:
                self.before_snapshot()
            except Exception as error:  # the hook is a courtesy; the snapshot matters
                logger.debug("sync: before-snapshot hook failed: %s", error)
        with self._snapshot_lock:
            staged: dict[str, StagedFile] = {}
            for _ in range(_BOUNDARY_PASSES):
                taken, waiting = self._pass()
                staged.update((item.relative, item) for item in taken)
                if not waiting:
                    break
            staged.update((item.relative, item) for item in self._stage_again())
            return list(staged)

    def _stage_again(self) -> list[StagedFile]:
        """Stage the unchanged files asked for again (``again``), each only when the time left before the
        cutoff covers its copy at the pace the last checkpoint took; the others go to ``skipped``."""
        with self.changed:
            wanted, self._again = self._again, None
        if wanted is None:
            return []
        staged: list[StagedFile] = []
        for path, relative in self._files():
            if not wanted(relative):
                continue
            try:
                signature = Signature.of(path)
            except OSError:
                continue
            if self.stager.seen.get(relative) != signature:
                continue  # changed since, or waiting for its row: the boundary's own staging takes it to every store
            needed = signature.size / self.stager.rate if self.stager.rate else 0.0
            left = self.cutoff - time.monotonic()
            if left <= needed:
                why = f"no time left before the exit to stage it ({needed:.1f} s needed, {max(left, 0.0):.1f} s left)"
                logger.info("sync: %s not staged again: %s", relative, why)
                with self.changed:
                    self.stager.skipped[relative] = why
                continue
            del self.stager.seen[relative]
            try:
                item = self.stager.stage(path, relative, signature, time.monotonic())
            except Exception as error:  # as in a pass: failed, and staged by the next snapshot
                self.stager.failed_to_stage(relative, f"cannot stage {relative}: {type(error).__name__}: {error}")
                continue
            if item is not None:
                staged.append(item)
        with self.changed:
            if staged:
                self.deliver(staged)
            self.changed.notify_all()
        return staged

    def _pass(self) -> tuple[list[StagedFile], list[str]]:
        """Stage the changed files: those staged, and the checkpoints that wait for their epoch's row."""
        seen_at = time.monotonic()
        with contextlib.suppress(OSError):
            self._boundary_signature = Signature.of(self.run_dir / BOUNDARY_FILE)
        staged: list[StagedFile] = []
        present, late = set(), []
        for path, relative in self._files():
            present.add(relative)
            try:
                signature = Signature.of(path)
            except OSError:
                continue
            if self.stager.seen.get(relative) == signature:
                continue
            if time.monotonic() >= self.cutoff:
                late.append(relative)  # the process exits now: left on the volume, and said
                continue
            try:
                result = self.stager.stage(path, relative, signature, seen_at)
            except Exception as error:  # any failure to stage: pending and failed, never dropped
                self.stager.failed_to_stage(relative, f"cannot stage {relative}: {type(error).__name__}: {error}")
                continue
            if result is not None:
                staged.append(result)
        staged, waiting = self._hold_unrecorded(staged)
        if late:
            logger.warning(
                "sync: %d changed file(s) not staged, no time left before the exit: %s", len(late), ", ".join(late[:5])
            )
            self.stager.last_error = LATE
        with self.changed:
            # deleted since (or read now, for a failed snapshot): nothing left to upload, nor kept on this volume
            for pending in (self.stager.failed, self.stager.refused_missing, self.stager.torn):
                for gone in set(pending) - present:
                    del pending[gone]
            self.stager.failed.update(dict.fromkeys(late, LATE))
            if staged:
                self.deliver(staged)
            self.changed.notify_all()
        return staged, waiting

    def _hold_unrecorded(self, staged: list[StagedFile]) -> tuple[list[StagedFile], list[str]]:
        """Split off the checkpoints of epochs the metrics.jsonl going with them does not record yet;
        they are unstaged and not marked seen, so the next pass or snapshot stages them again."""
        if all(item.epochs is None for item in staged):
            return staged, []  # no checkpoint in this pass: no row to read
        metrics = next((item.path for item in staged if item.relative == libreyolo.METRICS_FILE), None)
        if metrics is None:  # unchanged since it was staged: the run folder's copy is the one sent
            metrics = self.run_dir / libreyolo.METRICS_FILE
            if not metrics.is_file():
                return staged, []  # no libreyolo run folder (a stand-in writer): no rows to wait for
        recorded = libreyolo.last_recorded_epoch(metrics) or 0
        kept, waiting = [], []
        for item in staged:
            if item.epochs is not None and item.epochs > recorded:
                logger.debug("sync: %s holds epoch %d, not yet in metrics.jsonl: it waits", item.relative, item.epochs)
                self.stager.seen.pop(item.relative, None)
                item.path.unlink(missing_ok=True)
                waiting.append(item.relative)
            else:
                kept.append(item)
        return kept, waiting
