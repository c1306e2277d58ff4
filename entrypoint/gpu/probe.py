"""Runs in a child process: the only code of the agent that touches CUDA.

For each GPU asked about: its name, compute capability, free memory, whether this torch has
kernels for it, and a 2048x2048 fp32 matmul whose result is checked against the CPU. With
several GPUs, an NCCL all-reduce across them (one process per GPU), retried once with
``NCCL_P2P_DISABLE=1`` when it fails, so the report can say whether that is the fix.

Protocol: lines on stdout that start with ``TRAINBOX_PROBE `` carry JSON: ``{"step": ...}``
before each step (the parent's hang watchdog names the step that never finished) and one
``{"report": ...}`` at the end, printed even when everything failed. Everything else on stdout
and stderr (torch warnings, NCCL's own lines) is free text the parent keeps for diagnosis.

The CUDA context, and its memory on every card, is gone when this process exits, before
libreyolo sizes ``batch=-1``.
"""

from __future__ import annotations

import argparse
import importlib
import json
import math
import os
import queue
import shutil
import socket
import sys
import time
import warnings
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any, NoReturn

from .. import procs
from . import causes as gpu_causes

PREFIX = "TRAINBOX_PROBE "
MATMUL_SIZE = 2048
MATMUL_REPEATS = 5
# A correct fp32 matmul (even with TF32 enabled) stays far below this relative error.
MATMUL_TOLERANCE = 1e-3
ALL_REDUCE_MIB = 32
# Tried in this order when the defaults fail: peer-to-peer off (broken P2P/IOMMU, PCIe ACS), shared
# memory off (a small or broken /dev/shm between the ranks), then both (only the network transport).
NCCL_FALLBACKS: tuple[dict[str, str], ...] = (
    {"NCCL_P2P_DISABLE": "1"},
    {"NCCL_SHM_DISABLE": "1"},
    {"NCCL_P2P_DISABLE": "1", "NCCL_SHM_DISABLE": "1"},
)
NVIDIA_SMI_TIMEOUT = 20.0
_PROC_DRIVER_VERSION = Path("/proc/driver/nvidia/version")


def emit(**event: Any) -> None:
    print(PREFIX + json.dumps(event), flush=True)


def error_text(error: BaseException) -> str:
    return f"{type(error).__name__}: {error}".strip()


def report_and_exit(make_report: Callable[[], dict[str, Any]]) -> NoReturn:
    """Print the one report, whatever happened, and leave at once.

    Exiting through ``os._exit``: multiprocessing's exit handler would join ranks stuck in the driver
    without a bound, and CUDA's (or gloo's) teardown can hang on a card that fell off the bus."""
    try:
        report = make_report()
    except BaseException as error:  # the parent needs a report, whatever happened
        report = {"crashed": error_text(error)}
    emit(report=report)
    sys.stdout.flush()
    os._exit(0)


# -- facts that need no CUDA context ---------------------------------------------------------------


def _nvidia_smi(*query: str) -> str | None:
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return None
    try:
        result = procs.run([smi, *query], timeout=NVIDIA_SMI_TIMEOUT)
    except OSError:
        return None
    return result.stdout if result.returncode == 0 else None


def driver_version() -> str | None:
    """The NVIDIA driver version, from nvidia-smi, else from the kernel module."""
    text = _nvidia_smi("--query-gpu=driver_version", "--format=csv,noheader")
    if text is None:
        try:
            text = _PROC_DRIVER_VERSION.read_text()
        except OSError:
            return None
    return gpu_causes.parse_driver_version(text)


def smi_gpus() -> list[dict[str, Any]]:
    """The cards as nvidia-smi lists them (in PCI order, which may differ from CUDA's)."""
    text = _nvidia_smi("--query-gpu=name,compute_cap,memory.total,memory.free", "--format=csv,noheader,nounits")
    cards: list[dict[str, Any]] = []
    for line in (text or "").splitlines():
        parts = [part.strip() for part in line.split(",")]
        if len(parts) == 4:
            cards.append({"name": parts[0], "compute_cap": parts[1], "total_mib": parts[2], "free_mib": parts[3]})
    return cards


