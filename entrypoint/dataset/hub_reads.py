"""Dataset repos on the Hub, the read side: revision → commit, root listing, file metadata, and the
bytes of one file (Xet CAS stream, plain GET with Range resume, or hf_hub_download)."""

from __future__ import annotations

import contextlib
import queue
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from ..errors import (
    AgentError,
    CorruptArchiveError,
    DatasetError,
    RevisionNotFoundError,
)
from ..foreign import Area, Where, agent_error
from ..hub import BASE_WAIT, MAX_WAIT, Hub, with_retries
from ..log import logger
from ..retry import RetryPolicy, describe, is_retryable, retry_after_of

# == Dataset repos: the read side of the dataset stage ======================================
# Revision → commit sha, the files at the repo root, one file's metadata, and its bytes: streamed
# from the Xet CAS for Xet-backed files, or by a plain GET of the resolve URL (resuming with Range
# after a dropped connection); both from any offset, so a stopped download continues.
DATASET = "dataset"
STREAM_ATTEMPTS = 6  # consecutive failures without a byte of progress before giving up
XET_STALL_S = 60.0  # a Xet download that delivers nothing for this long is abandoned
_PIECE = 1 << 20


@dataclass(frozen=True)
class RemoteFile:
    """One file of a dataset repo at a pinned commit."""

    repo_id: str
    path: str
    revision: str  # commit sha
    size: int | None
    etag: str | None  # sha256 for LFS/xet files, git blob sha1 for regular ones
    xet: bool  # stored on Xet, and this client may use it: streamed from the CAS
    url: str
    xet_hash: str | None = None
    xet_refresh: str | None = None  # the Hub route that hands out (and refreshes) a CAS read token


def dataset_revision(hub: Hub, repo_id: str, revision: str, *, sleep: Callable[[float], None] = time.sleep) -> str:
    """The commit sha that ``revision`` (branch, tag or sha) of dataset ``repo_id`` points at."""
    with _DatasetErrors(hub, repo_id, revision):
        info = with_retries(
            lambda: hub.api.dataset_info(repo_id, revision=revision),
            f"reading dataset {repo_id}@{revision}",
            sleep=sleep,
        )
    if not info.sha:
        raise RevisionNotFoundError(f"the Hub gave no commit for {repo_id}@{revision}", "set DATASET_REVISION")
    return info.sha


def dataset_files(hub: Hub, repo_id: str, sha: str, *, recursive: bool = True) -> dict[str, int]:
    """Path → size of the files of the dataset repo at commit ``sha``: every one (its parquet shards sit in
    folders), or those at its root only."""
    from huggingface_hub.hf_api import RepoFile

    with _DatasetErrors(hub, repo_id, sha):
        entries = with_retries(
            lambda: list(hub.api.list_repo_tree(repo_id, repo_type=DATASET, revision=sha, recursive=recursive)),
            f"listing dataset {repo_id}",
        )
    return {entry.path: entry.size for entry in entries if isinstance(entry, RepoFile)}


def dataset_file(hub: Hub, repo_id: str, path: str, sha: str) -> RemoteFile:
    """Size, ETag and storage of one file (a HEAD request; nothing is downloaded)."""
    from huggingface_hub import get_hf_file_metadata, hf_hub_url

    url = hf_hub_url(repo_id, path, repo_type=DATASET, revision=sha, endpoint=hub.endpoint)
    with _DatasetErrors(hub, repo_id, sha, path):
        meta = with_retries(
            lambda: get_hf_file_metadata(url, token=hub.token or False, endpoint=hub.endpoint),
            f"reading {path} of {repo_id}",
        )
    xet = meta.xet_file_data
    return RemoteFile(
        repo_id=repo_id,
        path=path,
        revision=sha,
        size=meta.size,
        etag=meta.etag,
        xet=xet is not None and _xet_enabled(),
        url=url,
        xet_hash=xet.file_hash if xet else None,
        xet_refresh=xet.refresh_route if xet else None,
    )


class XetStalled(Exception):
    """The Xet download delivered nothing for ``XET_STALL_S``."""


