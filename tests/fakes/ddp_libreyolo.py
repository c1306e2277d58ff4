"""A stand-in for libreyolo's training as one torchrun worker of several nodes (CPU, gloo), for tests of the agent.

Run by ``entrypoint.training.ddp_worker`` when ``TRAINBOX_DDP_ENTRY=tests.fakes.ddp_libreyolo:main``. Every
worker joins the process group and sums a tensor once per epoch (a lost peer ends the others as it would end
libreyolo's); global rank 0 writes the run folder as tests/fakes/libreyolo.py does (checkpoints, a
``metrics.jsonl`` row, ``status.json`` last). ``resume=true model=<checkpoint>`` continues after its epoch.

``FAKE_OOM_NODE=<n>`` with ``FAKE_OOM_ABOVE=<batch>``: a worker of node n whose global batch is above that runs
out of GPU memory during epoch ``FAKE_OOM_EPOCH`` (default 2) as libreyolo 1.6.0 does under ddp_worker: the
worker reports it (``ddp_worker.tell_out_of_memory``, as the patched libreyolo CLI does), prints libreyolo's
``Error [cuda_oom]`` line and exits 1; rank 0 also writes ``status.json`` ``failed``.
``FAKE_EPOCH_SECONDS`` paces the epochs (default 0).
"""

from __future__ import annotations

import json
import os
import sys
import time
from datetime import timedelta

from entrypoint.training import ddp_worker
from tests.fakes.libreyolo import _checkpoint, _epoch_of, _out_of_memory


def main(argv: list[str]) -> None:
    import torch
    import torch.distributed as dist

    args = dict(a.split("=", 1) for a in argv[1:] if "=" in a)
    rank, node = int(os.environ["RANK"]), int(os.environ["GROUP_RANK"])
    dist.init_process_group("gloo", timeout=timedelta(seconds=float(os.environ.get(ddp_worker.TIMEOUT_VAR, "60"))))
    run_dir = os.path.join(args["project"], args["name"])
    weights = os.path.join(run_dir, "weights")
    total = int(args.get("epochs", "2"))
    batch = int(args.get("batch", "16"))
    batch = 16 if batch == -1 else batch
    if rank == 0:
        os.makedirs(weights, exist_ok=True)
        with open(os.path.join(run_dir, "train_config.yaml"), "w") as f:
            f.write(f"epochs: {total}\nbatch: {batch}\n")
    oom_node = int(os.environ.get("FAKE_OOM_NODE", "-1"))
    oom_above = int(os.environ.get("FAKE_OOM_ABOVE", "0"))
    oom_epoch = int(os.environ.get("FAKE_OOM_EPOCH", "2"))
    pause = float(os.environ.get("FAKE_EPOCH_SECONDS", "0"))
    first = _epoch_of(args["model"]) + 1 if args.get("resume") == "true" else 1
    for epoch in range(first, total + 1):
        time.sleep(pause)
        if node == oom_node and oom_above and batch > oom_above and epoch == oom_epoch:
            message = "CUDA out of memory. Tried to allocate 2.00 GiB"
            ddp_worker.tell_out_of_memory(f"OutOfMemoryError: {message}")
            if rank == 0:
                _out_of_memory(run_dir, epoch)
            else:
                print(f"ERROR    Error [cuda_oom]: Training failed: {message}", flush=True)
            sys.exit(1)
        dist.all_reduce(torch.ones(1))  # every worker's step of this epoch
        if rank != 0:
            continue
        data = _checkpoint(epoch, total)
        for name in (f"epoch_{epoch}.pt", "last.pt", "best.pt"):
            with open(os.path.join(weights, name), "wb") as f:
                f.write(data)
        with open(os.path.join(run_dir, "metrics.jsonl"), "a") as f:
            f.write(json.dumps({"epoch": epoch, "loss": 1.0 / epoch}) + "\n")
        state = "completed" if epoch == total else "running"
        status = {"state": state, "completed_epochs": epoch, "total_epochs": total, "pid": os.getpid()}
        tmp = os.path.join(run_dir, ".status.json.tmp")
        with open(tmp, "w") as f:
            json.dump(status, f)
        os.replace(tmp, os.path.join(run_dir, "status.json"))
        print(f"epoch {epoch}/{total} done", flush=True)
    dist.destroy_process_group()