# -- the checks -------------------------------------------------------------------------------------


def reference_matmul(torch: Any, size: int = MATMUL_SIZE) -> tuple[Any, Any, Any]:
    """Two seeded random matrices and their product, computed on the CPU once for every GPU."""
    generator = torch.Generator().manual_seed(20261202)
    a = torch.randn(size, size, generator=generator)
    b = torch.randn(size, size, generator=generator)
    return a, b, a @ b


def check_matmul(torch: Any, device: Any, reference: tuple[Any, Any, Any]) -> dict[str, Any]:
    """Multiply on ``device``, compare with the CPU's product there (torch's own kernels too)."""
    a, b, expected = reference
    with torch.cuda.device(device):  # events and streams belong to the current device
        x, y = a.to(device), b.to(device)
        product = x @ y
        scale = float(expected.abs().max())
        error = float((product - expected.to(device)).abs().max()) / scale
        torch.cuda.synchronize(device)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(MATMUL_REPEATS):
            x @ y
        end.record()
        end.synchronize()
        seconds = start.elapsed_time(end) / 1000
    size = a.shape[0]
    return {
        "ok": math.isfinite(error) and error < MATMUL_TOLERANCE,
        "max_rel_error": error,
        "tflops_fp32": round(2 * size**3 * MATMUL_REPEATS / seconds / 1e12, 1) if seconds > 0 else None,
    }


