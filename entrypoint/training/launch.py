"""Several machines: the training command becomes torchrun, one worker per GPU on every node.

Static rendezvous (``--node-rank`` honoured): global rank 0, the one process that writes checkpoints,
must run on node 0, the one agent that uploads them. torchrun's c10d rendezvous ranks nodes by host
name instead. ``--max-restarts 0``: a lost peer ends every node's job; the launcher (SkyPilot managed
jobs, the Kubernetes Job) restarts the whole set, which resumes from OUTPUT_REPO.
"""

from __future__ import annotations

import contextlib
import json
import re
import sys
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from ..errors import AgentError, PeerLostError
from ..run_args import RunArgs
from ..topology import Topology
from . import ddp_worker
from .process import CONSOLE_LOG, TrainCommand, check_batch

_SCAN_BYTES = 256 * 1024  # the end of the worker's traceback and torchrun's report fit

# torchrun's own words (and gloo/NCCL's) when another node's processes went away.
_PEER_LOST = re.compile(
    r"Connection closed by peer|Connection reset by peer|Broken pipe|DistNetworkError|DistStoreError|"
    r"RendezvousTimeoutError|RendezvousClosedError|Watchdog caught collective operation timeout|"
    r"NCCL communicator was aborted|ProcessGroupNCCL.*[Tt]imeout|Socket Timeout|recvValue failed",
)


def nproc_per_node(topology: Topology, gpu_indices: tuple[int, ...] | None) -> int:
    """Workers on this node: one per GPU the check proved, else one (the CPU)."""
    if gpu_indices:
        return len(gpu_indices)
    return 1


def torchrun(command: TrainCommand, topology: Topology, nproc: int, run_name: str) -> TrainCommand:
    """``libreyolo train …`` → ``python -m torch.distributed.run … -m entrypoint.training.ddp_worker train …``."""
    assert command.argv[1] == "train", command.argv
    argv = (
        sys.executable,
        "-m",
        "torch.distributed.run",
        f"--nnodes={topology.nnodes}",
        f"--nproc-per-node={nproc}",
        f"--node-rank={topology.node_rank}",
        "--rdzv-backend=static",
        f"--master-addr={topology.master_addr}",
        f"--master-port={topology.master_port}",
        f"--rdzv-id={run_name}",
        f"--rdzv-conf=timeout={int(topology.join_timeout)}",
        "--max-restarts=0",
        "-m",
        ddp_worker.__name__,
        *command.argv[1:],
    )
    return replace(command, argv=argv)


def torch_env(topology: Topology, gpu_indices: tuple[int, ...] | None) -> dict[str, str]:
    """What the workers need besides the agent's env: a bounded wait on a lost peer, their GPUs."""
    env = {
        ddp_worker.TIMEOUT_VAR: str(int(topology.peer_timeout)),
        # NCCL aborts the process group on a timed-out collective instead of hanging in it
        "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1",
        "TORCH_NCCL_BLOCKING_WAIT": "0",
    }
    if gpu_indices:  # torchrun's workers take cuda:LOCAL_RANK: show them the chosen GPUs only
        env["CUDA_VISIBLE_DEVICES"] = ",".join(map(str, gpu_indices))
    return env


def log_size(run_dir: Path) -> int:
    """Where this attempt's output starts in console.log (earlier attempts' lines come before it)."""
    try:
        return (run_dir / CONSOLE_LOG).stat().st_size
    except OSError:
        return 0


def attempt_output(run_dir: Path, since: int) -> str:
    """The end of this attempt's output (console.log from ``since``): a worker's words may be far above
    torchrun's own report."""
    try:
        with (run_dir / CONSOLE_LOG).open("rb") as log:
            log.seek(max(since, log.seek(0, 2) - _SCAN_BYTES))
            return log.read().decode(errors="replace")
    except OSError:
        return ""


def peer_lost(code: int, run_dir: Path, since: int, topology: Topology) -> PeerLostError | None:
    """A failed multi-node training whose output (this attempt's, in console.log) says another node
    went away. torchrun ends with its own traceback: the worker's words are further up."""
    if code == 0:
        return None
    if not _PEER_LOST.search(attempt_output(run_dir, since)):
        return None
    return PeerLostError(
        f"another node of this {topology.nnodes}-node training went away (this is node {topology.node_rank})",
        "restart every node (SkyPilot managed jobs and the Kubernetes Job do): the run resumes from OUTPUT_REPO",
    )


@dataclass(frozen=True)
class Launch:
    """How this job's training starts, chosen once from the topology: libreyolo's own launch on one
    machine (its DDP across the proven GPUs), or torchrun with one worker per GPU on every node.

    It knows the three things that differ: the command and its environment, how many workers share
    a batch, and how a lost peer shows in a failed training's output.
    """

    topology: Topology
    run_name: str
    # Several machines: where this node's first worker writes what another worker reported (ddp_worker).
    peer_report: Path | None = None

    def workers(self, gpu_indices: tuple[int, ...] | None) -> int:
        """Training processes of the whole job: a fixed batch must divide by it."""
        if self.topology.multi:
            return self.topology.nnodes * nproc_per_node(self.topology, gpu_indices)
        return len(gpu_indices) if gpu_indices else 1

    def check_batch(self, args: RunArgs, gpu_indices: tuple[int, ...] | None) -> int:
        """Refuse a batch the workers cannot share (before a byte of the dataset is paid for); the workers."""
        workers = self.workers(gpu_indices)
        if self.topology.multi:
            check_batch(args, workers, "workers of all nodes")
        elif gpu_indices:
            check_batch(args, workers)
        return workers

    def command(self, command: TrainCommand, gpu_indices: tuple[int, ...] | None) -> TrainCommand:
        if not self.topology.multi:
            return command
        return torchrun(command, self.topology, nproc_per_node(self.topology, gpu_indices), self.run_name)

    def env(self, gpu_indices: tuple[int, ...] | None) -> dict[str, str]:
        if not self.topology.multi:
            return {}
        report = {ddp_worker.PEER_REPORT_VAR: str(self.peer_report)} if self.peer_report is not None else {}
        return torch_env(self.topology, gpu_indices) | report

    def clear_peer_report(self) -> None:
        """Before a training starts: an earlier training's report says nothing of this one."""
        if self.peer_report is not None:
            with contextlib.suppress(OSError):
                self.peer_report.unlink()
            self.peer_report.parent.mkdir(parents=True, exist_ok=True)

    def peer_out_of_memory(self) -> dict[str, Any] | None:
        """What a worker of another node reported during the training that just ended: out of GPU memory."""
        if self.peer_report is None:
            return None
        try:
            found = json.loads(self.peer_report.read_text())
        except (OSError, ValueError):
            return None
        return found if isinstance(found, dict) else None

    def lost_peer(self, code: int, run_dir: Path, since: int) -> AgentError | None:
        """The failure a lost machine explains, read from this attempt's output (one machine: none)."""
        return peer_lost(code, run_dir, since, self.topology) if self.topology.multi else None
