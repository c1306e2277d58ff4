"""Preflight: prove the GPUs run kernels (in a child process), before a byte of the dataset is paid for.

The agent never creates a CUDA context itself: it would hold memory on every card and skew
libreyolo's ``batch=-1`` sizing. ``gpu.probe`` runs in a child, watched by a hang watchdog
that kills its whole process tree; ``gpu.causes`` turns what it reports into a typed error
naming the fix.
"""

from __future__ import annotations

import contextlib
import glob
import json
import os
import queue
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from .errors import AgentError, ConfigError, GpuError, GpuHangError, NcclError, NoGpuError
from .gpu import causes as gpu_causes
from .gpu.causes import Facts
from .gpu.probe import PREFIX
from .log import logger, redact, step
from .procs import Child, proc_table
from .run_args import RunArgs
from .settings import GpuSelection, Settings

# No step of the check (importing torch, one card's context and matmul) takes this long on a
# working machine; the child's own all-reduce deadline is shorter, so it reports before this.
STEP_TIMEOUT = 90.0
NCCL_TIMEOUT = 45.0
_OUTPUT_LINES = 40
_POLL = 0.2
_KILL_WAIT = 5.0


@dataclass(frozen=True)
class GpuReport:
    indices: tuple[int, ...] | None  # None: train on the CPU
    details: dict[str, Any] = field(default_factory=dict)  # for trainbox.json and `trainbox check --json`
    problem: AgentError | None = field(default=None, compare=False)

    def raise_problem(self) -> None:
        if self.problem is not None:
            raise self.problem


def nvidia_present() -> bool:
    """A cheap look for an NVIDIA driver, so a CPU machine fails in milliseconds, not after importing torch."""
    return bool(glob.glob("/dev/nvidia[0-9]*")) or shutil.which("nvidia-smi") is not None


def probe_env(settings: Settings) -> dict[str, str]:
    """The child needs no secret: drop every variable holding one."""
    secrets = set(settings.secrets())
    return {key: value for key, value in settings.env.items() if value not in secrets}


def _pump(stream: IO[bytes], lines: queue.Queue[bytes | None]) -> None:
    try:
        for line in iter(stream.readline, b""):
            lines.put(line)
    finally:
        lines.put(None)


def _group_members(pgid: int) -> list[int]:
    """Live (not zombie) processes of a process group, from /proc."""
    return [entry.pid for entry in proc_table() if entry.pgid == pgid and entry.state != "Z"]


def _wait_for_group_exit(pgid: int, timeout: float) -> None:
    """SIGKILL is delivered asynchronously: let the GPU memory of the killed tree be freed before going on."""
    deadline = time.monotonic() + timeout
    while _group_members(pgid) and time.monotonic() < deadline:
        time.sleep(0.05)


def run_probe(
    selection: str,
    env: Mapping[str, str],
    *,
    step_timeout: float = STEP_TIMEOUT,
    argv: Sequence[str] | None = None,
) -> dict[str, Any]:
    """Run the probe child; its report, or ``{"hang": step}`` / ``{"crashed": …}``. Never leaves a process behind."""
    command = list(argv or [sys.executable, "-m", "entrypoint.gpu.probe", "--gpus", selection])
    if argv is None:
        command += ["--nccl-timeout", str(NCCL_TIMEOUT)]
    child = Child(command, cwd=Path.cwd(), env=env)
    lines: queue.Queue[bytes | None] = queue.Queue()
    assert child.process.stdout is not None
    threading.Thread(target=_pump, args=(child.process.stdout, lines), name="gpu-probe-output", daemon=True).start()
    current: dict[str, Any] = {"what": "starting the GPU check"}
    report: dict[str, Any] | None = None
    output: deque[str] = deque(maxlen=_OUTPUT_LINES)
    deadline = time.monotonic() + step_timeout
    exited = False
    try:
        while True:
            try:
                raw = lines.get(timeout=_POLL)
            except queue.Empty:
                # Orphaned grandchildren may hold the pipe open after the check itself exited: once it
                # has, stop when its last words are read.
                if exited:
                    break
                exited = child.poll() is not None
                if time.monotonic() > deadline:
                    return {"hang": {**current, "timeout": step_timeout}, "output": list(output)}
                continue
            if raw is None:
                break
            text = raw.decode(errors="replace").rstrip()
            if not text.startswith(PREFIX):
                if text.strip():
                    output.append(redact(text))
                continue
            try:
                event = json.loads(text[len(PREFIX) :])
            except ValueError:
                continue
            if "report" in event:
                report = event["report"]
            else:
                current, deadline = event, time.monotonic() + step_timeout
        try:
            code = child.wait(timeout=step_timeout)
        except subprocess.TimeoutExpired:
            return {"hang": {"what": "the GPU check exiting", "timeout": step_timeout}, "output": list(output)}
    finally:
        if child.poll() is None:
            child.send(signal.SIGKILL)  # its group and every descendant
        else:
            # All-reduce ranks orphaned by a crash still hold GPU memory; they stay in the group, and
            # Linux does not reuse the number of a group that still has members.
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(child.pid, signal.SIGKILL)
        # A process stuck in the driver may not die at all: don't wait for it forever.
        with contextlib.suppress(subprocess.TimeoutExpired):
            child.wait(timeout=_KILL_WAIT)
        _wait_for_group_exit(child.pid, _KILL_WAIT)
    if report is None:
        return {"crashed": f"the GPU check exited with code {code} without a report", "output": list(output)}
    report["output"] = list(output)
    return report


