"""The CPUs a container may use (host/grant.py), read from cgroup v1 and v2 trees laid out as the kernel
and container engines lay them out, and the trainer's threads sized from them (training/sizing.py)."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from entrypoint.host import grant
from entrypoint.training import sizing

HOST_V1 = """\
25 30 0:23 / /sys/fs/cgroup ro,nosuid - tmpfs tmpfs ro,mode=755
33 25 0:29 / /sys/fs/cgroup/cpu,cpuacct rw,nosuid - cgroup cgroup rw,cpu,cpuacct
34 25 0:30 / /sys/fs/cgroup/memory rw,nosuid - cgroup cgroup rw,memory
35 25 0:31 / /sys/fs/cgroup/unified rw,nosuid - cgroup2 cgroup2 rw
"""


def proc_self(tmp_path: Path, cgroup: str, mountinfo: str) -> Path:
    """A folder standing in for /proc/self, its mount points rewritten into ``tmp_path``."""
    folder = tmp_path / "proc-self"
    folder.mkdir()
    (folder / "cgroup").write_text(cgroup)
    (folder / "mountinfo").write_text(mountinfo.replace(" /sys/fs/cgroup", f" {tmp_path}/sys/fs/cgroup"))
    return folder


def write(path: Path, **files: str) -> None:
    path.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (path / name.replace("__", ".")).write_text(text + "\n")


def test_v1_on_the_host_reads_the_process_cgroup_and_its_parents(tmp_path: Path) -> None:
    cpu = tmp_path / "sys/fs/cgroup/cpu,cpuacct"
    write(cpu, cpu__cfs_quota_us="-1", cpu__cfs_period_us="100000")
    write(cpu / "kubepods", cpu__cfs_quota_us="400000", cpu__cfs_period_us="100000")  # the pod: 4 CPUs
    write(cpu / "kubepods/pod1", cpu__cfs_quota_us="250000", cpu__cfs_period_us="100000")  # the container: 2.5
    proc = proc_self(tmp_path, "4:cpu,cpuacct:/kubepods/pod1\n3:memory:/kubepods/pod1\n0::/\n", HOST_V1)
    quota = grant.cpu_quota(proc)
    assert quota == (2.5, str(cpu / "kubepods/pod1/cpu.cfs_quota_us"))
    # a tighter limit further up binds too
    write(cpu / "kubepods", cpu__cfs_quota_us="150000")
    assert grant.cpu_quota(proc) == (1.5, str(cpu / "kubepods/cpu.cfs_quota_us"))


def test_v1_inside_a_container_reads_its_own_cgroup_mounted_at_the_top(tmp_path: Path) -> None:
    """docker run --cpus=1 on cgroup v1: /proc/self/cgroup names /docker/<id>, and that cgroup is what is
    mounted at /sys/fs/cgroup/cpu,cpuacct (the mount's root is /docker/<id>)."""
    cpu = tmp_path / "sys/fs/cgroup/cpu,cpuacct"
    write(cpu, cpu__cfs_quota_us="100000", cpu__cfs_period_us="100000")
    mountinfo = HOST_V1.replace("0:29 / /sys/fs/cgroup/cpu,cpuacct", "0:29 /docker/0123abcd /sys/fs/cgroup/cpu,cpuacct")
    proc = proc_self(tmp_path, "4:cpu,cpuacct:/docker/0123abcd\n", mountinfo)
    assert grant.cpu_quota(proc) == (1.0, str(cpu / "cpu.cfs_quota_us"))
    assert grant.cgroup_dirs("cpu", proc) == [cpu]


def test_v2_reads_cpu_max_up_the_tree_and_max_is_no_limit(tmp_path: Path) -> None:
    root = tmp_path / "sys/fs/cgroup"
    write(root / "system.slice", cpu__max="max 100000")
    write(root / "system.slice/job.scope", cpu__max="50000 100000")  # half a CPU
    mountinfo = "40 30 0:26 / /sys/fs/cgroup rw,nosuid,nodev - cgroup2 cgroup2 rw,nsdelegate\n"
    proc = proc_self(tmp_path, "0::/system.slice/job.scope\n", mountinfo)
    assert grant.cpu_quota(proc) == (0.5, str(root / "system.slice/job.scope/cpu.max"))
    write(root / "system.slice/job.scope", cpu__max="max 100000")
    assert grant.cpu_quota(proc) is None


def test_v2_in_a_cgroup_namespace_reads_the_top_of_its_mount(tmp_path: Path) -> None:
    root = tmp_path / "sys/fs/cgroup"
    write(root, cpu__max="800000 100000")
    proc = proc_self(tmp_path, "0::/\n", "40 30 0:26 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n")
    assert grant.cpu_quota(proc) == (8.0, str(root / "cpu.max"))


def test_no_quota_anywhere_and_unreadable_files_mean_none(tmp_path: Path) -> None:
    cpu = tmp_path / "sys/fs/cgroup/cpu,cpuacct"
    write(cpu, cpu__cfs_quota_us="-1", cpu__cfs_period_us="100000")
    proc = proc_self(tmp_path, "4:cpu,cpuacct:/\n0::/\n", HOST_V1)
    assert grant.cpu_quota(proc) is None
    assert grant.cpu_quota(tmp_path / "no-such-proc") is None
    write(cpu, cpu__cfs_quota_us="garbage")
    assert grant.cpu_quota(proc) is None


def test_mountinfo_escapes_and_stacked_mounts(tmp_path: Path) -> None:
    text = (
        "52 51 0:29 / /sys/fs/cgroup/cpu rw - cgroup cgroup rw,cpu\n"
        "70 52 0:29 /job /sys/fs/cgroup/cpu rw - cgroup cgroup rw,cpu\n"  # bound over it: the job's own view
        "71 52 0:40 / /mnt/with\\040space rw - cgroup2 cgroup2 rw\n"
        "72 52 8:1 / /data rw - ext4 /dev/sda1 rw\n"
    )
    mounts = grant.parse_mountinfo(text)
    assert [(m.version, m.root, str(m.point)) for m in mounts] == [
        (1, "/job", "/sys/fs/cgroup/cpu"),
        (2, "/", "/mnt/with space"),
    ]
    assert grant.parse_cgroup("5:cpu,cpuacct:/a\n0::/b\n") == {"cpu": "/a", "cpuacct": "/a", "": "/b"}


@pytest.mark.parametrize(
    ("affinity", "quota", "cpus"),
    [(2, None, 2), (2, 1.0, 1), (64, 8.0, 8), (64, 2.5, 2), (2, 0.5, 1), (4, 16.0, 4)],
)
def test_whole_cpus_granted(affinity: int, quota: float | None, cpus: int) -> None:
    assert grant.CpuGrant(affinity, quota).cpus == cpus


@pytest.mark.parametrize(("cpus", "processes", "per_process"), [(8, 1, 8), (8, 2, 4), (32, 8, 4), (4, 8, 1), (1, 1, 1)])
def test_threads_are_the_cpus_granted_divided_among_the_training_processes(
    cpus: int, processes: int, per_process: int
) -> None:
    env, record = sizing.threads(grant.CpuGrant(64, float(cpus), "cpu.max"), processes, {})
    names = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "OPENCV_FOR_THREADS_NUM")
    assert env == {name: str(per_process) for name in names}
    assert record == {"per_process": per_process, "source": "cgroup quota"}


