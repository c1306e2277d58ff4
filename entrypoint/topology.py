"""Where this machine sits in a multi-node job: how many nodes, which one this is, who leads.

Read from, in this order (the first that says "more than one node" wins):
explicit ``NNODES``/``NODE_RANK``/``MASTER_ADDR``/``MASTER_PORT``; SkyPilot's ``SKYPILOT_*``
variables; a Kubernetes indexed Job (``JOB_COMPLETION_INDEX``, with ``HEADLESS_SERVICE`` naming
the Service that gives pod 0 a DNS name); Kubeflow PyTorchJob's ``PET_NNODES``/``PET_NODE_RANK``
(its ``WORLD_SIZE`` is pods × ``nprocPerNode``, not pods); else the ``MASTER_ADDR``/``RANK``/
``WORLD_SIZE`` that JobSet manifests and older PyTorchJobs set (one agent per pod: they count pods).
One node (nothing set, or a count of 1) is ``Topology()``: the single-machine job, unchanged.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

from .errors import ConfigError

DEFAULT_PORT = 29500
DEFAULT_PEER_TIMEOUT = 600.0  # seconds; NCCL's and libreyolo's default is 3 h of billing every node
DEFAULT_JOIN_TIMEOUT = 900.0  # seconds the nodes wait for each other at the start
_HOST = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9.:_-]{0,252})$")
_INDEXED_POD = re.compile(r"^(?P<job>.+)-(?P<index>\d+)$")


@dataclass(frozen=True, kw_only=True)
class Topology:
    nnodes: int = 1
    node_rank: int = 0
    master_addr: str = "127.0.0.1"
    master_port: int = DEFAULT_PORT
    source: str = "single"  # "env", "skypilot", "kubernetes", "pytorchjob": for the log and trainbox.json
    gpus_per_node: int | None = None  # the launcher's count (SkyPilot); else the GPU check's
    peer_timeout: float = DEFAULT_PEER_TIMEOUT
    join_timeout: float = DEFAULT_JOIN_TIMEOUT

    @property
    def multi(self) -> bool:
        return self.nnodes > 1

    @property
    def leader(self) -> bool:
        """Node 0: the one that owns OUTPUT_REPO (libreyolo's rank 0 writes the run folder there)."""
        return self.node_rank == 0

    @property
    def store_port(self) -> int:
        """Where the nodes check meets (the GPUs across nodes, node 0's resume choice). Not the
        rendezvous port: a fast node's torchrun must never reach the check's store instead."""
        return self.master_port + 1

    def describe(self) -> dict[str, object]:
        return {
            "nnodes": self.nnodes,
            "node_rank": self.node_rank,
            "master": f"{self.master_addr}:{self.master_port}",
            "source": self.source,
        }


def from_env(env: Mapping[str, str]) -> Topology:
    """The multi-node topology, or ``Topology()`` for one node. Bad or contradictory values → ConfigError."""
    if "NNODES" in env or "NODE_RANK" in env:
        return _explicit(env)
    if "SKYPILOT_NUM_NODES" in env:
        return _skypilot(env)
    if "HEADLESS_SERVICE" in env:
        raise ConfigError(
            "HEADLESS_SERVICE is set but NNODES is not",
            "set NNODES to the Job's completions (and parallelism), e.g. NNODES=2",
        )
    if "PET_NNODES" in env:
        return _pytorchjob(env, "PET_NNODES", "PET_NODE_RANK" if "PET_NODE_RANK" in env else "RANK")
    if "WORLD_SIZE" in env and "RANK" in env:
        return _pytorchjob(env, "WORLD_SIZE", "RANK")
    return Topology()


def _explicit(env: Mapping[str, str]) -> Topology:
    if "NNODES" not in env:
        raise ConfigError("NODE_RANK is set without NNODES", "set NNODES to the number of machines, e.g. NNODES=2")
    nnodes = _count(env, "NNODES")
    if nnodes == 1:
        return Topology()
    if "NODE_RANK" not in env and "JOB_COMPLETION_INDEX" not in env:
        raise ConfigError(f"NNODES={nnodes} without NODE_RANK", f"set NODE_RANK=0 on the first machine … {nnodes - 1}")
    return _build(env, nnodes, _rank(env, "NODE_RANK", nnodes), env.get("MASTER_ADDR"), "env", "MASTER_ADDR")


def _skypilot(env: Mapping[str, str]) -> Topology:
    nnodes = _count(env, "SKYPILOT_NUM_NODES")
    if nnodes == 1:
        return Topology()
    ips = env.get("SKYPILOT_NODE_IPS", "").split()
    if len(ips) != nnodes:
        raise ConfigError(
            f"SKYPILOT_NODE_IPS lists {len(ips)} addresses for SKYPILOT_NUM_NODES={nnodes}",
            "run the agent as the task's `run:` command, where SkyPilot sets both",
        )
    gpus = _count(env, "SKYPILOT_NUM_GPUS_PER_NODE") if "SKYPILOT_NUM_GPUS_PER_NODE" in env else None
    rank = _rank(env, "SKYPILOT_NODE_RANK", nnodes)
    topology = _build(env, nnodes, rank, ips[0], "skypilot", "SKYPILOT_NODE_IPS")
    return Topology(**{**topology.__dict__, "gpus_per_node": gpus or None})


def _pytorchjob(env: Mapping[str, str], count: str, rank: str) -> Topology:
    if ":" in env[count]:  # an elasticPolicy: torchrun would pick the node count at run time
        raise ConfigError(
            f"{count}={env[count]!r} is an elastic range: the agent trains on a fixed set of nodes",
            "remove the PyTorchJob's elasticPolicy (replicas fix the node count)",
        )
    nnodes = _count(env, count)
    if nnodes == 1:
        return Topology()
    return _build(env, nnodes, _rank(env, rank, nnodes), env.get("MASTER_ADDR"), "pytorchjob", "MASTER_ADDR")


def _build(env: Mapping[str, str], nnodes: int, rank: int, addr: str | None, source: str, addr_var: str) -> Topology:
    if source == "env" and "JOB_COMPLETION_INDEX" in env:
        source = "kubernetes"
        addr = addr or _headless_master(env)
    if not addr:
        raise ConfigError(
            f"NNODES={nnodes} but no address for node 0",
            f"set {addr_var} to node 0's address (Kubernetes: HEADLESS_SERVICE=<service name>)",
        )
    if not _HOST.match(addr):
        raise ConfigError(f"MASTER_ADDR={addr!r} is not a host name or address", "e.g. MASTER_ADDR=10.0.0.4")
    return Topology(nnodes=nnodes, node_rank=rank, master_addr=addr, master_port=_port(env), source=source)


def _headless_master(env: Mapping[str, str]) -> str | None:
    """Pod 0 of an indexed Job is ``<job>-0.<service>`` when the pods' subdomain is the Service."""
    service, host = env.get("HEADLESS_SERVICE"), env.get("HOSTNAME", "")
    match = _INDEXED_POD.match(host)
    if not service or not match:
        return None
    return f"{match['job']}-0.{service}"


def _count(env: Mapping[str, str], name: str) -> int:
    value = env[name].strip()
    if not value.isdigit() or int(value) < 1:
        raise ConfigError(f"{name}={env[name]!r} is not a number of machines", f"e.g. {name}=2")
    return int(value)


def _rank(env: Mapping[str, str], name: str, nnodes: int) -> int:
    name = "JOB_COMPLETION_INDEX" if name == "NODE_RANK" and name not in env else name
    value = env.get(name, "").strip()
    if not value.isdigit() or int(value) >= nnodes:
        raise ConfigError(
            f"{name}={env.get(name)!r} is not a node number below {nnodes}", f"use 0 … {nnodes - 1}, one per machine"
        )
    return int(value)


def _port(env: Mapping[str, str]) -> int:
    value = env.get("MASTER_PORT", str(DEFAULT_PORT)).strip()
    if not value.isdigit() or not 1 <= int(value) <= 65534:
        # 65535 is a port, but the nodes check listens on the next one
        raise ConfigError(
            f"MASTER_PORT={value!r} is not a port from 1 to 65534 (the nodes check also uses MASTER_PORT+1)",
            f"e.g. MASTER_PORT={DEFAULT_PORT}",
        )
    return int(value)
