"""The image itself: how it starts, what it keeps from its base, how it reports health."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from entrypoint import errors
from tests.container.images import docker

pytestmark = [pytest.mark.container, pytest.mark.slow]

TORCH_VERSIONS = "import torch, torchvision; print(torch.__version__, torchvision.__version__, torch.version.cuda)"


def test_image_starts_the_agent_under_tini(image_config: dict, base_image: str) -> None:
    config = image_config["Config"]
    assert config["Entrypoint"] == ["tini", "--", "trainbox"]
    assert config["Cmd"] == ["run"]
    assert config["WorkingDir"] == "/workspace"
    env = dict(item.split("=", 1) for item in config["Env"])
    assert env["PYTHONUNBUFFERED"] == "1"
    assert env["NVIDIA_DRIVER_CAPABILITIES"] == "compute,utility"
    assert "8420/tcp" in config["ExposedPorts"]
    assert config["Healthcheck"]["Test"][0] == "CMD"
    labels = config["Labels"]
    assert labels["org.opencontainers.image.base.name"] == base_image
    assert labels["org.opencontainers.image.revision"] == "test"
    assert labels["org.opencontainers.image.source"].startswith("https://")


def test_version_and_a_bad_setting_through_the_entrypoint(trainbox_image: str) -> None:
    shown = docker("run", "--rm", "--network", "none", trainbox_image, "--version", timeout=120)
    assert shown.returncode == 0, shown.stderr
    assert "trainbox, version" in shown.stdout

    refused = docker("run", "--rm", "--network", "none", "-e", "GPUS=bogus", trainbox_image, timeout=120)
    assert refused.returncode == errors.ConfigError.exit_code, refused.stdout + refused.stderr
    assert "GPUS" in refused.stderr
    assert "Traceback" not in refused.stderr


def test_the_base_torch_is_kept_and_protected(trainbox_image: str, base_image: str) -> None:
    ours = docker("run", "--rm", "--network", "none", "--entrypoint", "python3", trainbox_image, "-c", TORCH_VERSIONS)
    theirs = docker("run", "--rm", "--network", "none", "--entrypoint", "python3", base_image, "-c", TORCH_VERSIONS)
    assert ours.returncode == 0 and theirs.returncode == 0, ours.stderr + theirs.stderr
    assert ours.stdout == theirs.stdout

    # A later pip install that wants another torch fails instead of swapping it.
    swap = docker(
        "run", "--rm", "--network", "none", "--entrypoint", "python3", trainbox_image,
        "-m", "pip", "install", "--no-index", "torch==2.13.0", timeout=120,
    )  # fmt: skip
    assert swap.returncode != 0
    assert "ResolutionImpossible" in swap.stdout + swap.stderr
    assert "(constraint)" in swap.stdout + swap.stderr


def test_the_image_leaves_the_fetched_runtimes_and_matplotlib_out(trainbox_image: str) -> None:
    """pyarrow, onnx and onnxruntime are fetched on first use (entrypoint/runtimes/fetch.py); the plot is Pillow's."""
    modules = "('pyarrow', 'onnx', 'onnxruntime', 'matplotlib', 'PIL')"
    probe = f"import importlib.util as u; print(sorted(m for m in {modules} if u.find_spec(m)))"
    found = docker("run", "--rm", "--network", "none", "--entrypoint", "python3", trainbox_image, "-c", probe)
    assert found.returncode == 0, found.stderr
    assert found.stdout.strip() == "['PIL']"


def write_state(workspace: Path, phase: str) -> None:
    run_dir = workspace / "runs" / "demo-12345678"
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "trainbox.json").write_text(json.dumps({"run_name": run_dir.name, "phase": phase}))


def test_healthcheck_reads_the_agent_state(trainbox_image: str, image_config: dict, tmp_path: Path) -> None:
    program, *args = image_config["Config"]["Healthcheck"]["Test"][1:]

    def healthy() -> int:
        volume = f"{tmp_path}:/workspace"
        result = docker(
            "run", "--rm", "--network", "none", "-v", volume, "--entrypoint", program, trainbox_image, *args
        )
        return result.returncode

    assert healthy() != 0, "no trainbox.json yet: not healthy (the start period covers that)"
    write_state(tmp_path, "training")
    assert healthy() == 0
    for phase in ("failed", "stalled", "timed_out"):
        write_state(tmp_path, phase)
        assert healthy() != 0, phase
    write_state(tmp_path, "done")
    assert healthy() == 0
