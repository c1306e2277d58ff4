"""Two nodes on one machine's GPUs (one GPU each, NCCL, SyncBatchNorm as on real nodes), against the test Hub."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from entrypoint.sync.checkpoint import inspect
from tests.hubfixtures import HubContext
from tests.integration.test_multinode import finish, free_port, lose_a_node_then_resume, node_env
from tests.support import TINY_RUN_ARGS, make_dataset, start_trainbox

pytestmark = [pytest.mark.gpu, pytest.mark.slow]  # trains real models


def gpu_count() -> int:
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return 0
    listed = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=30).stdout
    return sum(line.startswith("GPU ") for line in listed.splitlines())


def need_two_gpus() -> None:
    if gpu_count() < 2:
        pytest.skip("two nodes on one machine need two GPUs (NCCL refuses two ranks on one GPU)")


@pytest.mark.transfer("xet")
def test_two_nodes_on_two_gpus(hub_ctx: HubContext, tmp_path: Path) -> None:
    need_two_gpus()
    dataset = make_dataset(tmp_path / "cones", train=16, val=4).parent
    repo = hub_ctx.repo_id("multinode-gpu")
    common = dict(DATASET_REPO=str(dataset), OUTPUT_REPO=repo, RUN_ARGS=f"{TINY_RUN_ARGS} epochs=2 batch=4")
    port = free_port()
    follower_env = node_env(tmp_path / "node1", 1, port, hub_ctx.read_token, **common) | {"GPUS": "1"}
    leader_env = node_env(tmp_path / "node0", 0, port, hub_ctx.token, **common) | {"GPUS": "0"}
    follower = start_trainbox("run", env=follower_env)
    leader = start_trainbox("run", env=leader_env)
    code0, out0 = finish(leader)
    code1, out1 = finish(follower)
    assert code0 == 0, out0[-4000:]
    assert code1 == 0, out1[-4000:]
    on_hub = json.loads(hub_ctx.hub.file_bytes(repo, "trainbox.json"))
    assert on_hub["phase"] == "done"
    assert inspect(hub_ctx.hub.blob_path(repo, "weights/last.pt")).completed_epochs == 2
    console = (tmp_path / "node0" / "runs" / "two-nodes" / "console.log").read_text()
    assert "SyncBatchNorm" in console  # the GPU path keeps libreyolo's sync_bn
    for node in ("node0", "node1"):  # the nodes check summed a tensor across the "nodes" with NCCL
        state = json.loads((tmp_path / node / "runs" / "two-nodes" / "trainbox.json").read_text())
        assert state["nodes_check"]["nccl"]["ok"], state["nodes_check"]
    assert "NCCL across nodes ok" in out0


@pytest.mark.transfer("xet")
def test_a_lost_gpu_node_ends_the_other_within_ddp_timeout_then_both_resume(
    hub_ctx: HubContext, tmp_path: Path
) -> None:
    """NCCL, not gloo: node 0 blocked in a collective with a vanished peer must end by the watchdog
    (DDP_TIMEOUT), not NCCL's 3 h default. More epochs than on the CPU: a GPU would finish 5 before the kill."""
    need_two_gpus()
    lose_a_node_then_resume(hub_ctx, tmp_path, epochs=40, gpus=("0", "1"))
