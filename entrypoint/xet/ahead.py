"""Large checkpoints on their way to Xet while they are being staged: one read of the run folder's file
feeds the staged copy, its hash, the secret scan and the upload.

Otherwise a 500 MB checkpoint is copied to the staging folder (hashed, scanned), checked, and only then
uploaded: the wire waits for all of that. Here the staging copy (``sync/staging.copy_checked``) feeds a
child process (``python -m entrypoint.xet.child --ahead``; its side is in xet/child.py) that streams the
copy's bytes to the Xet CAS (hf_xet's streaming upload) as they are written: the upload trails the copy by
a few MB. The rules that keep it safe:

* The child reads only bytes the secret scan has cleared: the copy holds back its last
  ``longest_secret() - 1`` bytes until the next chunk is scanned, so no byte of a secret is ever read,
  and a checkpoint found holding one is dropped at once (its stream ends short, before the secret).
* The child reads the staged copy, the very bytes that were hashed and are checked; its sha256 of what it
  sent must equal the copy's, or the upload is not used.
* What the child sends becomes a file of the repo only when a commit names it: ``Hub.commit`` claims the
  copies it commits (``take``), the child finishes the upload (its shard), and the commit sends them as
  uploaded. A copy refused later (torn, unsafe, an epoch not yet recorded) is never committed: its bytes
  lie in the CAS, referenced by nothing, and the child stops reading a copy deleted meanwhile.

Where to: the repo that took the staging folder's last commit, while no Storage Bucket takes the folder's
files (``repo_took``, ``bucket_took``); a bucket's boundaries are uploaded as before. The large copies of
one boundary share a child and one Xet upload, so twins (``best.pt`` and ``last.pt`` of the same epoch) go
once. Whatever fails here (the child dies, hf_xet or the CAS fails, a mismatch) leaves the commit to upload
the file itself, as before: slower, never wrong.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from ..log import logger

if TYPE_CHECKING:
    from huggingface_hub import CommitOperationAdd

_STOP_GRACE = 1.0
_KEEP_SESSIONS = 2  # sessions of a folder kept for claims: the open one and the one before


@dataclass(frozen=True)
class Destination:
    """A repo the staged copies go to, and the client that may write it."""

    repo_id: str
    endpoint: str
    token: str | None = field(repr=False)


_lock = threading.Lock()
_repo_of: dict[Path, Destination] = {}  # staging folder → the repo its last commit went to
_bucket_takes: set[Path] = set()  # staging folders a bucket took a batch from
_sessions: dict[Path, list[_Session]] = {}  # staging folder → its sessions, the newest (maybe open) last
_copies: dict[Path, _Copy] = {}  # staged copy → what was sent of it


# -- where staged copies go (told by the commit paths) ------------------------------------------------
def repo_took(paths: Sequence[Path], destination: Destination, *, more: bool = True) -> None:
    """A commit of these staged copies landed in ``destination``: that folder's large checkpoints go there
    next, from the moment they are staged. A folder that had large copies gets its next child now, so the
    next boundary finds it started (its Python and hf_xet loaded: under 40 MiB while it waits), unless no
    more boundaries are coming (``more``: false for the final upload)."""
    with _lock:
        for folder in {path.parent for path in paths}:
            _repo_of[folder] = destination
            kept = _sessions.get(folder)
            if more and kept and _destination(folder) == destination and not any(s.open for s in kept):
                _start_locked(folder, destination)


def bucket_took(paths: Sequence[Path]) -> None:
    """A bucket batch of these staged copies landed: the bucket holds that folder's working state, and
    nothing of it is sent to a repo ahead of a commit, for the rest of the run (a bucket that fails later
    and leaves the boundaries to the repo for a while leaves them to the usual upload too)."""
    with _lock:
        for folder in {path.parent for path in paths}:
            _bucket_takes.add(folder)
            for session in _sessions.get(folder, []):
                if session.open and not session.fed:
                    session.abandon()  # a child waiting for copies that will not come


def _destination(folder: Path) -> Destination | None:
    return None if folder in _bucket_takes else _repo_of.get(folder)


def _start_locked(folder: Path, destination: Destination) -> _Session | None:
    """A new session for ``folder`` (the module's lock held); older ones take no more copies."""
    try:
        session = _Session(destination)
    except OSError as error:  # no process to be had: the commits upload the files themselves
        logger.debug("xet ahead: cannot start the child (%s)", error)
        return None
    kept = _sessions.setdefault(folder, [])
    for older in kept:
        older.close_locked()  # it finishes what it has, for a commit that may still claim it
    kept.append(session)
    for gone in kept[:-_KEEP_SESSIONS]:
        gone.abandon()
    del kept[:-_KEEP_SESSIONS]
    for path in [path for path, held in _copies.items() if held.session.abandoned]:
        del _copies[path]
    return session


# -- the staging side ------------------------------------------------------------------------------------
def feed(target: Path, size: int) -> Feed | None:
    """Start sending the staged copy ``target`` (``size``: the file it copies, as it was when the copy
    began) while it is written; None when it goes the usual way (small, no repo known, a bucket)."""
    from huggingface_hub.utils._runtime import is_xet_available

    from .child import CHILD_MIN_BYTES

    if size < CHILD_MIN_BYTES or not is_xet_available():
        return None
    folder = target.parent
    with _lock:
        destination = _destination(folder)
        if destination is None:
            return None
        kept = _sessions.get(folder, [])
        session = kept[-1] if kept and kept[-1].open and kept[-1].destination == destination else None
        session = session or _start_locked(folder, destination)
        if session is None:
            return None
        copy = _copies[target] = _Copy(session)
        session.fed = True
        session.send({"file": str(target)})  # under the lock: a claim's close never overtakes it
    return Feed(target, copy)


@dataclass
class _Copy:
    session: _Session
    size: int | None = None  # known once the copy is whole
    sha256: str | None = None
    dropped: bool = False


class Feed:
    """The staging copy's side of one staged copy: how far it is cleared, then its end or its drop."""

    def __init__(self, target: Path, copy: _Copy) -> None:
        self.target = target
        self.copy = copy
        self._cleared = 0

    def cleared(self, upto: int) -> None:
        """Bytes ``[0, upto)`` of the staged copy are written and hold no secret."""
        if upto > self._cleared and not self.copy.dropped:
            self._cleared = upto
            self.copy.session.send({"upto": str(self.target), "n": upto})

    def done(self, size: int, sha256: str) -> None:
        """The copy is whole, scanned to its end, and clean: ``size`` bytes, ``sha256``."""
        if not self.copy.dropped:
            self.copy.size, self.copy.sha256 = size, sha256
            self.copy.session.send({"end": str(self.target), "n": size})

    def drop(self) -> None:
        """Not to be sent further (a secret in it, the copy failed): its stream ends where it is."""
        if not self.copy.dropped:
            self.copy.dropped = True
            self.copy.session.send({"drop": str(self.target)})


# -- the commit side -------------------------------------------------------------------------------------
def take(
    operations: Sequence[CommitOperationAdd],
    repo_id: str,
    *,
    endpoint: str,
    token: str | None,
    deadline: float | None = None,
) -> list[CommitOperationAdd]:
    """Mark the operations whose staged copy was sent ahead to ``repo_id`` as uploaded, once the child
    finished it and it matches the copy (size, sha256); return them. The others are left as they were,
    for the usual upload. Raises ``TimeoutError`` at ``deadline``, and what asking the Hub for the upload
    mode raises (the request ``create_commit`` makes)."""
    wanted = Destination(repo_id, endpoint, token)
    found: list[tuple[CommitOperationAdd, _Copy]] = []
    with _lock:
        for op in operations:
            copy = _copies.get(Path(op.path_or_fileobj)) if isinstance(op.path_or_fileobj, str) else None
            if copy is None or op._is_uploaded or copy.size is None or copy.dropped:
                continue
            if copy.session.destination == wanted and not copy.session.abandoned:
                found.append((op, copy))
        for session in {copy.session for _, copy in found}:
            session.close_locked()
    if not found:
        return []
    # The Hub's answer on how it keeps each file comes while the child finishes (the request the upload makes).
    _upload_modes([op for op, _ in found], repo_id, endpoint=endpoint, token=token)
    taken = []
    for op, copy in found:
        answer = copy.session.answer(deadline)
        sent = answer.get("files", {}).get(op.path_or_fileobj)
        # What the child sent is the staged copy, whole, and the operation commits that copy as an LFS file.
        if (
            isinstance(sent, dict)
            and copy.sha256 is not None
            and sent.get("sha256") == copy.sha256
            and sent.get("size") == copy.size == op.upload_info.size
            and op._upload_mode == "lfs"
            and not op._should_ignore
        ):
            op.upload_info.sha256 = bytes.fromhex(copy.sha256)
            op._is_uploaded = True
            taken.append(op)
            continue
        why = answer.get("why") or f"the child sent {sent} of {copy.size} bytes, sha256 {copy.sha256}"
        logger.info("xet ahead: %s goes up the usual way (%s)", op.path_in_repo, why)
    return taken


def _upload_modes(operations: list[CommitOperationAdd], repo_id: str, *, endpoint: str, token: str | None) -> None:
    """Ask the Hub how it keeps each file (regular, LFS, ignored), as ``create_commit`` would."""
    from huggingface_hub._commit_api import _fetch_upload_modes
    from huggingface_hub.utils import build_hf_headers

    headers = build_hf_headers(token=token or False)
    _fetch_upload_modes(
        additions=operations, repo_type="model", repo_id=repo_id, headers=headers, revision="main", endpoint=endpoint
    )


def forget() -> None:
    """Every destination and session dropped, their children stopped (between tests)."""
    with _lock:
        sessions = [session for kept in _sessions.values() for session in kept]
        _repo_of.clear()
        _bucket_takes.clear()
        _sessions.clear()
        _copies.clear()
    for session in sessions:
        session.abandon()


class _Session:
    """One child and its Xet upload: the large copies of a boundary, until a commit claims them or a later
    boundary's copies need a session (then it is closed: it finishes, for a commit that claims it later)."""

    def __init__(self, destination: Destination) -> None:
        from .. import procs
        from . import child as xetchild

        self.destination = destination
        self.open = True  # takes new copies (changed under the module's lock)
        self.fed = False  # has taken a copy
        self.abandoned = False
        self._lock = threading.Lock()
        self._answer: dict[str, Any] | None = None
        # Read and closed once the child has exited (_read_answer): unlike a pipe, never full.
        self._out: IO[bytes] = tempfile.TemporaryFile()  # noqa: SIM115
        self._err: IO[bytes] = tempfile.TemporaryFile()  # noqa: SIM115
        self.child = procs.Child(
            [sys.executable, "-m", "entrypoint.xet.child", "--ahead", destination.repo_id],
            cwd=Path(__file__).resolve().parent.parent,
            env=xetchild.child_env(destination.endpoint, destination.token),
            output=self._out,
            errors=self._err,
            echo=False,
            label="xet upload ahead",
            stdin=subprocess.PIPE,
        )
        if self.child.process.stdin is not None:
            os.set_blocking(self.child.process.stdin.fileno(), False)  # see send

    def send(self, command: dict[str, Any]) -> None:
        """One command to the child, never waiting on it: a child gone, or so far behind that the pipe is
        full, loses its session (its copies go the usual way), never the staging copy's time."""
        data = json.dumps(command).encode() + b"\n"
        with self._lock:
            stdin = self.child.process.stdin
            if stdin is None or stdin.closed:
                return
            try:
                written = os.write(stdin.fileno(), data)
            except OSError:  # BlockingIOError (full), BrokenPipeError (gone)
                written = -1
            if written != len(data):
                self.abandoned, self.open = True, False  # its copies go the usual way, later ones to a new child
                with contextlib.suppress(OSError):
                    stdin.close()  # the child sees the end of its commands and finishes nothing

    def close_locked(self) -> None:
        """No new copies (the module's lock held): the child finishes the upload once those it has are whole."""
        if self.open:
            self.open = False
            self.send({"close": True})

    def abandon(self) -> None:
        """Nobody will claim these copies: the child is stopped, its upload never finished."""
        self.abandoned, self.open = True, False
        with self._lock, contextlib.suppress(OSError):
            if self.child.process.stdin is not None:
                self.child.process.stdin.close()
        if self.child.poll() is None:  # SIGTERM ends it at once (its default action), reaped here
            self.child.stop(signal.SIGTERM, grace=_STOP_GRACE)
        with self._lock:
            if self._answer is None:
                self._answer = {"why": "abandoned: nobody was to claim its copies"}
                for handle in (self._out, self._err):
                    handle.close()

    def answer(self, deadline: float | None) -> dict[str, Any]:
        """The child's answer once it has exited: ``{"files": {path: {sha256, size} | {short}}}``, or
        ``{"why": ...}`` when it failed or died. ``TimeoutError`` at ``deadline``."""
        with self._lock:
            if self._answer is not None:
                return self._answer
        try:
            self.child.process.wait(None if deadline is None else max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            raise TimeoutError("the upload of a large file sent ahead did not finish in time") from None
        with self._lock:
            if self._answer is None:
                self._answer = self._read_answer()
            return self._answer

    def _read_answer(self) -> dict[str, Any]:
        from ..log import redact

        with contextlib.suppress(OSError):
            if self.child.process.stdin is not None:
                self.child.process.stdin.close()
        self._out.seek(0)
        lines = self._out.read().decode(errors="replace").strip().splitlines()
        self._err.seek(0)
        last = self._err.read().decode(errors="replace").strip().splitlines()
        for handle in (self._out, self._err):
            handle.close()
        try:
            answer = json.loads(lines[-1]) if lines else {}
        except json.JSONDecodeError:
            answer = {}
        if isinstance(answer, dict) and isinstance(answer.get("files"), dict):
            return answer
        if isinstance(answer, dict) and isinstance(answer.get("error"), dict):
            error = answer["error"]
            why = f"{error.get('name') or error.get('status')}: {error.get('message')}"
        else:
            why = f"the child exited {self.child.process.returncode}: {last[-1] if last else 'no output'}"
        return {"why": redact(why)[:300]}
