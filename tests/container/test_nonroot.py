"""The optional non-root image (--build-arg TRAINBOX_UID): the agent trains as that user and writes the volume."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.container import images
from tests.container.images import docker

pytestmark = [pytest.mark.container, pytest.mark.slow]
UID = images.NONROOT_UID


@pytest.fixture(scope="module")
def nonroot_image(base_image: str, tmp_path_factory: pytest.TempPathFactory) -> str:
    try:
        return images.project_image(base_image, tmp_path_factory.mktemp("build") / "build.log", TRAINBOX_UID=UID)
    except images.BuildError as error:
        pytest.fail(str(error))


@pytest.fixture
def volume(container_name: str) -> Iterator[str]:
    name = f"{container_name}-workspace"
    yield name
    docker("rm", "-f", container_name)  # a volume still mounted by the test's container is not removed
    docker("volume", "rm", "-f", name)


def test_the_default_image_runs_as_root(trainbox_image: str) -> None:
    user = json.loads(docker("image", "inspect", trainbox_image, check=True).stdout)[0]["Config"]["User"]
    assert user in ("", "0:0", "0")


def test_the_cpu_demo_trains_as_the_user_and_writes_a_new_volume(
    nonroot_image: str, container_name: str, volume: str
) -> None:
    config = json.loads(docker("image", "inspect", nonroot_image, check=True).stdout)[0]["Config"]
    assert config["User"] == f"{UID}:{UID}"
    run = docker(
        # One CPU (tests/container/test_compose.py says why); one epoch writes the weights this reads. Neither the
        # score at the end nor the host's measure (a `libreyolo val`, 128 MiB fsync'd) is what this test reads.
        "run", "--name", container_name, "--init", "--network", "none", "--shm-size", "1g", "--cpus", "1",
        "-v", f"{volume}:/workspace", "-e", "GPUS=cpu", "-e", "RUN_ARGS=epochs=1", "-e", "EVAL=0",
        "-e", "HOST_CHECK=off", nonroot_image, timeout=900,
    )  # fmt: skip
    assert run.returncode == 0, (run.stdout + run.stderr)[-4000:]
    listed = docker(
        "run", "--rm", "--network", "none", "-v", f"{volume}:/workspace", "--entrypoint", "sh", nonroot_image,
        "-c", "id -u; stat -c %u /workspace/runs/*/weights/last.pt; ls /workspace/runs/*/weights/",
        timeout=120,
    )  # fmt: skip
    assert listed.returncode == 0, listed.stderr
    lines = listed.stdout.split()
    assert lines[:2] == [UID, UID], "the agent ran as the user, and the weights are the user's"
    assert {"best.pt", "last.pt"} <= set(lines[2:])


def test_a_bad_uid_fails_the_build(base_image: str, tmp_path: Path) -> None:
    with pytest.raises(images.BuildError, match="TRAINBOX_UID must be a number"):
        images.project_image(base_image, tmp_path / "build.log", TRAINBOX_UID="root")
