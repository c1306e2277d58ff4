"""The GPU check's verdicts: what a probe report means, and the CPU / demo / no-GPU paths.

Reports here have the shape ``gpu.probe`` prints; the texts inside are real ones (see
test_gpu_causes). The child itself runs in tests/integration and, on a GPU, in tests/gpu.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest

from entrypoint import preflight, settings
from entrypoint.errors import (
    ConfigError,
    GpuArchitectureError,
    GpuDriverError,
    GpuError,
    GpuHangError,
    NcclError,
    NoGpuError,
)
from entrypoint.gpu import problems as gpu_problems
from entrypoint.gpu import report as gpu_report
from entrypoint.gpu import run as gpu_run
from entrypoint.settings import GpuSelection, parse_gpus

ALL = GpuSelection()

H100 = {
    "index": 0,
    "name": "NVIDIA H100 80GB HBM3",
    "capability": [9, 0],
    "sm": "sm_90",
    "arch_supported": True,
    "total_gib": 79.1,
    "free_gib": 78.6,
    "matmul": {"ok": True, "max_rel_error": 2.1e-07, "tflops_fp32": 48.3},
}


def passing_report(count: int = 2) -> dict[str, Any]:
    gpus = [{**copy.deepcopy(H100), "index": index} for index in range(count)]
    report: dict[str, Any] = {
        "driver": "580.95.05",
        "cards": [{"name": H100["name"], "compute_cap": "9.0", "total_mib": "81559", "free_mib": "81004"}] * count,
        "available": True,
        "torch": "2.14.1+cu130",
        "cuda": "13.0",
        "arch_list": ["sm_75", "sm_80", "sm_86", "sm_90", "sm_100", "sm_120"],
        "visible": count,
        "nccl_version": "2.30.7",
        "gpus": gpus,
        "output": [],
    }
    if count > 1:
        report["all_reduce"] = {"gpus": list(range(count)), "ok": True, "seconds": 1.2, "busbw_gbps": 181.5}
    return report


def test_a_passing_report_has_no_problem() -> None:
    assert gpu_problems.find_problem(passing_report(), ALL) is None


def test_hang_names_the_step() -> None:
    report = {"hang": {"step": "gpu", "index": 3, "what": "GPU 3 (CUDA context, memory, matmul)", "timeout": 90.0}}
    problem = gpu_problems.find_problem(report, ALL)
    assert isinstance(problem, GpuHangError)
    assert problem.exit_code == 54
    assert problem.message == "GPU 3 (CUDA context, memory, matmul) did not finish within 90 s"


def test_crash_without_a_known_text_shows_the_last_line() -> None:
    report = {"crashed": "the GPU check exited with code -11 without a report", "output": ["a", "Segmentation fault"]}
    problem = gpu_problems.find_problem(report, ALL)
    assert type(problem) is GpuError
    assert problem.message.endswith("Segmentation fault")


def test_driver_too_old_uses_nvidia_smi_facts() -> None:
    """torch cannot start, so the card's compute capability comes from nvidia-smi."""
    report = {
        "driver": "550.54.15",
        "cards": [{"name": "NVIDIA L40S", "compute_cap": "8.9", "total_mib": "46068", "free_mib": "45000"}],
        "available": False,
        "cuda": "13.0",
        "gpus": [],
        "init_error": "RuntimeError: The NVIDIA driver on your system is too old (found version 12040). Please "
        "update your GPU driver by downloading and installing a new version from the URL: "
        "http://www.nvidia.com/Download/index.aspx",
    }
    problem = gpu_problems.find_problem(report, ALL)
    assert isinstance(problem, GpuDriverError)
    assert "driver 550.54.15" in problem.message
    assert ">= 580.65.06" in problem.hint and "cu126" in problem.hint


def test_no_device_without_an_error_text_names_gpus_and_the_cpu_way_out() -> None:
    problem = gpu_problems.find_problem({"available": False, "gpus": [], "init_error": None}, parse_gpus("0,1"))
    assert isinstance(problem, NoGpuError)
    assert problem.message.startswith("GPUS=0,1 ")
    assert "GPUS=cpu" in problem.hint


def test_asking_for_a_gpu_the_machine_lacks_is_a_config_error() -> None:
    report = passing_report(2)
    report["gpus"] = [report["gpus"][0], {"index": 2, "missing": True}]
    del report["all_reduce"]
    problem = gpu_problems.find_problem(report, parse_gpus("0,2"))
    assert isinstance(problem, ConfigError)
    assert "GPUS=0,2 names GPU 2, but this machine shows 2 (0-1)" in problem.message


