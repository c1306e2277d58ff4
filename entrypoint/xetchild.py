"""The Xet transfer of large files in a child process, so the agent's own memory stays flat.

hf_xet's upload holds whole xorbs (64 MB each) in RAM while it chunks, compresses and sends them, and
more of them the faster it chunks than the CAS accepts: the agent's peak grew with the checkpoint
(bench/xet_memory.py), and none of hf_xet's settings bounds it (its upload concurrency does not). So
``preupload`` runs huggingface_hub's ``preupload_lfs_files`` for the large files of a commit in a child
(``python -m entrypoint.xetchild``) and copies what it learnt onto the parent's operations:
``create_commit`` then skips their transfer and sends the same commit as before. The child's memory
is returned to the system when it exits; a child that dies is an attempt that failed without an
answer (retried like a network error: hf_xet skips the xorbs the CAS already holds). Its errors come
back as the exceptions ``create_commit`` would have raised, so the retry policy and the error table
see no difference. The token reaches it in its environment, never in its argv.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

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
    from . import procs

    todo = large(operations)
    if not todo:
        return
    files = [[op.path_in_repo, op.path_or_fileobj] for op in todo]
    env = {key: value for key, value in procs.scrubbed_env().items() if key != "HF_TOKEN"}
    env.update({"HF_ENDPOINT": endpoint, "HF_HUB_DISABLE_PROGRESS_BARS": "1", _PARENT_VAR: str(os.getpid())})
    env.setdefault("GLIBC_TUNABLES", _CHILD_MALLOC)
    if token:
        env["HF_TOKEN"] = token
    else:
        env["HF_HUB_DISABLE_IMPLICIT_TOKEN"] = "1"
    argv = [sys.executable, "-m", "entrypoint.xetchild", repo_id, json.dumps(files)]
    # From the folder that holds this package: the child imports the very code the parent runs.
    child = procs.Child(
        argv,
        cwd=Path(__file__).resolve().parent.parent,
        env=env,
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
    from .log import redact

    if returncode is not None and returncode < 0:
        return XetChildDied(f"the upload process was killed ({signal.Signals(-returncode).name})")
    last = redact(err.decode(errors="replace").strip().splitlines()[-1]) if err.strip() else "no output"
    return XetChildDied(f"the upload process exited {returncode} without an answer: {last}")


def _rebuilt(error: dict[str, Any]) -> Exception:
    """The child's exception as the parent's: an HTTP error through huggingface_hub's own mapping."""
    from .retry import NETWORK_ERRORS

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
def _die_with_parent() -> None:
    """SIGKILL when the parent dies (Linux), so an agent killed outright leaves no upload running."""
    import ctypes

    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    if os.environ.get(_PARENT_VAR) and os.getppid() != int(os.environ[_PARENT_VAR]):
        os._exit(1)  # the parent was gone before the line above


def _encoded(error: BaseException) -> dict[str, Any]:
    from huggingface_hub.errors import HfHubHTTPError

    from .retry import NETWORK_ERRORS

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
    _die_with_parent()
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    repo_id, files = argv[0], json.loads(argv[1])
    from huggingface_hub import CommitOperationAdd, HfApi

    operations = [CommitOperationAdd(path_in_repo=name, path_or_fileobj=path) for name, path in files]
    try:
        HfApi().preupload_lfs_files(repo_id, additions=operations, repo_type="model")
    except Exception as error:
        print(json.dumps({"error": _encoded(error)}), flush=True)
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


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
