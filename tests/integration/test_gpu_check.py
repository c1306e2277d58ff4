"""The GPU check as real processes: the probe child, its watchdog, the all-reduce ranks, and the CLI.

On a machine without a GPU (CI) the real probe child meets torch's real "no driver" error; the
watchdog and clean-up are proven with stand-in children that hang or crash for real.
"""

from __future__ import annotations

import json
import os
import sys
import tarfile
import textwrap
from pathlib import Path

import pytest

from entrypoint.errors import GpuHangError, NoGpuError
from entrypoint.gpu import causes as gpu_causes
from entrypoint.gpu import probe as gpu_probe
from entrypoint.gpu import problems as gpu_problems
from entrypoint.gpu import run as gpu_run
from entrypoint.settings import GpuSelection
from tests.hubfixtures import HubContext
from tests.support import make_dataset, process_alive, run_trainbox, trainbox_env

needs_no_gpu = pytest.mark.skipif(gpu_run.nvidia_present(), reason="this machine has an NVIDIA GPU")


def _stand_in(tmp_path: Path, body: str) -> list[str]:
    """A child that speaks the probe's protocol, then misbehaves; it leaves a grandchild behind."""
    script = tmp_path / "stand_in.py"
    script.write_text(
        textwrap.dedent(
            f"""
            import subprocess, sys, time
            grandchild = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
            print(f"grandchild {{grandchild.pid}}", flush=True)
            def emit(line):
                print({gpu_probe.PREFIX!r} + line, flush=True)
            """
        )
        + textwrap.dedent(body)
    )
    return [sys.executable, str(script)]


def _grandchild(report: dict) -> int:
    line = next(line for line in report["output"] if line.startswith("grandchild "))
    return int(line.split()[1])


def test_watchdog_kills_a_hanging_check_and_names_the_step(tmp_path: Path) -> None:
    argv = _stand_in(
        tmp_path,
        """
        emit('{"step": "gpu", "index": 3, "what": "GPU 3 (CUDA context, memory, matmul)"}')
        time.sleep(600)
        """,
    )
    report = gpu_run.run_probe("all", os.environ, step_timeout=1.0, argv=argv)
    problem = gpu_problems.find_problem(report, GpuSelection())
    assert isinstance(problem, GpuHangError)
    assert problem.message == "GPU 3 (CUDA context, memory, matmul) did not finish within 1 s"
    assert not process_alive(_grandchild(report))


def test_a_crashed_check_is_classified_and_leaves_no_orphan(tmp_path: Path) -> None:
    argv = _stand_in(
        tmp_path,
        """
        emit('{"step": "gpu", "index": 0, "what": "GPU 0"}')
        print("RuntimeError: CUDA error: uncorrectable ECC error encountered", file=sys.stderr, flush=True)
        sys.exit(3)
        """,
    )
    report = gpu_run.run_probe("all", os.environ, step_timeout=30.0, argv=argv)
    assert report["crashed"] == "the GPU check exited with code 3 without a report"
    problem = gpu_problems.find_problem(report, GpuSelection())
    assert "uncorrectable ECC error" in problem.message and "faulty" in problem.hint
    assert not process_alive(_grandchild(report))


@pytest.mark.slow  # imports torch in a child
@needs_no_gpu
def test_the_real_probe_child_meets_torchs_no_driver_error() -> None:
    report = gpu_run.run_probe("all", os.environ)
    assert report["available"] is False
    assert report["torch"] and report["cuda"] and report["arch_list"]
    assert "Found no NVIDIA driver on your system" in report["init_error"]
    problem = gpu_problems.find_problem(report, GpuSelection())
    assert isinstance(problem, NoGpuError)
    assert "GPUS=cpu" in problem.hint


@pytest.mark.slow  # torch.distributed in child processes
def test_all_reduce_ranks_sum_across_processes() -> None:
    """The rank machinery (spawn, rendezvous, result check) on gloo; tests/gpu runs it on NCCL."""
    result = gpu_probe.all_reduce([0, 1], timeout=60, backend="gloo")
    assert result["ok"] is True, result
    assert result["busbw_gbps"] > 0


