"""On a real GPU: the stall guard reads GPU work from ``nvidia-smi``, so a training busy only on the card
(its CPU waiting on kernels, no output, no file written) is not taken for a stalled one."""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from entrypoint.training import liveness

pytestmark = [pytest.mark.gpu, pytest.mark.slow]

# Keeps the first GPU busy with large matmuls until stdin closes; prints "busy" once kernels run.
BURN = """\
import sys, threading, torch
stop = threading.Event()
threading.Thread(target=lambda: (sys.stdin.read(), stop.set()), daemon=True).start()
a = torch.randn(8192, 8192, device="cuda:0", dtype=torch.bfloat16)
torch.cuda.synchronize()
print("busy", flush=True)
while not stop.is_set():
    for _ in range(20):
        a = (a @ a).clamp_(-1, 1)
    torch.cuda.synchronize()
"""


def sample_gpu(probe: liveness.Liveness, seconds: float) -> list[bool]:
    """The GPU sign of ``probe`` taken every GPU_SAMPLE_INTERVAL for ``seconds``: True where it saw work."""
    seen = []
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        seen.append(probe._gpu_progress(time.monotonic() + liveness.GPU_SAMPLE_INTERVAL * (len(seen) + 1)) is not None)
        time.sleep(1.0)
    return seen


def test_gpu_work_counts_as_progress_and_an_idle_card_does_not(tmp_path: Path) -> None:
    if shutil.which("nvidia-smi") is None:
        pytest.skip("nvidia-smi is not installed: liveness then watches CPU and files only")
    burner = subprocess.Popen([sys.executable, "-c", BURN], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert burner.stdout is not None and burner.stdout.readline().strip() == "busy"
        busy = sample_gpu(liveness.Liveness(burner.pid, tmp_path, frozenset()), 6.0)
    finally:
        assert burner.stdin is not None
        burner.stdin.close()
        burner.wait(timeout=60)
        burner.stdout.close()
    utilisation = subprocess.run(
        ["nvidia-smi", "--query-gpu=utilization.gpu", "--format=csv,noheader,nounits"],
        capture_output=True,
        text=True,
        timeout=30,
    ).stdout.split()
    print(f"liveness samples while the card computed: {busy}; utilisation after: {utilisation} %")
    assert any(busy), "nvidia-smi never showed the burning GPU as busy"
    time.sleep(2.0)  # utilisation.gpu averages over the last sample period
    idle = sample_gpu(liveness.Liveness(1, tmp_path, frozenset()), 3.0)
    assert not all(idle), "an idle card still counted as progress"
