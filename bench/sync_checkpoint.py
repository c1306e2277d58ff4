"""``python -m bench.sync --checkpoint-mb 500 [--link-mbit 1000] [--compare OLD]``: boundary → Hub for large
checkpoints.

A real libreyolo training cannot write 500 MB checkpoints cheaply on this machine, so a stand-in writer makes
the epoch boundaries, as libreyolo lays them out: ``status.json`` at the training's start, then per epoch the
epoch's ``weights/last.pt`` (a torch checkpoint of random weights, made before the measurement and renamed
into place: weights barely compress or dedupe from one epoch to the next) and then ``status.json``, renamed
into place last. ``trainbox sync`` mirrors the run folder to a local Hub (tests/fakes/hub/, its Xet CAS over
HTTP on loopback, capped at ``--link-mbit`` for xorb uploads and data URLs together). Each boundary waits
until the previous checkpoint is on the Hub and the disk has taken what was written (``sync``), then
``--gap`` seconds more: the latency of one boundary, not of a queue (a real training that writes 500 MB
checkpoints spends minutes per epoch). Measured per boundary, from status.json's mtime to the server's time
of the first commit holding that epoch's last.pt (its sha256), and to the first holding its status.json;
where the time went (the Hub's request log); and the peak memory of the agent and of its upload children.

``--compare OLD`` runs the agent of the checkout OLD too, in the same run, each agent its own Hub and its own
cache, in rounds that alternate which goes first (``--checkpoint-rounds``): the load from other jobs on a
shared machine falls on both alike.
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

from bench.measure import PeakRss, PeakTree
from bench.xet_memory import write_checkpoint
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


def _stats(values: list[float]) -> dict[str, Any]:
    return {
        "p50": round(_percentile(values, 0.5), 3),
        "p95": round(_percentile(values, 0.95), 3),
        "max": round(max(values), 3),
        "n": len(values),
    }


def run(
    checkpoint_mb: float,
    link_mbit: float | None,
    boundaries: int,
    gap: float,
    out: Path,
    compare: Path | None = None,
    rounds: int = 1,
) -> dict[str, Any]:
    """This checkout's agent, and with ``compare`` that checkout's too, ``rounds`` times each."""
    started, load_before = time.time(), os.getloadavg()
    agents = {"agent": ROOT} | ({"before": compare.resolve()} if compare is not None else {})
    scratch = Path(tempfile.mkdtemp(prefix="trainbox-bench-ckpt-"))
    try:
        pending = scratch / "pending"
        pending.mkdir()
        shas = []
        for epoch in range(1, boundaries + 1):
            print(f"checkpoint {epoch}/{boundaries}: writing {checkpoint_mb:g} MB…", file=sys.stderr, flush=True)
            path = pending / f"epoch_{epoch}.pt"
            write_checkpoint(path, int(checkpoint_mb * 1e6))
            shas.append(_sha256(path))
        os.sync()  # the checkpoints' writeback is over before the first boundary
        results: dict[str, list[dict[str, Any]]] = {name: [] for name in agents}
        for index in range(rounds):
            order = list(agents) if index % 2 == 0 else list(reversed(agents))
            for name in order:
                print(f"round {index + 1}/{rounds}: {name}", file=sys.stderr, flush=True)
                where = scratch / f"{name}-{index}"
                result = _one_agent(agents[name], where, pending, shas, link_mbit, gap)
                results[name].append({"round": index, "first": name == order[0], **result})
                shutil.rmtree(where, ignore_errors=True)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    summary = {
        name: {
            "checkpoint_latency_s": _stats([row["checkpoint_s"] for r in runs for row in r["boundaries"]]),
            "peak_rss_mib": {
                "agent": max(r["peak_rss_mib"]["agent"] for r in runs),
                "upload_children": max(r["peak_rss_mib"]["upload_children"] for r in runs),
                "together": max(r["peak_rss_mib"]["together"] for r in runs),
            },
            "xorb_bytes_per_round": [r["xorb_bytes"] for r in runs],
        }
        for name, runs in results.items()
    }
    latency = summary["agent"]["checkpoint_latency_s"]
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
        "rounds": rounds,
        "agents": {
            name: "this checkout" if path == ROOT else "another checkout (--compare)" for name, path in agents.items()
        },
        "summary": summary,
        "runs": results,
        "goal_p95_s": P95_GOAL_S,
        "met": latency["p95"] <= P95_GOAL_S,
    }
    if "before" in summary:
        before = summary["before"]["checkpoint_latency_s"]
        report["ratio_agent_to_before"] = {key: round(latency[key] / before[key], 3) for key in ("p50", "p95", "max")}
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n")
    print(table(report))
    return report


def _one_agent(
    code: Path, scratch: Path, pending: Path, shas: list[str], link_mbit: float | None, gap: float
) -> dict[str, Any]:
    """One ``trainbox sync`` (the agent of ``code``) through every boundary, on a Hub of its own."""
    boundaries = len(shas)
    run_dir = scratch / "runs" / "large"
    (run_dir / "weights").mkdir(parents=True)
    load_before = os.getloadavg()
    with HubServer(scratch / "hub") as hub:
        hub.add_token(TOKEN, REPO.split("/")[0], "write")
        if link_mbit:
            hub.set_cas_bandwidth(int(link_mbit * 1e6 / 8))
        base = {key: value for key, value in os.environ.items() if not key.startswith(("HF_", "HUGGING"))}
        env = base | {
            "HF_ENDPOINT": hub.url,
            "HF_TOKEN": TOKEN,
            "HF_HOME": str(scratch / "hf"),  # its own: no chunk of another agent's upload is known to it
            "HF_HUB_DISABLE_TELEMETRY": "1",
            "OUTPUT_REPO": REPO,
            "WORKDIR": str(scratch / "work"),
            "PYTHONPATH": str(code),
        }
        _status(run_dir, "running", 0, boundaries)  # libreyolo writes it when the training starts
        log = scratch / "sync.err"
        with log.open("wb") as err:
            agent = subprocess.Popen(
                [sys.executable, "-m", "entrypoint", "--log-json", "sync", str(run_dir)],
                env=env,
                cwd=code,  # `-m` puts the working folder first on sys.path
                stdout=subprocess.DEVNULL,
                stderr=err,
            )
        peak, tree = PeakRss(agent.pid), PeakTree(agent.pid)
        peak.start()
        tree.start()
        try:
            while not (hub.repo_exists(REPO) and "status.json" in hub.files(REPO)):  # the first commit
                if agent.poll() is not None:
                    raise SystemExit(f"trainbox sync exited {agent.returncode}: {log.read_text()[-2000:]}")
                time.sleep(0.1)
            os.sync()
            time.sleep(gap)  # its start-up (the ledger, libreyolo's options, the first commit) is over
            marks = []
            for epoch in range(1, boundaries + 1):
                staged = run_dir / "weights" / ".last.pt.tmp"
                os.link(pending / f"epoch_{epoch}.pt", staged)  # the same bytes for every agent
                os.replace(staged, run_dir / "weights" / "last.pt")
                state = "completed" if epoch == boundaries else "running"
                marks.append(_status(run_dir, state, epoch, boundaries))
                end = time.monotonic() + LANDED_WAIT_S
                while (entry := hub.files(REPO).get("weights/last.pt")) is None or entry.sha256 != shas[epoch - 1]:
                    if time.monotonic() > end or agent.poll() is not None:
                        raise SystemExit(f"epoch {epoch}'s last.pt never reached the Hub: see {log}")
                    time.sleep(0.05)
                print(f"boundary {epoch}: on the Hub", file=sys.stderr, flush=True)
                os.sync()  # what this boundary wrote (the staged copy, the Hub's xorbs) is on disk
                time.sleep(gap)
            exit_code = agent.wait(LANDED_WAIT_S)
        finally:
            if agent.poll() is None:
                agent.kill()
                agent.wait()
        agent_peak = peak.stop()
        tree.stop()
        commits = list(reversed(hub.commits(REPO)))
        epochs = {
            c.oid: json.loads(hub.file_bytes(REPO, "status.json", revision=c.oid)).get("completed_epochs", 0)
            for c in commits
            if "status.json" in c.files
        }
        xorb_bytes = sum(r.bytes_in for r in hub.find_requests("POST", r"^/cas/v1/xorbs/"))
        requests = hub.find_requests()
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
                "timeline_s": _timeline(requests, mark, with_checkpoint.timestamp),
            }
        )
    return {
        "load_avg_start_end": [[round(x, 2) for x in load_before], [round(x, 2) for x in os.getloadavg()]],
        "agent_exit": exit_code,
        "boundaries": rows,
        "peak_rss_mib": {
            "agent": round(agent_peak, 1),
            "upload_children": round(tree.child_kb / 1024, 1),
            "together": round(max(tree.total_kb / 1024, agent_peak), 1),
        },
        "xorb_bytes": xorb_bytes,
    }


_STEPS = {
    "preupload": ("POST", "/preupload/"),
    "token": ("GET", "/xet-write-token/"),
    "xorbs": ("POST", "/cas/v1/xorbs/"),
    "shard": ("POST", "/cas/v1/shards"),
    "commit": ("POST", "/commit/"),
}


def _timeline(requests: list[Any], mark: float, landed: float) -> dict[str, list[float]]:
    """Per request kind, its first start and last end between the boundary and its commit, in seconds
    after the boundary (from the Hub's request log): where a boundary's time went."""
    found: dict[str, list[float]] = {}
    for step, (method, part) in _STEPS.items():
        times = [
            (r.started, r.started + r.duration)
            for r in requests
            if r.method == method and part in r.path and mark <= r.started <= landed
        ]
        if times:
            found[step] = [round(min(t[0] for t in times) - mark, 3), round(max(t[1] for t in times) - mark, 3)]
    return found


def table(report: dict[str, Any]) -> str:
    names = list(report["summary"])
    link = f"{report['link_mbit']:g} Mbit/s" if report["link_mbit"] else "uncapped"
    lat = {name: report["summary"][name]["checkpoint_latency_s"] for name in names}
    peaks = {name: report["summary"][name]["peak_rss_mib"] for name in names}
    lines = [
        "| measure | " + " | ".join(names) + " | goal |",
        "|---|" + "---|" * len(names) + "---|",
        f"| last.pt ({report['checkpoint_mb']:g} MB) replaced, status.json → commit on the Hub holding it, CAS at "
        f"{link}, p50 (n={lat[names[0]]['n']}) | " + " | ".join(f"{lat[n]['p50']:.2f} s" for n in names) + " | |",
        "| the same, p95 | "
        + " | ".join(f"{lat[n]['p95']:.2f} s (max {lat[n]['max']:.2f})" for n in names)
        + f" | ≤ {P95_GOAL_S:.0f} s |",
        f"| time on the wire alone per checkpoint | {report['wire_s_per_checkpoint'] or '–'} s" + " |" * len(names),
        "| peak RSS: the agent / its upload children / both at once | "
        + " | ".join(
            f"{peaks[n]['agent']:.0f} / {peaks[n]['upload_children']:.0f} / {peaks[n]['together']:.0f} MiB"
            for n in names
        )
        + " | |",
    ]
    if "ratio_agent_to_before" in report:
        ratio = report["ratio_agent_to_before"]
        lines.append(f"| agent / before: p50, p95 | {ratio['p50']:.2f}, {ratio['p95']:.2f} | | |")
    return "\n".join(lines)
