"""Every Hugging Face Hub call of the agent, and the one retry policy they share.

``with_retries`` is the one retry policy: the Hub's retryable status codes and network errors, capped
exponential backoff, and the server's ``Retry-After`` honoured in full (only a deadline cuts it short:
then the call fails at once instead of hammering a server that asked for quiet). huggingface_hub
retries too (``http_backoff``: 5 retries, up to 23 s of sleeps, on preupload, the bucket batch,
listings, paths-info) and so does hf_xet (its CAS client: minutes on a failing CAS); nested inside
ours, one refused bucket batch held the uploader for minutes. So a call made inside ``with_retries``
runs huggingface_hub's backoff with no retry of its own (``_install_one_try``), and the agent's hf_xet
retries a CAS request twice, 0.1 s apart: a blip, never a minute (settings.load sets it). A commit
the Hub rate-limits is not retried here: ``RateLimitedError`` tells the uploader how long to hold all
commits. A commit is resent only after checking the remote history, so a commit that landed before its
response was lost is never made twice.
"""

from __future__ import annotations

import contextvars
import functools
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn, TypeVar

from huggingface_hub import CommitOperationAdd, HfApi
from huggingface_hub.errors import BucketNotFoundError, HfHubHTTPError, RepositoryNotFoundError
from huggingface_hub.utils import build_hf_headers, get_session, hf_raise_for_status

from .errors import (
    AccessError,
    AgentError,
)
from .foreign import Area, Where, agent_error
from .log import logger
from .retry import (
    NETWORK_ERRORS,
    RETRY_STATUS,
    RetryPolicy,
    call_with_retries,
    describe,
    is_retryable,
    retry_after_of,
    status_of,
)
from .xet import ahead as xetahead
from .xet import child as xetchild

if TYPE_CHECKING:
    from .settings import Settings


class RateLimitedError(Exception):
    """The Hub answered 429 to a commit: no commit before ``retry_after`` seconds have passed.
    Not an exit of its own: the uploader waits, and a final upload that cannot wait is a SyncError."""

    def __init__(self, message: str, retry_after: float) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class ParentMovedError(Exception):
    """A commit sent with ``parent_commit`` was refused (412): the repo moved since its writer read it. Nothing
    landed; the writer reads again (the run's lease first) and never overwrites what came since."""


class CardRefusedError(Exception):
    """The Hub refused README.md's metadata (its YAML validation): the commit carrying it did not land.
    Not an exit: the card is the only file in its commit, so nothing else waits on it."""


T = TypeVar("T")

# The only retries a call gets (the client's own backoff is off inside them): 1+2+4+8+16+30+30 s of waits.
MAX_ATTEMPTS = 8
BASE_WAIT = 1.0
MAX_WAIT = 30.0  # our own backoff; a server's Retry-After may ask for longer
# The commit-id check reads one page of history (the newest commits), never the whole of it.
HISTORY_PAGE = 20
HISTORY_TIMEOUT = 10.0
# Marks each commit with an id so a resent commit can tell whether the first one landed.
_COMMIT_ID_PREFIX = "trainbox-commit-id: "


# True while a call runs inside ``with_retries``: huggingface_hub's own backoff then makes one try only.
_INSIDE_OURS: contextvars.ContextVar[bool] = contextvars.ContextVar("trainbox_retries", default=False)


def _install_one_try() -> None:
    """Wrap huggingface_hub's ``_http_backoff_base`` (which ``http_backoff`` and ``http_stream_backoff``
    call by name) so that inside ``with_retries`` it never retries: one retry policy, ours. huggingface_hub 2.4
    has no public knob for it: its callers (preupload, the LFS batch, listings, paths-info) pass no
    ``max_retries``, no setting changes the default, and ``set_client_factory`` replaces the client the loop
    calls, not the loop (tests/unit/test_hub_retries.py checks the private name is still there). What the loop
    waits on a 429, ``RateLimit`` then ``Retry-After``, ours reads the same way (``retry.retry_after_of``)."""
    from huggingface_hub.utils import _http

    original = _http._http_backoff_base
    if getattr(original, "trainbox_one_try", False):
        return

    def one_try(*args: Any, **kwargs: Any) -> Iterator[Any]:
        if _INSIDE_OURS.get():
            kwargs["max_retries"] = 0
        return original(*args, **kwargs)

    one_try.trainbox_one_try = True  # type: ignore[attr-defined]
    _http._http_backoff_base = one_try  # type: ignore[assignment]


