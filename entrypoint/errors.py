"""Typed errors and the one table of exit codes.

Every failure the agent knows about is an ``AgentError`` subclass carrying its exit code,
a short machine-readable ``reason`` (written to trainbox.json) and a ``hint`` naming the fix.
``cli.main`` is the only place that turns them into a process exit.
"""

from __future__ import annotations

from typing import Any, ClassVar

# The exit codes of a stop from outside, as a shell reports them (128 + the signal's number).
EXIT_INTERRUPTED = 130  # SIGINT, Ctrl-C
EXIT_PREEMPTED = 143  # SIGTERM


class AgentError(Exception):
    """A failure with a known cause. ``str(error)`` is one line: what failed, then the fix."""

    exit_code: ClassVar[int] = 1
    reason: ClassVar[str] = "error"

    def __init__(self, message: str, hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint

    def __str__(self) -> str:
        return f"{self.message} — {self.hint}" if self.hint else self.message


class StopRequested(AgentError):
    """The run was told to stop (a signal, MAX_RUNTIME, MAX_COST, a stall watchdog): not a fault of
    the work in progress, which is kept for the next start. A family, not an exit of its own."""


# -- configuration ---------------------------------------------------------------------------
class ConfigError(AgentError):
    exit_code = 10
    reason = "config"


class NotThisRunError(ConfigError):
    """The run this start names (RUN_NAME, OUTPUT_REPO) was started with another run-defining setting, dataset
    commit or run id: another run, refused before anything is written (exit 10; the crash-loop guard skips it)."""

    reason = "not_this_run"


class CrashLoopError(AgentError):
    exit_code = 11
    reason = "crash_loop"


class NodesMismatchError(ConfigError):
    """Multi-node: the nodes disagree on what they train or with what (run, GPU count, GPU size)."""

    exit_code = 12
    reason = "nodes_mismatch"


# -- access ----------------------------------------------------------------------------------
class AccessError(AgentError):
    exit_code = 20
    reason = "access"


# -- dataset ---------------------------------------------------------------------------------
class DatasetError(AgentError):
    exit_code = 30
    reason = "dataset"


class DatasetNotFoundError(DatasetError):
    exit_code = 31
    reason = "dataset_not_found"


class DatasetAccessError(DatasetError):
    exit_code = 32
    reason = "dataset_access"


class RevisionNotFoundError(DatasetError):
    exit_code = 33
    reason = "dataset_revision_not_found"


class NoArchiveError(DatasetError):
    exit_code = 34
    reason = "dataset_no_tar"


class AmbiguousArchiveError(DatasetError):
    exit_code = 35
    reason = "dataset_several_tars"


class CorruptArchiveError(DatasetError):
    exit_code = 36
    reason = "dataset_corrupt_tar"


class UnsafeArchiveError(DatasetError):
    exit_code = 37
    reason = "dataset_unsafe_member"


class DiskSpaceError(DatasetError):
    exit_code = 38
    reason = "disk_too_small"


class DataYamlNotFoundError(DatasetError):
    exit_code = 39
    reason = "data_yaml_not_found"


class AmbiguousDataYamlError(DatasetError):
    exit_code = 40
    reason = "data_yaml_ambiguous"


class DatasetInvalidError(DatasetError):
    """The data itself is wrong: doctor errors, or libreyolo refusing it (its exit code 3)."""

    exit_code = 41
    reason = "dataset_invalid"


# The refusals before training: the dataset would train, and learn nothing (or the wrong thing).
class NoLabelsError(DatasetError):
    exit_code = 42
    reason = "dataset_no_labels"


class ClassIdError(DatasetError):
    exit_code = 43
    reason = "dataset_class_outside_names"


class NoValidationError(DatasetError):
    exit_code = 44
    reason = "dataset_no_validation"


class UnreadableImagesError(DatasetError):
    exit_code = 45
    reason = "dataset_images_unreadable"


class BoxesOutsideError(DatasetError):
    exit_code = 46
    reason = "dataset_boxes_outside"


class DatasetFormError(DatasetError):
    """COCO JSON or parquet files that cannot be read as a detection dataset (no images, no boxes column)."""

    exit_code = 47
    reason = "dataset_form"


class EvalSplitMissingError(DatasetError):
    """``trainbox eval --split`` names a split the dataset does not have."""

    exit_code = 24
    reason = "eval_split_missing"


class HeldOutUnlabelledError(DatasetError):
    """The dataset's test split holds images and not one label: scoring it would say nothing."""

    exit_code = 25
    reason = "test_split_unlabelled"


class HeldOutClassesError(DatasetError):
    """The split to score names other classes than the model was trained on."""

    exit_code = 26
    reason = "test_split_classes"


class ParquetRuntimeError(DatasetError):
    """A parquet dataset, and pyarrow (fetched on first use, not in the image) could not be installed."""

    exit_code = 48
    reason = "dataset_parquet_runtime"


# -- GPU check -------------------------------------------------------------------------------
class GpuError(AgentError):
    exit_code = 50
    reason = "gpu"


class NoGpuError(GpuError):
    exit_code = 51
    reason = "gpu_none"


class GpuArchitectureError(GpuError):
    exit_code = 52
    reason = "gpu_arch_unsupported"


class GpuDriverError(GpuError):
    exit_code = 53
    reason = "gpu_driver_too_old"


class GpuHangError(GpuError):
    exit_code = 54
    reason = "gpu_hang"


class NcclError(GpuError):
    exit_code = 55
    reason = "gpu_nccl"


class HostShortfallError(GpuError):
    """HOST_CHECK=strict: the machine is not what was paid for (slow card, link or disk, another GPU)."""

    exit_code = 56
    reason = "host_shortfall"


# -- training --------------------------------------------------------------------------------
class TrainingError(AgentError):
    """libreyolo's runtime errors (its exit code 1: OOM, diverged, download failed)."""

    exit_code = 60
    reason = "training_failed"


class TrainingConfigError(TrainingError):
    """libreyolo refused its arguments (its exit code 2)."""

    exit_code = 61
    reason = "training_config"


class ModelError(TrainingError):
    """libreyolo could not load the model or checkpoint (its exit code 4)."""

    exit_code = 62
    reason = "training_model"


class PeerLostError(TrainingError):
    """Multi-node: another node's training went away (machine lost, preempted, crashed)."""

    exit_code = 63
    reason = "peer_lost"


class GpuMemoryError(TrainingError):
    """Out of GPU memory, and halving the batch (OOM_RETRIES) could not or did not help."""

    exit_code = 65
    reason = "out_of_memory"


class NodesOutOfMemoryError(TrainingError):
    """Multi-node: a worker ran out of GPU memory. Every node ends with this code, node 0 records the halved
    batch on the Hub, and the launcher starts the whole set again (the nodes never heal in place)."""

    exit_code = 66
    reason = "nodes_out_of_memory"

    def __init__(self, message: str, fix: str, record: dict[str, Any] | None = None) -> None:
        super().__init__(message, fix)
        self.record = record or {}  # the attempt's fields in trainbox.json (node 0: the next batch)


class NodesUnreachableError(AgentError):
    """Multi-node: the nodes never all met before training (a node not started, a port closed)."""

    exit_code = 64
    reason = "nodes_unreachable"


# -- the rest of the job ---------------------------------------------------------------------
class SyncError(AgentError):
    exit_code = 70
    reason = "sync_failed"


class TakenOverError(AgentError):
    """A newer attempt of this run writes its working state now (a second container on the same run):
    this one stops writing anything, stops training and ends, so two agents never alternate."""

    exit_code = 71
    reason = "taken_over"


class LeaseHeldError(AgentError):
    """Another container holds this run's lease and is alive (its heartbeat moved while this one watched):
    this one ends at once, having written nothing. Not retryable: the run is being trained."""

    exit_code = 72
    reason = "lease_held"


class StoreUnreadableError(AgentError):
    """The run's bucket could not be read at resume, and the repo knows the run: its newest epochs may be
    there alone. Nothing is written (a fresh start would lose them); retryable: the platform starts it again."""

    exit_code = 73
    reason = "store_unreadable"


class LeaseRefusedError(TakenOverError):
    """The repo refused this run's lease: a token that may not commit to OUTPUT_REPO (401/403), or a rate limit
    longer than a start may wait out. The run is never written unleased: this one ends, having written nothing."""

    exit_code = 74
    reason = "lease_refused"


class DeadlineError(StopRequested):
    exit_code = 80
    reason = "deadline"


class StallError(StopRequested):
    exit_code = 81
    reason = "stalled"


class CostLimitError(StopRequested):
    """MAX_COST spent at the instance's price: wrapped up like MAX_RUNTIME."""

    exit_code = 82
    reason = "max_cost"


class PriceCeilingError(AgentError):
    """The instance bills more per hour than MAX_PRICE_PER_HOUR: refused at the start, before the dataset."""

    exit_code = 83
    reason = "price_ceiling"


class ReleaseError(AgentError):
    exit_code = 90
    reason = "release_failed"


# -- stopped from outside --------------------------------------------------------------------
class UserInterruptError(StopRequested):
    """Ctrl-C (SIGINT)."""

    exit_code = EXIT_INTERRUPTED
    reason = "interrupted"


class PreemptedError(StopRequested):
    """SIGTERM: the platform is taking the machine back."""

    exit_code = EXIT_PREEMPTED
    reason = "preempted"


# -- looking from another machine ------------------------------------------------------------
class RemoteReadError(AccessError):
    """``trainbox status --repo``: the token cannot read the repo (or it does not exist). Never a run's
    own exit, so a script watching a run tells "could not look" from how the run ended."""

    exit_code = 21
    reason = "remote_unreadable"


class RemoteUnreachableError(AccessError):
    """``trainbox status --repo``: the Hub did not answer (no network, DNS, a proxy, an outage). Not the
    run's own exit either: the run may be training on."""

    exit_code = 22
    reason = "remote_unreachable"


def all_errors() -> list[type[AgentError]]:
    """Every error class with an exit code of its own, in table order (docs/exit-codes.md's test reads it)."""
    seen: list[type[AgentError]] = []
    stack: list[type[AgentError]] = [AgentError]
    while stack:
        cls = stack.pop()
        if cls not in seen:
            seen.append(cls)
            stack.extend(cls.__subclasses__())
    own = [cls for cls in seen if "exit_code" in vars(cls)]  # not a family such as StopRequested
    return sorted(own, key=lambda cls: cls.exit_code)
