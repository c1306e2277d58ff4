"""Tests marked ``gpu`` run where an NVIDIA GPU is, and are skipped with the reason everywhere else."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from entrypoint.gpu import run as gpu_run


def no_gpu_reason() -> str | None:
    """Why this machine cannot run the GPU tests, or None. Asks nvidia-smi, never creates a CUDA context."""
    if not gpu_run.nvidia_present():
        return "no NVIDIA GPU on this machine (no /dev/nvidia* device, no nvidia-smi)"
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return None  # device nodes without nvidia-smi: let the GPU check itself decide
    try:
        listed = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired) as error:
        return f"nvidia-smi -L did not answer ({error})"
    return None if "GPU " in listed else "nvidia-smi lists no GPU"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    marked = [item for item in items if item.get_closest_marker("gpu")]
    if not marked:
        return
    reason = no_gpu_reason()
    if reason is not None:
        for item in marked:
            item.add_marker(pytest.mark.skip(reason=reason))