def xet_stream_dataset_file(
    hub: Hub, remote: RemoteFile, start: int = 0, *, stall_s: float | None = None
) -> Iterator[bytes]:
    """The bytes of Xet-backed ``remote`` from offset ``start``, in order, as hf_xet rebuilds them from the CAS.

    hf_xet fetches the chunks in parallel and keeps its chunk cache under ``HF_XET_CACHE``. The transfer
    runs in a worker thread so that a stall (no byte for ``stall_s``, token route included) raises
    ``XetStalled`` here instead of hanging: the caller retries or falls back to the plain stream.
    """
    assert remote.xet_hash is not None and remote.xet_refresh is not None and remote.size is not None
    stall_s = XET_STALL_S if stall_s is None else stall_s
    # hf_xet hands over ~16 MB at a time (its reconstruction step: cli.py), which goes on in 1 MB pieces. The
    # worker takes the next one from hf_xet only when asked, so the agent holds one outside hf_xet's bounded
    # buffer, not three (a handed-over item, one queued, one waiting to be queued): bench/xet_memory.py.
    pipe: queue.Queue[Any] = queue.Queue(maxsize=1)
    asks: queue.Queue[bool] = queue.Queue(maxsize=1)
    stop = threading.Event()
    end = object()

    def asked() -> bool:
        """Wait for the reader to want the next item; False when it has gone."""
        while not stop.is_set():
            try:
                return asks.get(timeout=0.2)
            except queue.Empty:
                continue
        return False

    def hand(item: Any) -> bool:
        """Into the pipe, unless the reader has gone (False)."""
        while not stop.is_set():
            try:
                pipe.put(item, timeout=0.2)
                return True
            except queue.Full:
                continue
        return False

    def produce() -> None:
        from hf_xet import XetFileInfo
        from huggingface_hub.utils import build_hf_headers
        from huggingface_hub.utils._xet import (
            XetFileData,
            get_xet_session,
            refresh_xet_connection_info,
            xet_headers_without_auth,
        )

        group = None
        try:
            headers = build_hf_headers(token=hub.token or False)
            data = XetFileData(file_hash=remote.xet_hash, refresh_route=remote.xet_refresh)  # type: ignore[arg-type]
            cas = refresh_xet_connection_info(file_data=data, headers=headers)
            group = get_xet_session().new_download_stream_group(
                endpoint=cas.endpoint,
                token=cas.access_token,
                token_expiry_unix_secs=cas.expiration_unix_epoch,
                token_refresh_url=remote.xet_refresh,  # the Hub's token route: the Hub token goes only there
                token_refresh_headers=headers,
                custom_headers=xet_headers_without_auth(headers),
            )
            stream = group.download_stream(XetFileInfo(remote.xet_hash, remote.size), start=start)
            while True:
                if not asked():
                    stream.cancel()
                    return
                chunk = next(stream, end)
                if chunk is end:
                    break
                if not hand(chunk):
                    stream.cancel()
                    return
                del chunk  # not held while waiting for the next ask
            group.finish()
            group = None
            hand(end)
        except BaseException as error:  # handed to the reader
            hand(error)
        finally:
            if group is not None:
                with contextlib.suppress(Exception):
                    group.abort()

    worker = threading.Thread(target=produce, name="xet-download", daemon=True)
    worker.start()
    offset = start
    try:
        while True:
            asks.put(True)
            try:
                item = pipe.get(timeout=stall_s)
            except queue.Empty:
                raise XetStalled(f"no byte from the Xet CAS for {stall_s:.0f} s") from None
            if item is end:
                if offset < remote.size:  # hf_xet may end a failed stream (a 401 from the CAS) as if it were done
                    raise ConnectionError(f"the Xet stream ended at byte {offset} of {remote.size}")
                return
            if isinstance(item, BaseException):
                raise item
            offset += len(item)
            for at in range(0, len(item), _PIECE):
                yield item[at : at + _PIECE]
            del item
    finally:
        stop.set()  # an abandoned worker (stalled in the CAS) is a daemon: it never holds up an exit