_install_one_try()


def _ours(call: Callable[[], T]) -> Callable[[], T]:
    def inside() -> T:
        token = _INSIDE_OURS.set(True)
        try:
            return call()
        finally:
            _INSIDE_OURS.reset(token)

    return inside


def with_retries(
    call: Callable[[], T],
    what: str,
    *,
    attempts: int = MAX_ATTEMPTS,
    sleep: Callable[[float], None] = time.sleep,
    before_retry: Callable[[], T | None] | None = None,
    deadline: float | None = None,
    retry_status: frozenset[int] = RETRY_STATUS,
) -> T:
    """Run ``call``; on a retryable failure wait and run it again (the policy of ``retry``).

    ``before_retry`` may return a result that makes the retry unnecessary (the commit check).
    ``deadline`` is a ``time.monotonic()`` value after which no new attempt starts.
    """
    policy = RetryPolicy(attempts=attempts, first_wait=BASE_WAIT, max_wait=MAX_WAIT, deadline=deadline, sleep=sleep)
    return call_with_retries(
        _ours(call),
        policy,
        retryable=lambda error: is_retryable(error, retry_status),
        describe=lambda error: f"{what}: {describe(error)}",
        before_retry=before_retry,
    )


def new_commit_id() -> str:
    return uuid.uuid4().hex


