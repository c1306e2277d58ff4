"""On a machine with two or more NVIDIA GPUs: every NCCL fallback the GPU check may choose really runs an
all-reduce, so a box whose defaults fail trains with the first of them that works."""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest

from entrypoint.gpu import probe as gpu_probe

pytestmark = [pytest.mark.gpu, pytest.mark.slow]


def _gpu_count() -> int:
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return 0
    listed = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=30).stdout
    return sum(line.startswith("GPU ") for line in listed.splitlines())


needs_two = pytest.mark.skipif(_gpu_count() < 2, reason="the NCCL fallbacks need two GPUs")


@needs_two
@pytest.mark.parametrize("fallback", gpu_probe.NCCL_FALLBACKS, ids=lambda env: "+".join(sorted(env)))
def test_each_fallback_runs_a_real_all_reduce(fallback: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in fallback.items():
        monkeypatch.setenv(name, value)  # the spawned ranks inherit it, as the training would
    result = gpu_probe.all_reduce([0, 1], timeout=60)
    assert result["ok"] is True, result
    assert result["busbw_gbps"] > 0


@needs_two
def test_a_failing_default_falls_back_on_real_nccl(monkeypatch: pytest.MonkeyPatch) -> None:
    """The defaults made to fail (an NCCL that may use no transport but one that is not there), the
    fallback chain finds the setting that works and records it."""
    real = gpu_probe.all_reduce
    monkeypatch.setattr(gpu_probe, "emit", lambda **_: None)
    for name in ("NCCL_P2P_DISABLE", "NCCL_SHM_DISABLE"):
        monkeypatch.delenv(name, raising=False)

    def defaults_broken(devices: list[int], timeout: float, backend: str = "nccl") -> dict[str, object]:
        if "NCCL_P2P_DISABLE" not in os.environ and "NCCL_SHM_DISABLE" not in os.environ:
            return {"gpus": devices, "ok": False, "error": "rank 0 (GPU 0): made to fail", "seconds": 0.0}
        return real(devices, timeout, backend)

    monkeypatch.setattr(gpu_probe, "all_reduce", defaults_broken)
    result = gpu_probe.check_all_reduce([0, 1], timeout=60)
    assert result["nccl_env"] == {"NCCL_P2P_DISABLE": "1"}, result
    assert result["fallbacks"][0]["ok"] is True and result["fallbacks"][0]["busbw_gbps"] > 0
