"""Two agents as two nodes of one training, on loopback, against the test Hub (CPU, gloo)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest

from entrypoint import errors
from entrypoint.sync.checkpoint import inspect
from tests.hubfixtures import HubContext
from tests.support import TINY_RUN_ARGS, make_dataset, start_trainbox, trainbox_env

# Run on one pytest-xdist worker with test_nodes_check.py (tests/conftest.py: WORKER_GROUPS): no other test
# takes the loopback ports they picked, and a lost peer's bound is not measured beside another pair of nodes.
pytestmark = pytest.mark.slow


def free_port() -> int:
    """A MASTER_PORT whose next port (the nodes check's) is free too."""
    while True:
        with socket.socket() as sock, socket.socket() as beside:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
            try:
                beside.bind(("127.0.0.1", port + 1))
            except OSError:
                continue
            return port


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
        HF_HOME=str(workdir / "hf-home"),  # two machines: no shared Hub or Xet cache
        **env,
    )


def finish(process: subprocess.Popen[str]) -> tuple[int, str]:
    output, _ = process.communicate(timeout=900)
    return process.returncode, output


@pytest.mark.contract  # torchrun, libreyolo's DDP worker, batch=-1 sized on rank 0
@pytest.mark.transfer("xet")
def test_two_nodes_train_one_run_and_only_node_0_writes_the_hub(hub_ctx: HubContext, tmp_path: Path) -> None:
    dataset = make_dataset(tmp_path / "cones", train=8, val=4).parent
    repo = hub_ctx.repo_id("multinode")
    common = dict(DATASET_REPO=str(dataset), OUTPUT_REPO=repo, RUN_ARGS=f"{TINY_RUN_ARGS} epochs=2 batch=-1")
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
    # batch=-1 is sized once, on rank 0 (node 0), and broadcast: on the CPU libreyolo keeps 16 per worker
    consoles = [(tmp_path / node / "runs" / "two-nodes" / "console.log").read_text() for node in ("node0", "node1")]
    assert consoles[0].count("AutoBatch: resolved global batch size = 32") == 1, consoles[0][-3000:]
    assert "AutoBatch" not in consoles[1]
    # every node met the other before fetching or training; node 1 learnt node 0's OUTPUT_REPO commit
    for node in ("node0", "node1"):
        state = json.loads((tmp_path / node / "runs" / "two-nodes" / "trainbox.json").read_text())
        assert [entry["gpus"] for entry in state["nodes_check"]["nodes"]] == [0, 0], state["nodes_check"]


