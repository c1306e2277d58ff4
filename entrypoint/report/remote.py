"""`trainbox status --repo`'s one read of the Hub: the run's newest trainbox.json, from the repo or its
working store. Everything shown is rendered from that file alone (report/status.py), so where it came
from can change without the view: the repo's copy and, in bucket mode, the bucket's newest whole boundary
(``<bucket>/<RUN_NAME>/<run id>/``, read through sync/read.py).

Kept apart from status.py so that a stage with news (``notify.event``) never depends on the sync's modules.
"""

from __future__ import annotations

import contextlib
import logging
import re
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import RemoteReadError, RemoteUnreachableError
from ..log import logger
from ..retry import NETWORK_ERRORS, RETRY_STATUS, status_of
from ..state import STATE_FILE, read_state

if TYPE_CHECKING:
    from ..hub import Hub

# A look gives up on a Hub that does not answer after this long (each request has huggingface_hub's 10 s timeout;
# a closed port or no DNS fails at once): one line and exit 22 within 30 s.
READ_DEADLINE = 18.0
READ_ATTEMPTS = 3
# huggingface_hub's client has no timeout of its own (a listing or a paths-info POST to a host that accepts and never
# answers waits for ever): a look that has not answered by then is "cannot reach the Hub".
LOOK_BOUND = 25.0
# trainbox.json is a few KB (its attempts' history included); anything far larger is not one to render.
STATE_MAX_BYTES = 4 * 1024 * 1024
# Fields of trainbox.json the views read as objects: a remote file holding another type there is read as without.
_OBJECTS = (
    "progress",
    "metrics",
    "storage",
    "settings",
    "gpus",
    "cost",
    "exit",
    "release",
    "timeline",
    "phases",
    "evaluation",
)
_TEXTS = ("run_name", "run_id", "phase", "updated_at", "started_at")


def fetch_remote_state(
    hub: Hub, repo_id: str, run_name: str | None = None, *, bucket: str | None = None
) -> dict[str, Any] | None:
    """The run's newest trainbox.json on the Hub, or None when it holds none (yet).

    The repo's copy names where the working state lives (``storage``); that store's copy (written at
    every epoch boundary) wins when it is newer. ``bucket``: the bucket to look in when the repo does not
    say (CHECKPOINT_BUCKET, by default ``<repo>-checkpoints``; None: none). ``run_name``: that run, else
    the repo's, else the bucket's newest. ``RemoteReadError`` when the token cannot read the repo,
    ``RemoteUnreachableError`` when the Hub does not answer within ``READ_DEADLINE``. Whatever the file
    holds, what comes back has the types the views read (``sanitized``)."""
    outcome: list[tuple[bool, Any]] = []

    def look() -> None:
        try:
            outcome.append((True, _fetch(hub, repo_id, run_name, bucket)))
        except BaseException as error:  # handed to the caller's thread
            outcome.append((False, error))

    looking = threading.Thread(target=look, name="status-look", daemon=True)  # a hung request never holds the exit
    looking.start()
    looking.join(LOOK_BOUND)
    if not outcome:
        raise _unreachable(f"no answer within {LOOK_BOUND:.0f} s")
    answered, value = outcome[0]
    if not answered:
        raise value
    return value  # type: ignore[no-any-return]


def _fetch(hub: Hub, repo_id: str, run_name: str | None, bucket: str | None) -> dict[str, Any] | None:
    deadline = time.monotonic() + READ_DEADLINE
    with _quiet():
        in_repo = _repo_state(hub, repo_id, deadline)
        if run_name is not None and in_repo is not None and in_repo.get("run_name") != run_name:
            in_repo = None  # the repo holds another run: only the bucket may know this one
        storage = (in_repo or {}).get("storage") or {}
        if storage.get("mode") == "bucket":
            bucket, prefix = _text(storage.get("bucket")), _text(storage.get("prefix")) or run_name
        elif storage.get("mode") == "repo":
            bucket, prefix = None, None  # the repo is the working store
        else:
            prefix = run_name or (in_repo or {}).get("run_name")
        run_id = (in_repo or {}).get("run_id")
        if prefix and "/" not in prefix and run_id:
            prefix = f"{prefix}/{run_id}"  # this run's folder, never another run id's (a repo made again)
        in_bucket = _bucket_state(hub, str(bucket), prefix) if bucket else None
    if in_repo is None or in_bucket is None:
        return in_bucket or in_repo
    # ISO times of one format compare as text; a tie goes to the working store (written every boundary)
    return in_repo if str(in_repo.get("updated_at")) > str(in_bucket.get("updated_at")) else in_bucket


