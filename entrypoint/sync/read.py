"""The read side of the sync: where the newest valid copy of this run is, across the volume, its bucket and
OUTPUT_REPO, and the newest trainbox.json of a run from any machine.

A copy counts when its bytes are whole (its size and sha256 as its store recorded them: the bucket's
manifest, the repo's LFS pointer), it loads (sync/checkpoint.py), and it is this run's (the bucket folder
of this run id; the repo that ``check_same_run`` accepted). ``find_newest`` takes the newest of the three
and brings its history along (``restore_history``: one place for every store). training/resume.py decides
with what it finds; nothing here imports the training wing.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from huggingface_hub.errors import EntryNotFoundError

from .. import libreyolo
from ..errors import StopRequested, StoreUnreadableError
from ..hub import Hub
from ..log import logger
from ..retry import describe
from ..state import STATE_FILE
from . import checkpoint, clock, protocol
from .bucket import Bucket, Manifest, RunFolder
from .lease import LEASE_FILE
from .staging import sha256_of

# The run folder's history, brought along with a checkpoint from a store, so the run keeps its rows
# and its best weights (training/resume.py adds the console log).
HISTORY = (*libreyolo.HISTORY_FILES, libreyolo.BEST_CHECKPOINT)
# Files a new repo may hold before any run: they prove nothing and belong to no run.
NOT_A_RUN = frozenset({".gitattributes", "README.md", LEASE_FILE})
# Reads of the bucket begun again when a writer tidied away the boundary being read.
_READS = 3


@dataclass(frozen=True)
class Copy:
    """A valid checkpoint of this run and where it came from: ``volume``, ``bucket`` or ``hub``."""

    path: Path
    info: checkpoint.CheckpointInfo
    source: str
    # When the repo won: its files, which the volume's older copies must never overwrite.
    hub_files: frozenset[str] = frozenset()

    @property
    def epochs(self) -> int:
        return self.info.completed_epochs or 0


class Source(Protocol):
    """A store's files of this run, as the read side needs them."""

    label: str

    def names(self) -> Sequence[str]: ...

    def epochs_hint(self, name: str) -> int | None:
        """What the store says of a checkpoint's epochs before it is downloaded (None: nothing)."""
        ...

    def same_as(self, name: str, local: Path) -> bool:
        """The store's ``name`` has the bytes of ``local`` (no download needed)."""
        ...

    def fetch(self, name: str, scratch: Path) -> Path | None:
        """``name`` downloaded under ``scratch`` and checked whole, or None."""
        ...


class RepoSource:
    """OUTPUT_REPO at its head, or at ``revision`` (node 0's commit, for several machines)."""

    def __init__(self, hub: Hub, repo_id: str, files: dict[str, Any], revision: str | None = None) -> None:
        self.hub, self.repo_id, self.files, self.revision = hub, repo_id, files, revision
        self.label = "on the Hub"

    def names(self) -> Sequence[str]:
        return list(self.files)

    def epochs_hint(self, name: str) -> int | None:
        match = libreyolo.EPOCH_CHECKPOINT.match(name)
        return int(match.group(1)) if match else None

    def same_as(self, name: str, local: Path) -> bool:
        lfs = getattr(self.files.get(name), "lfs", None)
        remote = getattr(lfs, "sha256", None) if lfs is not None else None
        return remote is not None and local.is_file() and sha256_of(local) == remote

    def fetch(self, name: str, scratch: Path) -> Path | None:
        return self.hub.download(self.repo_id, name, scratch / "repo", revision=self.revision)


