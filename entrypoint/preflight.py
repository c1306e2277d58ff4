"""Preflight: prove the GPUs work (in a child process), check disk and access, before paying for data.

The agent never creates a CUDA context itself: it would hold memory on every card and skew
libreyolo's ``batch=-1`` sizing. ``gpu_probe`` runs in a child that exits before training.
"""

from __future__ import annotations

import glob
import json
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from typing import Any

from .errors import GpuError, GpuHangError, NoGpuError
from .log import logger
from .settings import Settings

PROBE_TIMEOUT = 120.0


@dataclass(frozen=True)
class GpuReport:
    indices: tuple[int, ...] | None  # None: train on the CPU
    details: dict[str, Any] = field(default_factory=dict)


def nvidia_present() -> bool:
    """A cheap look for an NVIDIA driver, so a CPU machine fails in milliseconds, not after importing torch."""
    return bool(glob.glob("/dev/nvidia[0-9]*")) or shutil.which("nvidia-smi") is not None


def run_probe(indices: tuple[int, ...] | None, timeout: float = PROBE_TIMEOUT) -> dict[str, Any]:
    arg = ",".join(map(str, indices)) if indices else ""
    try:
        result = subprocess.run(
            [sys.executable, "-m", "entrypoint.gpu_probe", arg], capture_output=True, text=True, timeout=timeout
        )
    except subprocess.TimeoutExpired:
        raise GpuHangError(
            f"the GPU check did not finish within {timeout:.0f} s",
            "the GPU hangs: ask the provider for another machine",
        ) from None
    lines = [line for line in result.stdout.splitlines() if line.startswith("{")]
    if result.returncode != 0 or not lines:
        tail = (result.stderr.strip().splitlines() or ["no output"])[-1]
        raise GpuError(f"the GPU check crashed: {tail}", "run `trainbox check` for details")
    return json.loads(lines[-1])


def check_gpus(settings: Settings) -> GpuReport:
    """The GPUs to train on; the demo falls back to the CPU, a real run refuses to."""
    if settings.gpus.cpu:
        logger.warning("GPUS=cpu: training on the CPU, skipping the GPU check")
        return GpuReport(indices=None)
    report = run_probe(settings.gpus.indices) if nvidia_present() else {"available": False, "gpus": []}
    if not report.get("available"):
        if settings.is_demo:
            logger.warning("!" * 72)
            logger.warning("NO GPU FOUND: the demo trains on the CPU instead (slow, fine for a demo)")
            logger.warning("!" * 72)
            return GpuReport(indices=None, details=report)
        raise NoGpuError(
            f"GPUS={settings.gpus} but no usable NVIDIA GPU was found", "to train on the CPU, set GPUS=cpu"
        )
    broken = [gpu for gpu in report["gpus"] if gpu.get("error")]
    if broken:
        raise GpuError(f"GPU {broken[0]['index']}: {broken[0]['error']}", "fix GPUS or ask for another machine")
    indices = tuple(gpu["index"] for gpu in report["gpus"])
    return GpuReport(indices=indices, details=report)