def check_gpu(
    torch: Any, index: int, count: int, arch_list: list[str], reference: tuple[Any, Any, Any]
) -> dict[str, Any]:
    facts: dict[str, Any] = {"index": index}
    if index >= count:
        facts["missing"] = True
        return facts
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            props = torch.cuda.get_device_properties(index)
            capability = (props.major, props.minor)
            facts.update(
                name=props.name,
                capability=list(capability),
                sm=f"sm_{gpu_causes.sm_number(capability)}",
                arch_supported=gpu_causes.arch_supported(capability, arch_list),
                total_gib=round(props.total_memory / 2**30, 1),
            )
            device = torch.device("cuda", index)
            free, _total = torch.cuda.mem_get_info(device)  # creates this card's context
            facts["free_gib"] = round(free / 2**30, 1)
            facts["matmul"] = check_matmul(torch, device, reference)
        except Exception as error:  # the parent classifies the text
            facts["error"] = error_text(error)
    if caught:
        facts["warnings"] = [str(warning.message)[:500] for warning in caught]
    return facts


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _all_reduce_rank(rank: int, devices: list[int], port: int, backend: str, timeout: float, results: Any) -> None:
    """One rank of the all-reduce check; reports through ``results``, never raises."""
    import torch
    import torch.distributed as dist

    world = len(devices)
    try:
        if backend == "nccl":
            device = torch.device("cuda", devices[rank])
            torch.cuda.set_device(device)
        else:
            device = torch.device("cpu")
        dist.init_process_group(
            backend,
            init_method=f"tcp://127.0.0.1:{port}",
            rank=rank,
            world_size=world,
            timeout=timedelta(seconds=timeout),
            device_id=device if backend == "nccl" else None,
        )
        tensor = torch.full((ALL_REDUCE_MIB * 2**20 // 4,), float(rank + 1), device=device)
        dist.all_reduce(tensor)  # warm-up: builds the communicator and its transports
        tensor.fill_(float(rank + 1))
        dist.barrier()
        started = time.perf_counter()
        dist.all_reduce(tensor)
        value = float(tensor[0])  # waits for the collective
        seconds = time.perf_counter() - started
        expected = world * (world + 1) / 2
        correct = bool((tensor == expected).all())
        results.put({"rank": rank, "ok": correct, "value": value, "seconds": seconds, "expected": expected})
        dist.destroy_process_group()
    except BaseException as error:  # report whatever it was: the parent classifies it
        results.put({"rank": rank, "ok": False, "error": error_text(error)})


def all_reduce(devices: list[int], timeout: float, backend: str = "nccl") -> dict[str, Any]:
    """Sum a tensor across ``devices``, one process each; a rank silent for ``timeout`` s is a hang."""
    import torch.multiprocessing as mp

    context = mp.get_context("spawn")  # fork is unsafe once CUDA is initialised
    # Pickled by its importable name: run as ``python -m``, this module's own functions live in __main__.
    rank_main = importlib.import_module("entrypoint.gpu.probe")._all_reduce_rank
    results = context.Queue()
    port = _free_port()
    workers = [
        context.Process(target=rank_main, args=(rank, devices, port, backend, timeout, results), daemon=True)
        for rank in range(len(devices))
    ]
    started = time.monotonic()
    for worker in workers:
        worker.start()
    collected: dict[int, dict[str, Any]] = {}
    deadline = started + timeout
    silent_dead = 0
    while len(collected) < len(workers) and time.monotonic() < deadline:
        try:
            item = results.get(timeout=min(0.5, max(deadline - time.monotonic(), 0.01)))
        except queue.Empty:
            dead = [rank for rank, w in enumerate(workers) if w.exitcode is not None and rank not in collected]
            silent_dead = silent_dead + 1 if dead else 0
            if silent_dead >= 2:  # a rank died without a word (killed, crashed in C code)
                break
            continue
        collected[item["rank"]] = item
    for worker in workers:
        worker.join(timeout=5)
        if worker.is_alive():
            worker.kill()
            worker.join(timeout=5)
    stuck = [devices[rank] for rank, worker in enumerate(workers) if worker.is_alive()]
    result: dict[str, Any] = {"gpus": devices, "backend": backend, "seconds": round(time.monotonic() - started, 2)}
    if stuck:  # stuck in the driver even after SIGKILL: left behind (see ``__main__`` below)
        result["unreaped_gpus"] = stuck
    missing = [rank for rank in range(len(workers)) if rank not in collected]
    errors = [
        f"rank {rank} (GPU {devices[rank]}): {item['error']}"
        for rank, item in sorted(collected.items())
        if "error" in item
    ]
    wrong = [rank for rank, item in sorted(collected.items()) if "error" not in item and not item["ok"]]
    if errors:
        result["error"] = "\n".join(errors)
    elif missing:
        codes = {rank: workers[rank].exitcode for rank in missing}
        hung = [rank for rank, code in codes.items() if code is None or code == -9]
        result["hang"] = bool(hung)
        names = ", ".join(str(devices[rank]) for rank in missing)
        exits = ", ".join(str(code) for code in codes.values())
        result["error"] = (
            f"GPU(s) {names} did not finish the all-reduce within {timeout:.0f} s"
            if hung
            else f"the rank(s) of GPU(s) {names} exited with code(s) {exits} without a report"
        )
    elif wrong:
        values = ", ".join(f"GPU {devices[rank]}: {collected[rank]['value']}" for rank in wrong)
        result["error"] = f"the all-reduce returned a wrong sum ({values}; expected {collected[wrong[0]]['expected']})"
    result["ok"] = "error" not in result
    if result["ok"]:
        slowest = max(item["seconds"] for item in collected.values())
        world = len(devices)
        algbw = ALL_REDUCE_MIB * 2**20 / slowest / 1e9
        result["busbw_gbps"] = round(algbw * 2 * (world - 1) / world, 1)
    return result


def check_all_reduce(devices: list[int], timeout: float) -> dict[str, Any]:
    """NCCL across the GPUs; on failure again with each of ``NCCL_FALLBACKS`` in turn. The first that
    works is ``nccl_env``, which the training then runs with (a host whose peer-to-peer or shared-memory
    transport is broken still trains, a little slower). The user's own setting is not second-guessed."""
    emit(step="all_reduce", what=f"the NCCL all-reduce across GPUs {','.join(map(str, devices))}")
    os.environ.setdefault("NCCL_DEBUG", "WARN")  # NCCL then prints the CUDA error behind its own
    result = all_reduce(devices, timeout)
    if "NCCL_P2P_DISABLE" in os.environ:
        result["nccl_p2p_disable"] = os.environ["NCCL_P2P_DISABLE"]
    if result["ok"] or any(name in os.environ for name in ("NCCL_P2P_DISABLE", "NCCL_SHM_DISABLE")):
        return result
    result["fallbacks"] = []
    for fallback in NCCL_FALLBACKS:
        words = " ".join(f"{name}={value}" for name, value in fallback.items())
        emit(step="all_reduce_fallback", what=f"the NCCL all-reduce with {words}")
        os.environ.update(fallback)  # inherited by the spawned ranks
        try:
            retry = all_reduce(devices, timeout)
        finally:
            for name in fallback:
                del os.environ[name]
        kept: dict[str, Any] = {key: retry[key] for key in ("ok", "error", "seconds", "busbw_gbps") if key in retry}
        result["fallbacks"].append({"env": dict(fallback), **kept})
        if fallback == {"NCCL_P2P_DISABLE": "1"}:
            result["p2p_disabled"] = kept
        if retry["ok"]:
            result["nccl_env"] = dict(fallback)
            break
    return result


def probe(selection: list[int] | None, nccl_timeout: float, bench: bool = False) -> dict[str, Any]:
    started = time.monotonic()
    report: dict[str, Any] = {"driver": driver_version(), "cards": smi_gpus(), "gpus": [], "available": False}
    emit(step="import", what="importing torch")
    try:
        import torch
    except Exception as error:
        report["init_error"] = error_text(error)
        return report
    arch_list = torch.cuda.get_arch_list()
    report.update(torch=torch.__version__, cuda=torch.version.cuda, arch_list=arch_list)
    emit(step="init", what="initialising CUDA")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            torch.cuda.init()
            count = torch.cuda.device_count()
        except Exception as error:
            report["init_error"] = error_text(error)
            count = 0
    if caught:
        report["warnings"] = [str(warning.message)[:500] for warning in caught]
    report["visible"] = count
    if "init_error" in report or count == 0:
        return report
    report["available"] = True
    if torch.distributed.is_nccl_available():
        report["nccl_version"] = ".".join(map(str, torch.cuda.nccl.version()))
    reference = reference_matmul(torch)
    for index in selection if selection is not None else range(count):
        emit(step="gpu", index=index, what=f"GPU {index} (CUDA context, memory, matmul)")
        report["gpus"].append(check_gpu(torch, index, count, arch_list, reference))
    passed = [gpu["index"] for gpu in report["gpus"] if gpu.get("matmul", {}).get("ok") and gpu.get("arch_supported")]
    if bench:  # the host report's figures: what each working card delivers
        from . import bench as gpu_bench

        for gpu in report["gpus"]:
            if gpu["index"] in passed:
                emit(step="bench", index=gpu["index"], what=f"GPU {gpu['index']} (matmul TFLOP/s, copy GB/s)")
                gpu["bench"] = gpu_bench.bench(torch, torch.device("cuda", gpu["index"]))
        report["links"] = gpu_bench.links()
    if len(passed) > 1 and len(passed) == len(report["gpus"]):
        report["all_reduce"] = check_all_reduce(passed, nccl_timeout)
    report["seconds"] = round(time.monotonic() - started, 2)
    return report


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m entrypoint.gpu.probe")
    parser.add_argument("--gpus", default="all", help="all, or indices like 0,1")
    parser.add_argument("--nccl-timeout", type=float, default=45.0)
    parser.add_argument("--bench", action="store_true", help="also measure TFLOP/s, copy GB/s, PCIe link")
    args = parser.parse_args(argv)
    selection = None if args.gpus == "all" else [int(part) for part in args.gpus.split(",")]
    report_and_exit(lambda: probe(selection, args.nccl_timeout, args.bench))


if __name__ == "__main__":
    main()
