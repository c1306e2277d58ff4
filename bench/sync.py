"""Benchmark: checkpoint sync beside a real training run.

``trainbox run`` trains the tiny model of bench/overhead.py (YOLO9-t, ~35 MB checkpoints, on the
CPU) for 10 epochs with OUTPUT_REPO on a local Hub (tests/fakes/hub/, in this process, on
loopback) and without. Each round runs the two side by side, each process tree pinned to a CPU of
its own (swapped every round, who starts first alternating), the round's Hub on the sync side's
CPU: load from other jobs on a shared machine hits both alike, and every cost of the sync (the
agent's copying, hashing, checking and uploading, and the Hub storing it) lands on the CPU of the
training it serves. ``--sequential`` runs them one after the other on every CPU instead. Measured:

  boundary → Hub   for each epoch, from libreyolo replacing status.json (its mtime, watched every
                   20 ms) to the first Hub commit whose status.json holds that epoch or a later one
                   (the server's commit time); p50 and p95 over every epoch of sync runs each alone
                   on the machine and unpinned (as a GPU machine's spare CPUs would serve the agent),
                   and apart, of the side-by-side rounds (agent and training sharing one CPU)
  throughput       train images per second over epochs 2..N (libreyolo's metrics.jsonl, the
                   median epoch), with sync and without; the ratio per round
  CPU per epoch    what the agent spent itself (its own CPU seconds, read when it exits), with sync
                   and without, and what the Hub spent: load on the machine stretches wall time,
                   much less these
  SIGTERM → exit   longer runs, each sent SIGTERM once the Hub holds 2 epochs, until the agent
                   exited; its exit code, the phase its last trainbox.json on the Hub reports, and
                   whether the training child is gone

``--transfer xet`` (the default; the Hub today): checkpoints go to the Hub's Xet CAS, kept on local disk
by the local Hub; ``--transfer lfs``: a Hub without Xet and HF_HUB_DISABLE_XET=1 (classic LFS PUTs).

Goals: p95 ≤ 2 s, throughput ratio ≥ 0.97, SIGTERM → exit ≤ 5 s. Writes bench/results/sync.json (LFS)
or sync-xet.json and prints a Markdown table for docs/benchmarks.md. Run from the repository root:
``python -m bench.sync [--rounds 4] [--epochs 10] [--latency-runs 2] [--sigterm-runs 3] [--sequential]
[--transfer xet|lfs]``. ``--checkpoint-mb 500 --link-mbit 1000`` measures large checkpoints instead, with a
stand-in writer of epoch boundaries (bench/sync_checkpoint.py).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import statistics
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.overhead import (
    command,
    epoch_stats,
    pinned,
    prepare_workspace,
    round_cpus,
    stop,
    train_args,
    training_options,
    wait_with_cpu,
)
from entrypoint.sync.ledger import COMMIT_BURST
from tests.fakes.hub import HubError, HubServer

ROOT = Path(__file__).resolve().parents[1]

LATENCY_P95_GOAL_S = 2.0
THROUGHPUT_GOAL = 0.97
SIGTERM_GOAL_S = 5.0
WATCH_INTERVAL_S = 0.02
TOKEN = "hf_bench_sync_write_token_0123456789"


class BoundaryWatch(threading.Thread):
    """When each new ``completed_epochs`` of status.json appeared: the file's mtime, and when seen."""

    def __init__(self, run_dir: Path) -> None:
        super().__init__(name="boundary-watch", daemon=True)
        self.path = run_dir / "status.json"
        self.boundaries: dict[int, dict[str, float]] = {}
        self.done = threading.Event()

    def run(self) -> None:
        last: tuple[int, int] | None = None
        while not self.done.wait(WATCH_INTERVAL_S):
            try:
                stat = self.path.stat()
                signature = (stat.st_ino, stat.st_mtime_ns)
                if signature == last:
                    continue
                status = json.loads(self.path.read_text())
            except (OSError, ValueError):
                continue
            last = signature
            epoch = status.get("completed_epochs")
            if isinstance(epoch, int) and epoch > 0 and epoch not in self.boundaries:
                self.boundaries[epoch] = {"replaced_at": stat.st_mtime_ns / 1e9, "seen_at": time.time()}


def hub_json(hub: HubServer, repo: str, path: str, revision: str = "main") -> dict[str, Any] | None:
    try:
        return json.loads(hub.file_bytes(repo, path, revision=revision))
    except (HubError, ValueError):
        return None


