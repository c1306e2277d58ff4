"""Staging: a file of the run folder becomes a private copy, hashed, and scrubbed of secrets or searched for them."""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

from ..log import contains_secret, longest_secret, redact_bytes
from ..xet import ahead as xetahead

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