# -- report → problem -------------------------------------------------------------------------------


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
    if report.get("all_reduce") and not report["all_reduce"].get("ok"):
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
    preset = result.get("nccl_p2p_disable")  # the user's own NCCL_P2P_DISABLE: no retry was made
    if retry is not None or preset is not None:
        setting = "also with NCCL_P2P_DISABLE=1" if retry is not None else f"with NCCL_P2P_DISABLE={preset}"
        return NcclError(
            f"{across} failed, {setting}: {gpu_causes.first_line(text, 120)}",
            "train on one GPU (GPUS=0), or ask the provider for another machine",
        )
    return NcclError(f"{across} failed: {gpu_causes.first_line(text, 120)}", cause.hint)


def _problem_record(problem: AgentError) -> dict[str, Any]:
    record: dict[str, Any] = {"code": problem.exit_code, "reason": problem.reason, "message": problem.message}
    if problem.hint:
        record["hint"] = problem.hint
    if isinstance(problem, NcclError) and gpu_causes.P2P_ADVICE in (problem.hint or ""):
        record["advice"] = "set NCCL_P2P_DISABLE=1"
    return record


# -- the entry points -------------------------------------------------------------------------------


def probe_gpus(settings: Settings) -> GpuReport:
    """Run the GPU check; the report carries the problem instead of raising it (``trainbox check`` prints both)."""
    if settings.gpus.cpu:
        logger.warning("GPUS=cpu: skipping the GPU check, training runs on the CPU")
        return GpuReport(indices=None, details={"device": "cpu", "checked": False})
    started = time.monotonic()
    if nvidia_present():
        selection = "all" if settings.gpus.indices is None else ",".join(map(str, settings.gpus.indices))
        report = run_probe(selection, probe_env(settings))
    else:
        report = {
            "available": False,
            "gpus": [],
            "init_error": None,
            "reason": "no /dev/nvidia* device and no nvidia-smi",
        }
    report["check_seconds"] = round(time.monotonic() - started, 2)
    problem = find_problem(report, settings.gpus)
    details = {"device": "cuda", "checked": True, **report}
    if problem is not None:
        details["problem"] = _problem_record(problem)
        return GpuReport(indices=None, details=details, problem=problem)
    return GpuReport(indices=tuple(gpu["index"] for gpu in report["gpus"]), details=details)


def check_gpus(settings: Settings, record: Callable[[dict[str, Any]], None] | None = None) -> GpuReport:
    """The GPUs to train on, proven to work; the demo falls back to the CPU when there is no GPU at all.

    ``record`` receives the details before a problem is raised, so trainbox.json shows what failed.
    """
    with step("GPU check"):
        report = probe_gpus(settings)
    if isinstance(report.problem, NoGpuError) and settings.is_demo:
        logger.warning("!" * 72)
        logger.warning("NO GPU FOUND: the demo trains on the CPU instead (slow, fine for a demo)")
        logger.warning("!" * 72)
        details = {key: value for key, value in report.details.items() if key != "problem"}
        report = GpuReport(indices=None, details={**details, "device": "cpu", "fallback": "no GPU"})
    if record is not None:
        record(report.details)
    report.raise_problem()
    for line in summary_lines(report.details):
        logger.info("%s", line)
    return report


# -- presentation -----------------------------------------------------------------------------------


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


SHM_PATH = Path("/dev/shm")
MIN_SHM_BYTES = 1 << 30


def shared_memory_bytes(path: Path = SHM_PATH) -> int | None:
    try:
        stat = os.statvfs(path)
    except OSError:
        return None
    return stat.f_blocks * stat.f_frsize


def check_shared_memory(run_args: RunArgs, shm_bytes: int | None) -> None:
    """DataLoader workers pass batches through /dev/shm; on Docker's 64 MB default they die and the
    training hangs instead of failing (it would bill until the stall guard fires). Refuse up front."""
    workers = run_args.get("workers")
    if workers == "0" or shm_bytes is None or shm_bytes >= MIN_SHM_BYTES:
        return
    raise ConfigError(
        f"/dev/shm is only {shm_bytes / 2**20:.0f} MB and DataLoader workers (workers={workers or 'default'}) "
        "would hang once it fills",
        "run the container with --shm-size 8g (or --ipc=host), or set workers=0 in RUN_ARGS",
    )
