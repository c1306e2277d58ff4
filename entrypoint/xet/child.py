"""The Xet transfer of large files in a child process, so the agent's own memory stays flat.

hf_xet's upload holds whole xorbs (64 MB each) in RAM while it chunks, compresses and sends them, and
more of them the faster it chunks than the CAS accepts: the agent's peak grew with the checkpoint
(bench/xet_memory.py), and none of hf_xet's settings bounds it (its upload concurrency does not). So
``preupload`` runs huggingface_hub's ``preupload_lfs_files`` for the large files of a commit in a child
(``python -m entrypoint.xet.child``) and copies what it learnt onto the parent's operations:
``create_commit`` then skips their transfer and sends the same commit as before. The child's memory
is returned to the system when it exits; a child that dies is an attempt that failed without an
answer (retried like a network error: hf_xet skips the xorbs the CAS already holds). Its errors come
back as the exceptions ``create_commit`` would have raised, so the retry policy and the error table
see no difference. The token reaches it in its environment, never in its argv. ``--ahead`` starts the other
kind of child: the one a staging copy feeds while it is written (xet/ahead.py has the parent's side).
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, NoReturn

if TYPE_CHECKING:
    from huggingface_hub import CommitOperationAdd

# Files from this size go through the child: below one xorb, hf_xet holds little more than the file.
CHILD_MIN_BYTES = 64 * 1024 * 1024
# glibc's malloc keeps freed xorb buffers in per-thread arenas and raises its mmap threshold as they are
# freed, so the child's peak still grew with the file (446 -> 244 MiB at 2 GB, in a trial): big buffers
# mapped and unmapped, two arenas. Read by glibc when the child starts; a user's own value wins.
_CHILD_MALLOC = "glibc.malloc.mmap_threshold=1048576:glibc.malloc.arena_max=2"
_PARENT_VAR = "TRAINBOX_XET_PARENT"  # the child exits when its parent is gone
_STOP_GRACE = 1.0  # a child stopped early (deadline, signal) gets this long before SIGKILL
_POLL = 0.2
_KEEP_HEADERS = ("retry-after", "x-error-code", "x-error-message", "content-type", "x-request-id")
_BODY_LIMIT = 64 * 1024
_READ_BLOCK = 8 * 1024 * 1024  # the ahead child's reads of a staged copy: hf_xet ingests 8 MB blocks


class XetChildDied(ConnectionError):
    """The child ended without an answer (killed, out of memory): retried like a lost connection."""


def large(operations: Sequence[CommitOperationAdd]) -> list[CommitOperationAdd]:
    """The operations whose transfer belongs in the child: local files of ``CHILD_MIN_BYTES`` or more."""
    from huggingface_hub.utils._runtime import is_xet_available

    if not is_xet_available():
        return []  # the LFS path streams from disk: nothing to keep out of the agent
    return [
        op
        for op in operations
        if isinstance(op.path_or_fileobj, str) and not op._is_uploaded and op.upload_info.size >= CHILD_MIN_BYTES
    ]


def preupload(
    operations: Sequence[CommitOperationAdd],
    repo_id: str,
    *,
    endpoint: str,
    token: str | None,
    deadline: float | None = None,
) -> None:
    """Upload the large files of ``operations`` from a child and mark them uploaded; raise what
    ``create_commit`` would have raised. ``deadline``: a ``time.monotonic()`` value; the child is
    stopped then and ``TimeoutError`` raised."""
    from .. import procs

    todo = large(operations)
    if not todo:
        return
    files = [[op.path_in_repo, op.path_or_fileobj] for op in todo]
    argv = [sys.executable, "-m", "entrypoint.xet.child", repo_id, json.dumps(files)]
    # From the folder that holds this package: the child imports the very code the parent runs.
    child = procs.Child(
        argv,
        cwd=Path(__file__).resolve().parent.parent,
        env=child_env(endpoint, token),
        errors=subprocess.PIPE,
        echo=False,
        label="xet upload",
    )
    try:
        out, err = _wait(child.process, deadline, len(todo))
    finally:  # a deadline, or a stop raised by a signal handler meanwhile: no child left uploading
        if child.poll() is None:
            child.stop(signal.SIGTERM, grace=_STOP_GRACE)
        for pipe in (child.process.stdout, child.process.stderr):
            if pipe is not None:
                pipe.close()
    answer = _answer(out)
    if answer is None:
        raise _died(child.process.returncode, err)
    if "error" in answer:
        raise _rebuilt(answer["error"])
    states = {state["path"]: state for state in answer["files"]}
    for op in todo:
        state = states[op.path_in_repo]
        op._upload_mode = state["mode"]
        op._should_ignore = state["ignore"]
        op._remote_oid = state["remote_oid"]
        if state["sha256"]:
            op.upload_info.sha256 = bytes.fromhex(state["sha256"])
        op._is_uploaded = state["uploaded"]


def child_env(endpoint: str, token: str | None) -> dict[str, str]:
    """An upload child's environment: ours without provider keys, the Hub to write and the token (in the
    environment, never in its argv)."""
    from .. import procs

    env = {key: value for key, value in procs.scrubbed_env().items() if key != "HF_TOKEN"}
    env.update({"HF_ENDPOINT": endpoint, "HF_HUB_DISABLE_PROGRESS_BARS": "1", _PARENT_VAR: str(os.getpid())})
    env.setdefault("GLIBC_TUNABLES", _CHILD_MALLOC)
    if token:
        env["HF_TOKEN"] = token
    else:
        env["HF_HUB_DISABLE_IMPLICIT_TOKEN"] = "1"
    return env


def _wait(process: subprocess.Popen[bytes], deadline: float | None, count: int) -> tuple[bytes, bytes]:
    while True:
        timeout = _POLL if deadline is None else min(_POLL, deadline - time.monotonic())
        if timeout <= 0:
            raise TimeoutError(f"the upload of {count} large file(s) did not finish in time")
        try:
            return process.communicate(timeout=timeout)  # retried after a timeout without losing output
        except subprocess.TimeoutExpired:
            continue


def _answer(out: bytes) -> dict[str, Any] | None:
    lines = out.decode(errors="replace").strip().splitlines()
    try:
        answer = json.loads(lines[-1]) if lines else None
    except json.JSONDecodeError:
        return None
    return answer if isinstance(answer, dict) and ("files" in answer or "error" in answer) else None


def _died(returncode: int | None, err: bytes) -> Exception:
    from ..log import redact

    if returncode is not None and returncode < 0:
        return XetChildDied(f"the upload process was killed ({signal.Signals(-returncode).name})")
    last = redact(err.decode(errors="replace").strip().splitlines()[-1]) if err.strip() else "no output"
    return XetChildDied(f"the upload process exited {returncode} without an answer: {last}")


def _rebuilt(error: dict[str, Any]) -> Exception:
    """The child's exception as the parent's: an HTTP error through huggingface_hub's own mapping."""
    from ..retry import NETWORK_ERRORS

    if error["kind"] == "http":
        import httpx2
        from huggingface_hub.errors import HfHubHTTPError
        from huggingface_hub.utils import hf_raise_for_status

        request = httpx2.Request(error["method"], error["url"])
        response = httpx2.Response(
            error["status"], headers=error["headers"], content=error["body"].encode(), request=request
        )
        try:
            hf_raise_for_status(response)
        except HfHubHTTPError as rebuilt:
            return rebuilt
        return HfHubHTTPError(error["message"], response=response)
    try:
        cls = getattr(importlib.import_module(error["module"]), error["name"])
    except (ImportError, AttributeError):
        cls = None
    known = isinstance(cls, type) and (
        issubclass(cls, NETWORK_ERRORS) or (error["module"] in ("builtins", "hf_xet") and issubclass(cls, Exception))
    )
    if known:
        try:
            rebuilt_error: Exception = cls(error["message"])
            return rebuilt_error
        except (TypeError, ValueError):  # a class that wants other arguments: the generic form below
            pass
    if error["kind"] == "network":
        return ConnectionError(error["message"])
    return RuntimeError(f"{error['name']}: {error['message']}")


