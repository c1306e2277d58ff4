"""A probe report → the agent's typed GPU error naming the fix (``causes`` reads the evidence)."""

from __future__ import annotations

from typing import Any

from ..errors import AgentError, ConfigError, GpuError, GpuHangError, NcclError, NoGpuError
from ..settings import GpuSelection
from . import causes as gpu_causes
from .causes import Facts
from .run import STEP_TIMEOUT


def _capability(report: dict[str, Any]) -> tuple[int, int] | None:
    """The cards' compute capability when nvidia-smi lists one kind of card (torch may not have started)."""
    kinds = {card.get("compute_cap") for card in report.get("cards", [])}
    if len(kinds) != 1:
        return None
    parsed = gpu_causes.parse_version(kinds.pop())
    return (parsed[0], parsed[1]) if parsed and len(parsed) >= 2 else None


def _facts(report: dict[str, Any], where: str, gpu: dict[str, Any] | None = None) -> Facts:
    if gpu and gpu.get("capability"):
        major, minor = gpu["capability"]
        capability: tuple[int, int] | None = (major, minor)
    else:
        capability = _capability(report)
    return Facts(
        where=where,
        cuda=report.get("cuda"),
        driver=report.get("driver"),
        capability=capability,
        arch_list=tuple(report.get("arch_list") or ()),
    )


def _telling(primary: str, *context: str) -> str:
    """The error text itself when it is a known one, else with its context (warnings, output) to look in."""
    return primary if gpu_causes.match(primary) else "\n".join([primary, *context])


def _gpu_label(gpu: dict[str, Any]) -> str:
    return f"GPU {gpu['index']} ({gpu['name']})" if gpu.get("name") else f"GPU {gpu['index']}"


def find_problem(report: dict[str, Any], gpus: GpuSelection) -> AgentError | None:
    """The first thing that would stop training on these GPUs, as a typed error; None when all passed."""
    output = "\n".join(report.get("output") or [])
    if "hang" in report:
        hang = report["hang"]
        return GpuHangError(
            f"{hang.get('what', 'the GPU check')} did not finish within {hang.get('timeout', STEP_TIMEOUT):.0f} s",
            "the GPU hangs: ask the provider for another machine",
        )
    if "crashed" in report:
        tail = gpu_causes.first_line(output.splitlines()[-1]) if output else "no output"
        known = gpu_causes.match(output)
        if known is not None:
            return gpu_causes.classify(output, _facts(report, "the GPU check"))
        return GpuError(f"{report['crashed']}: {tail}", "run `trainbox check` for details")
    if not report.get("available"):
        text = report.get("init_error") or ""
        if not text:
            return NoGpuError(
                f"GPUS={gpus} but no NVIDIA GPU is visible in this container",
                "start it with a GPU (docker run --gpus all, or the provider's GPU template); "
                "to train on the CPU, set GPUS=cpu",
            )
        return gpu_causes.classify(
            _telling(text, *report.get("warnings", []), output), _facts(report, "CUDA initialisation")
        )
    missing = [gpu["index"] for gpu in report.get("gpus", []) if gpu.get("missing")]
    if missing:
        visible = report.get("visible", 0)
        return ConfigError(
            f"GPUS={gpus} names GPU {', '.join(map(str, missing))}, but this machine shows {visible} (0-{visible - 1})",
            f"set GPUS=all, or indices below {visible}",
        )
    for gpu in report.get("gpus", []):
        facts = _facts(report, _gpu_label(gpu), gpu)
        if gpu.get("arch_supported") is False:
            return gpu_causes.architecture_error(facts)
        if gpu.get("error"):
            return gpu_causes.classify(_telling(gpu["error"], *gpu.get("warnings", [])), facts)
        matmul = gpu.get("matmul") or {}
        if not matmul.get("ok"):
            return GpuError(
                f"{_gpu_label(gpu)} computed a wrong matmul (relative error {matmul.get('max_rel_error')})",
                "the card is faulty: ask the provider for another machine",
            )
    result = report.get("all_reduce")
    if result and not result.get("ok") and not result.get("nccl_env"):  # a fallback that works is trained with
        return all_reduce_problem(report, output)
    return None


def all_reduce_problem(report: dict[str, Any], output: str) -> GpuError:
    result = report["all_reduce"]
    across = f"the NCCL all-reduce across GPUs {','.join(map(str, result['gpus']))}"
    text = result.get("error") or "failed"
    retry = result.get("p2p_disabled")
    if retry and retry.get("ok"):
        return NcclError(
            f"{across} failed ({gpu_causes.first_line(text, 120)}) but works with NCCL_P2P_DISABLE=1",
            "these cards cannot copy peer-to-peer here: " + gpu_causes.P2P_ADVICE + ", or train on one GPU: GPUS=0",
        )
    cause = gpu_causes.classify(text + "\n" + output, _facts(report, across), nccl=True)
    if not isinstance(cause, NcclError):
        return cause  # a driver or hardware fault seen through NCCL
    tried = [" ".join(f"{k}={v}" for k, v in entry.get("env", {}).items()) for entry in result.get("fallbacks") or []]
    if len(tried) > 1:
        return NcclError(
            f"{across} failed with the defaults and with {', '.join(tried)}: {gpu_causes.first_line(text, 120)}",
            "train on one GPU (GPUS=0), or ask the provider for another machine",
        )
    preset = result.get("nccl_p2p_disable")  # the user's own NCCL_P2P_DISABLE: no retry was made
    if retry is not None or preset is not None:
        setting = "also with NCCL_P2P_DISABLE=1" if retry is not None else f"with NCCL_P2P_DISABLE={preset}"
        return NcclError(
            f"{across} failed, {setting}: {gpu_causes.first_line(text, 120)}",
            "train on one GPU (GPUS=0), or ask the provider for another machine",
        )
    return NcclError(f"{across} failed: {gpu_causes.first_line(text, 120)}", cause.hint)


def problem_record(problem: AgentError) -> dict[str, Any]:
    record: dict[str, Any] = {"code": problem.exit_code, "reason": problem.reason, "message": problem.message}
    if problem.hint:
        record["hint"] = problem.hint
    if isinstance(problem, NcclError) and gpu_causes.P2P_ADVICE in (problem.hint or ""):
        record["advice"] = "set NCCL_P2P_DISABLE=1"
    return record
