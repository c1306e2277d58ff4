"""The run's working state in a Hugging Face Storage Bucket: overwritten in place, no history.

Every epoch boundary's files (``weights/last.pt``, ``epoch_N.pt``, ``status.json``, ``metrics.jsonl``
…) go to ``<bucket>/<run name>/``, replacing the previous version: a bucket keeps no history, so a
300-epoch run stores one ``last.pt``, not 300. A bucket batch is not transactional, so each boundary
is two batches: the files first, then ``manifest.json`` (per file: sha256, size, epoch). Resume
trusts a bucket file only when its bytes match the manifest: an agent killed between the two
batches leaves files the manifest does not describe, and they are never loaded.

``BucketTarget`` gives the uploader of sync.py the four calls it makes on the Hub (commit, landed,
head, remote_ids), so the same snapshotter, committer, ledger and flush deadlines serve the bucket.
"""

from __future__ import annotations

import hashlib
import json
import re
import tempfile
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from huggingface_hub.errors import BucketNotFoundError, HfHubHTTPError
from huggingface_hub.utils import build_hf_headers, get_session, hf_raise_for_status

from .. import libreyolo
from ..errors import AccessError, StopRequested
from ..hub import Hub, with_retries
from ..log import logger
from ..retry import describe, status_of
from . import checkpoint

MANIFEST = "manifest.json"
MANIFEST_FORMAT = 1
# Restored with a checkpoint from the bucket, so the run keeps its history and its best weights.
_HISTORY = (*libreyolo.HISTORY_FILES, libreyolo.BEST_CHECKPOINT)
_EPOCH_NAME = re.compile(r"(?:^|/)epoch_(\d+)\.pt$")


class CommitTarget(Protocol):
    """What the uploader (sync.py) needs of the place it writes to: the Hub's model repo or a bucket."""

    def commit(
        self,
        repo_id: str,
        files: Sequence[tuple[str, Path]],
        message: str,
        *,
        deadline: float | None = None,
        commit_id: str | None = None,
    ) -> str: ...

    def landed(self, repo_id: str, commit_id: str, *, deadline: float | None = None) -> str | None: ...

    def head(self, repo_id: str) -> str | None: ...

    def remote_ids(self, repo_id: str) -> dict[str, str]: ...


class BucketUnavailable(Exception):
    """Buckets cannot be used here (no bucket routes, no Xet, a token without bucket rights)."""

    def __init__(self, message: str, fix: str) -> None:
        super().__init__(message)
        self.fix = fix

    def line(self) -> str:
        return f"{self}; checkpoints go to the model repo as commits instead ({self.fix})"


def default_bucket_id(output_repo: str) -> str:
    """The bucket derived from OUTPUT_REPO: same namespace, ``<name>-checkpoints``."""
    return f"{output_repo}-checkpoints"


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while chunk := handle.read(4 * 1024 * 1024):
            digest.update(chunk)
    return digest.hexdigest()


