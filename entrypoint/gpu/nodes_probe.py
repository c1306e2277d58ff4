"""Runs in a child process on every node of a multi-node training, before any of them trains.

The nodes meet at node 0's ``MASTER_ADDR:MASTER_PORT+1`` (a TCPStore bounded by the rendezvous
timeout), swap what each brings (``--facts``: its GPUs, its run; node 0's also names the Hub commit
every node resumes from), and, on GPUs, sum a tensor across the nodes with NCCL: the transport
torchrun's workers will use, between machines that have never talked before. Everything goes
through gloo except that one collective, so the report says which of the two failed.

Protocol: the lines of ``gpu.probe`` (``TRAINBOX_PROBE {"step": …}`` before each step, here with
the step's own ``timeout``, and one ``{"report": …}`` at the end, printed whatever happened).
"""

from __future__ import annotations

import argparse
import json
import socket
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

from .probe import emit, error_text, report_and_exit

ALL_REDUCE_MIB = 32
_MARGIN = 30.0  # beyond torch's own timeout: the parent's watchdog only catches what torch does not


def _nccl_all_reduce(dist: Any, torch: Any, rank: int, world: int, timeout: float) -> dict[str, Any]:
    """Sum ``rank + 1`` across the nodes on each node's first GPU (the others were checked locally)."""
    try:
        device = torch.device("cuda", 0)
        torch.cuda.set_device(device)
        group = dist.new_group(backend="nccl", timeout=timedelta(seconds=timeout))
        tensor = torch.full((ALL_REDUCE_MIB * 2**20 // 4,), float(rank + 1), device=device)
        dist.all_reduce(tensor, group=group)  # warm-up: builds the communicator and its transports
        tensor.fill_(float(rank + 1))
        dist.barrier(group=group)
        timed = time.perf_counter()
        dist.all_reduce(tensor, group=group)
        value = float(tensor[0])  # waits for the collective
        seconds = time.perf_counter() - timed
        expected = world * (world + 1) / 2
        if not bool((tensor == expected).all()):
            return {"ok": False, "error": f"the all-reduce across the nodes returned {value}, not {expected}"}
        algbw = ALL_REDUCE_MIB * 2**20 / seconds / 1e9
        return {"ok": True, "busbw_gbps": round(algbw * 2 * (world - 1) / world, 1)}
    except Exception as error:  # the parent classifies the text
        return {"ok": False, "error": error_text(error)}


def check(args: argparse.Namespace) -> dict[str, Any]:
    facts = json.loads(Path(args.facts).read_text())
    facts["host"] = socket.gethostname()
    report: dict[str, Any] = {"node_rank": args.node_rank}
    emit(step="import", what="importing torch")
    import torch
    import torch.distributed as dist

    facts["torch"] = torch.__version__
    where = f"{args.master}:{args.port}"
    others = "node 0" if args.node_rank else f"the other {args.nnodes - 1} node(s)"
    emit(step="join", what=f"waiting for {others} at {where}", timeout=args.join_timeout + _MARGIN)
    started = time.monotonic()
    try:
        store = dist.TCPStore(  # type: ignore[attr-defined]
            args.master,
            args.port,
            world_size=args.nnodes,
            is_master=args.node_rank == 0,
            timeout=timedelta(seconds=args.join_timeout),
            wait_for_workers=True,
        )
        dist.init_process_group(
            "gloo", store=store, rank=args.node_rank, world_size=args.nnodes, timeout=timedelta(seconds=args.timeout)
        )
    except Exception as error:
        report["join_error"] = error_text(error)
        report["waited"] = round(time.monotonic() - started, 1)
        return report
    report["joined_after"] = round(time.monotonic() - started, 1)
    emit(step="exchange", what="exchanging what each node brings", timeout=args.timeout + _MARGIN)
    try:
        everyone: list[Any] = [None] * args.nnodes
        dist.all_gather_object(everyone, facts)
        report["nodes"] = everyone
        if args.nccl:
            emit(step="nccl", what="the NCCL all-reduce across the nodes", timeout=args.timeout + _MARGIN)
            report["nccl"] = _nccl_all_reduce(dist, torch, args.node_rank, args.nnodes, args.timeout)
        # Nobody leaves before everyone is done: node 0 hosts the store the others still talk to.
        verdicts: list[Any] = [None] * args.nnodes
        dist.all_gather_object(verdicts, report.get("nccl", {}).get("ok", True))
        report["nccl_ok_on"] = [rank for rank, ok in enumerate(verdicts) if ok]
        dist.destroy_process_group()
    except Exception as error:
        report["error"] = error_text(error)
    return report


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m entrypoint.gpu.nodes_probe")
    parser.add_argument("--nnodes", type=int, required=True)
    parser.add_argument("--node-rank", type=int, required=True)
    parser.add_argument("--master", required=True)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--join-timeout", type=float, required=True)
    parser.add_argument("--timeout", type=float, required=True, help="each collective's bound once joined")
    parser.add_argument("--facts", required=True, help="a JSON file: what this node brings")
    parser.add_argument("--nccl", action="store_true", help="also sum across the nodes' GPUs with NCCL")
    args = parser.parse_args(argv)
    report_and_exit(lambda: check(args))


if __name__ == "__main__":
    main()