def test_unsupported_architecture_wins_over_its_symptoms() -> None:
    report = passing_report(1)
    report["gpus"][0].update(
        name="Tesla V100-SXM2-16GB",
        capability=[7, 0],
        sm="sm_70",
        arch_supported=False,
        error="RuntimeError: CUDA error: no kernel image is available for execution on the device",
    )
    del report["gpus"][0]["matmul"]
    problem = gpu_problems.find_problem(report, ALL)
    assert isinstance(problem, GpuArchitectureError)
    assert problem.message.startswith("GPU 0 (Tesla V100-SXM2-16GB) is sm_70")
    assert "cu126" in problem.hint


def test_a_gpu_error_is_classified_with_its_name() -> None:
    report = passing_report(2)
    report["gpus"][1]["error"] = "RuntimeError: CUDA error: uncorrectable ECC error encountered"
    del report["gpus"][1]["matmul"]
    problem = gpu_problems.find_problem(report, ALL)
    assert type(problem) is GpuError
    assert problem.message.startswith("GPU 1 (NVIDIA H100 80GB HBM3) failed")


def test_a_wrong_matmul_is_a_faulty_card() -> None:
    report = passing_report(1)
    report["gpus"][0]["matmul"] = {"ok": False, "max_rel_error": 0.37, "tflops_fp32": 40.0}
    problem = gpu_problems.find_problem(report, ALL)
    assert type(problem) is GpuError
    assert "wrong matmul (relative error 0.37)" in problem.message


def test_all_reduce_that_works_without_p2p_says_so() -> None:
    report = passing_report(2)
    report["all_reduce"] = {
        "gpus": [0, 1],
        "ok": False,
        "hang": True,
        "error": "GPU(s) 0, 1 did not finish the all-reduce within 45 s",
        "p2p_disabled": {"ok": True, "seconds": 2.0, "busbw_gbps": 11.2},
    }
    problem = gpu_problems.find_problem(report, ALL)
    assert isinstance(problem, NcclError)
    assert problem.exit_code == 55
    assert "works with NCCL_P2P_DISABLE=1" in problem.message
    assert "NCCL_P2P_DISABLE=1" in problem.hint and "GPUS=0" in problem.hint
    assert gpu_problems.problem_record(problem)["advice"] == "set NCCL_P2P_DISABLE=1"


def test_all_reduce_failing_both_ways() -> None:
    report = passing_report(2)
    text = "rank 0 (GPU 0): DistBackendError: NCCL error in: ProcessGroupNCCL.cpp:1970, unhandled system error"
    report["all_reduce"] = {"gpus": [0, 1], "ok": False, "error": text, "p2p_disabled": {"ok": False, "error": text}}
    problem = gpu_problems.find_problem(report, ALL)
    assert isinstance(problem, NcclError)
    assert "also with NCCL_P2P_DISABLE=1" in problem.message
    assert "GPUS=0" in problem.hint
    assert "advice" not in gpu_problems.problem_record(problem)


def test_all_reduce_failing_with_the_users_own_p2p_setting() -> None:
    report = passing_report(2)
    text = "rank 0 (GPU 0): DistBackendError: NCCL error in: ProcessGroupNCCL.cpp:1970, unhandled system error"
    report["all_reduce"] = {"gpus": [0, 1], "ok": False, "error": text, "nccl_p2p_disable": "1"}
    problem = gpu_problems.find_problem(report, ALL)
    assert isinstance(problem, NcclError)
    assert "failed, with NCCL_P2P_DISABLE=1: " in problem.message
    assert "set NCCL_P2P_DISABLE" not in problem.hint


def test_all_reduce_without_a_retry_advises_p2p() -> None:
    """No retry in the report: trying without peer-to-peer is the advice."""
    report = passing_report(2)
    report["all_reduce"] = {"gpus": [0, 1], "ok": False, "error": "rank 1 (GPU 1): unhandled cuda error"}
    report["output"] = ["transport/p2p.cc:238 NCCL WARN failed to open CUDA IPC handle : 217 peer access is not "]
    problem = gpu_problems.find_problem(report, ALL)
    assert isinstance(problem, NcclError)
    assert "NCCL_P2P_DISABLE=1" in problem.hint


def test_a_driver_fault_seen_through_nccl_keeps_its_class() -> None:
    report = passing_report(2)
    report["all_reduce"] = {
        "gpus": [0, 1],
        "ok": False,
        "error": "rank 0 (GPU 0): RuntimeError: CUDA error: uncorrectable NVLink error detected during the execution",
        "p2p_disabled": {"ok": False, "error": "same"},
    }
    assert type(gpu_problems.find_problem(report, ALL)) is GpuError


# -- the entry points on this machine -------------------------------------------------------------

needs_no_gpu = pytest.mark.skipif(gpu_run.nvidia_present(), reason="this machine has an NVIDIA GPU")


def _settings(tmp_path: Path, **env: str) -> settings.Settings:
    return settings.from_env({"WORKDIR": str(tmp_path / "work"), **env})


def test_gpus_cpu_skips_the_check(tmp_path: Path) -> None:
    report = preflight.check_gpus(_settings(tmp_path, GPUS="cpu"))
    assert report.indices is None
    assert report.details == {"device": "cpu", "checked": False}
    assert gpu_report.render(report).startswith("GPUS=cpu")


