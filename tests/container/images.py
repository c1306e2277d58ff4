"""The Docker engine and the images the container tests (and bench/image_layers.py) run.

The project image is built once per content: its tag is a hash of everything the build reads (Dockerfile,
.dockerignore, pyproject.toml, README.md, entrypoint/, docker/) and of the base image's id, so an unchanged tree reuses
it and a changed one rebuilds only the layers after the change (Docker's layer cache).

The base is ``TRAINBOX_TEST_BASE_IMAGE`` where a registry is reachable (e.g. the real PyTorch image on GitHub
Actions), else the stand-in built by ``standin_base.py`` (no registry needed; built once, then reused).

``python -m tests.container.images`` builds both ahead of the tests (.ci/run starts it beside the lint and the
other tests); a build under way holds a lock that the tests' fixtures wait on, so nothing is built twice.
"""

from __future__ import annotations

import functools
import hashlib
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from tests.container import standin_base

REPO = Path(__file__).resolve().parents[2]
IMAGE_NAME = "trainbox-test"
# What the build context holds (see .dockerignore), and the Dockerfile itself.
BUILD_INPUTS = ("Dockerfile", ".dockerignore", "pyproject.toml", "README.md")
BUILD_FOLDERS = ("entrypoint", "docker")
BUILD_TIMEOUT = 1800

Unavailable = standin_base.StandinUnavailable


class BuildError(RuntimeError):
    pass


def docker(*args: str, timeout: float = 120, check: bool = False) -> subprocess.CompletedProcess[str]:
    """``docker ARGS``, output captured as text."""
    return subprocess.run(["docker", *args], capture_output=True, text=True, timeout=timeout, check=check)


@functools.cache
def engine_unavailable() -> str | None:
    """Why no container can run here, or None."""
    if shutil.which("docker") is None:
        return "no docker CLI (bash .ci/docker.sh installs the engine)"
    try:
        info = docker("info", "--format", "{{.ServerVersion}}", timeout=60)
    except subprocess.TimeoutExpired:
        return "`docker info` did not answer within 60 s"
    if info.returncode != 0:
        last = (info.stderr.strip().splitlines() or ["no output"])[-1]
        return f"no Docker engine answers ({last}); bash .ci/docker.sh starts one"
    return None


def image_id(tag: str) -> str | None:
    found = docker("image", "inspect", "--format", "{{.Id}}", tag)
    return found.stdout.strip() if found.returncode == 0 else None


def base_image() -> str:
    """The image the Dockerfile builds on; raises ``Unavailable`` where none can be had."""
    named = os.environ.get("TRAINBOX_TEST_BASE_IMAGE")
    if not named:
        return standin_base.ensure()
    if image_id(named) is None:
        pulled = docker("pull", named, timeout=BUILD_TIMEOUT)
        if pulled.returncode != 0:
            raise BuildError(f"cannot pull {named}: {pulled.stderr.strip()[-500:]}")
    return named