def hub_history(hub: HubServer, repo: str) -> list[dict[str, Any]]:
    """Every commit, oldest first: when, the epoch its status.json holds, whether it brought a new last.pt."""
    history = []
    previous_checkpoint = None
    for commit in reversed(hub.commits(repo)):
        status = hub_json(hub, repo, "status.json", commit.oid) if "status.json" in commit.files else None
        checkpoint = commit.files.get("weights/last.pt")
        sha = checkpoint.sha256 if checkpoint is not None else None
        history.append(
            {
                "at": commit.timestamp,
                "epoch": (status or {}).get("completed_epochs"),
                "files": sorted(commit.files),
                "new_checkpoint": sha is not None and sha != previous_checkpoint,
            }
        )
        previous_checkpoint = sha or previous_checkpoint
    return history


def latencies(boundaries: dict[int, dict[str, float]], history: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per epoch: the first commit whose status.json holds it (or a later epoch), and how long after."""
    found = []
    for epoch, seen in sorted(boundaries.items()):
        commit = next((c for c in history if isinstance(c["epoch"], int) and c["epoch"] >= epoch), None)
        found.append(
            {
                "epoch": epoch,
                "latency_s": round(commit["at"] - seen["replaced_at"], 3) if commit else None,
                # The agent's commits so far (the repo's initial commit aside): past its burst, the commit
                # budget spaces them out.
                "commits_before": sum(1 for c in history[1:] if c["at"] < seen["replaced_at"]),
                "watch_delay_s": round(seen["seen_at"] - seen["replaced_at"], 3),
                "exact": commit is not None and commit["epoch"] == epoch,  # False: carried by a later boundary
                "with_new_checkpoint": bool(commit and commit["new_checkpoint"]),
            }
        )
    return found


def percentile(values: list[float], share: float) -> float:
    return statistics.quantiles(values, n=100, method="inclusive")[round(share * 100) - 1]


TRANSFER = {"mode": "xet"}  # set once by main


def new_hub(root: Path) -> HubServer:
    return HubServer(root, xet=TRANSFER["mode"] == "xet")


def hub_env(hub: HubServer, scratch: Path) -> dict[str, str]:
    env = {"HF_TOKEN": TOKEN, "HF_ENDPOINT": hub.url, "HF_HOME": str(scratch / "hf")}
    if TRANSFER["mode"] == "lfs":
        env["HF_HUB_DISABLE_XET"] = "1"
    return env


@dataclass
class SyncRun:
    name: str
    repo: str | None
    process: subprocess.Popen[bytes]
    spawned: float
    watch: BoundaryWatch
    run_dir: Path
    log: Path
    cpu: int | None
    load1: float


def start_run(env: dict[str, str], workdir: Path, name: str, repo: str | None, cpu: int | None) -> SyncRun:
    """``trainbox run`` (pinned to ``cpu`` when given), with OUTPUT_REPO=``repo`` or without."""
    run_env = env | {"RUN_NAME": name} | ({"OUTPUT_REPO": repo} if repo else {})
    run_dir = workdir / "runs" / name
    watch = BoundaryWatch(run_dir)
    watch.start()
    load = os.getloadavg()[0]
    log = workdir / f"{name}.err"
    with pinned(cpu), open(workdir / f"{name}.out", "wb") as out, open(log, "wb") as err:
        spawned = time.time()
        process = subprocess.Popen([command("trainbox"), "--log-json", "run"], env=run_env, stdout=out, stderr=err)
    return SyncRun(name, repo, process, spawned, watch, run_dir, log, cpu, load)


def finish_run(run: SyncRun) -> dict[str, Any]:
    code, cpu = wait_with_cpu(run.process)
    wall = time.time() - run.spawned
    run.watch.done.set()
    run.watch.join()
    if code != 0:
        raise SystemExit(f"trainbox run {run.name} failed ({code}): see {run.log}")
    return {
        "mode": "sync" if run.repo else "no-sync",
        "name": run.name,
        "cpu": run.cpu,
        "wall_s": round(wall, 3),
        "load1": run.load1,
        "agent_cpu_s": cpu["own_cpu_s"],
        "training_cpu_s": cpu["children_cpu_s"],
        **epoch_stats(run.run_dir),
        "boundaries": run.watch.boundaries,
        "sync_warnings": sync_warnings(run.log),
    }


def sync_warnings(log: Path) -> list[str]:
    """The agent's own warnings about uploads (a failed commit is retried after a back-off), the bench's
    temporary folder written as ``$TMP``."""
    scratch = str(log.parent.parent)
    found = []
    for line in log.read_text().splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue  # progress bars of huggingface_hub share the stream
        if record.get("level") in {"warning", "error"} and record.get("message", "").startswith("sync:"):
            found.append(record["message"].replace(scratch, "$TMP"))
    return found


def one_round(
    index: int, env: dict[str, str], workdir: Path, root: Path, cpus: list[int] | None
) -> list[dict[str, Any]]:
    """With sync and without, side by side on a CPU each (swapped every round; the round's own Hub on the
    sync side's CPU), or with ``cpus`` None one after the other. Who starts first alternates."""
    sync_cpu, plain_cpu = (None, None) if cpus is None else (cpus[index % 2], cpus[(index + 1) % 2])
    repo = f"bench/sync-{index}"
    with pinned(sync_cpu):  # its serving thread, and so every request's thread, inherits the CPU
        hub = new_hub(root / f"hub-{index}").start()
    try:
        hub.add_token(TOKEN, "bench", "write")
        sync_env = env | hub_env(hub, root)
        bench_cpu = time.process_time()  # this process: the Hub's threads (and the watchers)
        starts = [
            lambda: start_run(sync_env, workdir, f"sync-{index}", repo, sync_cpu),
            lambda: start_run(env, workdir, f"nosync-{index}", None, plain_cpu),
        ]
        if index % 2:
            starts.reverse()
        if cpus is None:
            runs = [finish_run(start()) for start in starts]
        else:
            started: list[SyncRun] = []
            try:
                for start in starts:
                    started.append(start())
                runs = [finish_run(run) for run in started]
            except BaseException:
                for run in started:
                    stop(run.process)
                raise
        bench_cpu = time.process_time() - bench_cpu
        history = hub_history(hub, repo)
    finally:
        hub.stop()
    for run in runs:
        if run["mode"] == "sync":
            run["hub_cpu_s"] = round(bench_cpu, 2)
            run["hub_commits"] = len(history)
            run["latencies"] = latencies(run["boundaries"], history)
    return runs


def latency_run(env: dict[str, str], workdir: Path, root: Path, index: int) -> dict[str, Any]:
    """A sync run alone on the machine, unpinned: boundary → Hub as a GPU machine's spare CPUs would give it."""
    repo = f"bench/alone-{index}"
    with new_hub(root / f"hub-alone-{index}") as hub:
        hub.add_token(TOKEN, "bench", "write")
        run = finish_run(start_run(env | hub_env(hub, root), workdir, f"alone-{index}", repo, None))
        history = hub_history(hub, repo)
    return run | {"hub_commits": len(history), "latencies": latencies(run["boundaries"], history)}


def preempt_run(env: dict[str, str], workdir: Path, hub: HubServer, name: str, after_epochs: int) -> dict[str, Any]:
    """SIGTERM once the Hub holds ``after_epochs`` epochs; how long until the agent exited, and what it left."""
    repo = f"bench/{name}"
    with open(workdir / f"{name}.out", "wb") as out, open(workdir / f"{name}.err", "wb") as err:
        process = subprocess.Popen(
            [command("trainbox"), "--log-json", "run"],
            env=env | {"RUN_NAME": name, "OUTPUT_REPO": repo},
            stdout=out,
            stderr=err,
        )
    while process.poll() is None:
        if hub.repo_exists(repo) and ((hub_json(hub, repo, "status.json") or {}).get("completed_epochs") or 0) >= (
            after_epochs
        ):
            break
        time.sleep(0.1)
    else:
        raise SystemExit(f"the preempt run ended before {after_epochs} epochs reached the Hub: see {name}.err")
    child = json.loads((workdir / "runs" / name / "trainbox.json").read_text())["training"]["pid"]
    signalled = time.time()
    process.send_signal(signal.SIGTERM)
    try:
        code = process.wait(120)
    except subprocess.TimeoutExpired:
        stop(process)
        raise SystemExit("the agent did not exit within 120 s of SIGTERM") from None
    exited = time.time()
    final = hub_json(hub, repo, "trainbox.json") or {}
    last_commit = hub.commits(repo)[0].timestamp
    return {
        "sigterm_to_exit_s": round(exited - signalled, 3),
        "sigterm_to_last_commit_s": round(last_commit - signalled, 3),
        "exit_code": code,
        "hub_phase": final.get("phase"),
        "hub_exit": final.get("exit"),
        "hub_epochs_done": (final.get("progress") or {}).get("epochs_done"),
        "training_child_gone": not _alive(child),
        # The child had to be killed: libreyolo did not stop within the agent's grace after its SIGINT.
        "child_killed": "did not stop within" in (workdir / f"{name}.err").read_text(),
        "sync_warnings": sync_warnings(workdir / f"{name}.err"),
    }


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def latency_stats(runs: list[dict[str, Any]]) -> dict[str, Any]:
    epochs = [item for run in runs for item in run["latencies"]]
    values = [item["latency_s"] for item in epochs if item["latency_s"] is not None]
    within = [
        item["latency_s"] for item in epochs if item["latency_s"] is not None and item["commits_before"] < COMMIT_BURST
    ]
    return {
        "p50": round(percentile(values, 0.50), 3),
        "p95": round(percentile(values, 0.95), 3),
        "max": round(max(values), 3),
        "n": len(values),
        "within_commit_burst": {
            "p95": round(percentile(within, 0.95), 3) if len(within) > 1 else None,
            "max": round(max(within), 3) if within else None,
            "n": len(within),
        },
        "missing": len(epochs) - len(values),
        "carried_by_later_commit": sum(1 for item in epochs if not item["exact"]),
        "with_new_checkpoint": sum(1 for item in epochs if item["with_new_checkpoint"]),
    }


def summarize(
    runs: list[dict[str, Any]], alone: list[dict[str, Any]], preempts: list[dict[str, Any]]
) -> dict[str, Any]:
    rounds = sorted({run["round"] for run in runs})
    by = {(run["round"], run["mode"]): run for run in runs}
    ratios = [by[r, "sync"]["images_per_s"] / by[r, "no-sync"]["images_per_s"] for r in rounds]
    return {
        "latency_s": latency_stats(alone),
        "latency_sharing_a_cpu_s": latency_stats([by[r, "sync"] for r in rounds]),
        "throughput_ratio": {"median": round(statistics.median(ratios), 4), "per_round": [round(x, 4) for x in ratios]},
        "sync_images_per_s": round(statistics.median(by[r, "sync"]["images_per_s"] for r in rounds), 4),
        "no_sync_images_per_s": round(statistics.median(by[r, "no-sync"]["images_per_s"] for r in rounds), 4),
        "sync_wall_s": round(statistics.median(by[r, "sync"]["wall_s"] for r in rounds), 3),
        "no_sync_wall_s": round(statistics.median(by[r, "no-sync"]["wall_s"] for r in rounds), 3),
        # Load-independent: CPU seconds per epoch the agent spent itself, and this process (the Hub).
        "agent_cpu_per_epoch_s": {
            mode: round(statistics.median(by[r, mode]["agent_cpu_s"] / epochs_of(by[r, mode]) for r in rounds), 3)
            for mode in ("sync", "no-sync")
        },
        "hub_cpu_per_epoch_s": round(
            statistics.median(by[r, "sync"]["hub_cpu_s"] / epochs_of(by[r, "sync"]) for r in rounds), 3
        ),
        "training_cpu_per_epoch_s": round(statistics.median(run["training_cpu_s"] / epochs_of(run) for run in runs), 3),
        "sync_warnings": sum(len(run["sync_warnings"]) for run in runs + alone if run["mode"] == "sync"),
        "sync_runs": sum(1 for run in runs + alone if run["mode"] == "sync"),
        "sigterm": {
            "exit_s": {
                "median": round(statistics.median(p["sigterm_to_exit_s"] for p in preempts), 3),
                "max": round(max(p["sigterm_to_exit_s"] for p in preempts), 3),
                "n": len(preempts),
            },
            "exit_codes": sorted({p["exit_code"] for p in preempts}),
            "hub_phases": sorted({str(p["hub_phase"]) for p in preempts}),
            "hub_epochs_done": [p["hub_epochs_done"] for p in preempts],
            "children_gone": sum(1 for p in preempts if p["training_child_gone"]),
            "children_killed": sum(1 for p in preempts if p["child_killed"]),
            "last_commit_s_max": round(max(p["sigterm_to_last_commit_s"] for p in preempts), 3),
        },
    }


def epochs_of(run: dict[str, Any]) -> int:
    return len(run["epoch_s"])


def table(summary: dict[str, Any]) -> str:
    lat, ratio, term = summary["latency_s"], summary["throughput_ratio"], summary["sigterm"]
    cpu, hub = summary["agent_cpu_per_epoch_s"], summary["hub_cpu_per_epoch_s"]
    burst, shared = lat["within_commit_burst"], summary["latency_sharing_a_cpu_s"]
    per_round = ", ".join(f"{x:.3f}" for x in ratio["per_round"])
    outcome = (
        f"exit {', '.join(map(str, term['exit_codes']))}; Hub phase {', '.join(term['hub_phases'])} "
        f"(epochs on the Hub: {', '.join(map(str, term['hub_epochs_done']))}); training child gone "
        f"{term['children_gone']}/{term['exit_s']['n']} (killed after the grace: {term['children_killed']})"
    )
    lines = [
        "| measure | result | goal |",
        "|---|---|---|",
        f"| status.json replaced → commit on the Hub, run alone, p50 (n={lat['n']}) | {lat['p50']:.2f} s | |",
        f"| status.json replaced → commit on the Hub, p95 | {lat['p95']:.2f} s (max {lat['max']:.2f}) "
        f"| ≤ {LATENCY_P95_GOAL_S:.0f} s |",
        f"| the same, boundaries before the agent's first {COMMIT_BURST} commits were spent (n={burst['n']}) "
        f"| p95 {burst['p95']:.2f} s (max {burst['max']:.2f}) | |",
        f"| the same, agent and training sharing one CPU (side-by-side rounds, n={shared['n']}) "
        f"| p50 {shared['p50']:.2f} s, p95 {shared['p95']:.2f} s (max {shared['max']:.2f}) | |",
        f"| training throughput with / without sync (each the median of rounds) | {summary['sync_images_per_s']:.2f} / "
        f"{summary['no_sync_images_per_s']:.2f} img/s: ratio {ratio['median']:.3f} (rounds: {per_round}) "
        f"| ≥ {THROUGHPUT_GOAL} |",
        f"| wall time with / without sync (median) "
        f"| {summary['sync_wall_s']:.1f} / {summary['no_sync_wall_s']:.1f} s | |",
        f"| CPU per epoch: agent with / without sync; Hub | {cpu['sync']:.2f} / {cpu['no-sync']:.2f} s; "
        f"{hub:.2f} s (training child, its start-up included: "
        f"{summary['training_cpu_per_epoch_s']:.2f} s) | |",
        f"| the agent's sync warnings (a failed commit waits for a back-off) | {summary['sync_warnings']} in "
        f"{summary['sync_runs']} sync runs | |",
        f"| SIGTERM → agent exited (n={term['exit_s']['n']}) | {term['exit_s']['median']:.2f} s "
        f"(max {term['exit_s']['max']:.2f}); {outcome} | ≤ {SIGTERM_GOAL_S:.0f} s, 143 |",
    ]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    training_options(
        parser, rounds=4, epochs=10, sequential_help="with and without sync one after the other on every CPU"
    )
    parser.add_argument("--latency-runs", type=int, default=2, help="sync runs alone on the machine, for latency")
    parser.add_argument("--sigterm-runs", type=int, default=3)
    parser.add_argument("--preempt-after", type=int, default=2, help="epochs on the Hub before the SIGTERM")
    parser.add_argument("--transfer", choices=("xet", "lfs"), default="xet")
    parser.add_argument("--out", type=Path, help="results file (default: bench/results/sync.json, or sync-xet.json)")
    parser.add_argument(
        "--checkpoint-mb", type=float, help="instead: a stand-in writer's boundaries with last.pt of this size (Xet)"
    )
    parser.add_argument("--link-mbit", type=float, help="with --checkpoint-mb: the CAS capped at this link speed")
    parser.add_argument("--boundaries", type=int, default=6, help="with --checkpoint-mb: epoch boundaries")
    parser.add_argument("--gap", type=float, default=3.0, help="with --checkpoint-mb: seconds between boundaries")
    parser.add_argument(
        "--compare", type=Path, help="with --checkpoint-mb: the agent of this checkout too, side by side (before)"
    )
    parser.add_argument("--checkpoint-rounds", type=int, default=1, help="with --checkpoint-mb: rounds per agent")
    args = parser.parse_args()
    if args.checkpoint_mb:  # bench/sync_checkpoint.py: no training can write such checkpoints cheaply here
        from bench import sync_checkpoint

        name = f"sync-checkpoint-{args.checkpoint_mb:g}mb" + (f"-link{args.link_mbit:g}" if args.link_mbit else "")
        out = args.out or ROOT / "bench" / "results" / f"{name}.json"
        sync_checkpoint.run(
            args.checkpoint_mb, args.link_mbit, args.boundaries, args.gap, out, args.compare, args.checkpoint_rounds
        )
        return
    TRANSFER["mode"] = args.transfer
    if args.transfer == "xet":
        os.environ.pop("HF_HUB_DISABLE_XET", None)  # the agents inherit this environment
    args.out = args.out or ROOT / "bench" / "results" / ("sync-xet.json" if args.transfer == "xet" else "sync.json")
    cpus = round_cpus(args)
    started = time.time()
    loads = [os.getloadavg()]
    runs: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="trainbox-bench-") as tmp:
        root = Path(tmp)
        _, workdir, _, env = prepare_workspace(root, args)
        for index in range(args.rounds):
            for run in one_round(index, env, workdir, root, cpus):
                runs.append({"round": index, **run})
                print(f"round {index} {run['mode']}: {run['images_per_s']:.2f} img/s, wall {run['wall_s']:.1f} s")
        alone = []
        for index in range(args.latency_runs):
            run = latency_run(env, workdir, root, index)
            alone.append(run)
            print(f"alone {index}: boundary → Hub {[item['latency_s'] for item in run['latencies']]}", flush=True)
        preempts = []
        with new_hub(root / "hub-preempt") as hub:
            hub.add_token(TOKEN, "bench", "write")
            long_args = train_args(max(args.epochs, 50), args.imgsz, args.batch)
            for index in range(args.sigterm_runs):
                preempt = preempt_run(
                    env | hub_env(hub, root) | {"RUN_ARGS": " ".join(long_args)},
                    workdir,
                    hub,
                    f"preempt-{index}",
                    args.preempt_after,
                )
                preempts.append(preempt)
                print(f"SIGTERM → exit {preempt['sigterm_to_exit_s']:.2f} s, code {preempt['exit_code']}", flush=True)
    loads.append(os.getloadavg())
    args.out.parent.mkdir(parents=True, exist_ok=True)
    raw = {"benchmark": "sync", "runs": runs, "alone": alone, "sigterm": preempts}
    args.out.write_text(json.dumps(raw, indent=2) + "\n")
    summary = summarize(runs, alone, preempts)
    report = {
        "benchmark": "sync",
        "date": time.strftime("%Y-%m-%d"),
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}",
        "design": "sequential" if cpus is None else f"side by side, one CPU each of {cpus}, swapped every round",
        "transfer": args.transfer,
        "load_avg_start_end": [[round(x, 2) for x in load] for load in loads],
        "seconds": round(time.time() - started, 1),
        "training": {"args": train_args(args.epochs, args.imgsz, args.batch), "device": "cpu"},
        "runs": runs,
        "alone": alone,
        "sigterm_runs": preempts,
        "summary": summary,
        "goals": {
            "latency_p95_s": LATENCY_P95_GOAL_S,
            "throughput_ratio": THROUGHPUT_GOAL,
            "sigterm_s": SIGTERM_GOAL_S,
        },
        "met": {
            "latency_p95": summary["latency_s"]["p95"] <= LATENCY_P95_GOAL_S,
            "throughput_ratio": summary["throughput_ratio"]["median"] >= THROUGHPUT_GOAL,
            "sigterm": all(
                preempt["sigterm_to_exit_s"] <= SIGTERM_GOAL_S
                and preempt["exit_code"] == 143
                and preempt["hub_phase"] == "preempted"
                and preempt["training_child_gone"]
                for preempt in preempts
            ),
        },
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(table(summary))
    print(f"\n{args.rounds} rounds ({report['design']}) on {report['machine']} in {report['seconds']:.0f} s")
    print(f"goals met: {report['met']}; written to {args.out}")


if __name__ == "__main__":
    main()