@needs_no_gpu
def test_no_gpu_fails_a_real_run(tmp_path: Path) -> None:
    dataset = tmp_path / "data"
    dataset.mkdir()
    with pytest.raises(NoGpuError, match="GPUS=all but no NVIDIA GPU is visible"):
        preflight.check_gpus(_settings(tmp_path, DATASET_REPO=str(dataset)))


@needs_no_gpu
def test_the_failed_check_is_recorded_before_it_is_raised(tmp_path: Path) -> None:
    dataset = tmp_path / "data"
    dataset.mkdir()
    recorded: list[dict[str, Any]] = []
    with pytest.raises(NoGpuError):
        preflight.check_gpus(_settings(tmp_path, DATASET_REPO=str(dataset)), record=recorded.append)
    assert [details["problem"]["reason"] for details in recorded] == ["gpu_none"]


@needs_no_gpu
def test_no_gpu_sends_the_demo_to_the_cpu(tmp_path: Path) -> None:
    report = preflight.check_gpus(_settings(tmp_path))
    assert report.indices is None
    assert report.details["device"] == "cpu" and report.details["fallback"] == "no GPU"
    assert "problem" not in report.details


@needs_no_gpu
def test_probe_gpus_reports_instead_of_raising(tmp_path: Path) -> None:
    report = preflight.probe_gpus(_settings(tmp_path))  # the demo: `trainbox check` does not fall back
    assert isinstance(report.problem, NoGpuError)
    assert report.details["problem"]["code"] == 51
    assert gpu_report.as_json(report)["ok"] is False
    with pytest.raises(NoGpuError):
        report.raise_problem()


def test_probe_env_holds_no_secret(tmp_path: Path) -> None:
    token = "hf_" + "x" * 30
    env = preflight.probe_env(_settings(tmp_path, HF_TOKEN=token, GPUS="cpu", NCCL_P2P_DISABLE="1"))
    assert token not in env.values()
    assert env["NCCL_P2P_DISABLE"] == "1"


# -- what people read ------------------------------------------------------------------------------


def test_render_a_passing_check() -> None:
    report = gpu_report.GpuReport(indices=(0, 1), details={"device": "cuda", "checked": True, **passing_report(2)})
    text = gpu_report.render(report)
    assert "torch     2.14.1+cu130 (built for CUDA 13.0; kernels for sm_75" in text
    assert "driver    580.95.05" in text
    rows = [line for line in text.splitlines() if line.startswith(("0 ", "1 "))]
    assert len(rows) == 2 and all("NVIDIA H100 80GB HBM3" in row and "matmul ok, 48.3 TFLOP/s" in row for row in rows)
    assert "NCCL all-reduce across GPUs 0,1: ok, 181.5 GB/s bus bandwidth" in text
    assert text.endswith("result    ok: training would use GPUs 0,1")


def test_render_a_failed_check() -> None:
    details = {"device": "cuda", "checked": True, **passing_report(2)}
    details["gpus"][1] = {**details["gpus"][1], "arch_supported": False, "error": "RuntimeError: no kernel image"}
    problem = gpu_problems.find_problem(details, ALL)
    text = gpu_report.render(gpu_report.GpuReport(indices=None, details=details, problem=problem))
    row = next(line for line in text.splitlines() if line.startswith("1 "))
    assert "sm_90 NO KERNELS" in row and "FAILED: RuntimeError: no kernel image" in row
    assert "result    FAILED (gpu_arch_unsupported, exit 52)" in text


def test_summary_lines_for_the_run_log() -> None:
    lines = gpu_report.summary_lines(passing_report(2))
    assert lines[0] == "GPU 0: NVIDIA H100 80GB HBM3, sm_90, 78.6/79.1 GiB free, matmul ok, 48.3 TFLOP/s fp32"
    assert lines[-1] == "NCCL all-reduce across GPUs 0,1: ok, 181.5 GB/s bus bandwidth"


def test_small_shared_memory_with_workers_is_refused() -> None:
    from entrypoint.errors import ConfigError
    from entrypoint.preflight import check_shared_memory, shared_memory_bytes
    from entrypoint.run_args import parse

    docker_default = 64 * 2**20
    with pytest.raises(ConfigError, match="64 MB") as caught:
        check_shared_memory(parse("workers=8"), docker_default)
    assert "--shm-size" in caught.value.hint and "workers=0" in caught.value.hint
    with pytest.raises(ConfigError):
        check_shared_memory(parse("epochs=3"), docker_default)  # libreyolo's default uses workers
    check_shared_memory(parse("workers=0"), docker_default)  # no workers, no shared memory
    check_shared_memory(parse("workers=8"), 8 * 2**30)
    assert shared_memory_bytes() is None or shared_memory_bytes() > 0  # read from the real /dev/shm