def stream_dataset_file(
    hub: Hub, remote: RemoteFile, start: int = 0, *, sleep: Callable[[float], None] = time.sleep
) -> Iterator[bytes]:
    """The bytes of ``remote`` from offset ``start``, as they arrive.

    A dropped connection or a retryable status is retried with ``Range`` from the last byte
    received: at once after progress, with capped exponential backoff when nothing arrives.
    """
    from huggingface_hub import constants
    from huggingface_hub.utils import build_hf_headers, get_session, hf_raise_for_status

    headers = build_hf_headers(token=hub.token or False)
    headers["Accept-Encoding"] = "identity"  # the bytes of the file, not a re-compressed body
    # Not call_with_retries: bytes that arrived make the next try immediate and reset the count.
    policy = RetryPolicy(attempts=STREAM_ATTEMPTS, first_wait=BASE_WAIT, max_wait=MAX_WAIT, sleep=sleep)
    offset, failures = start, 0
    while remote.size is None or offset < remote.size:
        progressed = False
        try:
            with _DatasetErrors(hub, remote.repo_id, remote.revision, remote.path):
                wanted = {**headers, "Range": f"bytes={offset}-"} if offset else headers
                # Redirects (LFS → CDN) are followed; httpx drops the Authorization header when the host changes.
                with get_session().stream(
                    "GET", remote.url, headers=wanted, timeout=constants.HF_HUB_DOWNLOAD_TIMEOUT, follow_redirects=True
                ) as response:
                    if response.status_code >= 400:
                        response.read()
                        hf_raise_for_status(response)
                    # A server that ignores Range sends the whole file again: skip what we already have.
                    skip = offset if offset and response.status_code == 200 else 0
                    for chunk in response.iter_bytes():  # as received: a reset loses no byte already here
                        if skip:
                            cut, skip = min(skip, len(chunk)), max(0, skip - len(chunk))
                            chunk = chunk[cut:]
                        if chunk:
                            offset += len(chunk)
                            progressed = True
                            yield chunk
            if remote.size is None:
                return
            if offset < remote.size:
                raise ConnectionError(f"the Hub closed the download at byte {offset} of {remote.size}")
        except Exception as error:
            failures = 0 if progressed else failures + 1
            if not is_retryable(error) or failures >= policy.attempts:
                if isinstance(error, AgentError):
                    raise
                raise DatasetError(
                    f"downloading {remote.path} from {remote.repo_id} failed at byte {offset}: {describe(error)}",
                    "check the network; the next start resumes from the bytes already on disk",
                ) from None
            if not progressed:
                wait = policy.pause(failures - 1, retry_after_of(error))
                logger.warning("download of %s: %s; retrying in %.0f s", remote.path, describe(error), wait)
                policy.sleep(wait)
            else:
                logger.warning("download of %s: %s; resuming at byte %d", remote.path, describe(error), offset)
    if remote.size is not None and offset > remote.size:
        raise CorruptArchiveError(
            f"the Hub sent {offset} bytes of {remote.path}, expected {remote.size}", "try again later"
        )


def download_dataset_file(hub: Hub, remote: RemoteFile, local_dir: Path) -> Path:
    """``remote`` into ``local_dir`` with hf_hub_download (xet-aware; its own progress bar and retries)."""
    with _DatasetErrors(hub, remote.repo_id, remote.revision, remote.path):
        path = with_retries(
            lambda: hub.api.hf_hub_download(
                remote.repo_id, remote.path, repo_type=DATASET, revision=remote.revision, local_dir=str(local_dir)
            ),
            f"downloading {remote.path} from {remote.repo_id}",
        )
    return Path(path)


def _xet_enabled() -> bool:
    """What hf_hub_download decides: xet when hf_xet is installed and not disabled."""
    import importlib.util

    from huggingface_hub import constants

    return not constants.HF_HUB_DISABLE_XET and importlib.util.find_spec("hf_xet") is not None


class _DatasetErrors:
    """Turn huggingface_hub's errors about a dataset repo into the agent's dataset errors."""

    def __init__(self, hub: Hub, repo_id: str, revision: str, path: str | None = None) -> None:
        self.hub, self.repo_id, self.revision, self.path = hub, repo_id, revision, path

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None, _tb: Any) -> Literal[False]:
        if error is None or not isinstance(error, Exception) or isinstance(error, AgentError):
            return False
        where = Where(
            Area.DATASET_READ, repo_id=self.repo_id, revision=self.revision, path=self.path, token=bool(self.hub.token)
        )
        mapped = agent_error(error, where)
        if mapped is None:
            return False
        raise mapped from None
