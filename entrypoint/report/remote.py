"""`trainbox status --repo`'s one read of the Hub: the run's newest trainbox.json, from the repo or its
working store. Everything shown is rendered from that file alone (report/status.py), so where it came
from can change without the view: the repo's copy and, in bucket mode, the bucket's newest whole boundary
(``<bucket>/<RUN_NAME>/<run id>/``, read through sync/read.py).

Kept apart from status.py so that a stage with news (``notify.event``) never depends on the sync's modules.
"""

from __future__ import annotations

import re
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import RemoteReadError
from ..log import logger
from ..state import STATE_FILE, read_state

if TYPE_CHECKING:
    from ..hub import Hub


def fetch_remote_state(
    hub: Hub, repo_id: str, run_name: str | None = None, *, bucket: str | None = None
) -> dict[str, Any] | None:
    """The run's newest trainbox.json on the Hub, or None when it holds none (yet).

    The repo's copy names where the working state lives (``storage``); that store's copy (written at
    every epoch boundary) wins when it is newer. ``bucket``: the bucket to look in when the repo does not
    say (CHECKPOINT_BUCKET, by default ``<repo>-checkpoints``; None: none). ``run_name``: that run, else
    the repo's, else the bucket's newest. ``RemoteReadError`` when the token cannot read the repo."""
    in_repo = _repo_state(hub, repo_id)
    if run_name is not None and in_repo is not None and in_repo.get("run_name") != run_name:
        in_repo = None  # the repo holds another run: only the bucket may know this one
    storage = (in_repo or {}).get("storage") or {}
    if storage.get("mode") == "bucket":
        bucket, prefix = storage.get("bucket"), storage.get("prefix") or run_name
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


def _repo_state(hub: Hub, repo_id: str) -> dict[str, Any] | None:
    from huggingface_hub.errors import (
        EntryNotFoundError,
        GatedRepoError,
        HfHubHTTPError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    from ..hub import with_retries
    from ..retry import status_of

    with tempfile.TemporaryDirectory(prefix="trainbox-status-") as scratch:
        try:
            path = with_retries(
                lambda: hub.api.hf_hub_download(repo_id, STATE_FILE, repo_type="model", local_dir=scratch),
                f"reading {repo_id}",
            )
        except (EntryNotFoundError, RevisionNotFoundError):
            return None  # a repo without a run (yet)
        except (RepositoryNotFoundError, GatedRepoError):
            raise _unreadable(repo_id, "it does not exist, or the token may not read it") from None
        except HfHubHTTPError as error:
            if status_of(error) in (401, 403):
                raise _unreadable(repo_id, f"HTTP {status_of(error)}") from None
            raise
        return read_state(Path(path))


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
            return bucket_state(RunFolder(bucket, run_name, run_id), Path(scratch))
    except HfHubHTTPError as error:  # no such bucket, or one this token may not read: the repo's copy stands
        logger.debug("status: bucket %s not read (%s)", bucket_id, type(error).__name__)
        return None


# <RUN_NAME>/<run id>/manifests/<attempt>-<sequence>.json; an attempt begins with its start in milliseconds
_MANIFEST_KEY = re.compile(r"^([^/]+)/([^/]+)/manifests/(\d{13}-[0-9a-f]{6}-\d{6})\.json$")


def _newest_folder(bucket: Any, run_name: str | None) -> tuple[str, str] | None:
    """The run folder (of ``run_name``, else any) whose newest manifest was written last."""
    listing = bucket.listing(run_name or "", recursive=True)
    found = [(m.group(3), m.group(1), m.group(2)) for key in listing if (m := _MANIFEST_KEY.match(key))]
    if not found:
        return None
    _, name, run_id = max(found)
    return name, run_id