@dataclass(frozen=True)
class Hub:
    """One authenticated client. ``token`` is the secret value; it never leaves this object."""

    token: str | None = field(repr=False)
    endpoint: str | None = None

    @classmethod
    def for_settings(cls, settings: Settings) -> Hub:
        """The client of this job's HF_TOKEN: the one way the agent builds one."""
        return cls(token=settings.hf_token.reveal() if settings.hf_token else None)

    @property
    def api(self) -> HfApi:
        return HfApi(endpoint=self.endpoint, token=self.token if self.token else False)

    # -- output repo: access and commits -----------------------------------------------------
    def ensure_writable_repo(self, repo_id: str, *, bucket: str | None = None) -> None:
        """Create ``repo_id`` (private) if missing and prove the token may write to it (and to ``bucket``, the
        run's Storage Bucket, when given): a token that cannot is refused now, before any dataset byte."""
        if not self.token:
            raise AccessError(f"OUTPUT_REPO={repo_id} needs a token", "set HF_TOKEN to a token with write access")
        try:
            identity = with_retries(lambda: self.api.whoami(), "checking HF_TOKEN")
        except HfHubHTTPError as error:
            _raise_mapped(error, Where(Area.TOKEN))
        role = ((identity.get("auth") or {}).get("accessToken") or {}).get("role")
        if role == "read":
            raise AccessError(f"HF_TOKEN is read-only: it cannot upload to {repo_id}", "use a token with write access")
        namespace = repo_id.split("/", 1)[0]
        writable = {identity.get("name")} | {
            org.get("name") for org in identity.get("orgs") or [] if org.get("roleInOrg") not in {"read"}
        }
        if role == "fineGrained":
            self._check_fine_grained(identity, repo_id, bucket)
        elif namespace not in writable:
            raise AccessError(
                f"HF_TOKEN (user {identity.get('name')}) cannot write to the namespace {namespace!r}",
                "use an OUTPUT_REPO in your own namespace or an organisation you can write to",
            )
        try:
            with_retries(
                lambda: self.api.create_repo(repo_id, repo_type="model", private=True, exist_ok=True),
                f"creating {repo_id}",
            )
        except HfHubHTTPError as error:
            _raise_mapped(error, Where(Area.REPO_CREATE, repo_id=repo_id))

    def _check_fine_grained(self, identity: dict[str, Any], repo_id: str, bucket: str | None) -> None:
        """A fine-grained token writes only where its grants say (whoami): refuse one that cannot write or
        create OUTPUT_REPO or the bucket, naming the permission to add. Only what exists is asked about."""
        grants = token_write_grants(identity)
        if grants is None:
            return  # grants not shown: the first write will tell
        places = [("OUTPUT_REPO", repo_id, "model")] + ([("the bucket", bucket, "bucket")] if bucket else [])
        for label, target, kind in places:
            gap = write_gap(grants, target, exists=functools.partial(self._exists, target, kind))
            if gap is not None:
                action, needed = gap
                raise AccessError(
                    f"HF_TOKEN (fine-grained) may not {action} {label} {target}",
                    f"add {needed} to the token at https://huggingface.co/settings/tokens"
                    + (", or set CHECKPOINT_BUCKET=off" if kind == "bucket" else ""),
                )

    def _exists(self, target: str, kind: str) -> bool:
        """Whether a repo or bucket exists (asked only for a token whose grant names it alone)."""
        api = self.api
        ask: Callable[[], object] = (
            (lambda: api.bucket_info(target)) if kind == "bucket" else (lambda: api.repo_info(target, repo_type=kind))
        )
        try:
            with_retries(ask, f"reading {target}")
        except (RepositoryNotFoundError, BucketNotFoundError):
            return False
        except HfHubHTTPError as error:
            _raise_mapped(error, Where(Area.REPO_CREATE, repo_id=target))
        return True

    def head(self, repo_id: str, *, deadline: float | None = None) -> str | None:
        """The commit sha of ``main``, or None when the repo does not exist."""
        try:
            info = with_retries(
                lambda: self.api.repo_info(repo_id, repo_type="model"), f"reading {repo_id}", deadline=deadline
            )
        except RepositoryNotFoundError:
            return None
        return info.sha

    def commit(
        self,
        repo_id: str,
        files: Sequence[tuple[str, Path]],
        message: str,
        *,
        sleep: Callable[[float], None] = time.sleep,
        deadline: float | None = None,
        commit_id: str | None = None,
        parent: str | None = None,
    ) -> str:
        """Commit ``(path_in_repo, local_file)`` pairs as one commit; return its sha. ``parent``: the commit it
        must follow (``parent_commit``): ``ParentMovedError`` when the repo moved since.

        ``commit_id`` marks the commit (a new one when None); ``landed`` finds it later, so a
        caller whose earlier attempt failed without an answer can tell whether it landed."""
        commit_id = commit_id or new_commit_id()
        description = f"{_COMMIT_ID_PREFIX}{commit_id}"

        def attempt() -> str:
            # Operations are mutated by create_commit: build fresh ones for every attempt.
            operations = [CommitOperationAdd(path_in_repo=name, path_or_fileobj=str(path)) for name, path in files]
            api = self.api
            # Large staged copies sent while they were staged need no upload now (xet/ahead.py); the other large
            # files travel from a child process first (the agent's memory stays flat: xet/child.py).
            xetahead.take(operations, repo_id, endpoint=api.endpoint, token=self.token, deadline=deadline)
            xetchild.preupload(operations, repo_id, endpoint=api.endpoint, token=self.token, deadline=deadline)
            info = api.create_commit(
                repo_id,
                operations,
                commit_message=message,
                commit_description=description,
                repo_type="model",
                parent_commit=parent,
            )
            return info.oid

        try:
            sha = with_retries(
                attempt,
                f"committing to {repo_id}",
                sleep=sleep,
                before_retry=lambda: self.landed(repo_id, commit_id, deadline=deadline),
                deadline=deadline,
                retry_status=RETRY_STATUS - {429},
            )
        except HfHubHTTPError as error:
            status = status_of(error)
            if status == 412:
                raise ParentMovedError(f"{repo_id} moved since {parent} (HTTP 412): nothing committed") from None
            if status == 429:
                wait = retry_after_of(error)
                raise RateLimitedError(
                    f"the Hub rate-limits commits to {repo_id} (Retry-After: {wait if wait is not None else '?'} s);"
                    " the next commit waits and carries every newer epoch",
                    wait if wait is not None else 60.0,
                ) from None
            raise _upload_error(error, repo_id) from None
        except NETWORK_ERRORS as error:
            raise _upload_error(error, repo_id) from None
        except ValueError as error:
            # huggingface_hub checks README.md with the Hub's /api/validate-yaml before uploading anything
            if "README.md" in str(error):
                raise CardRefusedError(" ".join(str(error).split())) from None
            raise
        # This folder's next large copies go up here while they are staged (a final upload has no next ones).
        destination = xetahead.Destination(repo_id, self.api.endpoint, self.token)
        xetahead.repo_took([path for _, path in files], destination, more=deadline is None)
        return sha

    def landed(self, repo_id: str, commit_id: str, *, deadline: float | None = None) -> str | None:
        """The sha of the commit marked ``commit_id`` among the newest of ``repo_id``, or None.

        Raises when the history cannot be read: not knowing is no reason to commit again (a
        second copy of the same commit), only to ask again later."""
        timeout = HISTORY_TIMEOUT if deadline is None else max(0.1, min(HISTORY_TIMEOUT, deadline - time.monotonic()))
        url = f"{self.api.endpoint}/api/models/{repo_id}/commits/main"
        # One page: paging the whole history of a long run would take longer than a preemption allows.
        headers = build_hf_headers(token=self.token or False)
        response = get_session().get(url, params={"limit": HISTORY_PAGE}, headers=headers, timeout=timeout)
        hf_raise_for_status(response)
        for entry in response.json()[:HISTORY_PAGE]:
            if commit_id in (entry.get("message") or ""):
                logger.info("commit %s had landed before its answer was lost", str(entry.get("id"))[:8])
                landed = entry.get("id")
                return None if landed is None else str(landed)
        return None

    def download(
        self,
        repo_id: str,
        filename: str,
        target_dir: Path,
        revision: str | None = None,
        *,
        deadline: float | None = None,
    ) -> Path:
        """One file of a model repo into ``target_dir`` (used to resume from the Hub)."""
        path = with_retries(
            lambda: self.api.hf_hub_download(
                repo_id, filename, repo_type="model", revision=revision, local_dir=str(target_dir)
            ),
            f"downloading {filename} from {repo_id}",
            deadline=deadline,
        )
        return Path(path)

    def download_folder(
        self,
        repo_id: str,
        folder: str,
        target_dir: Path,
        revision: str | None = None,
        *,
        deadline: float | None = None,
    ) -> Path:
        """Every file under ``folder`` of a model repo (a folder export: OpenVINO's ``.xml``, ``.bin`` and metadata)
        into ``target_dir``, in one snapshot; its path there."""
        prefix = folder.strip("/")
        with_retries(
            lambda: self.api.snapshot_download(
                repo_id,
                repo_type="model",
                revision=revision,
                allow_patterns=[f"{prefix}/*"],
                local_dir=str(target_dir),
            ),
            f"downloading {prefix}/ from {repo_id}",
            deadline=deadline,
        )
        return target_dir / prefix

    def remote_ids(self, repo_id: str, *, deadline: float | None = None) -> dict[str, str]:
        """``path → id`` of a model repo's files: sha256 for LFS files, the git blob id for others."""
        return {
            entry.path: entry.lfs.sha256 if getattr(entry, "lfs", None) else entry.blob_id
            for entry in self.list_files(repo_id, deadline=deadline)
        }

    def list_files(self, repo_id: str, revision: str | None = None, *, deadline: float | None = None) -> list[Any]:
        """The files of a model repo (``RepoFile`` entries with size and LFS sha256)."""
        return with_retries(
            lambda: [
                entry
                for entry in self.api.list_repo_tree(repo_id, repo_type="model", recursive=True, revision=revision)
                if getattr(entry, "size", None) is not None
            ],
            f"listing {repo_id}",
            deadline=deadline,
        )


