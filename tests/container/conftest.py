"""Container tests: the real Dockerfile, built and run by a real Docker engine (see ``images.py``).

Tests marked ``container`` skip, with the reason, where no engine answers (``bash .ci/docker.sh`` installs and
starts one) or no base image can be had.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.container import images
from tests.container.images import docker


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    if item.get_closest_marker("container") is not None:
        reason = images.engine_unavailable()
        if reason:
            pytest.skip(reason)


@pytest.fixture(scope="session")
def base_image() -> str:
    """The image the Dockerfile builds on: the real PyTorch image if named, else the stand-in."""
    try:
        return images.base_image()
    except images.Unavailable as reason:
        pytest.skip(f"no base image: {reason}")


@pytest.fixture(scope="session")
def trainbox_image(base_image: str, tmp_path_factory: pytest.TempPathFactory) -> str:
    try:
        return images.project_image(base_image, tmp_path_factory.mktemp("build") / "build.log")
    except images.BuildError as error:
        pytest.fail(str(error))


@pytest.fixture(scope="session")
def wheelhouse(trainbox_image: str) -> Path:
    """The runtimes' pinned wheels on this machine (downloaded once), for containers that fetch them offline."""
    try:
        return images.wheelhouse(trainbox_image)
    except images.BuildError as error:
        pytest.fail(str(error))


@pytest.fixture(scope="session")
def image_config(trainbox_image: str) -> dict:
    return json.loads(docker("image", "inspect", trainbox_image, check=True).stdout)[0]


@pytest.fixture
def container_name(request: pytest.FixtureRequest) -> Iterator[str]:
    """A unique container name, removed after the test whatever happened."""
    name = f"trainbox-test-{os.getpid()}-{request.node.name}"[:120].replace("[", "-").replace("]", "")
    yield name
    docker("rm", "-f", "-v", name)
