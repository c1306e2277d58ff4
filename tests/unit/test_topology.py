"""Where a node stands: from explicit variables, SkyPilot, Kubernetes; bad combinations refused."""

from __future__ import annotations

from pathlib import Path

import pytest

from entrypoint import topology
from entrypoint.errors import ConfigError, PeerLostError
from entrypoint.topology import Topology
from entrypoint.training import launch
from entrypoint.training.process import TrainCommand


def test_nothing_set_is_one_node() -> None:
    assert topology.from_env({}) == Topology()
    assert not Topology().multi and Topology().leader
    assert topology.from_env({"NNODES": "1"}) == Topology()


def test_explicit() -> None:
    found = topology.from_env({"NNODES": "3", "NODE_RANK": "2", "MASTER_ADDR": "10.0.0.4", "MASTER_PORT": "29600"})
    assert (found.nnodes, found.node_rank, found.master_addr, found.master_port) == (3, 2, "10.0.0.4", 29600)
    assert found.multi and not found.leader


def test_skypilot_takes_node_0_from_the_ip_list() -> None:
    found = topology.from_env(
        {
            "SKYPILOT_NUM_NODES": "2",
            "SKYPILOT_NODE_RANK": "1",
            "SKYPILOT_NODE_IPS": "10.1.0.7\n10.1.0.9\n",
            "SKYPILOT_NUM_GPUS_PER_NODE": "8",
        }
    )
    assert (found.nnodes, found.node_rank, found.master_addr, found.gpus_per_node) == (2, 1, "10.1.0.7", 8)
    assert found.source == "skypilot"


def test_kubernetes_indexed_job() -> None:
    found = topology.from_env(
        {"NNODES": "2", "JOB_COMPLETION_INDEX": "1", "HEADLESS_SERVICE": "trainbox", "HOSTNAME": "train-1"}
    )
    assert (found.node_rank, found.master_addr, found.source) == (1, "train-0.trainbox", "kubernetes")


def test_pytorchjob_counts_pods() -> None:
    found = topology.from_env({"WORLD_SIZE": "4", "RANK": "0", "MASTER_ADDR": "job-master-0", "MASTER_PORT": "23456"})
    assert (found.nnodes, found.node_rank, found.master_port, found.leader) == (4, 0, 23456, True)


def test_pytorchjob_with_nproc_per_node_counts_nodes_not_processes() -> None:
    # Kubeflow's operator: WORLD_SIZE = pods x nprocPerNode; PET_NNODES / PET_NODE_RANK count pods
    env = {
        "WORLD_SIZE": "16",
        "RANK": "1",
        "PET_NNODES": "2",
        "PET_NODE_RANK": "1",
        "PET_NPROC_PER_NODE": "8",
        "MASTER_ADDR": "job-master-0",
        "MASTER_PORT": "23456",
    }
    found = topology.from_env(env)
    assert (found.nnodes, found.node_rank, found.master_addr, found.source) == (2, 1, "job-master-0", "pytorchjob")


def test_an_elastic_pytorchjob_is_refused() -> None:
    with pytest.raises(ConfigError, match="elasticPolicy"):
        topology.from_env({"PET_NNODES": "1:3", "RANK": "0", "MASTER_ADDR": "job-master-0"})


@pytest.mark.parametrize(
    ("env", "names"),
    [
        ({"NODE_RANK": "1"}, "NNODES"),
        ({"NNODES": "2", "MASTER_ADDR": "10.0.0.1"}, "NODE_RANK"),
        ({"NNODES": "2", "NODE_RANK": "2", "MASTER_ADDR": "10.0.0.1"}, "NODE_RANK"),
        ({"NNODES": "two", "NODE_RANK": "0"}, "NNODES"),
        ({"NNODES": "2", "NODE_RANK": "0"}, "MASTER_ADDR"),
        ({"NNODES": "2", "NODE_RANK": "0", "MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "99999"}, "MASTER_PORT"),
        ({"NNODES": "2", "NODE_RANK": "0", "MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "65535"}, "MASTER_PORT+1"),
        ({"SKYPILOT_NUM_NODES": "2", "SKYPILOT_NODE_RANK": "0", "SKYPILOT_NODE_IPS": "10.0.0.1"}, "SKYPILOT"),
        ({"JOB_COMPLETION_INDEX": "0", "HEADLESS_SERVICE": "trainbox"}, "NNODES"),
    ],
)
def test_bad_combinations_name_the_fix(env: dict[str, str], names: str) -> None:
    with pytest.raises(ConfigError) as caught:
        topology.from_env(env)
    assert names in str(caught.value)
    assert "\n" not in str(caught.value)


NODE_1 = Topology(nnodes=2, node_rank=1, master_addr="10.0.0.1", master_port=29500, source="env")


def test_torchrun_wraps_the_train_command() -> None:
    command = TrainCommand(argv=("/venv/bin/libreyolo", "train", "epochs=2", "device=0,1"), cwd=None, run_dir=None)  # type: ignore[arg-type]
    argv = launch.torchrun(command, NODE_1, 2, "run-a").argv
    assert argv[1:3] == ("-m", "torch.distributed.run")
    assert {"--nnodes=2", "--nproc-per-node=2", "--node-rank=1", "--master-addr=10.0.0.1", "--max-restarts=0"} <= set(
        argv
    )
    assert argv[-4:] == ("entrypoint.training.ddp_worker", "train", "epochs=2", "device=0,1")
    env = launch.torch_env(NODE_1, (2, 3))
    assert env["CUDA_VISIBLE_DEVICES"] == "2,3" and env["TRAINBOX_DDP_TIMEOUT"] == "600"


def test_a_lost_peer_is_told_apart(tmp_path: Path) -> None:
    log = tmp_path / "console.log"
    log.write_text("earlier attempt: Connection closed by peer\n")
    start = launch.log_size(tmp_path)
    with log.open("a") as handle:
        handle.write("ValueError: No images found\n")
    assert launch.peer_lost(1, tmp_path, start, NODE_1) is None  # an earlier attempt's words do not count
    with log.open("a") as handle:
        handle.write("RuntimeError: [gloo/transport/tcp/pair.cc:534] Connection closed by peer [127.0.0.1]:4242\n")
        handle.write("torch.distributed.elastic.multiprocessing.errors.ChildFailedError:\n" + "x" * 300 + "\n")
    assert isinstance(launch.peer_lost(1, tmp_path, start, NODE_1), PeerLostError)
    assert launch.peer_lost(0, tmp_path, start, NODE_1) is None
