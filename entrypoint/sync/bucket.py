"""A run's working state in a Hugging Face Storage Bucket: where its files go, and the manifests that name them.

Layout, in the bucket ``CHECKPOINT_BUCKET``, under ``<RUN_NAME>/<run id>/`` (``RunFolder.prefix``)::

    objects/<attempt>/<sha256[:16]>/<relative path>   a file's bytes, one key per content: never overwritten
    manifests/<attempt>-<seq>.json                    one per boundary: every file of it (key, sha256, size,
                                                      epoch), the run id, the attempt that wrote it

A bucket batch is not transactional and a bucket keeps no history, so nothing consistent is ever replaced:
a boundary's objects and its manifest go in one batch to keys no earlier boundary used, and what the new
manifest no longer names is deleted only once it has landed. A manifest counts only when it is *whole*
(every key it names is there, with its size); readers take the newest whole one. A kill, a refusal or a
5xx at any step leaves the previous whole boundary in place. ``<attempt>`` (``new_attempt``) orders the
agents that wrote the run, the newest last: a writer that finds a newer attempt's manifest stops.
The run id in the path keeps another run of the same RUN_NAME (a repo made again) apart: its files are
never read as ours, and never deleted.
"""

from __future__ import annotations

import re
import secrets
import tempfile
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from huggingface_hub.errors import BucketNotFoundError, EntryNotFoundError, HfHubHTTPError
from huggingface_hub.utils import build_hf_headers, get_session, hf_raise_for_status

from ..errors import AccessError
from ..hub import Hub, with_retries
from ..log import logger
from ..retry import status_of
from ..xet import ahead as xetahead
from . import clock, protocol
from .protocol import Manifest as Manifest

MANIFESTS = "manifests"
OBJECTS = "objects"
# Manifests read, newest first, when looking for the newest whole one (a torn boundary or two before it).
_READ_MANIFESTS = 4
# A manifest names a boundary's few dozen files in a few KB: one far larger is not ours, and is not read.
MANIFEST_MAX_BYTES = 1024 * 1024
# Tries of a bucket call: the bucket is one store of three, a failing one is worked around (the repo takes
# the working state, resume reads the others), so it is not waited for as long as the Hub's other calls.
BUCKET_ATTEMPTS = 3
_ATTEMPT = re.compile(r"^(\d{13})-([0-9a-f]{6})$")
_MANIFEST_NAME = re.compile(r"^(\d{13}-[0-9a-f]{6})-(\d{6})\.json$")


class BucketUnavailable(Exception):
    """Buckets cannot be used here (no bucket routes, no Xet, a token without bucket rights)."""

    def __init__(self, message: str, fix: str) -> None:
        super().__init__(message)
        self.fix = fix

    def line(self) -> str:
        return f"{self}; checkpoints go to the model repo as commits instead ({self.fix})"


class ListingContradicted(Exception):
    """A listing answered empty (a 404 included) for a folder in which a key is known to exist: a failed read,
    never an empty folder (sync/protocol.py's ``listing_read``)."""


def default_bucket_id(output_repo: str) -> str:
    """The bucket derived from OUTPUT_REPO: same namespace, ``<name>-checkpoints``."""
    return f"{output_repo}-checkpoints"


def new_attempt(after: str | None = None) -> str:
    """An attempt's id: its start in ms, zero-padded, then random; later than ``after`` (the newest
    attempt seen in the bucket) even on a machine whose clock is behind the last writer's."""
    millis = int(clock.time() * 1000)
    if after is not None and (match := _ATTEMPT.match(after)):
        millis = max(millis, int(match.group(1)) + 1)
    return f"{millis:013d}-{secrets.token_hex(3)}"


