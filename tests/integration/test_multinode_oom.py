"""Out of GPU memory on one node of several: every node ends with one code, node 0 records the halved batch on
the Hub, and the set the launcher starts again finishes with every epoch once; the Hub never goes back.

Two agents as two nodes on loopback (CPU, gloo) against the test Hub, training with the stand-in torchrun worker
(tests/fakes/ddp_libreyolo.py), which runs out of memory on node 1 at epoch 3 while its batch is above 8."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from entrypoint import errors
from entrypoint.sync.checkpoint import inspect
from tests.fakes import libreyolo as fake_libreyolo
from tests.hubfixtures import HubContext
from tests.integration.test_multinode import finish, free_port, node_env
from tests.support import make_dataset, start_trainbox

pytestmark = pytest.mark.slow  # two agents, torchrun and gloo workers


def hub_epoch_per_commit(hub_ctx: HubContext, repo: str) -> list[int]:
    """The newest epoch in metrics.jsonl at each commit of the repo, oldest first."""
    hub = hub_ctx.hub
    found = []
    for commit in reversed(hub.commits(repo)):
        if "metrics.jsonl" not in hub.files(repo, revision=commit.oid):
            continue
        text = hub.file_bytes(repo, "metrics.jsonl", revision=commit.oid).decode()
        found.append(max(json.loads(line)["epoch"] for line in text.splitlines() if line.strip()))
    return found


@pytest.mark.transfer("xet")
def test_out_of_memory_on_node_1_restarts_the_set_at_half_the_batch(hub_ctx: HubContext, tmp_path: Path) -> None:
    dataset = make_dataset(tmp_path / "cones", train=4, val=2).parent
    repo = hub_ctx.repo_id("multinode-oom")
    libreyolo = fake_libreyolo.install(tmp_path / "bin")
    common = dict(
        DATASET_REPO=str(dataset),
        OUTPUT_REPO=repo,
        RUN_ARGS="epochs=5 batch=16",
        TRAINBOX_LIBREYOLO=str(libreyolo),
        TRAINBOX_DDP_ENTRY="tests.fakes.ddp_libreyolo:main",
        FAKE_OOM_NODE="1",
        FAKE_OOM_ABOVE="8",
        FAKE_OOM_EPOCH="3",
        FAKE_EPOCH_SECONDS="0.5",
        DDP_TIMEOUT="60",
        RENDEZVOUS_TIMEOUT="120",
        PYTHONPATH=str(Path(__file__).parents[2]),  # the workers import the stand-in from tests/
    )

    def start_both() -> tuple[subprocess.Popen[str], subprocess.Popen[str]]:
        port = free_port()
        follower = start_trainbox("run", env=node_env(tmp_path / "node1", 1, port, hub_ctx.read_token, **common))
        leader = start_trainbox("run", env=node_env(tmp_path / "node0", 0, port, hub_ctx.token, **common))
        return follower, leader

    follower, leader = start_both()
    code0, out0 = finish(leader)
    code1, out1 = finish(follower)
    # one code on every node, the one the launchers restart the set on
    assert code1 == errors.NodesOutOfMemoryError.exit_code, out1[-4000:]
    assert code0 == errors.NodesOutOfMemoryError.exit_code, out0[-4000:]
    assert "out of GPU memory on node 1 at epoch 3 with batch=16" in out0, out0[-4000:]
    assert "first step" not in out1 and "does not fit" not in out1  # node 1 judges nothing from its empty folder
    on_hub = json.loads(hub_ctx.hub.file_bytes(repo, "trainbox.json"))
    last = on_hub["attempts"][-1]
    assert (last["reason"], last["exit_code"]) == ("nodes_out_of_memory", 66), last
    assert (last["epochs_done"], last["batch"], last["next_batch"]) == (2, 16, 8), last

    # the launcher starts the set again: every node trains with the halved batch and the run finishes
    follower, leader = start_both()
    code0, out0 = finish(leader)
    code1, out1 = finish(follower)
    assert code0 == 0, out0[-4000:]
    assert code1 == 0, out1[-4000:]
    for node in ("node0", "node1"):
        state = json.loads((tmp_path / node / "runs" / "two-nodes" / "trainbox.json").read_text())
        assert "batch=8" in state["training"]["argv"], (node, state["training"]["argv"])
    text = hub_ctx.hub.file_bytes(repo, "metrics.jsonl").decode()
    assert [json.loads(line)["epoch"] for line in text.splitlines() if line.strip()] == [1, 2, 3, 4, 5]
    assert inspect(hub_ctx.hub.blob_path(repo, "weights/last.pt")).completed_epochs == 5
    per_commit = hub_epoch_per_commit(hub_ctx, repo)
    assert per_commit == sorted(per_commit), f"the Hub went back: {per_commit}"
