"""The nodes check, agent side: run ``gpu.nodes_probe`` and judge what every node reported.

Before a multi-node training bills every machine for hours, the nodes must have met (bounded by
``RENDEZVOUS_TIMEOUT``), train the same run on the same number of GPUs, be able to sum a tensor with
NCCL across the network, and agree on the Hub commit they resume from: node 0's.
"""

from __future__ import annotations

import json
import sys
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import AgentError, ConfigError, NcclError, NodesMismatchError, NodesUnreachableError
from ..log import logger
from ..topology import Topology
from . import causes as gpu_causes
from .run import run_probe

COLLECTIVE_TIMEOUT = 60.0  # each exchange once the nodes have met; NCCL's first connection included
# batch=-1 sizes the global batch on node 0's GPU (libreyolo probes on rank 0 and broadcasts it)
SMALLER_GPU_TOLERANCE = 0.95
_ACROSS = "the NCCL all-reduce across the nodes"


@dataclass(frozen=True)
class NodesAgreement:
    revision: str | None  # the OUTPUT_REPO commit node 0 saw: every node resumes from it
    workers: int  # torchrun workers across all nodes
    details: dict[str, Any] = field(default_factory=dict)  # for trainbox.json


def facts(run_name: str, gpu_details: Mapping[str, Any], indices: tuple[int, ...] | None) -> dict[str, Any]:
    """What this node brings: its run and the GPUs it trains on (from the local GPU check)."""
    gpus = [
        {"name": gpu.get("name"), "total_gib": gpu.get("total_gib")}
        for gpu in gpu_details.get("gpus", [])
        if indices is not None and gpu.get("index") in indices
    ]
    return {"run_name": run_name, "gpus": gpus, "workers": len(gpus) or 1}


def meet(topology: Topology, brings: Mapping[str, Any], env: Mapping[str, str], *, nccl: bool) -> dict[str, Any]:
    """Run the check child; its report (see ``gpu.run.run_probe`` for hangs and crashes)."""
    with tempfile.TemporaryDirectory(prefix="trainbox-nodes-") as folder:
        path = Path(folder) / "facts.json"
        path.write_text(json.dumps(brings))
        argv = [
            sys.executable,
            "-m",
            "entrypoint.gpu.nodes_probe",
            f"--nnodes={topology.nnodes}",
            f"--node-rank={topology.node_rank}",
            f"--master={topology.master_addr}",
            f"--port={topology.store_port}",
            f"--join-timeout={topology.join_timeout}",
            f"--timeout={COLLECTIVE_TIMEOUT}",
            f"--facts={path}",
            *(["--nccl"] if nccl else []),
        ]
        return run_probe("", env, argv=argv, name="the nodes check")


def judge(report: Mapping[str, Any], topology: Topology, batch: str | None) -> NodesAgreement:
    """The agreement, or the typed error naming the fix."""
    problem = _problem(report, topology, batch)
    if problem is not None:
        raise problem
    nodes = report["nodes"]
    versions = {node.get("torch") for node in nodes}
    if len(versions) > 1:
        logger.warning("nodes run different torch versions (%s): DDP may fail", ", ".join(map(str, sorted(versions))))
    return NodesAgreement(
        revision=nodes[0].get("revision"),
        workers=sum(int(node["workers"]) for node in nodes),
        details=summary(report),
    )


def summary(report: Mapping[str, Any]) -> dict[str, Any]:
    """What trainbox.json keeps: who met, after how long, NCCL's verdict (no raw output)."""
    kept = {key: report[key] for key in ("joined_after", "waited", "nccl", "join_error", "error") if key in report}
    if "nodes" in report:
        kept["nodes"] = [
            {"host": node.get("host"), "gpus": len(node.get("gpus", [])), "torch": node.get("torch")}
            for node in report["nodes"]
        ]
    return kept


