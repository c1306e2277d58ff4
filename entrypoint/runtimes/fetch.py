"""Optional runtimes kept out of the image and fetched on first use: pyarrow (parquet datasets), onnx and
onnxruntime (EXPORT=onnx), trackio (TRACKIO naming a Space to create). Together 305 MB installed that most runs
never import (docs/image.md).

Each runtime is a fixed set of wheels pinned to exact versions (those the tests pass with), installed by the
image's own pip (``--no-deps --only-binary=:all:``; pip reads its PIP_* settings from the environment, so an
index, a proxy or a wheelhouse works) into the volume, ``<WORKDIR>/.trainbox/runtimes/<python>/``, so a restart
does not fetch again. pip writes into a temporary folder that is renamed into place once complete: a folder
under its final name is whole (a kill mid-install leaves only a temporary folder, removed by the next fetch).
A lock file serialises the fetch: a second container on the volume waits, then uses the first's folder.
Nothing is fetched where the modules import already (a dev install, or an image built with them:
``--build-arg TRAINBOX_RUNTIMES``).

The agent imports them through ``sys.path``; the children that need them (the export and its check, the parquet
conversion) through ``PYTHONPATH`` (``child_env``).
"""

from __future__ import annotations

import fcntl
import hashlib
import importlib
import importlib.util
import os
import platform
import re
import shutil
import sys
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from .. import procs
from ..log import logger

PIP_TIMEOUT = 15 * 60.0  # pyarrow's wheel is 55 MB, onnxruntime's 28 MB: minutes on a slow link at most
_TEMPORARY = ".partial-"


@dataclass(frozen=True)
class Runtime:
    name: str
    modules: tuple[str, ...]  # what it makes importable; all there already: nothing fetched
    wheels: tuple[str, ...]  # ``name==version``, the dependencies the image lacks among them (pip gets --no-deps)

    @property
    def folder(self) -> str:
        """Its folder's name: another set of pins is another folder, never mixed with this one."""
        return f"{self.name}-{hashlib.sha256(' '.join(self.wheels).encode()).hexdigest()[:12]}"


# numpy, packaging and typing_extensions, which these require too, are in the image (libreyolo, torch).
PARQUET = Runtime("parquet", ("pyarrow",), ("pyarrow==26.0.1",))
ONNX = Runtime(
    "onnx",
    ("onnx", "onnxruntime"),
    ("onnx==1.23.2", "onnxruntime==1.32.0", "protobuf==7.36.2", "ml_dtypes==0.7.0", "flatbuffers==25.12.19"),
)
# TRACKIO naming a Space that does not exist yet: trackio's deploy creates it (report/dashboard.py)
TRACKIO = Runtime(
    "trackio",
    ("trackio",),
    (
        "trackio==0.43.0",
        "gradio_client==2.7.2",
        "orjson==3.13.0",
        "python-multipart==0.0.34",
        "starlette==1.10.0",
        "uvicorn==0.55.0",
        "watchfiles==1.3.0",
    ),
)
RUNTIMES = {runtime.name: runtime for runtime in (PARQUET, ONNX, TRACKIO)}

# What a runtime's fetch failed with, once per process: the agent does not ask the index again in the same start.
_failed: dict[str, str] = {}
_active: list[Path] = []


class FetchFailed(Exception):
    """The runtime could not be installed; the message says why, in one line, with no secret in it."""


def failure(runtime: Runtime) -> str | None:
    """Why this start's fetch of ``runtime`` failed, if it did."""
    return _failed.get(runtime.name)


def providing(modules: tuple[str, ...]) -> list[Runtime]:
    """The runtimes that would provide these modules."""
    return [runtime for runtime in RUNTIMES.values() if set(runtime.modules) & set(modules)]


def not_importable(modules: tuple[str, ...]) -> list[str]:
    """The wheels a start would fetch here for ``modules`` (those not importable): for the dry run."""
    lacking = [
        runtime for runtime in providing(modules) if any(importlib.util.find_spec(m) is None for m in runtime.modules)
    ]
    return [wheel for runtime in lacking for wheel in runtime.wheels]


def root(workdir: Path) -> Path:
    """Where runtimes live on the volume, one folder per Python (a volume may outlive the image)."""
    return workdir / ".trainbox" / "runtimes" / f"{sys.implementation.cache_tag}-{platform.machine()}"


