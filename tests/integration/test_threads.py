"""The agent sizes its training's threads to the CPUs the container may use: in a real cgroup granted one
CPU by quota where this machine lets a test make one (root, a writable cgroup v1 ``cpu`` or v2 hierarchy),
and against a cgroup tree of the test's own through the ``TRAINBOX_PROC_SELF`` seam everywhere. The stand-in
libreyolo prints the variables it got (``FAKE_PRINT_ENV``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.fakes import libreyolo as fake_libreyolo
from tests.support import trainbox_env

pytestmark = pytest.mark.slow  # `trainbox run` with the stand-in libreyolo
THREADS = "OMP_NUM_THREADS,MKL_NUM_THREADS,OPENBLAS_NUM_THREADS,OPENCV_FOR_THREADS_NUM"


def agent_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    fake_libreyolo.install(tmp_path / "bin")
    env = trainbox_env(
        tmp_path / "work",
        GPUS="cpu",
        RUN_ARGS="epochs=1",
        TRAINBOX_LIBREYOLO=str(tmp_path / "bin" / "libreyolo"),
        FAKE_PRINT_ENV=THREADS,
        **extra,
    )
    for name in THREADS.split(","):
        if name not in extra:
            env.pop(name, None)
    return env


def outcome(tmp_path: Path) -> tuple[dict[str, Any], str]:
    (path,) = (tmp_path / "work" / "runs").glob("*/trainbox.json")
    return json.loads(path.read_text()), (path.parent / "console.log").read_text()


def run(argv: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120)


AGENT = [sys.executable, "-m", "entrypoint", "run"]


def test_a_quota_of_one_cpu_gives_one_thread(tmp_path: Path) -> None:
    proc = tmp_path / "proc-self"
    proc.mkdir()
    cgroup = tmp_path / "cgroup"
    (cgroup / "job").mkdir(parents=True)
    (cgroup / "job" / "cpu.max").write_text("100000 100000\n")
    (proc / "cgroup").write_text("0::/job\n")
    (proc / "mountinfo").write_text(f"40 30 0:26 / {cgroup} rw - cgroup2 cgroup2 rw\n")
    result = run(AGENT, agent_env(tmp_path, TRAINBOX_PROC_SELF=str(proc)))
    assert result.returncode == 0, result.stderr[-3000:]
    state, console = outcome(tmp_path)
    for name in THREADS.split(","):
        assert f"env {name}=1\n" in console
    sizing = state["sizing"]
    assert sizing["cpus"]["quota"] == 1.0 and sizing["cpus"]["cpus"] == 1
    assert sizing["cpus"]["quota_at"] == str(cgroup / "job" / "cpu.max")
    assert sizing["threads"] == {"per_process": 1, "source": "cgroup quota"} or os.cpu_count() == 1
    assert "1 thread per process" in state["receipt"]["feeding"]


def test_the_users_threads_are_kept(tmp_path: Path) -> None:
    result = run(AGENT, agent_env(tmp_path, OMP_NUM_THREADS="3"))
    assert result.returncode == 0, result.stderr[-3000:]
    state, console = outcome(tmp_path)
    assert "env OMP_NUM_THREADS=3\n" in console
    assert "env MKL_NUM_THREADS=None\n" in console  # nothing added beside a choice of the user's
    assert state["sizing"]["threads"] == {"per_process": 3, "source": "user", "set": {"OMP_NUM_THREADS": "3"}}


def _writable_cpu_hierarchy() -> tuple[Path, str] | None:
    """Where a test may make a cgroup with a CPU quota: (parent folder, the quota file's name)."""
    if os.geteuid() != 0:
        return None
    v1 = Path("/sys/fs/cgroup/cpu")
    if (v1 / "cpu.cfs_quota_us").is_file() and os.access(v1, os.W_OK):
        return v1, "cpu.cfs_quota_us"
    v2 = Path("/sys/fs/cgroup")
    subtree = v2 / "cgroup.subtree_control"
    if subtree.is_file() and "cpu" in subtree.read_text().split() and os.access(v2, os.W_OK):
        return v2, "cpu.max"
    return None


@pytest.fixture
def one_cpu_cgroup() -> Iterator[Path]:
    found = _writable_cpu_hierarchy()
    if found is None:
        pytest.skip("no cgroup this test may make (needs root and a writable cgroup v1 cpu or v2 cpu hierarchy)")
    parent, quota_file = found
    group = parent / f"trainbox-test-{os.getpid()}"
    group.mkdir()
    try:
        (group / quota_file).write_text("100000" if quota_file == "cpu.cfs_quota_us" else "100000 100000")
        yield group
    finally:
        for _ in range(50):  # emptied once its last process is reaped
            try:
                group.rmdir()
                break
            except OSError:
                time.sleep(0.1)


def test_in_a_real_cgroup_granted_one_cpu(tmp_path: Path, one_cpu_cgroup: Path) -> None:
    # the agent joins the cgroup before it starts, as a container's first process is in the container's
    enter = f'echo $$ > "{one_cpu_cgroup}/cgroup.procs" && exec "$@"'
    result = run(["sh", "-c", enter, "sh", *AGENT], agent_env(tmp_path))
    assert result.returncode == 0, result.stderr[-3000:]
    state, console = outcome(tmp_path)
    assert "env OMP_NUM_THREADS=1\n" in console and "env MKL_NUM_THREADS=1\n" in console
    assert state["sizing"]["cpus"]["quota"] == 1.0 and state["sizing"]["threads"]["per_process"] == 1
    assert state["sizing"]["cpus"]["quota_at"].startswith(str(one_cpu_cgroup))