@dataclass(frozen=True)
class Bucket:
    """One Storage Bucket and the few calls the agent makes on it, each under the one retry policy. It keeps
    the keys its answers showed there (``_seen``; those it deleted forgotten), so that a listing contradicting
    them is a failed read, never an empty folder."""

    hub: Hub
    bucket_id: str
    _seen: set[str] = field(default_factory=set, compare=False, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, compare=False, repr=False)

    def saw(self, keys: Sequence[str] = (), gone: Sequence[str] = ()) -> None:
        """``keys`` are in the bucket, ``gone`` no longer (a delete of this agent's)."""
        with self._lock:
            self._seen.update(keys)
            self._seen.difference_update(gone)

    def known_under(self, prefix: str) -> list[str]:
        """The keys under ``prefix`` this agent saw in the bucket."""
        with self._lock:
            return [key for key in self._seen if key.startswith(f"{prefix.rstrip('/')}/")]

    def open(self, *, write: bool) -> None:
        """Prove the bucket can be used: created (private) if missing and writable (``write``), else
        readable. Raise ``BucketUnavailable`` when this Hub or this token cannot have one."""
        from huggingface_hub import constants

        if constants.HF_HUB_DISABLE_XET:
            raise BucketUnavailable(
                "HF_HUB_DISABLE_XET is set and Storage Buckets are Xet-only", "unset it, or set CHECKPOINT_BUCKET=off"
            )
        api = self.hub.api
        try:
            if write:
                with_retries(
                    lambda: api.create_bucket(self.bucket_id, private=True, exist_ok=True), "creating the bucket"
                )
            with_retries(lambda: api.bucket_info(self.bucket_id), "reading the bucket")
            if write:  # a fine-grained token may read a bucket it cannot write: ask for what a write needs
                url = f"{api.endpoint}/api/buckets/{self.bucket_id}/xet-write-token"
                headers = build_hf_headers(token=self.hub.token or False)
                with_retries(
                    lambda: hf_raise_for_status(get_session().get(url, headers=headers)), "checking the bucket"
                )
        except BucketNotFoundError:
            raise BucketUnavailable(
                f"HF_TOKEN may not create or read the bucket {self.bucket_id}",
                "give the token write access to buckets, or set CHECKPOINT_BUCKET=off",
            ) from None
        except HfHubHTTPError as error:
            status = status_of(error)
            if status == 404:
                raise BucketUnavailable(
                    f"this Hub has no Storage Buckets (404 on /api/buckets/{self.bucket_id})",
                    "set CHECKPOINT_BUCKET=off to silence this",
                ) from None
            if status in (401, 403):
                raise BucketUnavailable(
                    f"HF_TOKEN may write the model repo but not the bucket {self.bucket_id} (HTTP {status})",
                    "give the token write access to buckets, or set CHECKPOINT_BUCKET=off",
                ) from None
            raise BucketUnavailable(
                f"the bucket {self.bucket_id} cannot be used: {error}", "set CHECKPOINT_BUCKET=off"
            ) from None

    def batch(
        self,
        add: Sequence[tuple[Path | bytes, str]] = (),
        delete: Sequence[str] = (),
        *,
        deadline: float | None = None,
        attempts: int = 2,
        before_retry: Callable[[], None] | None = None,
    ) -> None:
        """One batch: ``(source, key)`` adds in one Xet upload session, in order, then deletes. Not
        transactional: on an error some may have been applied. ``before_retry`` runs before the batch is sent
        again (the lease's check: a writer frozen in its retry's pause must not write on its thaw)."""
        adds: list[tuple[str | Path | bytes, str]] = [
            (str(source) if isinstance(source, Path) else source, key) for source, key in add
        ]
        staged = [source for source, _ in add if isinstance(source, Path)]
        self.saw(gone=list(delete))  # forgotten even when the batch fails: some deletes may have been applied
        try:
            with_retries(
                lambda: self.hub.api.batch_bucket_files(self.bucket_id, add=adds or None, delete=list(delete) or None),
                f"writing to the bucket {self.bucket_id}",
                deadline=deadline,
                attempts=attempts,
                before_retry=before_retry,
            )
        except HfHubHTTPError as error:
            if status_of(error) in (401, 403):
                raise AccessError(
                    f"HF_TOKEN may no longer write the bucket {self.bucket_id}",
                    "give the token write access to buckets, or set CHECKPOINT_BUCKET=off",
                ) from None
            raise
        self.saw([key for _, key in add])
        # A bucket takes this folder's working state: none of its copies is sent to the repo ahead of a commit.
        xetahead.bucket_took(staged)

    def listing(self, prefix: str, *, recursive: bool = True, deadline: float | None = None) -> dict[str, int | None]:
        """``key → size`` under ``prefix`` (``None`` for a folder, when not ``recursive``); empty when absent.
        ``ListingContradicted`` when it answers empty (or 404) for a folder where a key is known to exist."""

        def read() -> dict[str, int | None]:
            found: dict[str, int | None] = {}
            for item in self.hub.api.list_bucket_tree(self.bucket_id, prefix=prefix, recursive=recursive):
                found[item.path] = getattr(item, "size", None) if getattr(item, "type", "file") == "file" else None
            return found

        try:
            found = with_retries(
                read, f"listing the bucket {self.bucket_id}", deadline=deadline, attempts=BUCKET_ATTEMPTS
            )
        except EntryNotFoundError:
            found = {}
        known = self.known_under(prefix)
        if protocol.listing_read(found, known) is protocol.Read.FAILED:
            raise ListingContradicted(
                f"listing {self.bucket_id}/{prefix} answered nothing, but {known[0]} is known to be there"
            )
        self.saw([key for key, size in found.items() if size is not None])
        return found

    def sizes(self, keys: Sequence[str], *, deadline: float | None = None) -> dict[str, int]:
        """``key → size`` of those of ``keys`` the bucket holds."""
        if not keys:
            return {}
        wanted = set(keys)
        found = with_retries(
            lambda: list(self.hub.api.get_bucket_paths_info(self.bucket_id, sorted(wanted))),
            f"reading the bucket {self.bucket_id}",
            deadline=deadline,
            attempts=BUCKET_ATTEMPTS,
        )
        present = {item.path: int(item.size) for item in found if item.path in wanted}
        self.saw(list(present))
        return present

    def download(self, wanted: dict[str, Path], *, deadline: float | None = None) -> None:
        """``key → local path``, in one Xet download; ``EntryNotFoundError`` when a key is missing."""
        if not wanted:
            return
        for local in wanted.values():
            local.parent.mkdir(parents=True, exist_ok=True)
        with_retries(
            lambda: self.hub.api.download_bucket_files(
                self.bucket_id, [(key, local) for key, local in wanted.items()], raise_on_missing_files=True
            ),
            f"downloading from the bucket {self.bucket_id}",
            deadline=deadline,
            attempts=BUCKET_ATTEMPTS,
        )