class BucketSource:
    """One whole boundary of this run in its bucket (a manifest): every byte checked against it. A writer
    deletes a boundary's objects once a newer one landed, so what a reader needs of it is fetched in one
    download (``prefetch``); one gone meanwhile is ``EntryNotFoundError``, and the reader reads again."""

    def __init__(self, folder: RunFolder, manifest: Manifest) -> None:
        self.folder, self.manifest = folder, manifest
        self.label = f"in {folder.label} (epoch {manifest.epoch})"
        self._fetched: dict[str, Path | None] = {}

    def names(self) -> Sequence[str]:
        return list(self.manifest.files)

    def epochs_hint(self, name: str) -> int | None:
        return int(self.manifest.files[name].get("epoch") or 0)

    def same_as(self, name: str, local: Path) -> bool:
        return local.is_file() and sha256_of(local) == self.manifest.files[name]["sha256"]

    def prefetch(self, names: Sequence[str], scratch: Path) -> None:
        """Download those of ``names`` this boundary holds, in one call, each checked against the manifest."""
        todo = {n: scratch / "bucket" / n for n in names if n in self.manifest.files and n not in self._fetched}
        self.folder.bucket.download({self.manifest.files[n]["key"]: local for n, local in todo.items()})
        for name, local in todo.items():
            entry = self.manifest.files[name]
            whole = local.stat().st_size == entry["size"] and sha256_of(local) == entry["sha256"]
            if not whole:
                logger.warning("resume: %s %s does not match its manifest; not using it", name, self.label)
            self._fetched[name] = local if whole else None

    def fetch(self, name: str, scratch: Path) -> Path | None:
        if name not in self._fetched:
            self.prefetch([name], scratch)
        return self._fetched.get(name)


# -- the volume ---------------------------------------------------------------------------------
def valid(path: Path) -> checkpoint.CheckpointInfo | None:
    try:
        info = checkpoint.inspect(path)
    except checkpoint.InvalidCheckpoint as error:
        logger.warning("resume: %s is not usable: %s", path.name, error)
        return None
    return info if info.completed_epochs is not None else None


def _local_candidates(run_dir: Path) -> list[Path]:
    weights = run_dir / libreyolo.WEIGHTS_DIR
    epochs = sorted(weights.glob(libreyolo.EPOCH_GLOB), key=lambda p: int(re.sub(r"\D", "", p.stem) or 0), reverse=True)
    return [weights / libreyolo.LAST_NAME, *epochs]


def newest_local(run_dir: Path) -> tuple[Path, checkpoint.CheckpointInfo] | None:
    """The volume's checkpoint to resume from: the newest, unless libreyolo never recorded its epoch.

    libreyolo writes ``last.pt`` (and ``epoch_N.pt``) before the epoch's metrics.jsonl row: a kill in
    between leaves a checkpoint whose row would be missing forever. That epoch counts as in progress
    and is redone from the checkpoint of the last recorded one, when that costs no more than it."""
    found = [(path, info) for path in _local_candidates(run_dir) if path.is_file() and (info := valid(path))]
    if not found:
        return None
    newest = max(found, key=lambda item: item[1].completed_epochs or 0)
    recorded = libreyolo.recorded_epochs(run_dir)
    newest_epochs = newest[1].completed_epochs or 0
    if recorded is None or newest_epochs <= recorded:
        return newest
    if recorded == 0 and newest_epochs == 1:
        logger.info("resume: epoch 1 was saved but never recorded (cut off): starting it again")
        return None
    for path, info in found:
        if info.completed_epochs == recorded and recorded == newest_epochs - 1:
            logger.info("resume: epoch %d was saved but never recorded (cut off): redoing it", newest_epochs)
            return path, info
    logger.warning("resume: epoch %d has no row in metrics.jsonl (cut off before libreyolo wrote it)", newest_epochs)
    return newest


