"""Resume after preemption, on the same disk or on a new machine, with no human.

At start the agent looks for the newest valid checkpoint of its RUN_NAME on the volume and in
OUTPUT_REPO (the Hub is the source of truth when the disk is new), and continues from the later
one with LibreYOLO's ``resume=true``. A run whose epochs are all done is not trained again. A
run that failed the same way three times in a row is not started a fourth time.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .. import libreyolo, procs, run_args
from ..errors import ConfigError, CrashLoopError, PreemptedError, SyncError, UserInterruptError
from ..hub import Hub
from ..log import logger
from ..run_args import RunArgs
from ..state import STATE_FILE
from ..sync import checkpoint
from ..sync.bucket import Store, sha256_of
from ..sync.bucket import newest as newest_in_bucket
from .process import CONSOLE_LOG

CRASH_LOOP_LENGTH = 3
# Attempts that say nothing about the run's health: a preemption is not a crash.
# A lost attempt (the agent killed without a word) is the platform's doing, like a preemption.
_NOT_FAILURES = {
    "success",
    "already_complete",
    PreemptedError.reason,
    UserInterruptError.reason,
    CrashLoopError.reason,
    "lost",
    # Trained, only the upload failed (a Hub outage): the next start must be let through to upload it.
    SyncError.reason,
}
# The run folder's history, restored with a checkpoint from the Hub so it keeps all its rows.
_HISTORY_FILES = (*libreyolo.HISTORY_FILES, CONSOLE_LOG)
_EPOCH_FILE = libreyolo.EPOCH_CHECKPOINT
LIBREYOLO_DEFAULT_EPOCHS = 300
# Files a new repo may hold before any run: they prove nothing and belong to no run.
_NOT_A_RUN = frozenset({".gitattributes", "README.md"})


@dataclass(frozen=True)
class ResumePoint:
    checkpoint: Path  # where libreyolo resumes from: the run folder's weights/last.pt
    completed_epochs: int
    total_epochs: int
    source: str  # "volume" or "hub"
    # When the Hub won: its files, which the volume's older copies must never overwrite.
    hub_files: frozenset[str] = frozenset()

    @property
    def complete(self) -> bool:
        return self.completed_epochs >= self.total_epochs


# -- history -------------------------------------------------------------------------------
def remote_names(hub: Hub, repo_id: str) -> set[str]:
    """The files of OUTPUT_REPO (none for an empty or new repo)."""
    return {entry.path for entry in hub.list_files(repo_id)} if hub.head(repo_id) else set()


def remote_state(hub: Hub, repo_id: str, scratch: Path, names: set[str] | None = None) -> dict[str, Any] | None:
    """trainbox.json as OUTPUT_REPO holds it (None for an empty or new repo)."""
    names = remote_names(hub, repo_id) if names is None else names
    if STATE_FILE not in names:
        return None
    path = hub.download(repo_id, STATE_FILE, scratch)
    try:
        state = json.loads(path.read_text())
        if not isinstance(state, dict):
            raise ValueError("not a JSON object")
        return state
    except ValueError:
        logger.warning("resume: %s on the Hub is unreadable; ignoring its history", STATE_FILE)
        return None


def check_same_run(
    remote: dict[str, Any] | None,
    run_name: str,
    repo_id: str,
    names: set[str] | None = None,
    ours: dict[str, Any] | None = None,
) -> None:
    """OUTPUT_REPO holds nothing yet, or this run: its trainbox.json names it. Anything else
    (another run, or files without a trainbox.json, e.g. mirrored by `trainbox sync`) would be
    resumed, judged complete or overwritten as if it were ours. ``ours``: settings.record(), to name
    what differs (a higher ``epochs`` does not: it extends the run under the same name)."""
    other = (remote or {}).get("run_name")
    if other and other != run_name:
        differs = run_args.differences(ours or {}, (remote or {}).get("settings"))
        if differs:
            raise ConfigError(
                f"OUTPUT_REPO {repo_id} already holds run {other!r}, not {run_name!r}: {'; '.join(differs)}",
                "use a new OUTPUT_REPO for a new run, or that run's settings to continue it (more epochs extend it)",
            )
        raise ConfigError(
            f"OUTPUT_REPO {repo_id} already holds run {other!r} with these settings, named {run_name!r} here",
            f"set RUN_NAME={other} to continue (or extend) that run, or use a new OUTPUT_REPO",
        )
    foreign = sorted((names or set()) - _NOT_A_RUN)
    if not other and foreign:
        raise ConfigError(
            f"OUTPUT_REPO {repo_id} already holds files ({', '.join(foreign[:3])}) but no trainbox.json naming"
            f" run {run_name!r}: nothing proves they belong to this run",
            "use a new or empty OUTPUT_REPO",
        )


def check_crash_loop(attempts: list[dict[str, Any]]) -> None:
    """Refuse to start when the same failure ended the last CRASH_LOOP_LENGTH attempts."""
    relevant = [attempt for attempt in attempts if attempt.get("reason") != CrashLoopError.reason]
    recent = relevant[-CRASH_LOOP_LENGTH:]
    if len(recent) < CRASH_LOOP_LENGTH:
        return
    # The same failure at the same epoch: a run that fails later each time is still progressing,
    # and so is one whose batch keeps shrinking (out of GPU memory, resumed with half the batch).
    causes = {
        (attempt.get("exit_code"), attempt.get("reason"), attempt.get("epochs_done"), attempt.get("batch"))
        for attempt in recent
    }
    if len(causes) == 1:
        code, reason, _, _ = causes.pop()
        if reason not in _NOT_FAILURES and code != 0:
            raise CrashLoopError(
                f"the last {CRASH_LOOP_LENGTH} attempts all failed the same way ({reason}, exit {code}); not retrying",
                "fix the cause, then start with a new RUN_NAME (or delete the run's trainbox.json)",
            )


# -- an orphaned trainer -------------------------------------------------------------------
def stop_orphan(previous: dict[str, Any] | None) -> None:
    """An agent killed with SIGKILL leaves its libreyolo child running in the run folder:
    stop it before training there again."""
    training = (previous or {}).get("training")
    training = training if isinstance(training, dict) else {}
    pid = training.get("pid")
    if not isinstance(pid, int) or pid == os.getpid():
        return
    try:
        command = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return
    # Its recorded argv (a torchrun trainer of several nodes names no libreyolo), else libreyolo's name.
    args = [part.decode(errors="replace") for part in command.split(b"\0") if part]
    if b"libreyolo" not in command and not (training.get("argv") and args[1:] == training.get("argv")):
        return  # the pid was reused by something else
    logger.warning("resume: training process %d of the previous attempt is still running; stopping it", pid)
    procs.kill_tree(
        pid, members=lambda: [pid, *procs.descendants(pid)], wait=lambda bound: _gone(pid, bound), kill_wait=10
    )


def _gone(pid: int, bound: float) -> None:
    """Wait up to ``bound`` seconds for ``pid`` to leave /proc (reaping it where it is our child)."""
    deadline = time.monotonic() + bound
    while Path(f"/proc/{pid}").exists() and time.monotonic() < deadline:
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, os.WNOHANG)
        time.sleep(0.05)


# -- the newest valid checkpoint -----------------------------------------------------------
def _valid(path: Path) -> checkpoint.CheckpointInfo | None:
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
    found = [(path, info) for path in _local_candidates(run_dir) if path.is_file() and (info := _valid(path))]
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


def _same_as_local(entry: Any, local: Path | None) -> bool:
    """The Hub's file is the local one (same sha256): no need to download it."""
    lfs = getattr(entry, "lfs", None)
    remote = getattr(lfs, "sha256", None) if lfs is not None else None
    if remote is None or local is None or not local.is_file():
        return False
    return bool(sha256_of(local) == remote)