# -- the child ---------------------------------------------------------------------------------------
def die_with_parent() -> None:
    """SIGKILL when the parent dies (Linux), so an agent killed outright leaves no upload running."""
    import ctypes

    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    if os.environ.get(_PARENT_VAR) and os.getppid() != int(os.environ[_PARENT_VAR]):
        os._exit(1)  # the parent was gone before the line above


def encoded(error: BaseException) -> dict[str, Any]:
    from huggingface_hub.errors import HfHubHTTPError

    from ..retry import NETWORK_ERRORS

    response = getattr(error, "response", None)
    if isinstance(error, HfHubHTTPError) and response is not None:
        try:
            body = response.text[:_BODY_LIMIT]
        except (RuntimeError, ValueError):  # a streamed answer that was never read (httpx's ResponseNotRead)
            body = ""
        return {
            "kind": "http",
            "status": response.status_code,
            "headers": {key: value for key, value in response.headers.items() if key.lower() in _KEEP_HEADERS},
            "body": body,
            "method": response.request.method,
            "url": str(response.request.url),
            "message": str(error),
        }
    kind = "network" if isinstance(error, NETWORK_ERRORS) else "other"
    return {"kind": kind, "module": type(error).__module__, "name": type(error).__name__, "message": str(error)}


def main(argv: Sequence[str]) -> int:
    die_with_parent()
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    if argv[:1] == ["--ahead"]:
        _ahead_main(argv[1])
    repo_id, files = argv[0], json.loads(argv[1])
    from huggingface_hub import CommitOperationAdd, HfApi

    operations = [CommitOperationAdd(path_in_repo=name, path_or_fileobj=path) for name, path in files]
    try:
        HfApi().preupload_lfs_files(repo_id, additions=operations, repo_type="model")
    except Exception as error:
        print(json.dumps({"error": encoded(error)}), flush=True)
        return 1
    states = [
        {
            "path": op.path_in_repo,
            "mode": op._upload_mode,
            "ignore": op._should_ignore,
            "remote_oid": op._remote_oid,
            "sha256": op.upload_info.sha256.hex() if op.upload_info.is_hashed else None,
            "uploaded": op._is_uploaded,
        }
        for op in operations
    ]
    print(json.dumps({"files": states}), flush=True)
    return 0


