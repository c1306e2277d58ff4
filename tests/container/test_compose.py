"""compose.yaml through the real `docker compose`: it validates, and the CPU demo runs end to end.

Each test works on a copy of compose.yaml beside a .env made from .env.example, so a developer's own .env
(which holds their token) is never read or touched.
"""

from __future__ import annotations

import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from tests.container.images import REPO, docker

pytestmark = pytest.mark.container


@pytest.fixture
def project(tmp_path: Path) -> Path:
    if docker("compose", "version").returncode != 0:
        pytest.skip("no `docker compose` (bash .ci/docker.sh installs a compose v1 plugin)")
    shutil.copy(REPO / "compose.yaml", tmp_path / "compose.yaml")
    shutil.copy(REPO / ".env.example", tmp_path / ".env")
    return tmp_path


def set_env(project: Path, **values: str) -> None:
    lines = [
        line for line in (project / ".env").read_text().splitlines() if line.split("=", 1)[0] not in values
    ]  # fmt: skip
    (project / ".env").write_text("\n".join([*lines, *(f"{key}={value}" for key, value in values.items())]) + "\n")


def test_compose_config_validates(project: Path) -> None:
    # --profile cpu: compose v2 leaves services of inactive profiles out of `config`
    compose_file = str(project / "compose.yaml")
    checked = docker("compose", "--project-directory", str(project), "-f", compose_file, "--profile", "cpu", "config")
    assert checked.returncode == 0, checked.stderr
    config = yaml.safe_load(checked.stdout)
    assert set(config["services"]) == {"trainbox", "trainbox-cpu"}
    assert config["services"]["trainbox-cpu"]["environment"]["GPUS"] == "cpu"
    assert "workspace" in config["volumes"]


@pytest.fixture
def compose_project(project: Path) -> Iterator[tuple[Path, str]]:
    name = f"trainbox-test-{uuid.uuid4().hex[:8]}"
    yield project, name
    docker("compose", "--project-directory", str(project), "-p", name, "down", "-v", "--remove-orphans", timeout=300)


def test_cpu_demo_through_compose_writes_weights_to_the_volume(
    trainbox_image: str, compose_project: tuple[Path, str]
) -> None:
    project, name = compose_project
    set_env(project, TRAINBOX_IMAGE=trainbox_image, RUN_ARGS="epochs=2")
    compose = ["compose", "--project-directory", str(project), "-p", name]
    # `up` (what the README says), without building: the image under test is already there.
    up = docker(
        *compose, "--profile", "cpu", "up", "--no-build", "--exit-code-from", "trainbox-cpu", "trainbox-cpu",
        timeout=900,
    )  # fmt: skip
    assert up.returncode == 0, (up.stdout + up.stderr)[-4000:]

    listed = docker(
        "run", "--rm", "--network", "none", "-v", f"{name}_workspace:/workspace", "--entrypoint", "sh",
        trainbox_image, "-c", "ls /workspace/runs/*/weights/", timeout=120,
    )  # fmt: skip
    assert listed.returncode == 0, listed.stderr
    assert {"best.pt", "last.pt"} <= set(listed.stdout.split())
