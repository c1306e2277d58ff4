"""Datasets from a Hugging Face dataset repo: one tar, pinned to a commit, streamed into a checked folder.

The download and the extraction overlap: a thread reads the bytes, appends them to a partial file
on the volume, hashes them and hands them to the extractor, so the data is ready close to
max(download, extraction) instead of their sum. The bytes come from the Xet CAS for Xet-backed
files (hf_xet's parallel, in-order stream) or from a plain GET of the resolve URL (resuming with
``Range`` after a dropped connection). A Xet download that makes no progress for a minute is tried
once more, then continued over plain HTTP. Either way a stop (SIGTERM, a crash) keeps the partial
file, and the next start continues from its last byte.

Layout under ``WORKDIR/data/hub``: ``<org>--<name>/<sha>--<file>/`` holds ``tree/`` (the
extracted tar), ``data.yaml`` (its ``path`` made absolute) and the ready marker; ``refs/`` maps a
branch or tag to the commit it last resolved to (used when the Hub cannot be reached);
``.downloads/`` holds partial tars until their extraction is done.
"""

from __future__ import annotations

import contextlib
import hashlib
import queue
import re
import shutil
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

from ..errors import (
    AgentError,
    CorruptArchiveError,
    DatasetError,
    UnsafeArchiveError,
)
from ..hub import Hub
from ..log import logger
from ..retry import NETWORK_ERRORS, is_retryable
from ..settings import Settings
from . import extract, parquet, parquet_child, unzip
from .cache import READY_MARKER, PreparedDataset, data_dir, install_archive, read_ready_marker, use_ready_archive
from .checks import Deferred
from .choose import PARQUET, choose_archive
from .disk import GB, DiskNeed, check_disk, checkpoint_estimate, unpacked_estimate
from .hub_reads import (
    RemoteFile,
    dataset_file,
    dataset_files,
    dataset_revision,
    download_dataset_file,
    stream_dataset_file,
    xet_stream_dataset_file,
)

_BATCH_BYTES = 1 << 20
_QUEUE_CHUNKS = 16  # bytes in flight between download and extraction: a few MB
_HEX40 = re.compile(r"[0-9a-f]{40}")
_HEX64 = re.compile(r"[0-9a-f]{64}")


def store_dir(settings: Settings) -> Path:
    assert settings.dataset_repo is not None
    return data_dir(settings) / "hub" / settings.dataset_repo.replace("/", "--")


def prepare(settings: Settings, *, stream: bool = True, defer_to: Deferred | None = None) -> PreparedDataset:
    """The dataset of ``DATASET_REPO`` on the volume, checked; from the cache when this commit is there.

    ``stream=False`` takes the download-then-extract path even where streaming is possible;
    ``defer_to``: see ``checks.doctor``.
    """
    assert settings.dataset_repo is not None
    repo, hub, store = settings.dataset_repo, Hub.for_settings(settings), store_dir(settings)
    sha = resolve_revision(hub, repo, settings.dataset_revision, store)
    name = settings.dataset_file or _cached_choice(store, sha) or choose_archive(hub, repo, sha)
    entry = store / f"{sha}--{_safe(name)}"
    identity: dict[str, Any] = {"source": "hub", "repo": repo, "revision": sha, "file": name}
    if name == PARQUET:  # converted with this box format: another format is another dataset
        identity["bbox"] = settings.dataset_bbox.value
        entry = entry.with_name(f"{entry.name}-{settings.dataset_bbox.value}")
    description = f"{repo}@{sha[:12]}:{name}"
    marker = read_ready_marker(entry, identity)
    if marker is not None:
        logger.info("dataset: %s is already on the volume (%d files), nothing downloaded", description, marker["files"])
        return _with_revision(use_ready_archive(settings, entry, marker, description, defer_to=defer_to), sha)

    if name == PARQUET:
        prepared = _prepare_parquet(settings, hub, entry, identity, description, defer_to)
        _remember_choice(store, sha, name)
        return _with_revision(prepared, sha)
    remote = dataset_file(hub, repo, name, sha)
    if remote.size is None:
        raise CorruptArchiveError(f"the Hub does not tell the size of {name}", "try again later")
    partial = store.parent / ".downloads" / f"{_safe(remote.etag or sha)}.part"
    have = _partial_size(partial, remote.size) if stream else 0
    need = DiskNeed(remote.size - have, unpacked_estimate(name, remote.size), checkpoint_estimate(settings.run_args))
    free = check_disk(settings.workdir, need)
    # The extraction may use what the tar and the checkpoints leave; this also stops a gzip bomb.
    cap = free - need.archive - need.checkpoints
    via = "Xet" if remote.xet else "HTTP"
    how = "hf_hub_download, then extraction" if not stream else f"{via} download and extraction overlapped"
    resumed = f", resuming after {have / GB:.2f} GB already on disk" if have else ""
    logger.info("dataset: fetching %s (%.2f GB; %s%s)", description, remote.size / GB, how, resumed)

    if not stream:

        def fill(folder: Path) -> extract.ExtractReport:
            return _download_then_extract(hub, remote, partial.parent / remote.path.replace("/", "--"), folder, cap)

    elif unzip.is_zip(name):  # a zip's directory is at its end: the whole file first

        def fill(folder: Path) -> extract.ExtractReport:
            return _download_then_unzip(hub, remote, partial, folder, cap)

    else:

        def fill(folder: Path) -> extract.ExtractReport:
            return _stream_and_extract(hub, remote, partial, folder, cap)

    started = time.monotonic()
    try:
        prepared, _ = install_archive(settings, entry, identity, fill, description, defer_to=defer_to)
    except (UnsafeArchiveError, CorruptArchiveError):
        _discard(partial)  # the same bytes would be refused again
        raise
    _remember_choice(store, sha, name)
    logger.info("dataset: ready in %s", entry)
    seconds = time.monotonic() - started  # download and extraction overlap: a floor of the download's speed
    mbps = round((remote.size - have) / seconds / 1e6, 1) if seconds > 0 and remote.size > have else None
    return replace(_with_revision(prepared, sha), download_mbps=mbps)