@dataclass(frozen=True)
class Store:
    """One run's folder in one bucket: ``bucket_id`` and ``prefix`` (the run name)."""

    hub: Hub
    bucket_id: str
    prefix: str

    def key(self, relative: str) -> str:
        return f"{self.prefix}/{relative}"

    def open(self) -> None:
        """Create the bucket (private) if missing and prove it can be written; raise
        ``BucketUnavailable`` when this Hub or this token cannot have one."""
        from huggingface_hub import constants

        if constants.HF_HUB_DISABLE_XET:
            raise BucketUnavailable(
                "HF_HUB_DISABLE_XET is set and Storage Buckets are Xet-only", "unset it, or set CHECKPOINT_BUCKET=off"
            )
        api = self.hub.api
        try:
            with_retries(lambda: api.create_bucket(self.bucket_id, private=True, exist_ok=True), "creating the bucket")
            with_retries(lambda: api.bucket_info(self.bucket_id), "reading the bucket")
            # A fine-grained token may read a bucket it cannot write: ask for what a write needs.
            url = f"{api.endpoint}/api/buckets/{self.bucket_id}/xet-write-token"
            headers = build_hf_headers(token=self.hub.token or False)
            with_retries(lambda: hf_raise_for_status(get_session().get(url, headers=headers)), "checking the bucket")
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

    def upload(self, files: Sequence[tuple[str, Path | bytes]], deadline: float | None = None) -> None:
        adds: list[tuple[str | Path | bytes, str]] = [
            (str(source) if isinstance(source, Path) else source, self.key(rel)) for rel, source in files
        ]
        try:
            with_retries(
                lambda: self.hub.api.batch_bucket_files(self.bucket_id, add=adds),
                f"uploading to the bucket {self.bucket_id}",
                deadline=deadline,
            )
        except HfHubHTTPError as error:
            if status_of(error) in (401, 403):
                raise AccessError(
                    f"HF_TOKEN may no longer write the bucket {self.bucket_id}",
                    "give the token write access to buckets, or set CHECKPOINT_BUCKET=off",
                ) from None
            raise

    def manifest(self) -> dict[str, Any] | None:
        """The run's manifest, or None when the bucket holds none (a new run, or torn)."""
        with tempfile.TemporaryDirectory(prefix="bucket-manifest-") as scratch:
            path = Path(scratch) / MANIFEST
            if not self.download({MANIFEST: path}):
                return None
            try:
                data = json.loads(path.read_text())
            except (OSError, ValueError):
                logger.warning("bucket: %s/%s is unreadable; ignoring it", self.bucket_id, self.key(MANIFEST))
                return None
        if not isinstance(data, dict) or not isinstance(data.get("files"), dict):
            return None
        return data

    def sizes(self, relatives: Sequence[str]) -> dict[str, int]:
        """``relative → size`` of the files the bucket holds among ``relatives``."""
        keys = {self.key(rel): rel for rel in relatives}
        found = with_retries(
            lambda: list(self.hub.api.get_bucket_paths_info(self.bucket_id, list(keys))), "listing the bucket"
        )
        return {keys[item.path]: item.size for item in found if item.path in keys}

    def download(self, wanted: dict[str, Path]) -> bool:
        """Download ``relative → local path``; False when one of them is not in the bucket."""
        present = self.sizes(list(wanted))
        if set(present) != set(wanted):
            return False
        for local in wanted.values():
            local.parent.mkdir(parents=True, exist_ok=True)
        with_retries(
            lambda: self.hub.api.download_bucket_files(
                self.bucket_id, [(self.key(rel), local) for rel, local in wanted.items()], raise_on_missing_files=True
            ),
            "downloading from the bucket",
        )
        return True


