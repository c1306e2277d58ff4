"""Two agents as two nodes of one training, on loopback, against the test Hub (CPU, gloo)."""

from __future__ import annotations

import json
import socket
import subprocess
from pathlib import Path

import pytest

from entrypoint.checkpoint import inspect
from tests.hubfixtures import HubContext
from tests.support import TINY_RUN_ARGS, make_dataset, start_trainbox, trainbox_env

pytestmark = pytest.mark.slow  # every test here trains real models


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def node_env(workdir: Path, rank: int, port: int, token: str, **env: str) -> dict[str, str]:
    return trainbox_env(
        workdir,
        HF_TOKEN=token,
        GPUS="cpu",
        NNODES="2",
        NODE_RANK=str(rank),
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        RUN_NAME="two-nodes",
        **env,
    )


def finish(process: subprocess.Popen[str]) -> tuple[int, str]:
    output, _ = process.communicate(timeout=900)
    return process.returncode, output


@pytest.mark.transfer("xet")
def test_two_nodes_train_one_run_and_only_node_0_writes_the_hub(hub_ctx: HubContext, tmp_path: Path) -> None:
    dataset = make_dataset(tmp_path / "cones", train=8, val=4).parent
    repo = hub_ctx.repo_id("multinode")
    common = dict(DATASET_REPO=str(dataset), OUTPUT_REPO=repo, RUN_ARGS=f"{TINY_RUN_ARGS} epochs=2 batch=4")
    port = free_port()
    # node 1 holds a read-only token: any write to the Hub from it would fail its job
    follower = start_trainbox("run", env=node_env(tmp_path / "node1", 1, port, hub_ctx.read_token, **common))
    leader = start_trainbox("run", env=node_env(tmp_path / "node0", 0, port, hub_ctx.token, **common))
    code0, out0 = finish(leader)
    code1, out1 = finish(follower)
    assert code0 == 0, out0[-4000:]
    assert code1 == 0, out1[-4000:]

    hub = hub_ctx.hub
    on_hub = json.loads(hub.file_bytes(repo, "trainbox.json"))
    assert on_hub["phase"] == "done" and on_hub["settings"]["nodes"]["nnodes"] == 2
    assert inspect(hub.blob_path(repo, "weights/last.pt")).completed_epochs == 2
    # both ran the torchrun worker; rank 0 wrote the checkpoints on node 0's volume only
    for run_dir in (tmp_path / "node0" / "runs" / "two-nodes", tmp_path / "node1" / "runs" / "two-nodes"):
        state = json.loads((run_dir / "trainbox.json").read_text())
        assert state["phase"] == "done", state
        assert "torch.distributed.run" in state["training"]["argv"]
    assert (tmp_path / "node0" / "runs" / "two-nodes" / "weights" / "last.pt").is_file()
    assert not (tmp_path / "node1" / "runs" / "two-nodes" / "weights" / "last.pt").exists()
    assert "sync:" not in out1  # node 1 never started the uploader
