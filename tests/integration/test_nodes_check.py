"""The nodes check's real child on loopback (gloo over TCP): nodes meet, or fail to, within the bound."""

from __future__ import annotations

import os
import socket
import threading
import time
from typing import Any

import pytest

from entrypoint.errors import NodesMismatchError, NodesUnreachableError
from entrypoint.gpu import nodes
from entrypoint.topology import Topology
from tests.integration.test_multinode import free_port

pytestmark = pytest.mark.slow  # each node imports torch; one worker for these and test_multinode (WORKER_GROUPS)


def topologies(join_timeout: float = 60.0) -> list[Topology]:
    port = free_port()
    return [
        Topology(nnodes=2, node_rank=rank, master_addr="127.0.0.1", master_port=port, join_timeout=join_timeout)
        for rank in (0, 1)
    ]


def meet_all(everyone: list[tuple[Topology, dict[str, Any]]]) -> list[dict[str, Any]]:
    reports: list[dict[str, Any]] = [{} for _ in everyone]

    def one(index: int, topology: Topology, brings: dict[str, Any]) -> None:
        reports[index] = nodes.meet(topology, brings, dict(os.environ), nccl=False)

    threads = [threading.Thread(target=one, args=(i, *pair)) for i, pair in enumerate(everyone)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=300)
    return reports


def test_two_nodes_meet_and_share_node_0s_commit() -> None:
    lead, follower = topologies()
    reports = meet_all(
        [(lead, nodes.facts("run-a", {}, None) | {"revision": "c0ffee"}), (follower, nodes.facts("run-a", {}, None))]
    )
    pairs = zip(reports, (lead, follower), strict=True)
    agreements = [nodes.judge(report, topology, "4") for report, topology in pairs]
    assert [agreement.revision for agreement in agreements] == ["c0ffee", "c0ffee"]
    assert [agreement.workers for agreement in agreements] == [2, 2]
    assert all("output" not in agreement.details for agreement in agreements)
    with socket.socket() as sock:  # the check left no listener behind on its port
        # as a server binds (TCPStore does too): closed connections in TIME_WAIT may remain, a listener may not
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", lead.store_port))
        sock.listen()


@pytest.mark.parametrize("rank", [0, 1])
def test_a_node_alone_gives_up_after_the_rendezvous_timeout(rank: int) -> None:
    alone = topologies(join_timeout=3.0)[rank]
    started = time.monotonic()
    report = nodes.meet(alone, nodes.facts("run-a", {}, None), dict(os.environ), nccl=False)
    waited = time.monotonic() - started
    with pytest.raises(NodesUnreachableError, match="RENDEZVOUS_TIMEOUT") as caught:
        nodes.judge(report, alone, None)
    assert caught.value.exit_code == 64
    assert waited < 120, report  # bounded by the timeout (plus torch's import), never the 900 s default


def test_nodes_on_different_runs_both_refuse() -> None:
    lead, follower = topologies()
    reports = meet_all([(lead, nodes.facts("run-a", {}, None)), (follower, nodes.facts("run-b", {}, None))])
    for report, topology in zip(reports, (lead, follower), strict=True):
        with pytest.raises(NodesMismatchError, match="run 'run-b', node 0 'run-a'"):
            nodes.judge(report, topology, None)