def _problem(report: Mapping[str, Any], topology: Topology, batch: str | None) -> AgentError | None:
    where = f"{topology.master_addr}:{topology.store_port}"
    me = f"node {topology.node_rank} of {topology.nnodes}"
    unreachable_fix = (
        "start every node with the same NNODES, MASTER_ADDR and MASTER_PORT; let every machine reach node 0 on "
        "MASTER_PORT and MASTER_PORT+1; raise RENDEZVOUS_TIMEOUT when nodes start far apart"
    )
    if "hang" in report or "crashed" in report:
        step = report.get("hang") or report.get("during") or {}
        what = step.get("what", "the nodes check")
        text = report.get("crashed") or f"no answer within {step.get('timeout', '?')} s"
        if step.get("step") == "nccl":
            return _nccl_error(f"{what} ({text})", "\n".join(report.get("output", [])))
        return NodesUnreachableError(f"{me}: {what} failed: {text}", unreachable_fix)
    if "join_error" in report and _cannot_listen(report["join_error"]):
        return ConfigError(
            f"node 0 cannot listen on {where} for the nodes check: the port is taken",
            "set MASTER_PORT to a port that is free on node 0, together with the next one (MASTER_PORT+1)",
        )
    if "join_error" in report:
        return NodesUnreachableError(
            f"{me} did not meet the others at {where} within RENDEZVOUS_TIMEOUT ({topology.join_timeout:.0f} s): "
            f"{gpu_causes.first_line(report['join_error'], 120)}",
            unreachable_fix,
        )
    if "error" in report or "nodes" not in report:
        text = report.get("error") or report.get("crashed") or "no report"
        return NodesUnreachableError(
            f"{me}: a node left during the nodes check: {gpu_causes.first_line(str(text), 120)}", unreachable_fix
        )
    return _mismatch(report["nodes"], batch) or _nccl_problem(report, topology)


def _cannot_listen(text: str) -> bool:
    """torch's words when node 0's store cannot bind its port (c10d socket.cpp)."""
    return "failed to listen" in text or "Address already in use" in text


def _mismatch(nodes: list[dict[str, Any]], batch: str | None) -> AgentError | None:
    lead = nodes[0]
    for rank, node in enumerate(nodes[1:], start=1):
        if node.get("run_name") != lead.get("run_name"):
            return NodesMismatchError(
                f"node {rank} trains run {node.get('run_name')!r}, node 0 {lead.get('run_name')!r}",
                "give every node the same DATASET_REPO, DATASET_REVISION, RUN_ARGS and RUN_NAME",
            )
        if len(node.get("gpus", [])) != len(lead.get("gpus", [])):  # one GPU and the CPU are both one worker
            return NodesMismatchError(
                f"node {rank} trains on {_gpus(node)}, node 0 on {_gpus(lead)}: torchrun needs as many on every node",
                "use machines with the same GPUs, or set GPUS to the same number of GPUs on every node",
            )
    if batch is not None and int(batch) == -1:
        sizes = [min((gpu.get("total_gib") or 0.0) for gpu in node["gpus"]) if node["gpus"] else None for node in nodes]
        lead_size = sizes[0]
        for rank, size in enumerate(sizes[1:], start=1):
            if lead_size and size is not None and size < lead_size * SMALLER_GPU_TOLERANCE:
                return NodesMismatchError(
                    f"batch=-1 sizes the batch on node 0's GPU ({lead_size:.0f} GiB) but node {rank}'s have"
                    f" {size:.0f} GiB: they would run out of memory",
                    "set a fixed batch in RUN_ARGS that fits the smallest GPU, or use the same GPUs on every node",
                )
    return None


def _gpus(node: Mapping[str, Any]) -> str:
    count = len(node.get("gpus", []))
    return f"{count} GPU{'s' if count != 1 else ''}" if count else "the CPU"


def _nccl_problem(report: Mapping[str, Any], topology: Topology) -> AgentError | None:
    failed = [rank for rank in range(topology.nnodes) if rank not in report.get("nccl_ok_on", range(topology.nnodes))]
    own = report.get("nccl") or {}
    if own and not own.get("ok"):
        return _nccl_error(f"{_ACROSS} failed: {own.get('error')}", "")
    if failed:
        names = ", ".join(map(str, failed))
        return _nccl_error(f"{_ACROSS} failed on node(s) {names} (see their logs)", "")
    return None


def _nccl_error(text: str, output: str) -> AgentError:
    cause = gpu_causes.classify(text + "\n" + output, gpu_causes.Facts(where=_ACROSS), nccl=True)
    if not isinstance(cause, NcclError):
        return cause  # a driver or hardware fault seen through NCCL
    return NcclError(
        gpu_causes.first_line(text, 200),
        "the machines must reach each other on every port (NCCL opens its own); set NCCL_SOCKET_IFNAME to the "
        "network they share (NCCL_DEBUG=INFO names the interfaces)",
    )