class BucketTarget:
    """The bucket as the uploader's commit target: each "commit" is the files, then the manifest."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.files: dict[str, dict[str, Any]] = {}  # the manifest's entries as last written or read

    def head(self, repo_id: str) -> str | None:
        manifest = self.store.manifest()
        self.files = dict(manifest["files"]) if manifest else {}
        return str(manifest.get("commit")) if manifest else None

    def remote_ids(self, repo_id: str) -> dict[str, str]:
        return {rel: str(entry.get("sha256")) for rel, entry in self.files.items()}

    def landed(self, repo_id: str, commit_id: str, *, deadline: float | None = None) -> str | None:
        manifest = self.store.manifest()
        if manifest is not None and manifest.get("commit") == commit_id:
            self.files = dict(manifest["files"])
            return commit_id
        return None

    def commit(
        self,
        repo_id: str,
        files: Sequence[tuple[str, Path]],
        message: str,
        *,
        deadline: float | None = None,
        commit_id: str | None = None,
    ) -> str:
        commit_id = commit_id or uuid.uuid4().hex
        metrics = dict(files).get(libreyolo.METRICS_FILE)
        epoch = libreyolo.last_recorded_epoch(metrics) if metrics is not None else None
        if epoch is None:
            epoch = max((int(e.get("epoch") or 0) for e in self.files.values()), default=0)
        entries = {rel: {"sha256": sha256_of(path), "size": path.stat().st_size, "epoch": epoch} for rel, path in files}
        for rel, path in files:
            if rel.endswith(".pt"):  # a checkpoint's epoch is its own, whatever the metrics beside it say
                numbered = _EPOCH_NAME.search(rel)
                entries[rel]["epoch"] = _completed_epochs(path) or (int(numbered.group(1)) if numbered else epoch)
        # Weights first: a kill now leaves files the manifest does not describe, never trusted.
        self.store.upload(list(files), deadline)
        described = {**self.files, **entries}
        manifest = {
            "format": MANIFEST_FORMAT,
            "commit": commit_id,
            "epoch": epoch,
            "written_at": time.time(),
            "files": described,
        }
        self.store.upload([(MANIFEST, json.dumps(manifest, indent=1).encode())], deadline)
        self.files = described
        return commit_id


def _completed_epochs(path: Path) -> int | None:
    """The epochs a staged checkpoint holds (checked whole when staged: only its pickle is read again)."""
    try:
        return checkpoint.inspect(path, check_crc=False).completed_epochs
    except checkpoint.InvalidCheckpoint:
        return None


def newest(
    store: Store, scratch: Path, better_than: int, run_dir: Path
) -> tuple[Path, checkpoint.CheckpointInfo] | None:
    """The bucket's newest checkpoint whose bytes match its manifest, if newer than ``better_than``
    epochs; its history files come along when they match too."""
    try:
        manifest = store.manifest()
        if manifest is None:
            return None
        files: dict[str, dict[str, Any]] = manifest["files"]
        candidates = sorted(
            (rel for rel in files if rel.endswith(".pt") and rel != libreyolo.BEST_CHECKPOINT),
            key=lambda rel: int(files[rel].get("epoch") or 0),
            reverse=True,
        )
        sizes = store.sizes(candidates + [h for h in _HISTORY if h in files])
        for rel in candidates:
            entry = files[rel]
            if int(entry.get("epoch") or 0) <= better_than:
                break
            if sizes.get(rel) != entry.get("size"):
                logger.warning("resume: the bucket's %s does not match its manifest; not using it", rel)
                continue
            local = scratch / "bucket" / rel
            if not store.download({rel: local}) or sha256_of(local) != entry.get("sha256"):
                logger.warning("resume: the bucket's %s does not match its manifest; not using it", rel)
                continue
            try:
                info = checkpoint.inspect(local)
            except checkpoint.InvalidCheckpoint as error:
                logger.warning("resume: the bucket's %s is not usable: %s", rel, error)
                continue
            if info.completed_epochs is None or info.completed_epochs <= better_than:
                continue
            logger.info("resume: %s in the bucket %s has %d epochs", rel, store.bucket_id, info.completed_epochs)
            _restore_history(store, files, sizes, scratch, run_dir)
            return local, info
    except StopRequested:
        raise
    except Exception as error:  # the bucket is one of three places: never a reason not to resume
        logger.warning(
            "resume: cannot read the bucket %s (%s); using the volume and the repo", store.bucket_id, describe(error)
        )
    return None


def _restore_history(
    store: Store, files: dict[str, dict[str, Any]], sizes: dict[str, int], scratch: Path, run_dir: Path
) -> None:
    for name in _HISTORY:
        entry = files.get(name)
        if entry is None or sizes.get(name) != entry.get("size"):
            continue
        local = scratch / "bucket-history" / name
        if store.download({name: local}) and sha256_of(local) == entry.get("sha256"):
            (run_dir / name).parent.mkdir(parents=True, exist_ok=True)
            local.replace(run_dir / name)