@dataclass(frozen=True)
class RunFolder:
    """One run's folder in a bucket: ``<RUN_NAME>/<run id>/``."""

    bucket: Bucket
    run_name: str
    run_id: str
    holder: str | None = None  # the attempt the run's lease named at this one's take: whose chain a reader trusts

    @property
    def prefix(self) -> str:
        return f"{self.run_name}/{self.run_id}"

    @property
    def label(self) -> str:
        return f"hf://buckets/{self.bucket.bucket_id}/{self.prefix}"

    def manifest_key(self, attempt: str, seq: int) -> str:
        return f"{self.prefix}/{MANIFESTS}/{attempt}-{seq:06d}.json"

    def object_key(self, attempt: str, sha256: str, relative: str) -> str:
        return f"{self.prefix}/{OBJECTS}/{attempt}/{sha256[:16]}/{relative}"

    def attempt_of(self, key: str) -> str | None:
        """The attempt that wrote ``key`` (a manifest or an object of this folder), or None."""
        rest = key.removeprefix(f"{self.prefix}/")
        if rest.startswith(f"{MANIFESTS}/") and (match := _MANIFEST_NAME.match(rest.split("/", 1)[1])):
            return match.group(1)
        if rest.startswith(f"{OBJECTS}/"):
            attempt = rest.split("/")[1] if rest.count("/") >= 2 else ""
            return attempt if _ATTEMPT.match(attempt) else None
        return None

    def manifest_keys(self, *, deadline: float | None = None) -> list[str]:
        """The manifests of this run, newest first (attempt, then sequence)."""
        found = self.bucket.listing(f"{self.prefix}/{MANIFESTS}", recursive=False, deadline=deadline)
        names = [key for key, size in found.items() if size is not None and _MANIFEST_NAME.match(key.rsplit("/")[-1])]
        oversized = [key for key in names if (found[key] or 0) > MANIFEST_MAX_BYTES]
        for key in oversized:  # never one of ours: not downloaded
            logger.warning("bucket: %s is over %d bytes, not a manifest; ignoring it", key, MANIFEST_MAX_BYTES)
        return sorted((key for key in names if key not in oversized), reverse=True)

    def read_manifests(self, keys: Sequence[str], *, deadline: float | None = None) -> list[Manifest]:
        """``keys`` parsed (one download), in their order; those unreadable or of another run left out."""
        if not keys:
            return []
        with tempfile.TemporaryDirectory(prefix="bucket-manifests-") as scratch:
            wanted = {key: Path(scratch) / f"{n}.json" for n, key in enumerate(keys)}
            try:
                self.bucket.download(wanted, deadline=deadline)
            except EntryNotFoundError:  # one was deleted meanwhile (a writer tidying up): read the others
                present = self.bucket.sizes(list(keys), deadline=deadline)
                wanted = {key: path for key, path in wanted.items() if key in present}
                self.bucket.download(wanted, deadline=deadline)
            manifests = []
            for key, path in wanted.items():
                manifest = Manifest.parse(key, path.read_bytes())
                if manifest is None or manifest.run_id != self.run_id:
                    logger.warning("bucket: %s is not a manifest of this run; ignoring it", key)
                    continue
                manifests.append(manifest)
        return manifests

    def whole_manifests(self, *, deadline: float | None = None) -> list[Manifest]:
        """This run's whole boundaries among its newest manifests: the most epochs first, then the newest."""
        keys = self.manifest_keys(deadline=deadline)
        if self.holder is not None:  # never a later attempt's: it wrote without the lease
            keys = [key for key in keys if (self.attempt_of(key) or "") <= self.holder]
        manifests = self.read_manifests(keys[:_READ_MANIFESTS], deadline=deadline)
        sizes = self.bucket.sizes(sorted(set().union(*(m.keys() for m in manifests))), deadline=deadline)
        whole = protocol.trusted([m for m in manifests if m.whole(sizes)], self.holder)
        for torn in (m for m in manifests if not m.whole(sizes)):
            logger.info("bucket: %s names files the bucket lacks (a boundary cut short); not using it", torn.key)
        return sorted(whole, key=lambda m: (m.epoch, m.key), reverse=True)

    def other_runs(self, *, deadline: float | None = None) -> list[str]:
        """What else lies under ``<RUN_NAME>/``: other runs' folders (another run id: the repo made
        again) or an older layout; never read as this run, never deleted."""
        found = self.bucket.listing(self.run_name, recursive=False, deadline=deadline)
        return sorted(key for key in found if key.rstrip("/") != self.prefix)


def newest_attempt(keys: Sequence[str], folder: RunFolder) -> str | None:
    """The newest attempt that wrote any of ``keys``."""
    attempts = [a for key in keys if (a := folder.attempt_of(key)) is not None]
    return max(attempts, default=None)