# -- a store ------------------------------------------------------------------------------------
def newest_in(
    source: Source, scratch: Path, better_than: int, local: Path | None = None, *, local_counts: bool = False
) -> tuple[Path, checkpoint.CheckpointInfo] | None:
    """The store's newest valid checkpoint with more than ``better_than`` epochs. ``local``: the
    volume's last.pt; a store copy with its bytes is skipped (the volume was judged already), or, with
    ``local_counts``, taken from the volume instead of downloaded."""
    names = source.names()
    numbered = [n for n in names if libreyolo.EPOCH_CHECKPOINT.match(n)]
    candidates = ([libreyolo.LAST_CHECKPOINT] if libreyolo.LAST_CHECKPOINT in names else []) + numbered
    # Unknown epochs first (a repo's last.pt: the newest by construction), then the most epochs.
    candidates.sort(key=lambda n: (source.epochs_hint(n) is None, source.epochs_hint(n) or 0), reverse=True)
    for name in candidates:
        hint = source.epochs_hint(name)
        if hint is not None and hint <= better_than:
            continue
        if local is not None and name == libreyolo.LAST_CHECKPOINT and source.same_as(name, local):
            if not local_counts:
                continue
            info = valid(local)
            if info is not None and (info.completed_epochs or 0) > better_than:
                return local, info
            continue
        path = source.fetch(name, scratch)
        info = valid(path) if path is not None else None
        if path is None or info is None:
            logger.warning("resume: %s %s is corrupt; trying the next newest checkpoint", name, source.label)
            continue
        if (info.completed_epochs or 0) > better_than:
            logger.info("resume: %s %s has %d epochs", name, source.label, info.completed_epochs)
            return path, info
    return None


def restore_history(source: Source, run_dir: Path, scratch: Path, names: Sequence[str] = HISTORY) -> None:
    """A store's checkpoint won: bring its run history along (each file checked whole), so metrics keep
    every epoch and the best weights stay the run's."""
    run_dir.mkdir(parents=True, exist_ok=True)
    present = set(source.names())
    for name in names:
        if name not in present:
            continue
        fetched = source.fetch(name, scratch / "history")
        if fetched is not None:
            (run_dir / name).parent.mkdir(parents=True, exist_ok=True)
            os.replace(fetched, run_dir / name)


def bucket_sources(
    folder: RunFolder,
    *,
    say_others: bool = True,
    run_known: bool | None = None,
    read_for: float = 0.0,
    began: float | None = None,
    quiet: bool = False,
) -> list[BucketSource]:
    """This run's whole boundaries in its bucket, the most epochs first. A bucket that cannot be read is not
    an empty bucket (sync/protocol.py): with ``run_known`` set, its read is tried again for ``read_for``
    seconds; then, when the repo knows the run (True), ``StoreUnreadableError`` (exit 73: a fresh start would
    lose the epochs only the bucket holds); else (False, or None: a reader that only looks) none.
    Another run's folder under the same RUN_NAME is said in one line (``say_others``) and left alone.
    ``began``: when the resume's first read of the bucket began (its deadline counts from there)."""
    began = clock.monotonic() if began is None else began
    while True:
        try:
            manifests = folder.whole_manifests()
            break
        except StopRequested:
            raise
        except Exception as error:
            if quiet:  # a look ahead (the bucket not opened yet): a failed read is no news
                return []
            if not _read_again(folder, error, began, run_known, read_for):
                return []
    if not manifests and say_others:
        try:
            others = folder.other_runs()
        except StopRequested:
            raise
        except Exception:
            others = []
        if others:
            logger.warning(
                "resume: hf://buckets/%s/%s/ holds another run's state (%s), not run %s's: not resumed, left as it is",
                folder.bucket.bucket_id,
                folder.run_name,
                ", ".join(o.rsplit("/", 1)[-1] for o in others[:3]),
                folder.run_id,
            )
    return [BucketSource(folder, manifest) for manifest in manifests]


def _read_again(folder: RunFolder, error: Exception, began: float, run_known: bool | None, read_for: float) -> bool:
    """A read of the bucket at resume failed (a listing, a manifest, an object's download): True after a pause
    while the deadline allows (``run_known`` set); ``StoreUnreadableError`` once it passed and the repo knows the
    run; False (go on without the bucket) for a new run or a reader that only looks."""
    waited = clock.monotonic() - began
    decision = protocol.bucket_read(protocol.Read.FAILED, waited, bool(run_known), read_for)
    if run_known is not None and decision is protocol.BucketRead.RETRY:
        logger.warning("resume: cannot read %s (%s); reading it again", folder.label, describe(error))
        clock.sleep(min(5.0, max(0.5, read_for / 10)))
        return True
    if run_known is not None and decision is protocol.BucketRead.REFUSE:
        raise StoreUnreadableError(
            f"cannot read {folder.label} for {waited:.0f} s ({describe(error)}), and the run's newest epochs"
            " may be there alone: not starting over, nothing written",
            "start it again once the bucket answers (a retryable exit)",
        ) from None
    logger.warning("resume: cannot read %s (%s); using the volume and the repo", folder.label, describe(error))
    return False