def build_inputs_digest(base_id: str) -> str:
    digest = hashlib.sha256(base_id.encode())
    files = [REPO / name for name in BUILD_INPUTS]
    for folder in BUILD_FOLDERS:
        files += sorted(p for p in (REPO / folder).rglob("*") if p.is_file() and "__pycache__" not in p.parts)
    for path in files:
        digest.update(str(path.relative_to(REPO)).encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()[:16]


def project_image(base: str, log: Path, **build_args: str) -> str:
    """The project's image on ``base``, built from the working tree unless this exact content was built before;
    ``build_args`` (e.g. TRAINBOX_UID) make a variant with a tag of its own."""
    base_id = image_id(base)
    if base_id is None:
        raise BuildError(f"no image {base}")
    variant = "".join(f"-{key.lower()}{value}" for key, value in sorted(build_args.items()))
    tag = f"{IMAGE_NAME}:{build_inputs_digest(base_id)}{variant}"
    with standin_base.building(tag):
        if image_id(tag) is None:
            _build(tag, base, log, build_args)
    return tag


def _build(tag: str, base: str, log: Path, build_args: dict[str, str]) -> None:
    # --force-rm: a failed step's container (test_a_bad_uid_fails_the_build's) is removed too, not left holding
    # an image's layers on the disk.
    argv = ["docker", "build", "--force-rm", "--build-arg", f"BASE_IMAGE={base}", "--build-arg", "REVISION=test"]
    argv += ["-t", tag]
    argv += [arg for key, value in build_args.items() for arg in ("--build-arg", f"{key}={value}")]
    with log.open("w") as out:
        built = subprocess.run([*argv, str(REPO)], stdout=out, stderr=subprocess.STDOUT, timeout=BUILD_TIMEOUT)
    if built.returncode != 0:
        raise BuildError(f"docker build failed ({built.returncode}):\n{log.read_text()[-4000:]}")
    remove_older_builds(keep=tag)


def remove_older_builds(keep: str) -> None:
    """Untag earlier builds of the same variant, so repeated runs on one machine do not fill its disk."""
    listed = docker("image", "ls", "--format", "{{.Repository}}:{{.Tag}}", IMAGE_NAME)
    variant = keep.split(":", 1)[1][16:]  # what follows the 16-character digest
    for tag in listed.stdout.split():
        if tag != keep and tag.split(":", 1)[1][16:] == variant:
            docker("image", "rm", tag)  # refused while a container uses it: fine, next time


def wheelhouse(image: str) -> Path:
    """The pinned wheels of the runtimes the agent fetches on first use (entrypoint/runtimes/fetch.py), downloaded
    once by ``image``'s own pip (its Python and platform choose the files) into a folder on this machine: mounted
    into a test container with ``PIP_FIND_LINKS`` and ``PIP_NO_INDEX`` (``wheelhouse_env``), a run fetches them
    without the internet. Kept between test runs, one folder per set of pins and Python."""
    from entrypoint.runtimes.fetch import RUNTIMES

    pins = sorted(wheel for runtime in RUNTIMES.values() for wheel in runtime.wheels)
    ask = "import sys, platform; print(sys.implementation.cache_tag, platform.machine())"
    python = docker("run", "--rm", "--network", "none", "--entrypoint", "python3", image, "-c", ask, check=True)
    key = hashlib.sha256((" ".join(pins) + python.stdout).encode()).hexdigest()[:16]
    folder = Path(tempfile.gettempdir()) / "trainbox-wheelhouse" / key
    with standin_base.building(f"wheelhouse-{key}"):
        if not folder.is_dir():
            folder.parent.mkdir(parents=True, exist_ok=True)
            scratch = Path(tempfile.mkdtemp(prefix=f".{key}-", dir=folder.parent))
            scratch.chmod(0o777)  # the image may run as another user
            fetched = docker(
                "run", "--rm", "--network", "host", "-v", f"{scratch}:/wheels", "--entrypoint", "python3", image,
                "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--dest", "/wheels", *pins,
                timeout=BUILD_TIMEOUT,
            )  # fmt: skip
            if fetched.returncode != 0:
                shutil.rmtree(scratch, ignore_errors=True)
                raise BuildError(f"cannot download the runtimes' wheels: {fetched.stderr.strip()[-1000:]}")
            scratch.rename(folder)
    return folder


WHEELHOUSE_MOUNT = "/wheelhouse"
NONROOT_UID = "1000"  # the user of the non-root variant (--build-arg TRAINBOX_UID) the tests build


def wheelhouse_env() -> dict[str, str]:
    """pip inside the container takes its wheels from the mounted wheelhouse, and never asks an index."""
    return {"PIP_FIND_LINKS": WHEELHOUSE_MOUNT, "PIP_NO_INDEX": "1"}


def main() -> None:
    """Build the base and the project image the container tests use (each only if missing); print their tags."""
    reason = engine_unavailable()
    if reason:
        raise SystemExit(f"no images built: {reason}")
    try:
        base = base_image()
        print(base, flush=True)
        image = project_image(base, Path(tempfile.gettempdir()) / "trainbox-image-build.log")
        print(image, flush=True)
        # the non-root variant test_nonroot.py runs (its own last layer): built here, beside the lint and the types,
        # not on the container tests' worker
        log = Path(tempfile.gettempdir()) / "trainbox-image-build-nonroot.log"
        print(project_image(base, log, TRAINBOX_UID=NONROOT_UID), flush=True)
        print(wheelhouse(image), flush=True)
    except (Unavailable, BuildError) as error:
        raise SystemExit(f"no images built: {error}") from None


if __name__ == "__main__":
    main()
