"""Benchmark: what a run leaves on the Hub, with and without a Storage Bucket, against its epochs.

The agent's own uploader (``sync.uploader.Uploader``: the model repo alone for ``CHECKPOINT_BUCKET=off``,
with a ``BucketStore`` for the bucket) mirrors a run folder that this script rewrites like libreyolo does at
each epoch boundary: a
``last.pt`` of ``--size-mb`` (a real torch checkpoint, new weights every epoch), ``best.pt`` when the
metric improves (epochs 1, 2, 3, 5, 8, 13, 21, 34: fewer and fewer improvements, as in training),
``metrics.jsonl`` and ``status.json`` last. The local Hub (tests/fakes/hub/, Xet, loopback) runs in this
process. After each epoch the script waits for the boundary to land, then records:

  bytes stored   the Hub's storage for the run: every distinct file version any commit of the model
                 repo references (the Hub keeps them all), plus the bucket's files (each key counted)
  commits        commits in the model repo (its creation's included)
  latency        status.json replaced → that boundary durable: its whole batch (objects and manifest, one
                 Xet session, one batch call) landed in the bucket (bucket mode), or its commit in the repo
                 (off): ``Uploader.latencies``; p50 and p95

Epochs are ``--epoch-s`` apart and ``PUBLISH_EVERY`` is ``--publish-epochs`` epochs, so the figures for
50 epochs are those of a run of 50 epochs whatever their length. Writes bench/results/bucket_storage.json
and prints Markdown tables for docs/benchmarks.md. ``python -m bench.bucket_storage [--epochs 50]
[--size-mb 35] [--epoch-s 2] [--publish-epochs 10]``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

IMPROVES = {1, 2, 3, 5, 8, 13, 21, 34}
REPORT_AT = (0, 10, 20, 30, 40, 50)


def _checkpoint(path: Path, epoch: int, size_mb: int) -> None:
    import torch

    weights = torch.randn(size_mb * 1024 * 1024 // 4)
    tmp = path.with_name(f".{path.name}.tmp")
    torch.save({"model": {"w": weights}, "epoch": epoch - 1, "config": {"epochs": 999}}, tmp)
    tmp.replace(path)


def _boundary(run_dir: Path, epoch: int, size_mb: int) -> None:
    weights = run_dir / "weights"
    weights.mkdir(parents=True, exist_ok=True)
    _checkpoint(weights / "last.pt", epoch, size_mb)
    if epoch in IMPROVES:
        _checkpoint(weights / "best.pt", epoch, size_mb)
    with (run_dir / "metrics.jsonl").open("a") as rows:
        rows.write(json.dumps({"epoch": epoch, "metrics/mAP50-95": epoch / 100}) + "\n")
    tmp = run_dir / ".status.json.tmp"
    tmp.write_text(json.dumps({"completed_epochs": epoch, "state": "running"}))
    tmp.replace(run_dir / "status.json")


def _stored(hub: Any, repo: str, bucket_id: str | None) -> int:
    versions = {(e.sha256, e.size) for c in hub.commits(repo) for e in c.files.values()}
    in_bucket = sum(f.size for f in hub.bucket_files(bucket_id).values()) if bucket_id else 0
    return sum(size for _, size in versions) + in_bucket


def run_mode(mode: str, args: argparse.Namespace, root: Path) -> dict[str, Any]:
    from entrypoint.hub import Hub
    from entrypoint.sync.bucket import Bucket, RunFolder
    from entrypoint.sync.bucket_store import BucketStore
    from entrypoint.sync.ledger import CommitBudget
    from entrypoint.sync.uploader import Uploader
    from tests.fakes.hub import HubServer

    hub_server = HubServer(root / f"hub-{mode}").start()
    try:
        hub_server.add_token("hf_bench", "bench", "write")
        hub_server.set_cas_over_http(True)  # the CAS over HTTP, as the Hub serves it
        os.environ["HF_ENDPOINT"] = hub_server.url
        repo = "bench/run"
        hub = Hub(token="hf_bench", endpoint=hub_server.url)
        hub.ensure_writable_repo(repo)
        run_dir, work = root / f"run-{mode}", root / f"work-{mode}"
        bucket_id = None
        if mode == "bucket":
            folder = RunFolder(Bucket(hub, "bench/run-checkpoints"), "run", "0123456789abcdef")
            folder.bucket.open(write=True)
            bucket_id = folder.bucket.bucket_id
            uploader = Uploader(
                hub,
                repo,
                run_dir,
                work,
                bucket=BucketStore.begin(folder),
                publish_every=args.publish_epochs * args.epoch_s,
            )
            assert uploader.bucket is not None
            boundaries = uploader.bucket
        else:
            # Every boundary a commit, as with epochs of a minute or more (the budget allows 100 an hour).
            uploader = Uploader(hub, repo, run_dir, work, budget=CommitBudget(per_hour=10**9, burst=10**9))
            boundaries = uploader.repo
        uploader.start()
        rows = []
        began = time.monotonic()
        for epoch in range(args.epochs + 1):
            if epoch:
                _boundary(run_dir, epoch, args.size_mb)
                status = hashlib.sha256((run_dir / "status.json").read_bytes()).hexdigest()
                deadline = time.monotonic() + 120
                while not boundaries.ledger.has("status.json", [status]) and time.monotonic() < deadline:
                    time.sleep(0.05)
                while boundaries.busy and time.monotonic() < deadline:  # the superseded keys deleted too
                    time.sleep(0.05)
            if epoch in REPORT_AT or epoch == args.epochs:
                rows.append(
                    {
                        "epoch": epoch,
                        "bytes": _stored(hub_server, repo, bucket_id),
                        "bucket_bytes": sum(f.size for f in hub_server.bucket_files(bucket_id).values())
                        if bucket_id
                        else 0,
                        "commits": len(hub_server.commits(repo)),
                    }
                )
            time.sleep(max(0.0, began + (epoch + 1) * args.epoch_s - time.monotonic()))
        final_ok = uploader.flush(300)
        uploader.stop()
        end = {"bytes": _stored(hub_server, repo, bucket_id), "commits": len(hub_server.commits(repo))}
        if bucket_id is not None:
            end["bucket_bytes"] = sum(f.size for f in hub_server.bucket_files(bucket_id).values())
        latencies = sorted(boundaries.latencies)
        return {
            "mode": mode,
            "rows": rows,
            "after_final_publish": end,
            "final_ok": final_ok,
            "latency_p50": statistics.median(latencies) if latencies else None,
            "latency_p95": latencies[max(0, int(0.95 * len(latencies)) - 1)] if latencies else None,
            "latency_max": latencies[-1] if latencies else None,
            "n": len(latencies),
        }
    finally:
        hub_server.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--epochs", type=int, default=50)
    parser.add_argument("--size-mb", type=int, default=35)
    parser.add_argument("--epoch-s", type=float, default=2.0)
    parser.add_argument("--publish-epochs", type=int, default=10)
    parser.add_argument("--out", default="bench/results/bucket_storage.json")
    args = parser.parse_args()
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    results = []
    with tempfile.TemporaryDirectory(prefix="bench-bucket-") as tmp:
        for mode in ("off", "bucket"):
            results.append(run_mode(mode, args, Path(tmp)))
            print(json.dumps(results[-1]), flush=True)
    report = {
        "date": time.strftime("%Y-%m-%d"),
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}",
        "load_average": os.getloadavg(),
        "args": vars(args),
        "results": results,
    }
    Path(args.out).write_text(json.dumps(report, indent=1) + "\n")
    mb = 1024 * 1024
    print("| epochs | off: stored | off: commits | bucket: stored (of it in the bucket) | bucket: commits |")
    print("|---:|---:|---:|---:|---:|")
    off, bucket = results
    for a, b in zip(off["rows"], bucket["rows"], strict=True):
        print(
            f"| {a['epoch']} | {a['bytes'] / mb:.0f} MB | {a['commits']} | {b['bytes'] / mb:.0f} MB"
            f" ({b['bucket_bytes'] / mb:.0f} MB) | {b['commits']} |"
        )
    for r in results:
        print(
            f"{r['mode']}: after the final publish {r['after_final_publish']['bytes'] / mb:.0f} MB,"
            f" {r['after_final_publish']['commits']} commits; latency p50 {r['latency_p50']:.2f} s,"
            f" p95 {r['latency_p95']:.2f} s (max {r['latency_max']:.2f}, n={r['n']})"
        )


if __name__ == "__main__":
    main()
