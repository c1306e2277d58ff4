"""The GPU check's result, and how `trainbox check` and the run's log show it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..errors import AgentError
from . import causes as gpu_causes


@dataclass(frozen=True)
class GpuReport:
    indices: tuple[int, ...] | None  # None: train on the CPU
    details: dict[str, Any] = field(default_factory=dict)  # for trainbox.json and `trainbox check --json`
    problem: AgentError | None = field(default=None, compare=False)

    def raise_problem(self) -> None:
        if self.problem is not None:
            raise self.problem


def _gib(value: Any) -> str:
    return "?" if value is None else f"{value:.1f}"


def summary_lines(details: dict[str, Any]) -> list[str]:
    """One line per GPU and one for the all-reduce: what `trainbox run` logs and `check` prints."""
    lines = []
    for gpu in details.get("gpus", []):
        if gpu.get("missing"):
            lines.append(f"GPU {gpu['index']}: not on this machine")
            continue
        arch = "" if gpu.get("arch_supported", True) else " (no kernels in this torch)"
        verdict = _verdict(gpu, 100)
        lines.append(
            f"GPU {gpu['index']}: {gpu.get('name', '?')}, {gpu.get('sm', '?')}{arch}, "
            f"{_gib(gpu.get('free_gib'))}/{_gib(gpu.get('total_gib'))} GiB free, {verdict}"
        )
    result = details.get("all_reduce")
    if result:
        across = f"NCCL all-reduce across GPUs {','.join(map(str, result['gpus']))}"
        if result.get("ok"):
            lines.append(f"{across}: ok, {result.get('busbw_gbps')} GB/s bus bandwidth")
        else:
            retry = result.get("p2p_disabled") or {}
            after = " (works with NCCL_P2P_DISABLE=1)" if retry.get("ok") else ""
            if result.get("nccl_env"):
                words = " ".join(f"{k}={v}" for k, v in result["nccl_env"].items())
                after = f" with the defaults; works with {words}, which the training uses"
            lines.append(f"{across}: FAILED{after}: {gpu_causes.first_line(result.get('error') or '', 100)}")
    return lines


def _verdict(gpu: dict[str, Any], width: int) -> str:
    matmul = gpu.get("matmul") or {}
    if gpu.get("error"):
        return "FAILED: " + gpu_causes.first_line(gpu["error"], width)
    if matmul.get("ok"):
        return f"matmul ok, {matmul.get('tflops_fp32')} TFLOP/s fp32"
    return f"matmul WRONG (relative error {matmul.get('max_rel_error')})"


def _gpu_table(gpus: list[dict[str, Any]]) -> list[str]:
    rows = [("GPU", "name", "arch", "free/total GiB", "check")]
    for gpu in gpus:
        verdict = "not on this machine" if gpu.get("missing") else _verdict(gpu, 70)
        arch = gpu.get("sm", "?") + (" NO KERNELS" if gpu.get("arch_supported") is False else "")
        free = f"{_gib(gpu.get('free_gib'))}/{_gib(gpu.get('total_gib'))}"
        rows.append((str(gpu["index"]), gpu.get("name", "?"), arch, free, verdict))
    if len(rows) == 1:
        return []
    widths = [max(len(row[column]) for row in rows) for column in range(len(rows[0]))]
    return ["  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip() for row in rows]


def render(report: GpuReport) -> str:
    """``trainbox check``: a readable report of the GPU check."""
    details = report.details
    if not details.get("checked"):
        return "GPUS=cpu: GPU check skipped; training runs on the CPU"
    head = []
    if details.get("torch"):
        arch = " ".join(details.get("arch_list") or []) or "none"
        head.append(f"torch     {details['torch']} (built for CUDA {details.get('cuda')}; kernels for {arch})")
    head.append(f"driver    {details.get('driver') or 'not found'}")
    if details.get("nccl_version"):
        head.append(f"NCCL      {details['nccl_version']}")
    if details.get("available"):
        head.append(f"GPUs      {details.get('visible')} visible")
    elif details.get("init_error"):
        head.append(f"GPUs      CUDA did not start: {gpu_causes.first_line(details['init_error'], 100)}")
    else:
        head.append(f"GPUs      none visible ({details.get('reason') or 'CUDA reports no device'})")
    table = _gpu_table(details.get("gpus", []))
    lines = [*head, *(["", *table] if table else [])]
    lines += [line for line in summary_lines(details) if line.startswith("NCCL")]
    if report.problem is not None:
        lines += ["", f"result    FAILED ({report.problem.reason}, exit {report.problem.exit_code}): {report.problem}"]
    else:
        lines += ["", f"result    ok: training would use GPUs {','.join(map(str, report.indices or ()))}"]
    return "\n".join(line.rstrip() for line in lines).strip("\n")


def as_json(report: GpuReport) -> dict[str, Any]:
    return {"ok": report.problem is None, "indices": list(report.indices) if report.indices else None, **report.details}
