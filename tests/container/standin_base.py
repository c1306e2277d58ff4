"""A stand-in for the PyTorch CUDA runtime image, for building the real Dockerfile with no image registry.

It plays ``pytorch/pytorch:<torch>-cuda<x>-cudnn9-runtime``: a Debian root filesystem whose ``python3`` and
``pip`` (first on PATH) carry torch and torchvision. Built from package registries only, in about 3 minutes:

1. pip downloads the torch/torchvision wheels (and their dependencies) for the image's Python, on the host;
2. debootstrap makes a minimal Debian trixie, whose Python 3.13 is close to what the PyTorch images ship
   (bookworm's 3.11.2 predates fixes the official images have, such as tarfile's extraction filters);
3. in a chroot inside a private mount namespace, a venv at /opt/venv gets the wheels, installed by uv;
4. the tree is imported as a one-layer image (never ``COPY`` the wheels: 3 GB would stay in a layer).

The host's extra CA certificates go into the image, so pip in a ``docker build`` on top of it reaches PyPI where
HTTPS is intercepted, and the production Dockerfile needs no test-only arguments.

Run standalone: ``python tests/container/standin_base.py [--force]`` prints the tag once the image exists.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from collections.abc import Iterator
from pathlib import Path

TORCH = "2.14.1"
TORCHVISION = "0.29.1"
SUITE = "trixie"
PYTHON = "3.13"  # trixie's python3
# Bumped whenever the recipe changes what the image holds, so an old stand-in is not reused.
RECIPE = 1
TAG = f"trainbox-standin:torch{TORCH}-py{PYTHON}-r{RECIPE}"
# Peak use: the wheels (~3 GB), the root filesystem (~6 GB) and the image being imported (~6 GB).
NEEDED_FREE_BYTES = 15 * 1024**3
DEBIAN_MIRROR = "http://deb.debian.org/debian"
HOST_EXTRA_CERTS = Path("/usr/local/share/ca-certificates")
CA_BUNDLE = "/etc/ssl/certs/ca-certificates.crt"
_ENV = {
    "PATH": "/opt/venv/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    "LANG": "C.UTF-8",
    "SSL_CERT_FILE": CA_BUNDLE,
    "REQUESTS_CA_BUNDLE": CA_BUNDLE,
    "PIP_CERT": CA_BUNDLE,
}


class StandinUnavailable(RuntimeError):
    """This machine cannot build the stand-in (not a failure of the image): the tests that need it skip."""


def _run(argv: list[str], **kwargs: object) -> subprocess.CompletedProcess[bytes]:
    print("+", shlex.join(argv), file=sys.stderr, flush=True)
    return subprocess.run(argv, check=True, **kwargs)  # type: ignore[call-overload]


def image_exists(tag: str) -> bool:
    return subprocess.run(["docker", "image", "inspect", tag], capture_output=True).returncode == 0


def debian_mirror() -> str:
    """The Debian mirror apt already uses on this host (the one known to be reachable)."""
    if os.environ.get("TRAINBOX_DEBIAN_MIRROR"):
        return os.environ["TRAINBOX_DEBIAN_MIRROR"]
    sources = [*Path("/etc/apt/sources.list.d").glob("*.sources"), Path("/etc/apt/sources.list")]
    for path in sources:
        try:
            text = path.read_text()
        except OSError:
            continue
        found = re.search(r"^URIs:\s*(\S+/debian)/?\s*$", text, re.M) or re.search(
            r"^deb\s+(?:\[[^]]*\]\s+)?(\S+/debian)/?\s", text, re.M
        )
        if found:
            return found.group(1)
    return DEBIAN_MIRROR


def check_prerequisites(scratch: Path) -> None:
    if os.geteuid() != 0:
        raise StandinUnavailable("building the stand-in base needs root (debootstrap, chroot)")
    missing = [tool for tool in ("docker", "debootstrap", "unshare", "chroot", "tar") if shutil.which(tool) is None]
    if missing:
        raise StandinUnavailable(f"missing {', '.join(missing)} (bash .ci/docker.sh installs them)")
    free = shutil.disk_usage(scratch).free
    if free < NEEDED_FREE_BYTES:
        raise StandinUnavailable(f"{free / 1024**3:.0f} GB free under {scratch}; the stand-in needs 15 GB at its peak")


def manylinux_platforms() -> list[str]:
    """Every manylinux tag trixie's glibc (2.41) accepts: pip does not expand ``--platform`` itself."""
    tags = ["manylinux1_x86_64", "manylinux2010_x86_64", "manylinux2014_x86_64"]
    tags += [f"manylinux_2_{minor}_x86_64" for minor in range(5, 42)]
    return [arg for tag in tags for arg in ("--platform", tag)]


def download_wheels(dest: Path) -> None:
    abi = f"cp{PYTHON.replace('.', '')}"
    _run(
        [
            sys.executable, "-m", "pip", "download", "-qq", "--only-binary=:all:", "--dest", str(dest),
            "--python-version", PYTHON, "--implementation", "cp", "--abi", abi, "--abi", "abi3", "--abi", "none",
            *manylinux_platforms(), f"torch=={TORCH}", f"torchvision=={TORCHVISION}", "uv",
        ]
    )  # fmt: skip