def _prepare_parquet(
    settings: Settings,
    hub: Hub,
    entry: Path,
    identity: dict[str, Any],
    description: str,
    defer_to: Deferred | None,
) -> PreparedDataset:
    """The repo's parquet files converted into images and labels (``parquet``), one file at a time."""
    repo, sha = identity["repo"], identity["revision"]
    files = dataset_files(hub, repo, sha)
    train, validation, test = parquet.chosen_splits_with_test(list(files), repo)
    parquet_child.fetch_pyarrow(settings)  # before a byte of the dataset is downloaded
    largest = max(files[path] for path in train + validation + test)
    total = sum(files[path] for path in train + validation + test)
    # Two files on disk at a time (one converted, the next downloading); the images take what the files took.
    need = DiskNeed(2 * largest, total, checkpoint_estimate(settings.run_args))
    free = check_disk(settings.workdir, need)
    scratch = entry.parent.parent / ".downloads" / f"{entry.name}.files"
    readme = _readme(hub, repo, sha, files)
    logger.info(
        "dataset: converting %s (%d parquet files, %.2f GB)", description, len(train + validation + test), total / GB
    )

    def download(path: str, local: Path) -> None:
        remote = dataset_file(hub, repo, path, sha)
        partial = local.with_suffix(".part")
        _download_whole(hub, remote, partial)
        partial.rename(local)

    def fill(folder: Path) -> extract.ExtractReport:
        cap = free - need.archive - need.checkpoints
        try:
            report = parquet_child.convert_in_child(
                train,
                validation,
                download,
                scratch,
                folder,
                bbox=settings.dataset_bbox,
                readme=readme,
                max_bytes=cap,
                test=test,
            )
        except BaseException as error:
            if not isinstance(error, extract.STOP_REQUESTS):  # a stop keeps the files for the next start
                shutil.rmtree(scratch, ignore_errors=True)
            raise
        shutil.rmtree(scratch, ignore_errors=True)
        return report

    prepared, _ = install_archive(settings, entry, identity, fill, description, defer_to=defer_to)
    logger.info("dataset: ready in %s", entry)
    return prepared


def _readme(hub: Hub, repo: str, sha: str, files: dict[str, int]) -> str | None:
    """The dataset card (its ``dataset_info`` may name the classes), when the repo has a small one."""
    if "README.md" not in files or files["README.md"] > 1 << 20:
        return None
    remote = dataset_file(hub, repo, "README.md", sha)
    return b"".join(remote_chunks(hub, remote, 0)).decode(errors="replace")


def _download_whole(hub: Hub, remote: RemoteFile, partial: Path) -> None:
    """``remote`` into ``partial`` (continuing what an earlier start left there), its checksum verified."""
    download = _Download(hub, remote, partial)
    download.start()
    try:
        download.finish()
    finally:
        download.stop()
    download.progress.done()


def _with_revision(prepared: PreparedDataset, sha: str) -> PreparedDataset:
    return replace(prepared, revision=sha)


