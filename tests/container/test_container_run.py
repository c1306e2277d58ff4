"""The image doing its job: a Hub dataset in, a trained model on the Hub out; `docker stop` mid-training.

The container reaches the test Hub (served by this pytest process on 127.0.0.1) through ``--network host``
and trains on the CPU (``GPUS=cpu``). Secrets reach ``docker run`` through its environment (``-e HF_TOKEN``),
never its command line.
"""

from __future__ import annotations

import json
import os
import subprocess
import tarfile
import time
from pathlib import Path

import pytest

from entrypoint import errors
from entrypoint.sync.checkpoint import inspect, is_valid
from tests.container import images
from tests.container.images import docker
from tests.hubfixtures import HubContext
from tests.support import TINY_RUN_ARGS, make_dataset

pytestmark = [pytest.mark.container, pytest.mark.slow]

STOP_GRACE = 60  # seconds `docker stop` waits before SIGKILL (which would show as 137)


def hub_dataset(ctx: HubContext, tmp_path: Path) -> str:
    """A dataset repo holding one tar of a tiny generated dataset."""
    root = make_dataset(tmp_path / "cones", train=16, val=4).parent
    archive = tmp_path / "cones.tar"
    with tarfile.open(archive, "w") as tar:
        tar.add(root, arcname="cones")
    repo = ctx.repo_id("cones")
    ctx.hub.create_repo(repo, repo_type="dataset", private=True)
    ctx.hub.upload_file(repo, "cones.tar", archive, repo_type="dataset")
    return repo


def docker_run_argv(
    image: str, name: str, workspace: Path, env: dict[str, str], wheels: Path
) -> tuple[list[str], dict[str, str]]:
    """``docker run`` with ``env`` passed by name: values travel in the CLI's environment. The runtimes the
    agent fetches on first use (EXPORT=onnx's) come from ``wheels``, mounted: no index is asked."""
    # Both CPUs, not one as the demo tests grant: at one CPU libreyolo's in-place write of last.pt takes half of
    # these 2-second epochs, and the stop test's boundary can find it mid-write at every epoch (then only
    # epoch_N.pt reaches the Hub, which the stop test would not take for last.pt).
    argv = ["docker", "run", "--name", name, "--network", "host", "-v", f"{workspace}:/workspace"]
    argv += ["-v", f"{wheels}:{images.WHEELHOUSE_MOUNT}:ro"]
    env = {**env, **images.wheelhouse_env()}
    for key in env:
        argv += ["-e", key]
    return [*argv, image], {**os.environ, **env}


def agent_env(ctx: HubContext, dataset: str, output: str, run_args: str) -> dict[str, str]:
    return {
        "HF_TOKEN": ctx.token,
        "HF_ENDPOINT": ctx.hub.url,
        "HF_HUB_DISABLE_XET": "1",
        "HF_HUB_DISABLE_TELEMETRY": "1",
        "DATASET_REPO": dataset,
        "OUTPUT_REPO": output,
        "RUN_ARGS": run_args,
        "GPUS": "cpu",
        "PROVIDER": "none",
        "HOST_CHECK": "off",  # the host's measure (128 MiB written, fsync'd, read back) is test_host_check.py's
    }


def hub_json(ctx: HubContext, repo: str, path: str) -> dict:
    return json.loads(ctx.hub.file_bytes(repo, path))