def newest_on_hub(
    hub: Hub,
    repo_id: str,
    files: dict[str, Any],
    scratch: Path,
    better_than: int,
    local: Path | None = None,
    revision: str | None = None,
) -> tuple[Path, checkpoint.CheckpointInfo] | None:
    """Download OUTPUT_REPO's newest valid checkpoint (``files``: its listing), if newer than ``better_than``."""
    candidates = (
        [libreyolo.LAST_CHECKPOINT]
        if libreyolo.LAST_CHECKPOINT in files and not _same_as_local(files[libreyolo.LAST_CHECKPOINT], local)
        else []
    )
    numbered = sorted(
        ((int(match.group(1)), name) for name in files if (match := _EPOCH_FILE.match(name))), reverse=True
    )
    candidates += [name for epoch, name in numbered if epoch > better_than]
    for name in candidates:
        path = hub.download(repo_id, name, scratch, revision=revision)
        info = _valid(path)
        if info is None:
            logger.warning("resume: %s on the Hub is corrupt; trying the next newest checkpoint", name)
            continue
        if info.completed_epochs is not None and info.completed_epochs > better_than:
            logger.info("resume: %s on the Hub has %d epochs", name, info.completed_epochs)
            return path, info
    return None


def hub_newer(hub: Hub, repo_id: str, run_dir: Path, work_dir: Path) -> frozenset[str]:
    """The Hub's files when it holds a newer epoch of this run than the volume (``trainbox sync`` on an
    older volume): none of them is overwritten by the volume's older copy until training writes it again."""
    if hub.head(repo_id) is None:
        return frozenset()
    local = newest_local(run_dir)
    local_epochs = (local[1].completed_epochs or 0) if local else 0
    files = {entry.path: entry for entry in hub.list_files(repo_id)}
    work_dir.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix="newer-", dir=work_dir))
    try:
        remote = newest_on_hub(hub, repo_id, files, scratch, local_epochs, local=run_dir / libreyolo.LAST_CHECKPOINT)
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