def test_threads_without_a_quota_follow_the_affinity() -> None:
    env, record = sizing.threads(grant.CpuGrant(6), 2, {"PATH": "/bin"})
    assert env["OMP_NUM_THREADS"] == "3" and record["source"] == "affinity"


@pytest.mark.parametrize(
    "name", ["OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "OPENCV_FOR_THREADS_NUM"]
)
def test_threads_the_user_set_are_kept_all_of_them(name: str) -> None:
    env, record = sizing.threads(grant.CpuGrant(64, 8.0), 1, {name: "3"})
    assert env == {}  # nothing added: the user's variable reaches the child as they set it
    assert record["source"] == "user" and record["set"] == {name: "3"}


def test_memory_room_is_the_smallest_of_meminfo_and_the_cgroup_limits(tmp_path: Path) -> None:
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal: 32000000 kB\nMemAvailable: 16000000 kB\n")
    memory = tmp_path / "sys/fs/cgroup/memory"
    write(memory, memory__limit_in_bytes=str(2**63 - 4096), memory__usage_in_bytes="5")  # v1's "no limit"
    write(memory / "job", memory__limit_in_bytes=str(4 * 2**30), memory__usage_in_bytes=str(2**30))
    proc = proc_self(tmp_path, "3:memory:/job\n", HOST_V1)
    assert grant.memory_available(proc, meminfo) == 3 * 2**30
    write(memory / "job", memory__limit_in_bytes=str(64 * 2**30))
    assert grant.memory_available(proc, meminfo) == 16000000 * 1024


def test_the_dry_run_shows_the_cpus_threads_and_workers(tmp_path: Path) -> None:
    from click.testing import CliRunner

    from entrypoint.cli import cli

    (tmp_path / "sys/fs/cgroup").mkdir(parents=True)
    (tmp_path / "sys/fs/cgroup/cpu.max").write_text("100000 100000\n")
    proc = proc_self(tmp_path, "0::/\n", "40 30 0:26 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n")
    env = {"WORKDIR": str(tmp_path / "w"), "PROVIDER": "none", "GPUS": "0,1", "DATASET_REPO": "acme/cones"}
    env["TRAINBOX_PROC_SELF"] = str(proc)
    out = CliRunner().invoke(cli, ["run", "--dry-run"], env=env).output
    assert f"cpus       1 granted (affinity {len(os.sched_getaffinity(0))}, cgroup quota 1)" in out
    assert (
        "threads    OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 OPENCV_FOR_THREADS_NUM=1 sized,"
        " in each of 2 training processes"
    ) in out
    assert "workers    1 (the CPUs per GPU, one left for the agent)" in out
    assert "cache      off: DataLoader workers are restarted every epoch" in out
    assert re.search(r"^command .* workers=1 .*device=0,1$", out, re.MULTILINE)
    out = (
        CliRunner()
        .invoke(cli, ["run", "--dry-run"], env=env | {"OMP_NUM_THREADS": "6", "RUN_ARGS": "workers=2"})
        .output
    )
    assert "threads    OMP_NUM_THREADS=6 as you set them, in each of 2 training processes" in out
    assert "workers    2 (set by RUN_ARGS)" in out