def test_trains_a_hub_dataset_and_uploads_the_model(
    trainbox_image: str, container_name: str, hub_ctx: HubContext, tmp_path: Path, wheelhouse: Path
) -> None:
    dataset = hub_dataset(hub_ctx, tmp_path)
    output = hub_ctx.repo_id("model")
    workspace = tmp_path / "workspace"
    workspace.mkdir()
    argv, env = docker_run_argv(
        trainbox_image,
        container_name,
        workspace,
        agent_env(hub_ctx, dataset, output, f"{TINY_RUN_ARGS} epochs=2"),
        wheelhouse,
    )
    result = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=900)
    logs = result.stdout + result.stderr
    assert result.returncode == 0, logs[-4000:]
    assert hub_ctx.token not in logs

    files = hub_ctx.hub.files(output)
    for name in ("weights/best.pt", "weights/last.pt", "status.json", "trainbox.json"):
        assert name in files, f"{name} missing on the Hub"
    assert is_valid(hub_ctx.hub.blob_path(output, "weights/best.pt"))
    assert inspect(hub_ctx.hub.blob_path(output, "weights/last.pt")).completed_epochs == 2
    state = hub_json(hub_ctx, output, "trainbox.json")
    assert state["phase"] == "done"
    assert state["exit"]["code"] == 0
    # the dataset came from the Hub, pinned to the commit it resolved to
    assert state["dataset"]["revision"] == hub_ctx.hub.head(dataset, repo_type="dataset")
    # and the weights are on the volume too
    assert list(workspace.glob("runs/*/weights/best.pt"))
    # EXPORT's default (onnx, with OUTPUT_REPO): the image lacks onnx and onnxruntime, the agent fetched them into
    # the volume (from the mounted wheelhouse), exported and checked the file, and published it
    assert state["exports"]["onnx"]["status"] == "published", state["exports"]
    assert state["exports"]["onnx"]["file"] in files
    fetched = list(workspace.glob(".trainbox/runtimes/*/onnx-*/onnxruntime/__init__.py"))
    assert len(fetched) == 1, sorted(str(path) for path in workspace.glob(".trainbox/runtimes/**"))
    assert not list(workspace.glob(".trainbox/runtimes/*/.partial-*"))


def test_docker_stop_mid_training_is_a_clean_preemption(
    trainbox_image: str, container_name: str, hub_ctx: HubContext, tmp_path: Path, wheelhouse: Path
) -> None:
    dataset = hub_dataset(hub_ctx, tmp_path)
    output = hub_ctx.repo_id("preempted")
    workspace = tmp_path / "workspace"
    workspace.mkdir()
    # Long enough to be stopped mid-way; not more: each kept epoch_N.pt counts in the disk check (≈35 MB each).
    run_args = f"{TINY_RUN_ARGS} epochs=40 save_period=1"
    argv, env = docker_run_argv(
        trainbox_image, container_name, workspace, agent_env(hub_ctx, dataset, output, run_args), wheelhouse
    )
    process = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        completed = 0
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline and process.poll() is None:
            if hub_ctx.hub.repo_exists(output) and "status.json" in hub_ctx.hub.files(output):
                completed = hub_json(hub_ctx, output, "status.json").get("completed_epochs") or 0
                if completed >= 2:
                    break
            time.sleep(0.5)
        assert completed >= 2, "training never reached epoch 2 on the Hub"
        (status,) = workspace.glob("runs/*/status.json")
        done_locally = json.loads(status.read_text())["completed_epochs"]

        started = time.monotonic()
        stopped = docker("stop", "-t", str(STOP_GRACE), container_name, timeout=STOP_GRACE + 60)
        took = time.monotonic() - started
        logs, _ = process.communicate(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
    assert stopped.returncode == 0, stopped.stderr
    exit_code = docker("inspect", "--format", "{{.State.ExitCode}}", container_name).stdout.strip()
    # 143, not 137: tini passed SIGTERM on and the agent wrapped up before the grace period ran out.
    assert exit_code == str(errors.PreemptedError.exit_code), logs[-4000:]
    assert process.returncode == errors.PreemptedError.exit_code
    assert took < STOP_GRACE
    assert hub_ctx.token not in logs

    state = hub_json(hub_ctx, output, "trainbox.json")
    assert state["phase"] == "preempted"
    assert state["exit"]["code"] == errors.PreemptedError.exit_code
    files = hub_ctx.hub.files(output)
    assert f"weights/epoch_{done_locally}.pt" in files
    last = inspect(hub_ctx.hub.blob_path(output, "weights/last.pt"))
    assert last.completed_epochs is not None and last.completed_epochs >= done_locally