# -- revision and archive -----------------------------------------------------------------------
def resolve_revision(
    hub: Hub, repo: str, revision: str, store: Path, *, sleep: Callable[[float], None] = time.sleep
) -> str:
    """``DATASET_REVISION`` → commit sha; the last known sha of it when the Hub cannot be reached
    (after the retries) and that commit's dataset is on the volume."""
    ref = store / "refs" / _safe(revision)
    try:
        sha = dataset_revision(hub, repo, revision, sleep=sleep)
    except AgentError:
        raise
    except Exception as error:
        if not (is_retryable(error) or isinstance(error, NETWORK_ERRORS)):
            raise
        known = revision if _HEX40.fullmatch(revision) else _read(ref)
        if known and any((path / READY_MARKER).is_file() for path in store.glob(f"{known}--*")):
            logger.warning("dataset: the Hub cannot be reached (%s); using %s from the volume", error, known[:12])
            return known
        raise DatasetError(
            f"cannot reach the Hub to resolve {repo}@{revision}: {type(error).__name__}",
            "check the network and HF_ENDPOINT",
        ) from None
    if sha != revision:
        ref.parent.mkdir(parents=True, exist_ok=True)
        ref.write_text(sha)
    logger.info("dataset: %s@%s is commit %s", repo, revision, sha)
    return sha


def _cached_choice(store: Path, sha: str) -> str | None:
    """The archive chosen for this commit before (a commit never changes), saving a listing."""
    return _read(store / "refs" / f"{sha}.file")


def _remember_choice(store: Path, sha: str, name: str) -> None:
    path = store / "refs" / f"{sha}.file"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(name)


# -- the two transports -------------------------------------------------------------------------
def _stream_and_extract(hub: Hub, remote: RemoteFile, partial: Path, folder: Path, cap: int) -> extract.ExtractReport:
    download = _Download(hub, remote, partial)
    download.start()
    try:
        report = extract.extract(download.chunks(), folder, max_bytes=cap, on_member=download.progress.extracted)
        download.finish()  # the zero padding after the end of the archive, and the checksum of every byte
    finally:
        download.stop()
    download.progress.done()
    _discard(partial)  # complete and verified: what comes next never needs these bytes again
    return report


def _download_then_unzip(hub: Hub, remote: RemoteFile, partial: Path, folder: Path, cap: int) -> extract.ExtractReport:
    """The zip whole into the partial file (resumable, checksum verified), then extracted from it."""
    _download_whole(hub, remote, partial)
    report = unzip.extract_zip(partial, folder, max_bytes=cap)
    _discard(partial)
    return report


def _download_then_extract(hub: Hub, remote: RemoteFile, where: Path, folder: Path, cap: int) -> extract.ExtractReport:
    """hf_hub_download, then extraction (for comparison). ``where`` is removed once the data is extracted,
    not before: what hf_hub_download kept of a stopped download stays for the next start."""
    where.mkdir(parents=True, exist_ok=True)
    path = download_dataset_file(hub, remote, where)
    logger.info("dataset: downloaded; extracting")
    report = extract.extract(extract.read_file(path), folder, max_bytes=cap)
    shutil.rmtree(where, ignore_errors=True)
    with contextlib.suppress(OSError):
        where.parent.rmdir()  # only when empty
    return report


def remote_chunks(hub: Hub, remote: RemoteFile, start: int) -> Iterator[bytes]:
    """The bytes of ``remote`` from ``start``: from the Xet CAS (one retry after a stall or an error),
    then, or otherwise, by a plain GET of the resolve URL from wherever Xet stopped."""
    offset = start
    for attempt in (1, 2) if remote.xet else ():
        try:
            for chunk in xet_stream_dataset_file(hub, remote, offset):
                offset += len(chunk)
                yield chunk
            return
        except AgentError:
            raise
        except Exception as error:
            again = "trying once more" if attempt == 1 else "continuing over plain HTTP"
            logger.warning(
                "dataset: the Xet download of %s failed at byte %d (%s); %s", remote.path, offset, error, again
            )
    yield from stream_dataset_file(hub, remote, offset)