def _newest_in_bucket(
    folder: RunFolder,
    scratch: Path,
    better_than: int,
    local_last: Path,
    local_counts: bool,
    history: Sequence[str],
    run_known: bool | None,
    read_for: float,
) -> tuple[Copy, BucketSource] | None:
    began, moved = clock.monotonic(), 0
    while moved < _READS:
        try:
            for source in bucket_sources(folder, run_known=run_known, read_for=read_for, began=began):
                last = libreyolo.LAST_CHECKPOINT
                if last in source.manifest.files and (source.epochs_hint(last) or 0) > better_than:
                    wanted = [] if source.same_as(last, local_last) else [last]
                    source.prefetch([*wanted, *history], scratch)  # the boundary's files together
                found = newest_in(source, scratch, better_than, local_last, local_counts=local_counts)
                if found is not None:
                    return Copy(found[0], found[1], "bucket"), source
            return None
        except EntryNotFoundError:
            moved += 1
            logger.info("resume: %s moved on while it was read (a writer tidied up); reading it again", folder.label)
        except (StopRequested, StoreUnreadableError):
            raise
        except Exception as error:  # a download that fails is a failed read too: to the listing's deadline
            if not _read_again(folder, error, began, run_known, read_for):
                return None
    return None


def find_newest(
    run_dir: Path,
    work_dir: Path,
    *,
    volume: bool = True,
    folder: RunFolder | None = None,
    hub: Hub | None = None,
    repo_id: str | None = None,
    revision: str | None = None,
    history: Sequence[str] = HISTORY,
    run_known: bool | None = None,
    read_for: float = 0.0,
) -> Copy | None:
    """The newest valid checkpoint of this run on the volume, in its bucket (whole boundaries of this
    run id only) or in OUTPUT_REPO, copied to weights/last.pt with its history.
    ``volume=False``: the stores alone (what every node of a multi-node training can see);
    ``revision``: the repo as it was at that commit (node 0's, so every node picks the same epoch);
    ``run_known``, ``read_for``: a bucket that cannot be read (``bucket_sources``)."""
    local_last = run_dir / libreyolo.LAST_CHECKPOINT
    found = newest_local(run_dir) if volume else None
    best = Copy(found[0], found[1], "volume") if found else None
    winner: Source | None = None
    scratch = Path(tempfile.mkdtemp(prefix="resume-", dir=work_dir))
    try:
        if folder is not None:
            in_bucket = _newest_in_bucket(
                folder, scratch, best.epochs if best else 0, local_last, not volume, history, run_known, read_for
            )
            if in_bucket is not None:
                best, winner = in_bucket
        if hub is not None and repo_id is not None and (revision or hub.head(repo_id)):
            files = {entry.path: entry for entry in hub.list_files(repo_id, revision=revision)}
            repo = RepoSource(hub, repo_id, files, revision)
            remote = newest_in(repo, scratch, best.epochs if best else 0, local_last, local_counts=not volume)
            if remote is not None:
                best, winner = Copy(remote[0], remote[1], "hub", frozenset(files)), repo
        if best is None:
            return None
        if winner is not None:
            restore_history(winner, run_dir, scratch, history)
        target = run_dir / libreyolo.LAST_CHECKPOINT
        if best.path != target:
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(best.path, target.with_name(".last.pt.resume"))
            os.replace(target.with_name(".last.pt.resume"), target)
        return Copy(target, best.info, best.source, best.hub_files)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def hub_newer(hub: Hub, repo_id: str, run_dir: Path, work_dir: Path) -> frozenset[str]:
    """The repo's files when it holds a newer epoch of this run than the volume (``trainbox sync`` on an
    older volume): none of them is overwritten by the volume's older copy until training writes it again."""
    if hub.head(repo_id) is None:
        return frozenset()
    local = newest_local(run_dir)
    local_epochs = (local[1].completed_epochs or 0) if local else 0
    files = {entry.path: entry for entry in hub.list_files(repo_id)}
    work_dir.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix="newer-", dir=work_dir))
    try:
        remote = newest_in(RepoSource(hub, repo_id, files), scratch, local_epochs, run_dir / libreyolo.LAST_CHECKPOINT)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    if remote is None:
        return frozenset()
    logger.warning(
        "sync: %s holds epoch %s, this volume only %d: its older files stay off the Hub until written again",
        repo_id,
        remote[1].completed_epochs,
        local_epochs,
    )
    return frozenset(files) - {STATE_FILE}