def extract_uv(wheels: Path, dest: Path) -> Path:
    """uv's static binary from its PyPI wheel: installs the 3 GB of wheels in half pip's time."""
    wheel = next(wheels.glob("uv-*.whl"))
    with zipfile.ZipFile(wheel) as archive:
        member = next(name for name in archive.namelist() if name.endswith(".data/scripts/uv"))
        dest.write_bytes(archive.read(member))
    wheel.unlink()
    dest.chmod(0o755)
    return dest


def bootstrap(rootfs: Path) -> None:
    _run(
        ["debootstrap", "--variant=minbase", "--include=python3,python3-venv,ca-certificates", SUITE, str(rootfs),
         debian_mirror()],
        stdout=subprocess.DEVNULL,
    )  # fmt: skip
    certs = sorted(HOST_EXTRA_CERTS.glob("*.crt"))
    target = rootfs / HOST_EXTRA_CERTS.relative_to("/")
    target.mkdir(parents=True, exist_ok=True)
    for cert in certs:
        shutil.copy2(cert, target / cert.name)


def install_torch(rootfs: Path, wheels: Path) -> None:
    """Create /opt/venv and install the wheels, in a chroot whose mounts vanish with its namespace."""
    (rootfs / "wheels").mkdir()
    uv = extract_uv(wheels, rootfs / "root" / "uv")
    inside = (
        "update-ca-certificates >/dev/null && python3 -m venv /opt/venv && "
        f"/root/uv pip install --quiet --python /opt/venv/bin/python --no-index --find-links /wheels "
        f"--link-mode copy --no-cache torch=={TORCH} torchvision=={TORCHVISION}"
    )
    root = shlex.quote(str(rootfs))
    script = (
        "set -e; "
        f"mount --rbind /dev {root}/dev; mount -t proc proc {root}/proc; "
        f"mount --bind {shlex.quote(str(wheels))} {root}/wheels; mount -o remount,bind,ro {root}/wheels; "
        f"chroot {root} /bin/sh -c {shlex.quote(inside)}"
    )
    _run(["unshare", "--mount", "--propagation", "private", "sh", "-c", script])
    shutil.rmtree(wheels)  # 3 GB less at the peak, before the import doubles the root filesystem
    uv.unlink()
    (rootfs / "wheels").rmdir()
    for leftover in ("var/cache/apt/archives", "var/lib/apt/lists"):
        for path in (rootfs / leftover).glob("*"):
            if path.is_file():
                path.unlink()


def import_image(rootfs: Path, tag: str) -> None:
    changes = [f"ENV {key}={value}" for key, value in _ENV.items()]
    changes += [
        "WORKDIR /workspace",
        'CMD ["bash"]',
        f'LABEL org.opencontainers.image.description="trainbox test stand-in for the PyTorch {TORCH} runtime image"',
    ]
    argv = ["docker", "import", *(arg for change in changes for arg in ("--change", change)), "-", tag]
    print("+ tar -C ROOTFS -c . |", shlex.join(argv), file=sys.stderr, flush=True)
    with subprocess.Popen(["tar", "--numeric-owner", "-C", str(rootfs), "-c", "."], stdout=subprocess.PIPE) as tar:
        imported = subprocess.run(argv, stdin=tar.stdout, stdout=subprocess.DEVNULL, check=False)
        assert tar.stdout is not None
        tar.stdout.close()
    if tar.returncode or imported.returncode:
        raise RuntimeError(f"importing the stand-in failed (tar {tar.returncode}, docker {imported.returncode})")


def build(tag: str = TAG, scratch: Path | None = None) -> str:
    scratch = Path(scratch or os.environ.get("TRAINBOX_BUILD_TMP") or "/var/tmp")
    check_prerequisites(scratch)
    work = Path(tempfile.mkdtemp(prefix="trainbox-standin-", dir=scratch))
    wheels, rootfs = work / "wheels", work / "rootfs"
    steps = (
        ("download the wheels", lambda: download_wheels(wheels)),
        ("debootstrap", lambda: bootstrap(rootfs)),
        ("install torch", lambda: install_torch(rootfs, wheels)),
        ("import the image", lambda: import_image(rootfs, tag)),
    )
    try:
        for name, step in steps:
            started = time.monotonic()
            step()
            print(f"stand-in base: {name} took {time.monotonic() - started:.0f} s", file=sys.stderr, flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return tag


@contextlib.contextmanager
def building(tag: str) -> Iterator[None]:
    """Held while ``tag`` is checked and built: a second process (the CI script's early build, a pytest-xdist
    worker) waits for the first one's image instead of building it again beside it."""
    name = re.sub(r"[^A-Za-z0-9_.-]", "_", tag)
    with open(Path(tempfile.gettempdir()) / f"trainbox-build-{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def ensure(tag: str = TAG, *, force: bool = False) -> str:
    """The stand-in's tag, building it first unless it exists."""
    with building(tag):
        if force or not image_exists(tag):
            build(tag)
    return tag


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tag", default=TAG)
    parser.add_argument("--force", action="store_true", help="rebuild even if the tag exists")
    args = parser.parse_args()
    try:
        print(ensure(args.tag, force=args.force))
    except StandinUnavailable as reason:
        sys.exit(f"cannot build the stand-in base here: {reason}")


if __name__ == "__main__":
    main()
