"""Out of GPU memory after the run has begun: resume from ``last.pt`` with half the batch.

``batch=-1`` sizes the batch once, in the first seconds; validation, larger images or fragmentation
can still exhaust the card at a later epoch. libreyolo then writes ``status.json`` with
``state: failed`` and ``error.type: OutOfMemoryError`` (torch's ``torch.cuda.OutOfMemoryError``), prints
``Error [cuda_oom]: Training failed: CUDA out of memory ...`` and exits 1. With at least one epoch
done, the agent resumes with the batch halved (a multiple of every worker of every node), at most
``OOM_RETRIES`` times per run. Before any epoch, an explicit batch is simply too large: a
configuration error naming a smaller one.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from .. import libreyolo
from ..errors import AgentError, ConfigError, GpuMemoryError, NodesOutOfMemoryError, TrainingError
from ..run_args import RunArgs

if TYPE_CHECKING:
    from ..settings import Settings

REASON = GpuMemoryError.reason
# Several machines: the set ends, node 0 records the halved batch, the launcher starts every node again.
REASONS = frozenset({REASON, NodesOutOfMemoryError.reason})
# libreyolo's words for it: its status.json error type, its CLI error code, torch's message.
_TYPES = frozenset({"OutOfMemoryError"})
_MARKERS = ("CUDA out of memory", "cuda_oom", "OutOfMemoryError")
_CONFIG_BATCH = re.compile(r"^batch:\s*(-?\d+)\s*$", re.MULTILINE)


def ran_out(run_dir: Path, tail: str) -> bool:
    """The training ended out of GPU memory: libreyolo's status.json says so, or its last words do."""
    try:
        status = json.loads((run_dir / libreyolo.STATUS_FILE).read_text())
    except (OSError, ValueError):
        status = None
    if isinstance(status, dict) and status.get("state") == "failed":
        error = status.get("error")
        error = error if isinstance(error, dict) else {}
        if error.get("type") in _TYPES or any(m in str(error.get("message") or "") for m in _MARKERS):
            return True
    return any(marker in tail for marker in _MARKERS)


def batch_in_use(run_dir: Path, args: RunArgs) -> int | None:
    """The global batch the training ran with: train_config.yaml holds AutoBatch's choice, else RUN_ARGS'."""
    try:
        found = _CONFIG_BATCH.search((run_dir / "train_config.yaml").read_text())
    except OSError:
        found = None
    for value in (found.group(1) if found else None, args.get("batch")):
        if value is not None and value.lstrip("-").isdigit() and int(value) > 0:
            return int(value)
    return None


