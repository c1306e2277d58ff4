"""The one ordered table from foreign exceptions (the OS, huggingface_hub, its HTTP client) to the agent's errors.

A call site names where the failure happened (``Where``: what it was doing, on which repo or
file); ``agent_error`` walks ``TABLE`` top to bottom and the first row that answers wins. The order
matters: an error that is already ours passes through, a full disk is told apart from any other
``OSError`` (``HfHubHTTPError`` is an ``OSError`` too, without an errno), and a Hub refusal is told
apart from any other Hub failure. None: nothing here knows the error; the caller lets it propagate.

Errors that only one parser can name (a damaged tar header, invalid YAML) are raised where they are
detected; a provider's answer becomes ``providers.ProviderHttpError`` first, then a release error.
huggingface_hub is imported inside the rows: the HF_HOME it reads at import is set after start.
"""

from __future__ import annotations

import enum
import errno
from collections.abc import Callable
from dataclasses import dataclass

from .errors import (
    AccessError,
    AgentError,
    DatasetAccessError,
    DatasetError,
    DatasetNotFoundError,
    DiskSpaceError,
    NoArchiveError,
    RevisionNotFoundError,
    SyncError,
)
from .retry import NETWORK_ERRORS, describe, status_of

_DISK_FULL = (errno.ENOSPC, errno.EDQUOT)


class Area(enum.Enum):
    DISK = "disk"  # writing to WORKDIR: only a full disk is the agent's to name
    DATASET_WRITE = "dataset write"  # writing the dataset's files: any write failure is a dataset error
    DATASET_READ = "dataset read"  # reading a dataset repo on the Hub
    TOKEN = "token"  # proving HF_TOKEN (whoami)
    REPO_CREATE = "repo create"  # creating OUTPUT_REPO, or proving it may be written
    UPLOAD = "upload"  # committing to OUTPUT_REPO
    HUB = "hub"  # anything else that talks to the Hub


@dataclass(frozen=True)
class Where:
    """Where a foreign error happened: enough for a one-line message and its fix."""

    area: Area
    doing: str = ""  # "extracting 'a/b.jpg'": the disk rows
    repo_id: str = ""
    revision: str = ""
    path: str | None = None
    token: bool = False  # whether HF_TOKEN was sent
    disk_hint: str = "use a bigger disk"


Row = Callable[[BaseException, Where], AgentError | None]


def _ours(error: BaseException, where: Where) -> AgentError | None:
    return error if isinstance(error, AgentError) else None


def _disk_full(error: BaseException, where: Where) -> AgentError | None:
    if isinstance(error, OSError) and error.errno in _DISK_FULL:
        return DiskSpaceError(f"the disk filled up while {where.doing}: {error.strerror}", where.disk_hint)
    return None


def _dataset_answer(error: BaseException, where: Where) -> AgentError | None:
    """The Hub's refusal to read a dataset repo, by the exception huggingface_hub chose and the status."""
    from huggingface_hub.errors import EntryNotFoundError, GatedRepoError, HfHubHTTPError, RepositoryNotFoundError
    from huggingface_hub.errors import RevisionNotFoundError as HubRevisionNotFoundError

    repo_id = where.repo_id
    status = status_of(error)
    server_says = (error.server_message or "") if isinstance(error, HfHubHTTPError) else ""  # X-Error-Message
    if status == 401 and "invalid credentials" in server_says.lower():
        return DatasetAccessError(
            f"the Hub refused HF_TOKEN while reading dataset {repo_id}: invalid or expired",
            "set HF_TOKEN to a valid token with read access (huggingface.co/settings/tokens)",
        )
    if isinstance(error, GatedRepoError):
        return DatasetAccessError(
            f"dataset {repo_id} is gated and HF_TOKEN's account has not been granted access",
            "accept its conditions on the Hub with that account, or use another HF_TOKEN",
        )
    if isinstance(error, RepositoryNotFoundError):
        if not where.token:
            return DatasetAccessError(
                f"dataset {repo_id} is private or does not exist, and HF_TOKEN is not set",
                "set HF_TOKEN to a token that can read it, or check DATASET_REPO (org/name of a dataset repo)",
            )
        return DatasetNotFoundError(
            f"dataset repo {repo_id} not found (or HF_TOKEN's account cannot see it)",
            "check DATASET_REPO: org/name of a dataset repo (not a model repo), readable with HF_TOKEN",
        )
    if isinstance(error, HubRevisionNotFoundError):
        return RevisionNotFoundError(
            f"revision {where.revision!r} not found in dataset {repo_id}",
            "set DATASET_REVISION to a branch, tag or commit of that repo (default: main)",
        )
    if isinstance(error, EntryNotFoundError):
        return NoArchiveError(
            f"{where.path or 'the file'} is not in dataset {repo_id} at {where.revision[:12]}",
            "set DATASET_FILE to a file of the repo, e.g. data.tar",
        )
    if status in (401, 403):
        return DatasetAccessError(
            f"the Hub refused access to dataset {repo_id} (HTTP {status})", "check that HF_TOKEN may read it"
        )
    return None


