"""``python -m bench.sync --checkpoint-mb 500 [--link-mbit 1000]``: boundary → Hub for large checkpoints.

A real libreyolo training cannot write 500 MB checkpoints cheaply on this machine, so a stand-in writer makes
the epoch boundaries, as libreyolo lays them out: the epoch's ``weights/last.pt`` (a torch checkpoint of
random weights, made before the measurement and renamed into place: weights barely compress or dedupe from
one epoch to the next) and then ``status.json``, renamed into place last. ``trainbox sync`` mirrors the run
folder to a local Hub (tests/fakes/hub/, its Xet CAS over HTTP on loopback, capped at ``--link-mbit`` for
xorb uploads and data URLs together). Each boundary waits until the previous checkpoint is on the Hub, then
``--gap`` seconds more: the latency of one boundary, not of a queue (a real training that writes 500 MB
checkpoints spends minutes per epoch). Measured per boundary, from status.json's mtime to the server's time
of the first commit holding that epoch's last.pt (its sha256), and to the first holding its status.json;
and the peak memory of the agent and of its upload child (bench/xet_memory.py).
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.dataset import PeakRss
from bench.xet_memory import PeakTree, write_checkpoint
from tests.fakes.hub import HubServer

ROOT = Path(__file__).resolve().parents[1]
TOKEN = "hf_bench_sync_write_token_0123456789"
REPO = "bench/large-checkpoints"
P95_GOAL_S = 5.0
LANDED_WAIT_S = 600.0


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while block := f.read(1 << 22):
            digest.update(block)
    return digest.hexdigest()


def _status(run_dir: Path, state: str, epoch: int, total: int) -> float:
    """status.json renamed into place, as libreyolo does; returns its mtime (the boundary)."""
    tmp = run_dir / ".status.json.tmp"
    status = {"state": state, "completed_epochs": epoch, "total_epochs": total, "pid": os.getpid()}
    tmp.write_text(json.dumps(status))
    os.replace(tmp, run_dir / "status.json")
    return (run_dir / "status.json").stat().st_mtime_ns / 1e9


def _percentile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    at = share * (len(ordered) - 1)
    low = int(at)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (at - low)


def run(
    checkpoint_mb: float, link_mbit: float | None, boundaries: int, gap: float, out: Path, code: Path | None = None
) -> dict[str, Any]:
    """``code``: a checkout whose agent runs instead of this one (a before/after comparison)."""
    started, load_before = time.time(), os.getloadavg()
    scratch = Path(tempfile.mkdtemp(prefix="trainbox-bench-ckpt-"))
    try:
        run_dir, pending = scratch / "runs" / "large", scratch / "pending"
        (run_dir / "weights").mkdir(parents=True)
        pending.mkdir()
        shas = []
        for epoch in range(1, boundaries + 1):
            print(f"checkpoint {epoch}/{boundaries}: writing {checkpoint_mb:g} MB…", file=sys.stderr, flush=True)
            path = pending / f"epoch_{epoch}.pt"
            write_checkpoint(path, int(checkpoint_mb * 1e6))
            shas.append(_sha256(path))
        with HubServer(scratch / "hub") as hub:
            hub.add_token(TOKEN, REPO.split("/")[0], "write")
            if link_mbit:
                hub.set_cas_bandwidth(int(link_mbit * 1e6 / 8))
            base = {key: value for key, value in os.environ.items() if not key.startswith(("HF_", "HUGGING"))}
            env = base | {
                "HF_ENDPOINT": hub.url,
                "HF_TOKEN": TOKEN,
                "HF_HOME": str(scratch / "hf"),
                "HF_HUB_DISABLE_TELEMETRY": "1",
                "OUTPUT_REPO": REPO,
                "WORKDIR": str(scratch / "work"),
                "PYTHONPATH": str(code or ROOT),
            }
            log = scratch / "sync.err"
            with log.open("wb") as err:
                agent = subprocess.Popen(
                    [sys.executable, "-m", "entrypoint", "--log-json", "sync", str(run_dir)],
                    env=env,
                    cwd=code or ROOT,  # `-m` puts the working folder first on sys.path
                    stdout=subprocess.DEVNULL,
                    stderr=err,
                )
            peak, tree = PeakRss(agent.pid), PeakTree(agent.pid)
            peak.start()
            tree.start()
            try:
                while not hub.repo_exists(REPO):
                    if agent.poll() is not None:
                        raise SystemExit(f"trainbox sync exited {agent.returncode}: {log.read_text()[-2000:]}")
                    time.sleep(0.1)
                time.sleep(gap)  # its start-up (the ledger, libreyolo's options) is over
                marks = []
                for epoch in range(1, boundaries + 1):
                    os.replace(pending / f"epoch_{epoch}.pt", run_dir / "weights" / "last.pt")
                    state = "completed" if epoch == boundaries else "running"
                    marks.append(_status(run_dir, state, epoch, boundaries))
                    end = time.monotonic() + LANDED_WAIT_S
                    while (entry := hub.files(REPO).get("weights/last.pt")) is None or entry.sha256 != shas[epoch - 1]:
                        if time.monotonic() > end or agent.poll() is not None:
                            raise SystemExit(f"epoch {epoch}'s last.pt never reached the Hub: see {log}")
                        time.sleep(0.05)
                    print(f"boundary {epoch}: on the Hub", file=sys.stderr, flush=True)
                    time.sleep(gap)
                exit_code = agent.wait(LANDED_WAIT_S)
            finally:
                if agent.poll() is None:
                    agent.kill()
                    agent.wait()
            agent_peak = peak.stop()
            child_peak, total_peak, _ = tree.stop()
            commits = list(reversed(hub.commits(REPO)))
            epochs = {
                c.oid: json.loads(hub.file_bytes(REPO, "status.json", revision=c.oid)).get("completed_epochs", 0)
                for c in commits
                if "status.json" in c.files
            }
            xorb_bytes = sum(r.bytes_in for r in hub.find_requests("POST", r"^/cas/v1/xorbs/"))
        rows = []
        for epoch, (mark, sha) in enumerate(zip(marks, shas, strict=True), start=1):
            with_checkpoint = next(c for c in commits if (f := c.files.get("weights/last.pt")) and f.sha256 == sha)
            with_status = next(c for c in commits if epochs.get(c.oid, 0) >= epoch)
            rows.append(
                {
                    "epoch": epoch,
                    "checkpoint_s": round(with_checkpoint.timestamp - mark, 3),
                    "status_s": round(with_status.timestamp - mark, 3),
                    "same_commit": with_checkpoint.oid == with_status.oid,
                }
            )
        latency = [row["checkpoint_s"] for row in rows]
        report = {
            "benchmark": "sync-checkpoint",
            "date": time.strftime("%Y-%m-%d"),
            "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}",
            "load_avg_start_end": [[round(x, 2) for x in load_before], [round(x, 2) for x in os.getloadavg()]],
            "seconds": round(time.time() - started, 1),
            "checkpoint_mb": checkpoint_mb,
            "link_mbit": link_mbit,
            "wire_s_per_checkpoint": round(checkpoint_mb * 8 / link_mbit, 2) if link_mbit else None,
            "gap_s": gap,
            "code": "this checkout" if code is None else "another checkout (--code)",
            "agent_exit": exit_code,
            "boundaries": rows,
            "checkpoint_latency_s": {
                "p50": round(_percentile(latency, 0.5), 3),
                "p95": round(_percentile(latency, 0.95), 3),
                "max": round(max(latency), 3),
                "n": len(latency),
            },
            "peak_rss_mib": {"agent": round(agent_peak, 1), "upload_child": round(child_peak, 1)},
            "agent_and_child_peak_mib": round(max(total_peak, agent_peak), 1),
            "xorb_bytes": xorb_bytes,
            "goal_p95_s": P95_GOAL_S,
            "met": _percentile(latency, 0.95) <= P95_GOAL_S,
        }
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(report, indent=2) + "\n")
        print(table(report))
        return report
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def table(report: dict[str, Any]) -> str:
    lat, peaks = report["checkpoint_latency_s"], report["peak_rss_mib"]
    status = [row["status_s"] for row in report["boundaries"]]
    link = f"{report['link_mbit']:g} Mbit/s" if report["link_mbit"] else "uncapped"
    return "\n".join(
        [
            "| measure | result | goal |",
            "|---|---|---|",
            f"| last.pt ({report['checkpoint_mb']:g} MB) replaced, status.json → commit on the Hub holding it, "
            f"CAS at {link}, p50 (n={lat['n']}) | {lat['p50']:.2f} s | |",
            f"| the same, p95 | {lat['p95']:.2f} s (max {lat['max']:.2f}) | ≤ {P95_GOAL_S:.0f} s |",
            f"| status.json → commit holding it (max) | {max(status):.2f} s | |",
            f"| time on the wire alone per checkpoint | {report['wire_s_per_checkpoint']} s | |",
            f"| peak RSS: the agent / its upload child / both at once | {peaks['agent']:.0f} / "
            f"{peaks['upload_child']:.0f} / {report['agent_and_child_peak_mib']:.0f} MiB | |",
        ]
    )