# -- the child that takes a staging copy's bytes as they are written (xet/ahead.py) -------------------------
class _AheadCommands:
    """The parent's commands, read by a thread: the copies in order, how far each is cleared, their ends."""

    def __init__(self, stream: IO[bytes]) -> None:
        self._changed = threading.Condition()
        self._files: deque[str] = deque()
        self._cleared: dict[str, int] = {}
        self._ends: set[str] = set()
        self._dropped: set[str] = set()
        self._closed = False  # no more copies: finish the upload once these are whole
        self.abandoned = False  # the parent is gone or gave up: finish nothing
        threading.Thread(target=self._read, args=(stream,), name="commands", daemon=True).start()

    def _read(self, stream: IO[bytes]) -> None:
        for line in stream:
            with self._changed:
                try:
                    self._take(json.loads(line))
                except (ValueError, KeyError, TypeError, AttributeError):
                    continue  # a command cut short (the parent gave up writing): the end of stdin follows
                self._changed.notify_all()
        with self._changed:
            self.abandoned = True  # stdin ends only when the parent is gone or abandons the session
            self._changed.notify_all()

    def _take(self, command: dict[str, Any]) -> None:
        if "file" in command:
            self._files.append(command["file"])
            self._cleared[command["file"]] = 0
        elif "upto" in command or "end" in command:
            path = command.get("upto") or command["end"]
            self._cleared[path] = max(self._cleared[path], int(command["n"]))
            if "end" in command:
                self._ends.add(path)
        elif "drop" in command:
            self._dropped.add(command["drop"])
        elif command.get("close"):
            self._closed = True

    def files(self) -> Iterator[str]:
        """Each copy to send, in order, until the session is closed (and none is left) or abandoned."""
        while True:
            with self._changed:
                self._changed.wait_for(lambda: bool(self._files) or self._closed or self.abandoned)
                if self.abandoned or not self._files:
                    return
                path = self._files.popleft()
            yield path

    def wait(self, path: str, sent: int) -> tuple[int, bool]:
        """How far ``path`` is cleared once that is past ``sent`` or it ended, and whether to go on sending it
        (no when it was dropped or the session abandoned)."""
        with self._changed:
            self._changed.wait_for(
                lambda: self._cleared[path] > sent or path in self._ends or path in self._dropped or self.abandoned
            )
            return self._cleared[path], path not in self._dropped and not self.abandoned

    def ended(self, path: str) -> bool:
        with self._changed:
            return path in self._ends