def _token_refused(error: BaseException, where: Where) -> AgentError | None:
    from huggingface_hub.errors import HfHubHTTPError

    if isinstance(error, HfHubHTTPError) and status_of(error) == 401:
        return AccessError("HF_TOKEN is invalid or expired", "create a new write token")
    return None


def _repo_refused(error: BaseException, where: Where) -> AgentError | None:
    from huggingface_hub.errors import HfHubHTTPError

    if isinstance(error, HfHubHTTPError) and status_of(error) in {401, 403}:
        return AccessError(f"HF_TOKEN may not create or write {where.repo_id}", "check the token's scopes")
    return None


def _upload_refused(error: BaseException, where: Where) -> AgentError | None:
    from huggingface_hub.errors import HfHubHTTPError

    if isinstance(error, HfHubHTTPError) and status_of(error) in {401, 403}:
        return AccessError(f"the Hub refused the upload to {where.repo_id}", "check HF_TOKEN's write access")
    return None


def _upload_failed(error: BaseException, where: Where) -> AgentError | None:
    from huggingface_hub.errors import HfHubHTTPError

    if isinstance(error, HfHubHTTPError):
        return SyncError(f"upload to {where.repo_id} failed: {describe(error)}", "the run continues; see the log")
    if isinstance(error, NETWORK_ERRORS):
        return SyncError(f"upload to {where.repo_id} failed: {describe(error)}", "check the network")
    return None


def _hub_failed(error: BaseException, where: Where) -> AgentError | None:
    from huggingface_hub.errors import HfHubHTTPError

    if isinstance(error, (HfHubHTTPError, *NETWORK_ERRORS)):
        return SyncError(f"the Hub failed: {describe(error)}", "check the network and HF_ENDPOINT")
    return None


def _dataset_unwritable(error: BaseException, where: Where) -> AgentError | None:
    if isinstance(error, OSError):
        return DatasetError(
            f"cannot write {where.path!r} of the dataset: {error.strerror}", "check that WORKDIR is writable"
        )
    return None


_EVERYWHERE = frozenset(Area)

# (the areas a row speaks for, the row); first answer wins.
TABLE: tuple[tuple[frozenset[Area], Row], ...] = (
    (_EVERYWHERE, _ours),
    (frozenset({Area.DISK, Area.DATASET_WRITE}), _disk_full),
    (frozenset({Area.DATASET_READ}), _dataset_answer),
    (frozenset({Area.TOKEN}), _token_refused),
    (frozenset({Area.REPO_CREATE}), _repo_refused),
    (frozenset({Area.UPLOAD}), _upload_refused),
    (frozenset({Area.UPLOAD}), _upload_failed),
    (frozenset({Area.HUB}), _hub_failed),
    (frozenset({Area.DATASET_WRITE}), _dataset_unwritable),
)


def agent_error(error: BaseException, where: Where) -> AgentError | None:
    """The agent's error for ``error`` raised at ``where`` (None: not one the table knows)."""
    for areas, row in TABLE:
        if where.area in areas and (mapped := row(error, where)) is not None:
            return mapped
    return None