# Fine-grained tokens: whoami-v2 answers ``auth.accessToken.role == "fineGrained"`` and lists the token's grants
# in ``auth.accessToken.fineGrained.scoped``, each ``{"entity": {"type": "user"|"org"|"model"|..., "name": ...},
# "permissions": ["repo.content.read", "repo.write", ...]}``. ``repo.write`` on a user or an organisation lets the
# token create and write every repo of that namespace; on one repo, write that repo only.
REPO_WRITE = "repo.write"
_NAMESPACE_ENTITIES = frozenset({"user", "org", "organization"})


@dataclass(frozen=True)
class WriteGrants:
    """Where a fine-grained token may write: whole namespaces, and single repos or buckets."""

    namespaces: frozenset[str]
    targets: frozenset[str]


def token_write_grants(identity: dict[str, Any]) -> WriteGrants | None:
    """A fine-grained token's write grants from its whoami answer; None when the answer lists none at all (an
    unknown shape is never read as "no permission": the check is skipped instead)."""
    fine = ((identity.get("auth") or {}).get("accessToken") or {}).get("fineGrained")
    scoped = fine.get("scoped") if isinstance(fine, dict) else None
    if not isinstance(scoped, list):
        return None
    namespaces: set[str] = set()
    targets: set[str] = set()
    for grant in scoped:
        entity = grant.get("entity") if isinstance(grant, dict) else None
        permissions = grant.get("permissions") if isinstance(grant, dict) else None
        if not isinstance(entity, dict) or not isinstance(permissions, list) or not _writes(permissions):
            continue
        name = str(entity.get("name") or "")
        (namespaces if entity.get("type") in _NAMESPACE_ENTITIES else targets).add(name)
    return WriteGrants(frozenset(namespaces), frozenset(targets))


