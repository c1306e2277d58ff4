"""Preflight: prove the GPUs run kernels (in a child process), before a byte of the dataset is paid for.

The agent never creates a CUDA context itself: it would hold memory on every card and skew
libreyolo's ``batch=-1`` sizing. ``gpu.probe`` runs in a child, watched by a hang watchdog
that kills its whole process tree; ``gpu.causes`` turns what it reports into a typed error
naming the fix.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .errors import ConfigError, NoGpuError
from .gpu import nodes
from .gpu.problems import find_problem, problem_record
from .gpu.report import GpuReport, summary_lines
from .gpu.run import nvidia_present, run_probe
from .log import logger, step
from .run_args import RunArgs
from .settings import HostCheck, Settings

if TYPE_CHECKING:
    from .hub import Hub


def probe_env(settings: Settings) -> dict[str, str]:
    """The child needs no secret: drop every variable holding one."""
    secrets = set(settings.secrets())
    return {key: value for key, value in settings.env.items() if value not in secrets}


# -- the entry points -------------------------------------------------------------------------------


def probe_gpus(settings: Settings) -> GpuReport:
    """Run the GPU check; the report carries the problem instead of raising it (``trainbox check`` prints both)."""
    if settings.gpus.cpu:
        logger.warning("GPUS=cpu: skipping the GPU check, training runs on the CPU")
        return GpuReport(indices=None, details={"device": "cpu", "checked": False})
    started = time.monotonic()
    selection = "all" if settings.gpus.indices is None else ",".join(map(str, settings.gpus.indices))
    bench = ["--bench"] if settings.host_check is not HostCheck.OFF else []  # the host report's GPU figures
    stand_in = settings.gpu_probe  # a stand-in probe child (tests on machines without a GPU)
    if stand_in:
        report = run_probe(selection, probe_env(settings), argv=[sys.executable, stand_in, *bench])
    elif nvidia_present():
        report = run_probe(selection, probe_env(settings), extra=bench)
    else:
        report = {
            "available": False,
            "gpus": [],
            "init_error": None,
            "reason": "no /dev/nvidia* device and no nvidia-smi",
        }
    report["check_seconds"] = round(time.monotonic() - started, 2)
    problem = find_problem(report, settings.gpus)
    details = {"device": "cuda", "checked": True, **report}
    if problem is not None:
        details["problem"] = problem_record(problem)
        return GpuReport(indices=None, details=details, problem=problem)
    return GpuReport(indices=tuple(gpu["index"] for gpu in report["gpus"]), details=details)


def check_gpus(settings: Settings, record: Callable[[dict[str, Any]], None] | None = None) -> GpuReport:
    """The GPUs to train on, proven to work; the demo falls back to the CPU when there is no GPU at all.

    ``record`` receives the details before a problem is raised, so trainbox.json shows what failed.
    """
    with step("GPU check"):
        report = probe_gpus(settings)
    if isinstance(report.problem, NoGpuError) and settings.is_demo:
        logger.warning("!" * 72)
        logger.warning("NO GPU FOUND: the demo trains on the CPU instead (slow, fine for a demo)")
        logger.warning("!" * 72)
        details = {key: value for key, value in report.details.items() if key != "problem"}
        report = GpuReport(indices=None, details={**details, "device": "cpu", "fallback": "no GPU"})
    if record is not None:
        record(report.details)
    report.raise_problem()
    for line in summary_lines(report.details):
        logger.info("%s", line)
    fallback = nccl_env(report.details)
    if fallback:
        words = " ".join(f"{name}={value}" for name, value in fallback.items())
        logger.warning("NCCL: the all-reduce failed with the defaults and works with %s: training with it", words)
    return report


def nccl_env(details: dict[str, Any]) -> dict[str, str]:
    """The NCCL setting the GPU check found working when the defaults failed (none when they worked)."""
    found = (details.get("all_reduce") or {}).get("nccl_env")
    return {str(name): str(value) for name, value in found.items()} if isinstance(found, dict) else {}


def meet_nodes(
    settings: Settings, hub: Hub, gpus: GpuReport, record: Callable[[dict[str, Any]], None]
) -> nodes.NodesAgreement:
    """Several machines: meet, prove NCCL between them (``check_nodes``), share node 0's OUTPUT_REPO commit."""
    assert settings.output_repo is not None  # settings require OUTPUT_REPO
    revision = hub.head(settings.output_repo) if settings.topology.leader else None
    return check_nodes(settings, gpus, revision, record=record)


def check_nodes(
    settings: Settings, gpus: GpuReport, revision: str | None, record: Callable[[dict[str, Any]], None]
) -> nodes.NodesAgreement:
    """Several machines: meet the other nodes and prove NCCL between them (a child process, like the GPU
    check), before any of them fetches or trains. ``revision``: node 0's OUTPUT_REPO commit, shared."""
    topology = settings.topology
    brings = nodes.facts(settings.run_name, gpus.details, gpus.indices)
    if topology.leader:
        brings["revision"] = revision
    if topology.gpus_per_node and gpus.indices is not None and len(gpus.indices) != topology.gpus_per_node:
        logger.warning("the launcher gave this node %d GPUs; %d train here", topology.gpus_per_node, len(gpus.indices))
    env = probe_env(settings)
    if gpus.indices:  # the check's cuda:0 is this node's first training GPU
        env["CUDA_VISIBLE_DEVICES"] = ",".join(map(str, gpus.indices))
    with step(f"nodes check (node {topology.node_rank} of {topology.nnodes}, meeting at {topology.master_addr})"):
        report = nodes.meet(topology, brings, env, nccl=bool(gpus.indices))
    record(nodes.summary(report))
    agreement = nodes.judge(report, topology, settings.run_args.get("batch"))
    nccl = report.get("nccl") or {}
    logger.info(
        "nodes: %d met, %d workers in all%s",
        topology.nnodes,
        agreement.workers,
        f", NCCL across nodes ok ({nccl.get('busbw_gbps')} GB/s)" if nccl.get("ok") else "",
    )
    return agreement


# -- presentation -----------------------------------------------------------------------------------


SHM_PATH = Path("/dev/shm")
MIN_SHM_BYTES = 1 << 30


def shared_memory_bytes(path: Path = SHM_PATH) -> int | None:
    try:
        stat = os.statvfs(path)
    except OSError:
        return None
    return stat.f_blocks * stat.f_frsize


def check_shared_memory(run_args: RunArgs, shm_bytes: int | None) -> None:
    """DataLoader workers pass batches through /dev/shm; on Docker's 64 MB default they die and the
    training hangs instead of failing (it would bill until the stall guard fires). Refuse up front."""
    workers = run_args.get("workers")
    if workers == "0" or shm_bytes is None or shm_bytes >= MIN_SHM_BYTES:
        return
    raise ConfigError(
        f"/dev/shm is only {shm_bytes / 2**20:.0f} MB and DataLoader workers (workers={workers or 'default'}) "
        "would hang once it fills",
        "run the container with --shm-size 8g (or --ipc=host), or set workers=0 in RUN_ARGS",
    )