def _hub_last_here(files: dict[str, Any], local: Path) -> tuple[Path, checkpoint.CheckpointInfo] | None:
    entry = files.get(libreyolo.LAST_CHECKPOINT)
    if entry is None or not _same_as_local(entry, local):
        return None
    info = _valid(local)
    return (local, info) if info is not None else None


def find(
    run_dir: Path,
    args: RunArgs,
    *,
    hub: Hub | None = None,
    repo_id: str | None = None,
    work_dir: Path,
    volume: bool = True,
    revision: str | None = None,
    bucket: Store | None = None,
) -> ResumePoint | None:
    """The newest valid checkpoint of this run on the volume, in its bucket (manifest-consistent
    files only) or in OUTPUT_REPO, placed at weights/last.pt;
    ``volume=False``: the Hub's alone (what every node of a multi-node training can see);
    ``revision``: the Hub as it was at that commit (node 0's, so every node picks the same epoch)."""
    local = newest_local(run_dir) if volume else None
    local_epochs = local[1].completed_epochs if local else 0
    chosen, source = local, "volume"
    hub_files: set[str] = set()
    scratch = Path(tempfile.mkdtemp(prefix="resume-", dir=work_dir))
    try:
        in_bucket = newest_in_bucket(bucket, scratch, local_epochs or 0, run_dir) if bucket is not None else None
        if in_bucket is not None:
            chosen, source, local_epochs = in_bucket, "bucket", in_bucket[1].completed_epochs
        if hub is not None and repo_id is not None and (revision or hub.head(repo_id)):
            files = {entry.path: entry for entry in hub.list_files(repo_id, revision=revision)}
            local_last = run_dir / libreyolo.LAST_CHECKPOINT
            if volume:
                remote = newest_on_hub(hub, repo_id, files, scratch, better_than=local_epochs or 0, local=local_last)
            else:  # the Hub's choice; this volume's copy of it (same sha256) saves the download
                remote = _hub_last_here(files, local_last) or newest_on_hub(
                    hub, repo_id, files, scratch, 0, revision=revision
                )
            if remote is not None:
                chosen, source, hub_files = remote, "hub", set(files)
                _restore_history(hub, repo_id, set(files), run_dir, scratch, revision)
        if chosen is None:
            return None
        path, info = chosen
        target = run_dir / libreyolo.LAST_CHECKPOINT
        if path != target:
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(path, target.with_name(".last.pt.resume"))
            os.replace(target.with_name(".last.pt.resume"), target)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    assert info.completed_epochs is not None
    total = _requested_epochs(args, info)
    libreyolo.trim_metrics(run_dir, info.completed_epochs)
    point = ResumePoint(
        checkpoint=target,
        completed_epochs=info.completed_epochs,
        total_epochs=total,
        source=source,
        hub_files=frozenset(hub_files) if source == "hub" else frozenset(),
    )
    if path.name != libreyolo.LAST_NAME or source == "hub":
        logger.info("resume: continuing from %s (%s), epoch %d of %d", path.name, source, point.completed_epochs, total)
    return point


def _requested_epochs(args: RunArgs, info: checkpoint.CheckpointInfo) -> int:
    explicit = args.get("epochs")
    if explicit is not None:
        return int(explicit)
    return info.total_epochs or LIBREYOLO_DEFAULT_EPOCHS


def _restore_history(
    hub: Hub, repo_id: str, names: set[str], run_dir: Path, scratch: Path, revision: str | None = None
) -> None:
    """The Hub's checkpoint won: bring its run history along, so metrics keep every epoch."""
    run_dir.mkdir(parents=True, exist_ok=True)
    for name in _HISTORY_FILES:
        if name in names:
            downloaded = hub.download(repo_id, name, scratch / "history", revision=revision)
            os.replace(downloaded, run_dir / name)


def resume_args(args: RunArgs, point: ResumePoint) -> RunArgs:
    """``model=<checkpoint> resume=true`` plus the user's other options, which still win.
    ``pretrained`` goes: libreyolo refuses it together with resume."""
    kept = RunArgs(tuple((key, value) for key, value in args.pairs if key not in {"model", "pretrained", "resume"}))
    return kept.set("model", str(point.checkpoint)).set("resume", "true")
