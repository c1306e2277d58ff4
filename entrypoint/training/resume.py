"""Resume after preemption, on the same disk or on a new machine, with no human.

At start the agent asks the sync wing's read side (sync/read.py) for the newest valid checkpoint of
this run on the volume, in its bucket and in OUTPUT_REPO, and continues from it with LibreYOLO's
``resume=true``; this module only decides: a run whose epochs are all done is not trained again, a
run that failed the same way three times in a row is not started a fourth time, the resume arguments.
"""

from __future__ import annotations

import contextlib
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .. import libreyolo, procs
from ..errors import ConfigError, CrashLoopError, NotThisRunError, PreemptedError, SyncError, UserInterruptError
from ..hub import Hub
from ..log import logger
from ..run_args import RunArgs
from ..sync import checkpoint, read, run_identity
from ..sync.bucket import RunFolder
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
    # Another run refused at start: nothing of this run was tried.
    NotThisRunError.reason,
}
# The run folder's history, restored with a checkpoint from a store so it keeps all its rows.
_HISTORY_FILES = (*read.HISTORY, CONSOLE_LOG)
LIBREYOLO_DEFAULT_EPOCHS = 300
# Files a new repo may hold before any run: they prove nothing and belong to no run.
_NOT_A_RUN = read.NOT_A_RUN


@dataclass(frozen=True)
class ResumePoint:
    checkpoint: Path  # where libreyolo resumes from: the run folder's weights/last.pt
    completed_epochs: int
    total_epochs: int
    source: str  # "volume", "bucket" or "hub"
    # When the Hub won: its files, which the volume's older copies must never overwrite.
    hub_files: frozenset[str] = frozenset()

    @property
    def complete(self) -> bool:
        return self.completed_epochs >= self.total_epochs


# -- history: trainbox.json as OUTPUT_REPO holds it (the sync wing reads it) -------------------------
remote_names = read.remote_names
remote_state = read.remote_state
newest_local = read.newest_local  # the volume's checkpoint (dryrun.py shows it)


def check_same_run(
    remote: dict[str, Any] | None,
    run_name: str,
    repo_id: str,
    names: set[str] | None = None,
    ours: dict[str, Any] | None = None,
    run_id: str | None = None,
) -> None:
    """OUTPUT_REPO holds nothing yet, or this run: its trainbox.json names it, with this run's settings
    (``ours``: settings.record(); a higher ``epochs`` extends the run) and run id (``run_id``: the volume's, None
    when it knows none). Anything else (another run, or files without a trainbox.json, e.g. mirrored by
    `trainbox sync`) would be resumed, judged complete or overwritten as if it were ours."""
    other = (remote or {}).get("run_name")
    if other and other != run_name:
        differs = run_identity.setting_mismatches(ours or {}, (remote or {}).get("settings"))
        if differs:
            raise ConfigError(
                f"OUTPUT_REPO {repo_id} already holds run {other!r}, not {run_name!r}:"
                f" {'; '.join(mismatch.phrase() for mismatch in differs)}",
                "use a new OUTPUT_REPO for a new run, or that run's settings to continue it (more epochs extend it)",
            )
        raise ConfigError(
            f"OUTPUT_REPO {repo_id} already holds run {other!r} with these settings, named {run_name!r} here",
            f"set RUN_NAME={other} to continue (or extend) that run, or use a new OUTPUT_REPO",
        )
    mismatch = run_identity.refusal(remote, ours or {}, run_id=run_id) if other else None
    if mismatch is not None:
        raise run_identity.refuse(mismatch, run_name, f"OUTPUT_REPO {repo_id}")
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


# -- the newest valid checkpoint: asked of the sync wing's read side ------------------------------
def find(
    run_dir: Path,
    args: RunArgs,
    *,
    hub: Hub | None = None,
    repo_id: str | None = None,
    work_dir: Path,
    volume: bool = True,
    revision: str | None = None,
    bucket: RunFolder | None = None,
    run_known: bool | None = None,
    read_for: float = 0.0,
) -> ResumePoint | None:
    """Where to resume: the newest valid checkpoint of this run on the volume, in its bucket (whole
    boundaries of this run id only) or in OUTPUT_REPO, placed at weights/last.pt (``read.find_newest``);
    ``volume=False``: the stores alone (what every node of a multi-node training can see);
    ``revision``: the repo as it was at that commit (node 0's, so every node picks the same epoch);
    ``run_known``: the repo knew the run before this start, so a bucket that cannot be read for ``read_for``
    seconds ends the start (exit 73) instead of starting over (None: not judged)."""
    found = read.find_newest(
        run_dir,
        work_dir,
        volume=volume,
        folder=bucket,
        hub=hub,
        repo_id=repo_id,
        revision=revision,
        history=_HISTORY_FILES,
        run_known=run_known,
        read_for=read_for,
    )
    if found is None:
        return None
    assert found.info.completed_epochs is not None
    total = _requested_epochs(args, found.info)
    libreyolo.trim_metrics(run_dir, found.info.completed_epochs)
    point = ResumePoint(
        checkpoint=found.path,
        completed_epochs=found.info.completed_epochs,
        total_epochs=total,
        source=found.source,
        hub_files=found.hub_files if found.source == "hub" else frozenset(),
    )
    if found.source != "volume":
        logger.info("resume: continuing from the %s copy, epoch %d of %d", found.source, point.completed_epochs, total)
    return point


def _requested_epochs(args: RunArgs, info: checkpoint.CheckpointInfo) -> int:
    explicit = args.get("epochs")
    if explicit is not None:
        return int(explicit)
    return info.total_epochs or LIBREYOLO_DEFAULT_EPOCHS


def resume_args(args: RunArgs, point: ResumePoint) -> RunArgs:
    """``model=<checkpoint> resume=true`` plus the user's other options, which still win.
    ``pretrained`` goes: libreyolo refuses it together with resume."""
    kept = RunArgs(tuple((key, value) for key, value in args.pairs if key not in {"model", "pretrained", "resume"}))
    return kept.set("model", str(point.checkpoint)).set("resume", "true")