class _Download(threading.Thread):
    """Producer: the partial file's bytes first, then the Hub's from there on; every byte goes to
    the partial file, the hash and the queue the extractor reads."""

    _END = object()

    def __init__(self, hub: Hub, remote: RemoteFile, partial: Path) -> None:
        super().__init__(name="dataset-download", daemon=True)
        self.hub, self.remote, self.partial = hub, remote, partial
        self.queue: queue.Queue[bytes | BaseException | object] = queue.Queue(maxsize=_QUEUE_CHUNKS)
        self._stopping = threading.Event()
        self._ended = False
        assert remote.size is not None
        self.progress = _Progress(remote.path, remote.size)

    def run(self) -> None:
        try:
            self._transfer()
            self._put(self._END)
        except BaseException as error:  # handed to the extractor, which raises it in the main thread
            self._put(error)

    def _transfer(self) -> None:
        digest = _Digest(self.remote)
        self.partial.parent.mkdir(parents=True, exist_ok=True)
        assert self.remote.size is not None
        have = _partial_size(self.partial, self.remote.size)
        with open(self.partial, "r+b" if have else "wb") as sink:
            sink.truncate(have)
            for chunk in extract.read_file(self.partial) if have else ():
                digest.update(chunk)
                self.progress.downloaded(len(chunk))
                if not self._put(chunk):
                    return
            sink.seek(have)
            for chunk in _batched(remote_chunks(self.hub, self.remote, have)):
                sink.write(chunk)
                digest.update(chunk)
                self.progress.downloaded(len(chunk))
                if not self._put(chunk):
                    return
        digest.verify()

    def _put(self, item: Any) -> bool:
        """Queue ``item``; False once the extractor has gone (it failed or finished)."""
        while not self._stopping.is_set():
            try:
                self.queue.put(item, timeout=0.2)
                return True
            except queue.Full:
                continue
        return False

    def chunks(self) -> Iterator[bytes]:
        while not self._ended:
            item = self._next()
            if item is not None:
                yield item

    def finish(self) -> None:
        """Read to the end of the download; raises what the download raised (a failed checksum)."""
        while not self._ended:
            self._next()

    def _next(self) -> bytes | None:
        item = self.queue.get()
        if item is self._END:
            self._ended = True
            return None
        if isinstance(item, BaseException):
            self._ended = True
            raise item
        assert isinstance(item, bytes)
        return item

    def stop(self) -> None:
        self._stopping.set()
        self.join(timeout=2)  # never hold up a shutdown: the thread is a daemon


class _Digest:
    """The ETag check: sha256 for LFS/xet files, git's blob sha1 for regular ones; size always."""

    def __init__(self, remote: RemoteFile) -> None:
        self.remote = remote
        self.size = 0
        etag = (remote.etag or "").lower()
        self.expected = etag if _HEX64.fullmatch(etag) or _HEX40.fullmatch(etag) else None
        if self.expected is not None and len(self.expected) == 40:
            self.hash = hashlib.sha1(b"blob %d\0" % (remote.size or 0))
        else:
            self.hash = hashlib.sha256()

    def update(self, chunk: bytes) -> None:
        self.size += len(chunk)
        if self.expected is not None:
            self.hash.update(chunk)

    def verify(self) -> None:
        if self.size != self.remote.size:
            raise CorruptArchiveError(
                f"{self.remote.path}: got {self.size} bytes, the Hub announced {self.remote.size}", "try again"
            )
        if self.expected is not None and self.hash.hexdigest() != self.expected:
            raise CorruptArchiveError(
                f"{self.remote.path} does not match its checksum on the Hub: the download is corrupt", "try again"
            )


class _Progress:
    """Download progress: a bar on a terminal, otherwise one log line per 10 %."""

    def __init__(self, name: str, total: int) -> None:
        self.name, self.total = name, total
        self.done_bytes = 0
        self.files = 0
        self._next_percent = 10
        self._lock = threading.Lock()
        self._bar: Any = None
        if sys.stderr.isatty():
            from huggingface_hub.utils import are_progress_bars_disabled, tqdm

            if not are_progress_bars_disabled():
                self._bar = tqdm(total=total, unit="B", unit_scale=True, desc=name, leave=False)

    def downloaded(self, count: int) -> None:
        with self._lock:
            self.done_bytes += count
            if self._bar is not None:
                self._bar.update(count)
                return
            percent = 100 * self.done_bytes // max(1, self.total)
            if percent >= self._next_percent and self.done_bytes < self.total:
                self._next_percent = percent // 10 * 10 + 10
                logger.info("dataset: %d%% of %.2f GB, %d files extracted", percent, self.total / GB, self.files)

    def extracted(self, report: extract.ExtractReport) -> None:
        self.files = report.files

    def done(self) -> None:
        if self._bar is not None:
            self._bar.close()


# -- small helpers ------------------------------------------------------------------------------
def _partial_size(partial: Path, total: int) -> int:
    """Bytes of an earlier, interrupted download that can be continued (0 if none or unusable)."""
    try:
        size = partial.stat().st_size
    except OSError:
        return 0
    return size if size <= total else 0


def _batched(chunks: Iterator[bytes]) -> Iterator[bytes]:
    """Network reads (tens of KB) joined into ~1 MB pieces: far fewer steps for the threads to take."""
    pending: list[bytes] = []
    size = 0
    for chunk in chunks:
        pending.append(chunk)
        size += len(chunk)
        if size >= _BATCH_BYTES:
            yield b"".join(pending)
            pending, size = [], 0
    if pending:
        yield b"".join(pending)


def _discard(partial: Path) -> None:
    partial.unlink(missing_ok=True)
    with contextlib.suppress(OSError):
        partial.parent.rmdir()  # only when empty


def _read(path: Path) -> str | None:
    with contextlib.suppress(OSError):
        return path.read_text().strip() or None
    return None


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "-", name).strip("-.")[:100] or "x"