def ensure(
    runtime: Runtime,
    workdir: Path,
    env: Mapping[str, str],
    find: Callable[[str], object | None] = importlib.util.find_spec,
) -> None:
    """``runtime``'s modules importable here and in children (``child_env``): already, from the volume, or
    fetched now. ``FetchFailed`` says why not (remembered: a second call in this process does not retry)."""
    if runtime.name in _failed:
        raise FetchFailed(_failed[runtime.name])
    if all(find(module) is not None for module in runtime.modules):
        return
    installed = root(workdir) / runtime.folder
    if not installed.is_dir():
        try:
            _install(runtime, installed, env)
        except FetchFailed as error:
            _failed[runtime.name] = str(error)
            raise
    _activate(installed)
    missing = [module for module in runtime.modules if find(module) is None]
    if missing:  # the wheels installed, yet the modules are not there: another platform's, or a wrong pin
        _failed[runtime.name] = f"{', '.join(missing)} not importable from {installed}"
        raise FetchFailed(_failed[runtime.name])


def child_env(env: Mapping[str, str]) -> dict[str, str]:
    """``env`` with the fetched runtimes first on PYTHONPATH, for a child that imports them."""
    if not _active:
        return dict(env)
    paths = [str(path) for path in _active] + [part for part in env.get("PYTHONPATH", "").split(os.pathsep) if part]
    return {**env, "PYTHONPATH": os.pathsep.join(paths)}


def _activate(installed: Path) -> None:
    if installed not in _active:
        _active.append(installed)
        sys.path.insert(0, str(installed))
        importlib.invalidate_caches()


def _install(runtime: Runtime, installed: Path, env: Mapping[str, str]) -> None:
    try:
        installed.parent.mkdir(parents=True, exist_ok=True)
        # One fetch at a time per runtime on this volume (the lock goes with its holder, killed or not): a second
        # container waits, then finds the first's folder.
        with (installed.parent / f".{runtime.folder}.lock").open("a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if installed.is_dir():
                logger.info("runtime %s: another start installed it meanwhile", runtime.name)
                return
            for stale in installed.parent.glob(f"{_TEMPORARY}{runtime.folder}-*"):
                shutil.rmtree(stale, ignore_errors=True)  # what a killed fetch left: the lock says none is running
            scratch = Path(tempfile.mkdtemp(prefix=f"{_TEMPORARY}{runtime.folder}-", dir=installed.parent))
            try:
                scratch.chmod(0o755)  # mkdtemp's 0700 would hide it from a container running as another user
                _pip(runtime, scratch, env)
                scratch.rename(installed)  # the commit: a folder under this name is whole
            finally:
                shutil.rmtree(scratch, ignore_errors=True)
    except OSError as error:  # a full or read-only volume: said as the fetch's failure, in one line
        raise FetchFailed(f"could not install it into {installed}: {error.strerror or error}") from None
    logger.info("runtime %s: installed in %s", runtime.name, installed)


def _pip(runtime: Runtime, target: Path, env: Mapping[str, str]) -> None:
    logger.info("runtime %s: fetching %s", runtime.name, " ".join(runtime.wheels))
    argv = [sys.executable, "-m", "pip", "install", "--no-deps", "--only-binary=:all:", "--no-input"]
    argv += ["--disable-pip-version-check", "--target", str(target), *runtime.wheels]
    # pip's own settings (PIP_INDEX_URL, PIP_FIND_LINKS, proxies, certificates) come with the environment; the
    # Hub's token is nothing pip needs (the provider keys are already out of ``env``).
    pip_env = {key: value for key, value in env.items() if key != "HF_TOKEN"}
    done = procs.run(argv, timeout=PIP_TIMEOUT, env=pip_env, echo=False)
    if done.timed_out:
        raise FetchFailed(f"pip did not finish within {PIP_TIMEOUT:.0f} s")
    if done.returncode != 0:
        raise FetchFailed(f"pip install failed: {_why(done.stderr or done.stdout)}")


# user:password@ (or a token@) in a URL pip echoes: an index with credentials must never reach a log.
_CREDENTIALS = re.compile(r"(?<=://)[^/\s@]+@")


def redact(text: str) -> str:
    return _CREDENTIALS.sub("***@", text)


def _why(output: str) -> str:
    """pip's last ERROR line (else its last line), credentials removed, on one line."""
    lines = [line.strip() for line in output.splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith("ERROR:")]
    chosen = errors[-1] if errors else (lines[-1] if lines else "no output")
    return redact(chosen)[:400]