def sanitized(data: dict[str, Any]) -> dict[str, Any]:
    """A remote trainbox.json with the types the views read: an object field holding something else (a string,
    a list for ``progress``) is dropped, a text field that is not one is written as text, and the nested
    objects the views open (``metrics.best``, ``gpus.gpus``, ``timeline.marks``, ``phases``) likewise."""
    clean = {key: value for key, value in data.items() if key not in _OBJECTS or isinstance(value, dict)}
    for key in _TEXTS:
        if key in clean and clean[key] is not None and not isinstance(clean[key], str):
            clean[key] = str(clean[key])[:200]
    for outer, inner, kind in (("metrics", "best", dict), ("timeline", "marks", dict), ("gpus", "gpus", list)):
        if outer in clean and inner in clean[outer] and not isinstance(clean[outer][inner], kind):
            clean[outer] = {k: v for k, v in clean[outer].items() if k != inner}
    if "gpus" in clean and isinstance(clean["gpus"].get("gpus"), list):
        clean["gpus"] = {**clean["gpus"], "gpus": [gpu for gpu in clean["gpus"]["gpus"] if isinstance(gpu, dict)]}
    if "phases" in clean:
        clean["phases"] = {str(k): v for k, v in clean["phases"].items() if isinstance(v, dict)}
    return clean


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """The look says its outcome in one line: huggingface_hub's own lines (each failed request) and the retry
    lines are kept from the console while it looks (``-v`` keeps the retry lines)."""
    hf_logger = logging.getLogger("huggingface_hub")
    saved = hf_logger.level, logger.level
    hf_logger.setLevel(logging.CRITICAL)
    if logger.level != logging.DEBUG:
        logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        hf_logger.setLevel(saved[0])
        logger.setLevel(saved[1])


def _repo_state(hub: Hub, repo_id: str, deadline: float) -> dict[str, Any] | None:
    from huggingface_hub.errors import (
        EntryNotFoundError,
        GatedRepoError,
        HfHubHTTPError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    from ..hub import with_retries

    def download(scratch: str) -> str | None:
        found = list(hub.api.get_paths_info(repo_id, [STATE_FILE], repo_type="model"))
        if not found:
            return None
        size = getattr(found[0], "size", None)
        if not isinstance(size, int) or size > STATE_MAX_BYTES:
            logger.warning("%s in %s is not a trainbox.json of %d bytes or less", STATE_FILE, repo_id, STATE_MAX_BYTES)
            return None
        return hub.api.hf_hub_download(repo_id, STATE_FILE, repo_type="model", local_dir=scratch)

    with tempfile.TemporaryDirectory(prefix="trainbox-status-") as scratch:
        try:
            path = with_retries(
                lambda: download(scratch), f"reading {repo_id}", attempts=READ_ATTEMPTS, deadline=deadline
            )
        except LocalEntryNotFoundError:  # hf_hub_download's word for "the Hub did not answer" (before its 404s)
            raise _unreachable("the connection failed") from None
        except (EntryNotFoundError, RevisionNotFoundError):
            return None  # a repo without a run (yet)
        except (RepositoryNotFoundError, GatedRepoError):
            raise _unreadable(repo_id, "it does not exist, or the token may not read it") from None
        except HfHubHTTPError as error:
            if status_of(error) in (401, 403):
                raise _unreadable(repo_id, f"HTTP {status_of(error)}") from None
            if status_of(error) in RETRY_STATUS:
                raise _unreachable(f"it answered HTTP {status_of(error)}") from None
            raise
        except NETWORK_ERRORS as error:
            raise _unreachable(type(error).__name__) from None
        if path is None:
            return None
        found = read_state(Path(path))
        return sanitized(found) if found is not None else None


def _unreachable(why: str) -> RemoteUnreachableError:
    from huggingface_hub import constants

    return RemoteUnreachableError(
        f"cannot reach the Hub at {constants.ENDPOINT} ({why})",
        "check the network (and HF_ENDPOINT, a proxy), then look again; the run itself is not affected",
    )


def _unreadable(repo_id: str, why: str) -> RemoteReadError:
    return RemoteReadError(
        f"cannot read {repo_id}: {why}",
        "use a token that can read it (HF_TOKEN, or `hf auth login`), and check the repo id",
    )


def _bucket_state(hub: Hub, bucket_id: str, prefix: str | None) -> dict[str, Any] | None:
    """trainbox.json of the run's newest whole boundary in the bucket (``<RUN_NAME>/<run id>/``, the
    agent's layout, sync/bucket.py). ``prefix``: that folder, or a run name alone (its newest run id), or
    None (the run whose manifest was written last)."""
    from huggingface_hub.errors import HfHubHTTPError

    from ..sync.bucket import Bucket, RunFolder
    from ..sync.read import bucket_state

    bucket = Bucket(hub, bucket_id)
    try:
        run_name, _, run_id = (prefix or "").partition("/")
        if not run_id:
            found = _newest_folder(bucket, run_name or None)
            if found is None:
                return None
            run_name, run_id = found
        with tempfile.TemporaryDirectory(prefix="trainbox-status-") as scratch:
            state = bucket_state(RunFolder(bucket, run_name, run_id), Path(scratch), max_bytes=STATE_MAX_BYTES)
            return sanitized(state) if state is not None else None
    except HfHubHTTPError as error:  # no such bucket, or one this token may not read: the repo's copy stands
        logger.debug("status: bucket %s not read (%s)", bucket_id, type(error).__name__)
        return None
    except NETWORK_ERRORS as error:
        raise _unreachable(type(error).__name__) from None


# <RUN_NAME>/<run id>/manifests/<attempt>-<sequence>.json; an attempt begins with its start in milliseconds
_MANIFEST_KEY = re.compile(r"^([^/]+)/([^/]+)/manifests/(\d{13}-[0-9a-f]{6}-\d{6})\.json$")


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None


def _newest_folder(bucket: Any, run_name: str | None) -> tuple[str, str] | None:
    """The run folder (of ``run_name``, else any) whose newest manifest was written last."""
    listing = bucket.listing(run_name or "", recursive=True)
    found = [(m.group(3), m.group(1), m.group(2)) for key in listing if (m := _MANIFEST_KEY.match(key))]
    if not found:
        return None
    _, name, run_id = max(found)
    return name, run_id