@needs_no_gpu
@pytest.mark.slow  # torch.distributed in child processes
def test_all_reduce_rank_failures_are_collected_and_classified() -> None:
    result = gpu_probe.all_reduce([0, 1], timeout=60, backend="nccl")
    assert result["ok"] is False
    assert result["error"].startswith("rank 0 (GPU 0): ")
    assert "rank 1 (GPU 1): " in result["error"]
    error = gpu_causes.classify(result["error"], gpu_causes.Facts(where="the all-reduce"), nccl=True)
    assert isinstance(error, NoGpuError)


# -- the CLI -----------------------------------------------------------------------------------


@needs_no_gpu
def test_run_without_a_gpu_stops_before_any_download(tmp_path: Path, hub_ctx: HubContext) -> None:
    """A dataset and an output repo that exist on the (local) Hub: not one request reaches it."""
    api = hub_ctx.api()
    dataset, output = hub_ctx.repo_id("shapes"), hub_ctx.repo_id("shapes-model")
    data_yaml = make_dataset(tmp_path / "shapes")
    archive = tmp_path / "shapes.tar"
    with tarfile.open(archive, "w") as tar:
        tar.add(data_yaml.parent, arcname="shapes")
    api.create_repo(dataset, repo_type="dataset")
    api.upload_file(path_or_fileobj=archive, path_in_repo="shapes.tar", repo_id=dataset, repo_type="dataset")
    api.create_repo(output)
    assert hub_ctx.hub.requests  # the Hub logs what reaches it
    hub_ctx.hub.reset_log()

    workdir = tmp_path / "work"
    env = trainbox_env(workdir, GPUS="all", DATASET_REPO=dataset, OUTPUT_REPO=output, HF_TOKEN=hub_ctx.token)
    result = run_trainbox("run", env=env, timeout=120)
    assert result.returncode == 51, result.output[-3000:]
    errors = [line for line in result.stderr.splitlines() if "ERROR" in line]
    assert len(errors) == 1, result.stderr
    assert "GPUS=all but no NVIDIA GPU is visible in this container" in errors[0] and "GPUS=cpu" in errors[0]
    assert hub_ctx.hub.requests == []  # no access check, no download: the GPU check comes first
    state_file = next((workdir / "runs").glob("*/trainbox.json"))
    state = json.loads(state_file.read_text())
    assert state["phase"] == "failed"
    assert state["exit"]["code"] == 51 and state["exit"]["reason"] == "gpu_none"
    assert "preflight" in state["phases"]
    assert "dataset" not in state["phases"] and "training" not in state["phases"]
    assert not (workdir / "data").exists()
    assert hub_ctx.token not in state_file.read_text() + result.output


def test_check_with_gpus_cpu_skips_with_a_warning(tmp_path: Path) -> None:
    result = run_trainbox("check", env=trainbox_env(tmp_path, GPUS="cpu", HOST_CHECK="warn"), timeout=120)
    assert result.returncode == 0, result.stderr
    first, *host = result.stdout.strip().splitlines()
    assert first == "GPUS=cpu: GPU check skipped; training runs on the CPU"
    assert host[0].startswith("host: disk write ")  # the host report still measures the host
    assert "WARNING: GPUS=cpu: skipping the GPU check" in result.stderr


@needs_no_gpu
def test_check_without_a_gpu_prints_the_verdict_and_exits_51(tmp_path: Path) -> None:
    table = run_trainbox("check", env=trainbox_env(tmp_path, GPUS="all"), timeout=120)
    assert table.returncode == 51
    assert "GPUs      none visible" in table.stdout
    assert "result    FAILED (gpu_none, exit 51)" in table.stdout
    as_json = run_trainbox("check", "--json", env=trainbox_env(tmp_path, GPUS="all"), timeout=120)
    assert as_json.returncode == 51
    report = json.loads(as_json.stdout)
    assert report["ok"] is False and report["indices"] is None
    assert report["problem"]["code"] == 51 and report["problem"]["reason"] == "gpu_none"