# -- trainbox.json ----------------------------------------------------------------------------------
def remote_names(hub: Hub, repo_id: str) -> set[str]:
    """The files of OUTPUT_REPO (none for an empty or new repo)."""
    return {entry.path for entry in hub.list_files(repo_id)} if hub.head(repo_id) else set()


def _state_of(path: Path, where: str) -> dict[str, Any] | None:
    try:
        state = json.loads(path.read_text())
        if not isinstance(state, dict):
            raise ValueError("not a JSON object")
        return state
    except ValueError:
        logger.warning("resume: %s in %s is unreadable; ignoring its history", STATE_FILE, where)
        return None


def remote_state(hub: Hub, repo_id: str, scratch: Path, names: set[str] | None = None) -> dict[str, Any] | None:
    """trainbox.json as OUTPUT_REPO holds it (None for an empty or new repo)."""
    names = remote_names(hub, repo_id) if names is None else names
    if STATE_FILE not in names:
        return None
    return _state_of(hub.download(repo_id, STATE_FILE, scratch), repo_id)


def bucket_state(
    folder: RunFolder, scratch: Path, *, max_bytes: int | None = None, quiet: bool = False
) -> dict[str, Any] | None:
    """trainbox.json of this run's newest whole boundary in its bucket (None: none there, or unreadable; or,
    with ``max_bytes``, larger than that by its manifest: not downloaded)."""
    for _ in range(_READS):
        try:
            for source in bucket_sources(folder, say_others=False, quiet=quiet):
                entry = source.manifest.files.get(STATE_FILE)
                size = entry.get("size") if isinstance(entry, dict) else None
                if entry is not None and max_bytes is not None and (not isinstance(size, int) or size > max_bytes):
                    logger.warning("%s in %s is over %d bytes: not read", STATE_FILE, folder.label, max_bytes)
                    return None
                fetched = source.fetch(STATE_FILE, scratch) if entry is not None else None
                if fetched is not None:
                    return _state_of(fetched, folder.label)
            return None
        except EntryNotFoundError:
            continue  # a writer tidied that boundary away meanwhile: the newer one is there
        except StopRequested:
            raise
        except Exception as error:
            say = logger.debug if quiet else logger.warning  # quiet: a look ahead, the bucket not opened yet
            say("cannot read %s from %s (%s)", STATE_FILE, folder.label, describe(error))
            return None
    return None


def newest_state(hub: Hub, repo_id: str, work_dir: Path) -> dict[str, Any] | None:
    """The newest trainbox.json of the run OUTPUT_REPO holds, read from its working store: the bucket its
    trainbox.json names (every boundary carries one), or the repo itself (no bucket, or it fell back)."""
    work_dir.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix="state-", dir=work_dir))
    try:
        in_repo = remote_state(hub, repo_id, scratch)
        storage = (in_repo or {}).get("storage") or {}
        run_name, run_id = (in_repo or {}).get("run_name"), (in_repo or {}).get("run_id")
        if not (isinstance(storage, dict) and storage.get("bucket") and run_name and run_id):
            return in_repo
        folder = RunFolder(Bucket(hub, str(storage["bucket"])), str(run_name), str(run_id))
        in_bucket = bucket_state(folder, scratch)
        candidates = [s for s in (in_repo, in_bucket) if s is not None]
        return max(candidates, key=lambda s: str(s.get("updated_at") or ""), default=None)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