def _writes(permissions: list[Any]) -> bool:
    """``repo.write``, or a write permission of repos or buckets under another name: read generously, since a
    wrong refusal stops a run the Hub would have allowed."""
    return any(
        isinstance(p, str) and (p == REPO_WRITE or (p.endswith(".write") and p.split(".")[0] in {"repo", "bucket"}))
        for p in permissions
    )


def write_gap(grants: WriteGrants, target: str, *, exists: Callable[[], bool]) -> tuple[str, str] | None:
    """What the grants do not allow on ``target`` (``ns/name``): ``(action, permission to add)``, or None when
    they cover it. ``exists`` is asked only when a grant names ``target`` alone (such a grant cannot create it)."""
    namespace = target.split("/", 1)[0]
    if namespace in grants.namespaces:
        return None
    needed = f"'{REPO_WRITE}' on {namespace} (Write access to contents/settings of all repos of {namespace})"
    if target not in grants.targets:
        return "write to", needed
    if exists():
        return None
    return "create", f"{needed}: a grant on {target} alone writes it once it exists, but cannot create it"


def _raise_mapped(error: BaseException, where: Where) -> NoReturn:
    """Raise the table's error for ``error``, or ``error`` itself when the table has none."""
    mapped = agent_error(error, where)
    if mapped is None:
        raise error
    raise mapped from None


def _upload_error(error: BaseException, repo_id: str) -> AgentError:
    mapped = agent_error(error, Where(Area.UPLOAD, repo_id=repo_id))
    assert mapped is not None  # the upload rows answer every Hub and network error
    return mapped
