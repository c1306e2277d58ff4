"""The bucket as a store the uploader writes to: each boundary's objects and its manifest in one batch,
to keys no earlier boundary used; what the new manifest no longer names deleted only once it landed.

One ``BucketStore`` is one attempt (one agent process, the holder of the run's lease) writing one run's
folder (bucket.py has the layout). At its start it reads every manifest there (``learn``): its
manifests carry the newest whole one's files forward by key (the ``epoch_N.pt`` snapshots earlier attempts
made, which this volume may not hold), never uploaded again. Its steady state is one copy of each file of the
newest boundary plus, for a moment, the one before. After each landing it lists the folder (``tidy``) and
deletes only what sync/protocol.py's ``deletable`` allows: nothing on a failed listing, nothing named by a
manifest it does not know or by one with more epochs. A manifest of a newer attempt means another container
took the run over, and this one stops (``TakenOverError``) before it writes again.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from .. import libreyolo
from ..errors import TakenOverError
from ..log import logger
from . import clock, protocol
from .bucket import MANIFESTS, Manifest, RunFolder, new_attempt, newest_attempt
from .staging import StagedFile


class BucketStore:
    """One attempt's writes to one run's bucket folder (see ``stores.Store``)."""

    def __init__(self, folder: RunFolder, attempt: str) -> None:
        self.folder = folder
        self.attempt = attempt
        self.current: Manifest | None = None  # the newest boundary of ours known to be whole in the bucket
        self._seq = 0
        self._sent: dict[str, Manifest] = {}  # commit id → the manifest that batch carried
        self._present: set[str] = set()  # object keys of ours known to be in the bucket
        self._base: dict[str, dict[str, Any]] | None = None  # the newest whole manifest's files at the start
        self._known: dict[str, Manifest] = {}  # every manifest whose content this attempt knows, by key
        # Called with the deadline immediately before each batch (the lease's check: TakenOverError, or a read
        # of the lease when the last is a quarter period old), so no earlier call's freeze licenses the write.
        self.before_write: Callable[[float | None], None] = lambda deadline: None

    @classmethod
    def begin(cls, folder: RunFolder, *, attempt: str | None = None, deadline: float | None = None) -> BucketStore:
        """A new attempt on ``folder`` (``attempt``: the one the run's lease names), later than every manifest
        already there."""
        if attempt is not None:
            return cls(folder, attempt)
        return cls(folder, new_attempt(after=newest_attempt(folder.manifest_keys(deadline=deadline), folder)))

    def learn(self, deadline: float | None = None) -> None:
        """Once, with the resume (sync/job.py's ``begin_store``), else before the first boundary: every manifest of
        the folder, and the newest whole one's files to carry forward. A listing or a read that fails raises."""
        if self._base is not None:
            return
        listing = self.folder.bucket.listing(self.folder.prefix, deadline=deadline)
        keys = [key for key in listing if key.startswith(f"{self.folder.prefix}/{MANIFESTS}/")]
        manifests = self.folder.read_manifests(keys, deadline=deadline)
        self._known.update({manifest.key: manifest for manifest in manifests})
        sizes = {key: size for key, size in listing.items() if size is not None}
        whole = protocol.newest_whole(manifests, sizes, self.folder.run_id, self.folder.holder)
        self._base = dict(whole[0].files) if whole else {}
        if whole:
            carried = sorted(rel for rel in whole[0].files if protocol.is_snapshot(rel))
            logger.info("bucket: this attempt's boundaries keep naming %s", ", ".join(carried) or "the newest boundary")

    @property
    def name(self) -> str:
        return self.folder.label

    @property
    def bucket_id(self) -> str:
        return self.folder.bucket.bucket_id

    def head(self) -> str | None:
        """The newest manifest this attempt landed: none at start, so every file goes again under this
        attempt's own keys (Xet sends only chunks the CAS lacks), and no manifest of ours names another
        attempt's object, which that attempt may delete."""
        return self.current.key if self.current is not None else None

    def remote_ids(self) -> dict[str, str]:
        files = self.current.files if self.current is not None else {}
        return {relative: str(entry["sha256"]) for relative, entry in files.items()}

    def commit(self, files: Sequence[StagedFile], message: str, *, deadline: float | None, commit_id: str) -> str:
        self.learn(deadline)
        assert self._base is not None
        self._seq += 1
        entries: dict[str, dict[str, Any]] = {}
        add: list[tuple[Path | bytes, str]] = []
        epoch = _boundary_epoch(files, self.current)
        for item in files:
            key = self.folder.object_key(self.attempt, item.sha256, item.relative)
            entries[item.relative] = {"key": key, "sha256": item.sha256, "size": item.size, "epoch": epoch}
            if item.epochs is not None:  # a checkpoint's epoch is its own, whatever the metrics beside it say
                entries[item.relative]["epoch"] = item.epochs
            if key not in self._present:
                add.append((item.path, key))
        previous = self.current.files if self.current is not None else {}
        manifest = Manifest(
            key=self.folder.manifest_key(self.attempt, self._seq),
            run_id=self.folder.run_id,
            run_name=self.folder.run_name,
            attempt=self.attempt,
            seq=self._seq,
            commit=commit_id,
            epoch=epoch,
            written_at=clock.time(),
            files=protocol.next_files(self._base, previous, entries),
        )
        self._sent[commit_id] = manifest
        self._known[manifest.key] = manifest
        # The manifest last: a reader of the bucket sees the objects before the manifest naming them.
        self.before_write(deadline)
        self.folder.bucket.batch(
            [*add, (manifest.to_bytes(), manifest.key)],
            deadline=deadline,
            before_retry=lambda: self.before_write(deadline),
        )
        self._took(manifest)
        return manifest.key

    def landed(self, commit_id: str, *, deadline: float | None) -> str | None:
        """A batch without an answer landed if its manifest and every object it names are there."""
        manifest = self._sent.get(commit_id)
        if manifest is None:
            return None
        sizes = self.folder.bucket.sizes([manifest.key, *sorted(manifest.keys())], deadline=deadline)
        if manifest.key not in sizes or not manifest.whole(sizes):
            return None
        logger.info("bucket: boundary %s had landed before its answer was lost", manifest.key.rsplit("/", 1)[-1])
        self._took(manifest)
        return manifest.key

    def tidy(self, *, deadline: float | None) -> None:
        """Delete what sync/protocol.py's ``deletable`` allows after a landing (earlier boundaries, earlier
        attempts, batches cut short), after checking that no newer attempt writes this run. A listing that
        fails raises: nothing is deleted, tried again after the next boundary."""
        if self.current is None:
            return
        found = self.folder.bucket.listing(self.folder.prefix, deadline=deadline)
        manifests = [key for key in found if key.startswith(f"{self.folder.prefix}/{MANIFESTS}/")]
        newest = newest_attempt(manifests, self.folder)
        if newest is not None and newest > self.attempt:
            raise TakenOverError(
                f"another agent (attempt {newest}) writes this run's working state to {self.name} since this"
                f" one (attempt {self.attempt}) started; this one stops writing and training",
                "leave the newer one running; to continue here instead, stop it, then start this one again",
            )
        unknown = [key for key in manifests if key not in self._known]
        if unknown:  # another attempt's, written since this one started: what it names must be known
            self._known.update({m.key: m for m in self.folder.read_manifests(unknown, deadline=deadline)})
        listing = protocol.Listing(protocol.Read.COMPLETE, {k: v for k, v in found.items() if v is not None})
        garbage = sorted(
            protocol.deletable(listing, self.current, self._known, self.attempt, self.folder.attempt_of, holder=True)
        )
        if garbage:
            self.before_write(deadline)
            self.folder.bucket.batch(
                delete=garbage, deadline=deadline, before_retry=lambda: self.before_write(deadline)
            )
            self._present -= set(garbage)
            for key in garbage:
                self._known.pop(key, None)

    def _took(self, manifest: Manifest) -> None:
        if self.current is None or manifest.seq >= self.current.seq:
            self.current = manifest
        self._present |= manifest.keys()
        self._sent = {commit: sent for commit, sent in self._sent.items() if sent.seq > manifest.seq}


def _boundary_epoch(files: Sequence[StagedFile], current: Manifest | None) -> int:
    """The epoch a boundary records: its metrics.jsonl's last row, else the newest the folder knew."""
    metrics = next((item.path for item in files if item.relative == libreyolo.METRICS_FILE), None)
    epoch = libreyolo.last_recorded_epoch(metrics) if metrics is not None else None
    if epoch is None:
        epoch = current.epoch if current is not None else 0
    return epoch