def smaller_batch(batch: int, workers: int) -> int | None:
    """Half the batch, rounded down to a multiple of ``workers``; None when no smaller one exists."""
    workers = max(workers, 1)
    half = (batch // 2) // workers * workers
    return half if 0 < half < batch else None


@dataclass(frozen=True)
class Healing:
    """What the run has done about memory so far: the batch to use, and how many halvings it took."""

    batch: int | None  # None: nothing healed yet, the run's own batch
    retries: int


@dataclass(frozen=True)
class OomTry:
    """A training that ran out of GPU memory after ``epochs_done`` epochs, to resume with ``next_batch``."""

    epochs_done: int
    batch: int
    next_batch: int
    retry: int  # 1 … OOM_RETRIES
    limit: int
    exit_code: ClassVar[int] = GpuMemoryError.exit_code
    reason: ClassVar[str] = REASON

    def describe(self) -> str:
        return (
            f"out of GPU memory at epoch {self.epochs_done + 1} with batch={self.batch}"
            f" (halving {self.retry} of OOM_RETRIES={self.limit})"
        )

    def record(self) -> dict[str, Any]:
        """The fields of its entry in trainbox.json's ``attempts``."""
        return {"epochs_done": self.epochs_done, "batch": self.batch, "next_batch": self.next_batch}

    @staticmethod
    def healing(attempts: Iterable[Mapping[str, Any]]) -> Healing:
        """The healing recorded in trainbox.json's attempts (carried to a new disk through the Hub)."""
        healed = [a for a in attempts if a.get("reason") in REASONS and isinstance(a.get("next_batch"), int)]
        return Healing(batch=healed[-1]["next_batch"] if healed else None, retries=len(healed))

    @classmethod
    def judge(
        cls,
        error: AgentError,
        tail: str,
        settings: Settings,
        attempts: Iterable[Mapping[str, Any]],
        args: RunArgs,
        workers: int,
    ) -> OomTry:
        """The retry for a failed training, or raise: ``error`` itself when it is not out of memory (or
        before any epoch with AutoBatch's batch, or with OOM_RETRIES=0), a configuration error when an
        explicit batch ran out in the first step, ``GpuMemoryError`` when no smaller batch or retry is left."""
        if type(error) is not TrainingError or not ran_out(settings.run_dir, tail):
            raise error
        return cls.plan(error, settings, attempts, args, workers)

    @classmethod
    def plan(
        cls,
        error: AgentError,
        settings: Settings,
        attempts: Iterable[Mapping[str, Any]],
        args: RunArgs,
        workers: int,
    ) -> OomTry:
        """The retry for a training known to have run out of GPU memory (here, or on another node: the
        epochs are this run folder's, where global rank 0 writes them), or raise as ``judge`` says."""
        run_dir = settings.run_dir
        done = libreyolo.epochs_done(run_dir) or 0
        batch = batch_in_use(run_dir, args)
        healed = cls.healing(attempts)
        own = settings.run_args.get("batch")
        if done == 0 and batch is not None and own is not None and own.isdigit() and healed.batch is None:
            raise first_step_error(batch, workers)
        if done == 0 or settings.oom_retries == 0:  # nothing to resume from, or healing is off: as libreyolo said
            raise error
        smaller = smaller_batch(batch, workers) if batch is not None else None
        if batch is None or smaller is None or healed.retries >= settings.oom_retries:
            raise exhausted_error(batch, done, healed.retries, settings.oom_retries)
        return cls(done, batch, smaller, healed.retries + 1, settings.oom_retries)


def first_step_error(batch: int, workers: int) -> ConfigError:
    """Out of memory before any epoch with the user's own batch: that batch does not fit this card."""
    smaller = smaller_batch(batch, workers)
    fix = f"set batch={smaller} in RUN_ARGS" if smaller else "use a smaller imgsz or model in RUN_ARGS"
    return ConfigError(
        f"RUN_ARGS batch={batch} does not fit in the GPU's memory: out of memory in the first step",
        f"{fix}, or batch=-1 to size it to the card",
    )


def exhausted_error(batch: int | None, epochs_done: int | None, retries: int, limit: int) -> GpuMemoryError:
    at = f" at epoch {epochs_done + 1}" if epochs_done is not None else ""
    size = f" with batch={batch}" if batch is not None else ""
    tried = f" after {retries} smaller batches" if retries else ""
    hint = "lower batch or imgsz in RUN_ARGS, or rent a card with more memory"
    if retries and retries >= limit:
        hint += f" (OOM_RETRIES={limit} allows more halvings)"
    return GpuMemoryError(f"training ran out of GPU memory{at}{size}{tried}", hint)


def end_of_set(
    error: AgentError,
    output: str,
    peer: Mapping[str, Any] | None,
    settings: Settings,
    attempts: Iterable[Mapping[str, Any]],
    args: RunArgs,
    workers: int,
) -> AgentError:
    """Several machines never heal in place (a node resuming alone would wait for peers that left, and roll the
    Hub back to the epoch it started from): out of GPU memory on any node (this node's training ``output`` says
    so, or ``peer``, what another node's worker reported) ends every node with one code; node 0 records the
    halved batch in trainbox.json and the launcher starts the set again. Another failure is ``error`` itself.
    Only node 0 judges: only its run folder holds the run's epochs (global rank 0 writes them)."""
    own = isinstance(error, TrainingError) and ran_out(settings.run_dir, output)
    if peer is None and not own:
        return error
    node = settings.topology.node_rank if own or peer is None else peer.get("node")
    fix = "the launcher starts every node again (SkyPilot managed jobs, the Kubernetes Job, JobSet)"
    if not settings.topology.leader:
        return NodesOutOfMemoryError(
            f"out of GPU memory on node {node}: every node ends, node 0 records a smaller batch", fix
        )
    attempt = OomTry.plan(error, settings, attempts, args, workers)
    return NodesOutOfMemoryError(
        f"out of GPU memory on node {node} at epoch {attempt.epochs_done + 1} with batch={attempt.batch}:"
        f" every node ends, the next start trains with batch={attempt.next_batch}",
        fix,
        record=attempt.record(),
    )
