"""Staging: a file of the run folder becomes a private copy, hashed, and scrubbed of secrets or searched for them;
``Stager`` stages one file at a time and keeps what could not be staged, and why."""

from __future__ import annotations

import contextlib
import hashlib
import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

from ..log import contains_secret, logger, longest_secret, redact_bytes
from ..xet import ahead as xetahead
from . import checkpoint

_COPY_CHUNK = 4 * 1024 * 1024


def skipped(relative: str) -> bool:
    """Temporary and hidden files are never part of a snapshot."""
    name = relative.rsplit("/", 1)[-1]
    return name.startswith(".") or name.endswith((".tmp", ".part", ".lock", ".incomplete"))


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while chunk := handle.read(_COPY_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


@dataclass(frozen=True)
class StagedFile:
    relative: str
    path: Path  # the private copy that gets uploaded
    sha256: str
    git_oid: str | None  # the id the Hub shows for a file it keeps in git (checkpoints go to LFS)
    size: int
    epochs: int | None = None  # a checkpoint's own count of completed epochs
    seen_at: float = 0.0  # when its boundary was seen (time.monotonic()): latency runs from here

    @property
    def ids(self) -> list[str]:
        return [self.sha256] if self.git_oid is None else [self.sha256, self.git_oid]


@dataclass(frozen=True)
class Signature:
    size: int
    mtime_ns: int
    inode: int

    @classmethod
    def of(cls, path: Path) -> Signature:
        stat = path.stat()
        return cls(stat.st_size, stat.st_mtime_ns, stat.st_ino)


def copy_checked(path: Path, target: Path, *, is_checkpoint: bool) -> tuple[str, str | None, bool]:
    """Copy ``path`` to ``target``: ``(sha256, git blob id or None for a checkpoint, holds a secret)``.

    Text is copied scrubbed of secrets; a checkpoint is copied as is and only searched for them. A large
    checkpoint starts on its way to the repo while it is copied (``xetahead.feed``): the upload reads
    only what this copy wrote and the scan cleared."""
    digest = hashlib.sha256()
    git = hashlib.sha1()  # git's blob id, for text files the Hub keeps in git
    holds_secret = False
    with path.open("rb") as source, target.open("wb") as copy:
        if is_checkpoint:
            feed = xetahead.feed(target, os.fstat(source.fileno()).st_size)
            try:
                holds_secret = _copy_checkpoint(source, copy, digest, feed)
            except BaseException:
                if feed is not None:
                    feed.drop()
                raise
            if feed is not None and not holds_secret:  # one that holds a secret was dropped when it was found
                feed.done(copy.tell(), digest.hexdigest())
        else:
            data = redact_bytes(source.read())  # text files may echo a secret
            digest.update(data)
            git.update(b"blob %d\0" % len(data) + data)
            copy.write(data)
    return digest.hexdigest(), None if is_checkpoint else git.hexdigest(), holds_secret


def _copy_checkpoint(source: BinaryIO, copy: BinaryIO, digest: Any, feed: xetahead.Feed | None) -> bool:
    """One read of the checkpoint feeds its copy, its hash and the secret scan (and the upload, through
    ``feed``); whether it holds a secret. A binary cannot be scrubbed without breaking it: it is searched.
    Chunks overlap by a secret's length less one byte, so none hides across a boundary; for the same reason
    the last ``overlap`` bytes scanned are cleared for the upload only once the next chunk is scanned."""
    overlap, tail, holds_secret = max(0, longest_secret() - 1), b"", False
    while chunk := source.read(_COPY_CHUNK):
        digest.update(chunk)
        copy.write(chunk)
        if contains_secret(chunk) or (tail and contains_secret(tail + chunk[:overlap])):
            holds_secret = True
            if feed is not None:
                feed.drop()  # before any byte of this chunk was cleared
                feed = None
        tail = chunk[-overlap:] if overlap else b""
        if feed is not None:
            copy.flush()  # the child reads the copy's file: what is cleared must be in it
            feed.cleared(copy.tell() - overlap)
    if feed is not None:
        copy.flush()
    return holds_secret


class Stager:
    """Stages one file of the run folder at a time into ``staging``, and keeps what could not be staged and why
    (read and written under ``changed``, the uploader's condition): the stores lack those files."""

    def __init__(self, staging: Path, changed: threading.Condition) -> None:
        self.staging = staging
        self.changed = changed
        self.failed: dict[str, str] = {}  # could not be staged (disk full, I/O error): path → why
        self.refused: list[str] = []  # checkpoints not uploaded because they were torn or unsafe
        # Whole checkpoints refused (a secret inside, an unsafe pickle) and not uploaded since in a valid
        # version: the Hub lacks what only this volume holds.
        self.refused_missing: dict[str, str] = {}
        # Torn on the volume as last read (cut short while written): nothing in them is worth keeping.
        self.torn: dict[str, str] = {}
        # Asked for again and not staged again, no time being left: path → why (read under ``changed``).
        self.skipped: dict[str, str] = {}
        self.last_error: str | None = None
        self.seen: dict[str, Signature] = {}  # each file as it was last staged (or held back: ``Snapshotter``)
        self.rate: float | None = None  # bytes per second the last checkpoint took to stage
        self._copies = 0  # names the staged copies

    def failed_to_stage(self, relative: str, reason: str) -> None:
        logger.warning("sync: %s", reason)
        with self.changed:
            self.failed[relative] = reason
        self.last_error = reason

    def stage(self, path: Path, relative: str, signature: Signature, seen_at: float) -> StagedFile | None:
        """A private copy of ``path``, hashed and scrubbed, a checkpoint checked; None when there is nothing to send
        (vanished, written meanwhile, refused) or it failed (then in ``failed``)."""
        self._copies += 1
        target = self.staging / f"{self._copies}-{time.monotonic_ns()}-{path.name}"
        is_checkpoint = path.suffix == ".pt"
        epochs: int | None = None
        began = time.monotonic()
        try:
            sha256, git_oid, holds_secret = copy_checked(path, target, is_checkpoint=is_checkpoint)
            unchanged = Signature.of(path) == signature
        except OSError as error:
            with contextlib.suppress(OSError):
                target.unlink(missing_ok=True)
            if not path.exists():
                logger.debug("sync: %s vanished while copied (%s)", relative, error)
                return None
            # Disk full, I/O error: the file is not on its way to the Hub. It stays failed and is
            # tried again at the next snapshot.
            self.failed_to_stage(relative, f"cannot stage {relative}: {error}")
            return None
        with self.changed:
            self.failed.pop(relative, None)
            self.skipped.pop(relative, None)
        if not unchanged:
            # Written while we copied: the next boundary brings the finished version.
            target.unlink(missing_ok=True)
            return None
        if is_checkpoint:
            try:
                if holds_secret:
                    raise checkpoint.InvalidCheckpoint("it contains a secret value")
                epochs = checkpoint.inspect(target).completed_epochs
            except checkpoint.InvalidCheckpoint as error:
                logger.warning("sync: not uploading %s: %s", relative, error)
                self.refused.append(relative)
                torn = isinstance(error, checkpoint.TornCheckpoint)
                with self.changed:
                    (self.torn if torn else self.refused_missing)[relative] = str(error)
                    (self.refused_missing if torn else self.torn).pop(relative, None)
                target.unlink(missing_ok=True)
                return None
            except BaseException:  # could not be checked: failed (by the caller), and no copy left behind
                target.unlink(missing_ok=True)
                raise
            with self.changed:
                self.refused_missing.pop(relative, None)
                self.torn.pop(relative, None)
            took = time.monotonic() - began  # copied, hashed and checked: what staging it again would take
            self.rate = signature.size / took if took > 0 else None
        self.seen[relative] = signature
        return StagedFile(
            relative=relative,
            path=target,
            sha256=sha256,
            git_oid=git_oid,
            size=target.stat().st_size,
            epochs=epochs,
            seen_at=seen_at,
        )