def _stream_copy(upload: Any, path: str, commands: _AheadCommands) -> dict[str, Any]:
    """Stream the staged copy ``path`` as the parent clears it; its sha256 and size once whole, else how
    much was sent (a drop, a copy deleted meanwhile, the parent gone)."""
    import hf_xet

    try:
        source = open(path, "rb")  # noqa: SIM115 (the with below closes it)
    except OSError:  # refused and deleted before its turn came
        return {"short": 0}
    stream = upload.start_upload_stream(name=os.path.basename(path), sha256=hf_xet.COMPUTE_SHA256)
    sent, whole = 0, False
    with source:
        while True:
            cleared, going = commands.wait(path, sent)
            if not going:
                break
            if sent >= cleared:
                whole = commands.ended(path)
                break
            if not os.path.exists(path):  # refused or discarded meanwhile: no commit will name it
                break
            block = source.read(min(_READ_BLOCK, cleared - sent))
            if not block:
                break
            stream.write(block)
            sent += len(block)
    if commands.abandoned:
        return {"short": sent}  # the child exits without finishing anything
    # Never aborted: an aborted stream fails the whole upload (hf_xet 1.8); a short one is a file nobody names.
    info = stream.finish().xet_info
    return {"sha256": info.sha256, "size": info.file_size} if whole else {"short": sent}


def _open_upload(repo_id: str) -> Any:
    """hf_xet's upload to ``repo_id``'s CAS, authorised as huggingface_hub's own Xet upload is."""
    from huggingface_hub import constants
    from huggingface_hub.utils import build_hf_headers
    from huggingface_hub.utils._xet import (
        XetTokenType,
        get_xet_session,
        xet_connection_info_refresh_url,
        xet_headers_without_auth,
    )

    headers = build_hf_headers()
    url = xet_connection_info_refresh_url(
        token_type=XetTokenType.WRITE, repo_id=repo_id, repo_type="model", revision="main", endpoint=constants.ENDPOINT
    )
    return get_xet_session().new_upload_commit(
        token_refresh_url=url, token_refresh_headers=headers, custom_headers=xet_headers_without_auth(headers)
    )


def _ahead_main(repo_id: str) -> NoReturn:
    """``python -m entrypoint.xet.child --ahead REPO``: commands on stdin, one JSON answer on stdout."""
    from huggingface_hub.utils._xet import get_xet_session

    get_xet_session()  # hf_xet's runtime, while the child waits for its first copy
    commands = _AheadCommands(sys.stdin.buffer)
    upload, sent, code = None, {}, 0
    try:
        for path in commands.files():
            upload = upload or _open_upload(repo_id)
            sent[path] = _stream_copy(upload, path, commands)
            if commands.abandoned:
                break
        if commands.abandoned:
            code = 1  # the shard is never sent: nothing of it becomes a file
        elif upload is not None:
            upload.wait_to_finish()
    except Exception as error:
        print(json.dumps({"error": encoded(error)}), flush=True)
        code = 1
    if code == 0:
        print(json.dumps({"files": sent}), flush=True)
    sys.stderr.flush()
    # No interpreter shutdown: the command thread holds stdin's lock (a shutdown then aborts), and hf_xet's
    # runtime would flush telemetry for up to 2 s. The upload is whole once wait_to_finish returned.
    os._exit(code)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
