"""Runs in the GPU check's child (``probe --bench``): what a card delivers, for the host report.

Per GPU: bf16 and fp16 matmul TFLOP/s (a large square GEMM, after a warm-up, so the clocks have
ramped), host→device copy GB/s from pinned memory (what the PCIe link gives), and from nvidia-smi the
PCIe link (generation × width, current and maximum) and the active clock throttle reasons.
"""

from __future__ import annotations

import shutil
from typing import Any

from .. import procs

MATMUL_SIZE = 8192
MATMUL_REPEATS = 10
COPY_MIB = 256
COPY_REPEATS = 5
SMI_TIMEOUT = 20.0
# nvidia-smi's names for the link and the throttle reasons (renamed "clocks_event_reasons" in R535+).
_LINK = "pcie.link.gen.current,pcie.link.gen.max,pcie.link.width.current,pcie.link.width.max"
_THROTTLE = ("clocks_event_reasons.active", "clocks_throttle_reasons.active")
# The bits of the throttle mask that mean the card is held back (not idle, not an application cap).
_HELD_BACK = {
    0x8: "hw_slowdown",
    0x20: "sw_thermal_slowdown",
    0x40: "hw_thermal_slowdown",
    0x80: "hw_power_brake_slowdown",
}


def _timed(torch: Any, device: Any, work: Any, repeats: int) -> float:
    """Seconds for ``repeats`` runs of ``work`` on ``device``'s stream, after one warm-up run."""
    with torch.cuda.device(device):
        work()
        torch.cuda.synchronize(device)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(repeats):
            work()
        end.record()
        end.synchronize()
        return float(start.elapsed_time(end)) / 1000


def matmul_tflops(torch: Any, device: Any, dtype: Any, size: int = MATMUL_SIZE) -> float | None:
    a = torch.randn(size, size, device=device, dtype=dtype)
    b = torch.randn(size, size, device=device, dtype=dtype)
    seconds = _timed(torch, device, lambda: a @ b, MATMUL_REPEATS)
    return round(2 * size**3 * MATMUL_REPEATS / seconds / 1e12, 1) if seconds > 0 else None


def copy_gbps(torch: Any, device: Any, mib: int = COPY_MIB) -> float | None:
    host = torch.empty(mib * 2**20, dtype=torch.uint8).pin_memory()
    target = torch.empty(mib * 2**20, dtype=torch.uint8, device=device)
    seconds = _timed(torch, device, lambda: target.copy_(host, non_blocking=True), COPY_REPEATS)
    return round(mib * 2**20 * COPY_REPEATS / seconds / 1e9, 1) if seconds > 0 else None


def _smi(query: str) -> list[list[str]] | None:
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return None
    try:
        result = procs.run([smi, f"--query-gpu=index,{query}", "--format=csv,noheader,nounits"], timeout=SMI_TIMEOUT)
    except OSError:
        return None
    if result.returncode != 0:
        return None
    return [[part.strip() for part in line.split(",")] for line in result.stdout.splitlines() if line.strip()]


def _number(text: str) -> int | None:
    return int(text) if text.isdigit() else None


def links() -> dict[int, dict[str, Any]]:
    """The PCIe link and throttle reasons of every card, by nvidia-smi's index (PCI order; CUDA's order
    can differ only between cards of different speed, so on a machine of one model a card's figures
    may be paired with its twin's link, never with another model's datasheet)."""
    found: dict[int, dict[str, Any]] = {}
    for row in _smi(_LINK) or []:
        if len(row) == 5 and row[0].isdigit():
            gen, gen_max, width, width_max = (_number(part) for part in row[1:])
            found[int(row[0])] = {"gen": gen, "gen_max": gen_max, "width": width, "width_max": width_max}
    for query in _THROTTLE:
        rows = _smi(query)
        if rows is None:
            continue
        for row in rows:
            if len(row) == 2 and row[0].isdigit():
                try:
                    mask = int(row[1], 16)
                except ValueError:
                    continue
                reasons = [name for bit, name in _HELD_BACK.items() if mask & bit]
                found.setdefault(int(row[0]), {})["throttle"] = reasons
        break
    return found


def bench(torch: Any, device: Any) -> dict[str, Any]:
    """One card's figures; a figure that could not be measured is left out, with the error."""
    figures: dict[str, Any] = {}
    for key, dtype in (("bf16_tflops", torch.bfloat16), ("fp16_tflops", torch.float16)):
        try:
            figures[key] = matmul_tflops(torch, device, dtype)
        except Exception as error:
            figures.setdefault("errors", []).append(f"{key}: {type(error).__name__}: {error}"[:300])
    try:
        figures["copy_gbps"] = copy_gbps(torch, device)
    except Exception as error:
        figures.setdefault("errors", []).append(f"copy_gbps: {type(error).__name__}: {error}"[:300])
    torch.cuda.empty_cache()
    return figures