def descendants(pid: int) -> list[int]:
    """``pid`` and every process below it (a lost machine takes all of them at once)."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    found, todo = [], [pid]
    while todo:
        current = todo.pop()
        found.append(current)
        todo.extend(children.get(current, []))
    return found


def hub_epochs(hub_ctx: HubContext, repo: str) -> int:
    hub = hub_ctx.hub
    if not hub.repo_exists(repo) or "metrics.jsonl" not in hub.files(repo):
        return 0
    rows = [json.loads(line) for line in hub.file_bytes(repo, "metrics.jsonl").decode().splitlines() if line.strip()]
    return max((row["epoch"] for row in rows), default=0)


@pytest.mark.contract  # what torchrun and gloo say when a peer vanishes, and a real DDP resume
@pytest.mark.transfer("xet")
def test_a_lost_node_ends_the_other_then_both_resume_from_the_hub(hub_ctx: HubContext, tmp_path: Path) -> None:
    lose_a_node_then_resume(hub_ctx, tmp_path, epochs=5)


def lose_a_node_then_resume(
    hub_ctx: HubContext, tmp_path: Path, *, epochs: int, gpus: tuple[str, str] = ("cpu", "cpu")
) -> None:
    """Node 1's machine vanishes mid-run: node 0 ends within the stated bound, the reason on the Hub;
    the restarted set resumes on both nodes from the same commit and finishes. ``gpus``: each node's GPUS."""
    dataset = make_dataset(tmp_path / "cones", train=16, val=4).parent
    repo = hub_ctx.repo_id("multinode-lost")
    common = dict(
        DATASET_REPO=str(dataset),
        OUTPUT_REPO=repo,
        RUN_ARGS=f"{TINY_RUN_ARGS} epochs={epochs} batch=4 save_period=1",
        DDP_TIMEOUT="60",  # the bound on a peer that vanished without closing its sockets
        RENDEZVOUS_TIMEOUT="180",  # a node that failed before training must not hold the other long
    )

    def start_both() -> tuple[subprocess.Popen[str], subprocess.Popen[str]]:
        port = free_port()
        follower_env = node_env(tmp_path / "node1", 1, port, hub_ctx.read_token, **common) | {"GPUS": gpus[1]}
        leader_env = node_env(tmp_path / "node0", 0, port, hub_ctx.token, **common) | {"GPUS": gpus[0]}
        return start_trainbox("run", env=follower_env), start_trainbox("run", env=leader_env)

    follower, leader = start_both()
    deadline = time.monotonic() + 600
    while hub_epochs(hub_ctx, repo) < 1 and leader.poll() is None:
        assert time.monotonic() < deadline, "no epoch reached the Hub"
        time.sleep(0.2)
    for pid in descendants(follower.pid):  # node 1's machine is gone: agent, torchrun, workers
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    killed = time.monotonic()
    follower.communicate(timeout=30)

    code0, out0 = finish(leader)
    assert code0 == errors.PeerLostError.exit_code, out0[-4000:]
    # the bound README states: DDP_TIMEOUT for a silent peer (its connections closing ends it sooner),
    # plus the final upload and the release; never NCCL's 3 h
    assert time.monotonic() - killed < 60 + 120, out0[-4000:]
    on_hub = json.loads(hub_ctx.hub.file_bytes(repo, "trainbox.json"))
    assert on_hub["phase"] == "failed" and on_hub["exit"]["reason"] == "peer_lost", on_hub["exit"]
    done = hub_epochs(hub_ctx, repo)
    assert done < epochs

    # the launcher restarts the set: both resume from the Hub and finish
    follower, leader = start_both()
    code0, out0 = finish(leader)
    code1, out1 = finish(follower)
    assert code0 == 0, out0[-4000:]
    assert code1 == 0, out1[-4000:]
    resumed = []
    for workdir in (tmp_path / "node0", tmp_path / "node1"):
        state = json.loads((workdir / "runs" / "two-nodes" / "trainbox.json").read_text())
        assert state["resume"]["from"] == "hub" and state["resume"]["epochs_done"] >= done, state.get("resume")
        resumed.append(state["resume"])
    assert resumed[0] == resumed[1] and resumed[0]["revision"]  # node 0's commit, the same epoch on both
    on_hub = json.loads(hub_ctx.hub.file_bytes(repo, "trainbox.json"))
    assert on_hub["phase"] == "done"
    assert inspect(hub_ctx.hub.blob_path(repo, "weights/last.pt")).completed_epochs == epochs


def test_a_node_that_never_comes_ends_node_0_within_the_rendezvous_timeout(hub_ctx: HubContext, tmp_path: Path) -> None:
    dataset = make_dataset(tmp_path / "cones", train=4, val=2).parent
    repo = hub_ctx.repo_id("multinode-alone")
    env = node_env(
        tmp_path / "node0",
        0,
        free_port(),
        hub_ctx.token,
        DATASET_REPO=str(dataset),
        OUTPUT_REPO=repo,
        RUN_ARGS=f"{TINY_RUN_ARGS} epochs=2 batch=4",
        RENDEZVOUS_TIMEOUT="5",
    )
    code, output = finish(start_trainbox("run", env=env))
    assert code == errors.NodesUnreachableError.exit_code, output[-4000:]
    assert "MASTER_PORT+1" in output  # the fix names the ports to open
    # it ended before the uploader started (as any preflight failure): the volume's trainbox.json tells
    state = json.loads((tmp_path / "node0" / "runs" / "two-nodes" / "trainbox.json").read_text())
    assert state["exit"]["reason"] == "nodes_unreachable" and "training" not in state, state
    assert state["nodes_check"]["waited"] >= 5
