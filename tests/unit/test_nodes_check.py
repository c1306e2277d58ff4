"""Judging the nodes check: every way the nodes can disagree or fail to meet is a typed error naming its fix."""

from __future__ import annotations

from typing import Any

import pytest

from entrypoint.errors import ConfigError, GpuError, NcclError, NodesMismatchError, NodesUnreachableError
from entrypoint.gpu import nodes
from entrypoint.topology import Topology

NODE_0 = Topology(nnodes=2, node_rank=0, master_addr="10.0.0.4", master_port=29500, source="env")
H100 = {"name": "NVIDIA H100 80GB HBM3", "total_gib": 79.1}
A100_40 = {"name": "NVIDIA A100-SXM4-40GB", "total_gib": 39.4}


def node(gpus: list[dict[str, Any]], run: str = "run-a", **extra: Any) -> dict[str, Any]:
    return {"run_name": run, "gpus": gpus, "workers": len(gpus) or 1, "host": "h", "torch": "2.14.1", **extra}


def met(*everyone: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {"node_rank": 0, "joined_after": 1.0, "nodes": list(everyone), "nccl_ok_on": [0, 1], **extra}


def test_facts_keep_only_the_training_gpus() -> None:
    details = {"gpus": [{"index": 0, **H100, "free_gib": 78.0}, {"index": 1, **H100}, {"index": 2, **H100}]}
    brings = nodes.facts("run-a", details, (0, 2))
    assert brings == {"run_name": "run-a", "gpus": [H100, H100], "workers": 2}
    assert nodes.facts("run-a", {}, None) == {"run_name": "run-a", "gpus": [], "workers": 1}  # the CPU: one worker


def test_agreeing_nodes_share_node_0s_commit() -> None:
    report = met(node([H100] * 8, revision="c0ffee"), node([H100] * 8), nccl={"ok": True, "busbw_gbps": 40.1})
    agreement = nodes.judge(report, NODE_0, "-1")
    assert (agreement.revision, agreement.workers) == ("c0ffee", 16)
    assert agreement.details["nodes"] == [{"host": "h", "gpus": 8, "torch": "2.14.1"}] * 2
    assert agreement.details["nccl"]["ok"]


@pytest.mark.parametrize(
    ("report", "error", "names"),
    [
        (met(node([H100]), node([H100], run="run-b")), NodesMismatchError, "RUN_ARGS"),
        (met(node([H100] * 8), node([H100] * 4)), NodesMismatchError, "GPUS"),
        (met(node([H100]), node([])), NodesMismatchError, "the CPU"),
        ({"node_rank": 1, "join_error": "DistNetworkError: timed out", "waited": 6.0}, NodesUnreachableError, "+1"),
        ({"node_rank": 1, "error": "Connection reset by peer"}, NodesUnreachableError, "MASTER_ADDR"),
        (
            {"join_error": "DistNetworkError: The server socket has failed to listen on any local network address."},
            ConfigError,
            "10.0.0.4:29501",
        ),
        ({"hang": {"step": "join", "what": "waiting for node 0", "timeout": 930}}, NodesUnreachableError, "930"),
        (met(node([H100]), node([H100]), nccl={"ok": False, "error": "DistBackendError: NCCL error"}), NcclError, ""),
        (met(node([H100]), node([H100]), nccl={"ok": True}, nccl_ok_on=[0]), NcclError, "node(s) 1"),
        ({"hang": {"step": "nccl", "what": "the NCCL all-reduce across the nodes", "timeout": 90}}, NcclError, ""),
    ],
)
def test_each_failure_is_one_line_naming_its_fix(report: dict[str, Any], error: type, names: str) -> None:
    with pytest.raises(error) as caught:
        nodes.judge(report, NODE_0, None)
    assert type(caught.value) is error
    assert names in str(caught.value) and "\n" not in str(caught.value)
    assert caught.value.hint  # the fix


def test_batch_minus_one_refuses_smaller_gpus_elsewhere() -> None:
    report = met(node([H100] * 2), node([A100_40] * 2), nccl={"ok": True})
    with pytest.raises(NodesMismatchError, match="batch=-1"):
        nodes.judge(report, NODE_0, "-1")
    assert nodes.judge(report, NODE_0, "64").workers == 4  # a fixed batch is the user's call


def test_a_driver_fault_seen_through_nccl_is_the_driver_error() -> None:
    report = met(
        node([H100]), node([H100]), nccl={"ok": False, "error": "CUDA error: unspecified launch failure (Xid 79)"}
    )
    with pytest.raises(GpuError) as caught:
        nodes.judge(report, NODE_0, None)
    assert "across the nodes" in str(caught.value)
