"""NCCL trouble on a multi-GPU box: the defaults, then NCCL_P2P_DISABLE=1, then NCCL_SHM_DISABLE=1, then
both; the first that works is what the training runs with, and exit 55 only when none does. The
all-reduce itself needs two GPUs (tests/gpu); here it is a stand-in that fails unless the env it
inherits holds the setting that "fixes" this box."""

from __future__ import annotations

import os
from typing import Any

import pytest

from entrypoint import preflight
from entrypoint.errors import NcclError
from entrypoint.gpu import probe as gpu_probe
from entrypoint.gpu import problems as gpu_problems
from entrypoint.gpu import report as gpu_report
from entrypoint.settings import GpuSelection

FAILED = "rank 0 (GPU 0): DistBackendError: NCCL error in: ProcessGroupNCCL.cpp:1970, unhandled system error"


def box(monkeypatch: pytest.MonkeyPatch, works: set[str] | None, tried: list[dict[str, str]]) -> None:
    """An all-reduce that works only when exactly the NCCL_*_DISABLE variables in ``works`` are set."""

    def all_reduce(devices: list[int], timeout: float, backend: str = "nccl") -> dict[str, Any]:
        seen = {name for name in ("NCCL_P2P_DISABLE", "NCCL_SHM_DISABLE") if os.environ.get(name) == "1"}
        tried.append({name: "1" for name in sorted(seen)})
        ok = works is not None and seen == works
        return {"gpus": devices, "ok": ok, "seconds": 0.5, **({"busbw_gbps": 9.0} if ok else {"error": FAILED})}

    monkeypatch.setattr(gpu_probe, "all_reduce", all_reduce)
    monkeypatch.setattr(gpu_probe, "emit", lambda **_: None)
    for name in ("NCCL_P2P_DISABLE", "NCCL_SHM_DISABLE"):
        monkeypatch.delenv(name, raising=False)


def report_with(result: dict[str, Any]) -> dict[str, Any]:
    gpus = [
        {"index": i, "name": "NVIDIA A100-SXM4-80GB", "capability": [8, 0], "sm": "sm_80", "arch_supported": True,
         "total_gib": 79.2, "free_gib": 78.0, "matmul": {"ok": True, "max_rel_error": 1e-6, "tflops_fp32": 19.0}}
        for i in (0, 1)
    ]  # fmt: skip
    return {"available": True, "visible": 2, "driver": "580.65.06", "gpus": gpus, "all_reduce": result}


def test_shared_memory_off_fixes_this_box_and_is_what_training_gets(monkeypatch: pytest.MonkeyPatch) -> None:
    tried: list[dict[str, str]] = []
    box(monkeypatch, {"NCCL_SHM_DISABLE"}, tried)
    result = gpu_probe.check_all_reduce([0, 1], timeout=5)

    assert tried == [{}, {"NCCL_P2P_DISABLE": "1"}, {"NCCL_SHM_DISABLE": "1"}]  # in order, stopping at the first
    assert result["nccl_env"] == {"NCCL_SHM_DISABLE": "1"}
    assert [entry["ok"] for entry in result["fallbacks"]] == [False, True]
    assert "NCCL_SHM_DISABLE" not in os.environ and "NCCL_P2P_DISABLE" not in os.environ  # put back
    details = report_with(result)
    assert gpu_problems.find_problem(details, GpuSelection()) is None  # trains, not exit 55
    assert preflight.nccl_env(details) == {"NCCL_SHM_DISABLE": "1"}
    (line,) = [line for line in gpu_report.summary_lines({"checked": True, **details}) if "all-reduce" in line]
    assert "works with NCCL_SHM_DISABLE=1, which the training uses" in line


def test_only_both_off_works(monkeypatch: pytest.MonkeyPatch) -> None:
    tried: list[dict[str, str]] = []
    box(monkeypatch, {"NCCL_P2P_DISABLE", "NCCL_SHM_DISABLE"}, tried)
    result = gpu_probe.check_all_reduce([0, 1], timeout=5)
    assert len(tried) == 4 and result["nccl_env"] == {"NCCL_P2P_DISABLE": "1", "NCCL_SHM_DISABLE": "1"}


def test_the_defaults_working_try_nothing_else(monkeypatch: pytest.MonkeyPatch) -> None:
    tried: list[dict[str, str]] = []
    box(monkeypatch, set(), tried)
    result = gpu_probe.check_all_reduce([0, 1], timeout=5)
    assert tried == [{}] and result["ok"] and "fallbacks" not in result
    assert preflight.nccl_env(report_with(result)) == {}


def test_nothing_works_is_exit_55_naming_every_setting_tried(monkeypatch: pytest.MonkeyPatch) -> None:
    tried: list[dict[str, str]] = []
    box(monkeypatch, None, tried)
    result = gpu_probe.check_all_reduce([0, 1], timeout=5)
    assert len(tried) == 4 and "nccl_env" not in result
    problem = gpu_problems.find_problem(report_with(result), GpuSelection())
    assert isinstance(problem, NcclError) and problem.exit_code == 55
    assert "with NCCL_P2P_DISABLE=1, NCCL_SHM_DISABLE=1, NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1" in problem.message


def test_the_users_own_setting_is_not_second_guessed(monkeypatch: pytest.MonkeyPatch) -> None:
    tried: list[dict[str, str]] = []
    box(monkeypatch, {"NCCL_SHM_DISABLE"}, tried)
    monkeypatch.setenv("NCCL_P2P_DISABLE", "1")
    result = gpu_probe.check_all_reduce([0, 1], timeout=5)
    assert tried == [{"NCCL_P2P_DISABLE": "1"}] and "fallbacks" not in result
