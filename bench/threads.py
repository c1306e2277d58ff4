"""Benchmark: README command 1 in a container granted one CPU by quota, the agent's thread sizing against
``OMP_NUM_THREADS=1`` set by hand (and, with ``--before DIR``, against an older checkout that did not size them).

Each run is ``trainbox run`` exactly as README command 1 runs it (a fresh WORKDIR, no other variable: the
bundled demo on the CPU), in a cgroup v1 ``cpu`` group of its own whose quota is one CPU per period, seen as
a container sees it (``--view container``, the default): a private mount namespace binds the group over
``/sys/fs/cgroup/cpu`` (``docker run --cpus=1`` on cgroup v1 shows the container its own group there), so
libreyolo's own cap on torch's threads and OpenCV's count of CPUs, which read that path, work as they do in
a container. ``--view host``: the group joined as the host sees it (``systemd-run -p CPUQuota=100%``, a
limit on a parent cgroup), where only a reader of /proc/self/cgroup finds the quota.

Two runs at a time, side by side, each in its own one-CPU group (on a 2-core machine they share nothing but
the memory bus, and other jobs' load hits both):

  sized ‖ omp1     this checkout, no thread variable  ‖  this checkout, OMP_NUM_THREADS=1 by hand
  before ‖ omp1    the older checkout (--before), no thread variable  ‖  the same OMP_NUM_THREADS=1 run

Per run: the wall time from spawn to exit, trainbox.json's training seconds, the CPU seconds of the whole
process tree, and the group's throttling (``cpu.stat``: periods throttled of periods run). Needs root and a
writable cgroup v1 ``cpu`` hierarchy (this machine's kind); about 2½ CPU minutes a run. Writes
bench/results/threads.json and prints a Markdown table. ``python -m bench.threads [--before DIR] [--rounds N]``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from entrypoint.training import sizing
from tests.support import trainbox_env

ROOT = Path(__file__).resolve().parents[1]
CPU_ROOT = Path("/sys/fs/cgroup/cpu")
PERIOD_US = 100_000
# Bind the group over the cpu hierarchy (as a container sees its own), join it, then run the command.
ENTER = 'mount --bind "$1" /sys/fs/cgroup/cpu && echo $$ > /sys/fs/cgroup/cpu/cgroup.procs && shift && exec "$@"'
# Or join it as it is, seen from the host (systemd-run -p CPUQuota, a limit set on a parent cgroup).
ENTER_HOST = 'echo $$ > "$1/cgroup.procs" && shift && exec "$@"'
VIEWS = {"container": ["unshare", "--mount", "sh", "-c", ENTER], "host": ["sh", "-c", ENTER_HOST]}


def start(name: str, tree: Path, scratch: Path, extra: dict[str, str], view: str) -> dict[str, Any]:
    group = CPU_ROOT / f"trainbox-bench-{os.getpid()}-{name}"
    group.mkdir()
    (group / "cpu.cfs_period_us").write_text(str(PERIOD_US))
    (group / "cpu.cfs_quota_us").write_text(str(PERIOD_US))  # one CPU
    workdir = scratch / name / "workspace"
    workdir.parent.mkdir(parents=True)
    env = trainbox_env(workdir) | extra | {"PYTHONPATH": str(tree)}
    for variable in sizing.THREAD_VARS:
        if variable not in extra:
            env.pop(variable, None)
    argv = [*VIEWS[view], "sh", str(group), sys.executable, "-m", "entrypoint", "run"]
    log = (workdir.parent / "agent.log").open("w")
    process = subprocess.Popen(argv, env=env, cwd=tree, stdout=log, stderr=subprocess.STDOUT)
    return {
        "name": name,
        "group": group,
        "workdir": workdir,
        "process": process,
        "log": log,
        "started": time.monotonic(),
    }


def wait_all(runs: list[dict[str, Any]], deadline: float | None) -> None:
    """Reap the runs as each ends (its wall time, CPU and the group's cpu.stat then); one still going at
    ``deadline`` (monotonic) gets SIGTERM (the agent wraps up) and is recorded as stopped there."""
    waiting = list(runs)
    while waiting:
        for run in list(waiting):
            process: subprocess.Popen[bytes] = run["process"]
            pid, status, usage = os.wait4(process.pid, os.WNOHANG)
            if pid:
                run |= {"wall": time.monotonic() - run["started"], "status": status, "usage": usage}
                run.setdefault("stat", (run["group"] / "cpu.stat").read_text())
                waiting.remove(run)
            elif deadline is not None and time.monotonic() > deadline and not run.get("stopped"):
                run["stat"] = (run["group"] / "cpu.stat").read_text()  # the quota's account when stopped
                run["stopped"] = True
                process.send_signal(signal.SIGTERM)
        time.sleep(0.2)


def finish(run: dict[str, Any]) -> dict[str, Any]:
    """The figures of a reaped run (``wait_all``)."""
    process: subprocess.Popen[bytes] = run["process"]
    group: Path = run["group"]
    wall, usage = run["wall"], run["usage"]
    stopped = bool(run.get("stopped"))
    run["log"].close()
    process.returncode = os.waitstatus_to_exitcode(run["status"])
    stat = dict(line.split() for line in run["stat"].splitlines())
    for _ in range(50):
        try:
            group.rmdir()
            break
        except OSError:
            time.sleep(0.1)
    if process.returncode != 0 and not stopped:
        raise SystemExit(f"{run['name']}: trainbox run failed ({process.returncode}); see its log")
    (state_file,) = (run["workdir"] / "runs").glob("*/trainbox.json")
    state = json.loads(state_file.read_text())
    rows = [json.loads(line) for line in (state_file.parent / "metrics.jsonl").read_text().splitlines() if line]
    return {
        "name": run["name"],
        "stopped_at_limit": stopped,
        "wall_s": round(wall, 1),
        "training_s": round(state["phases"]["training"]["seconds"], 1),
        "epochs": len(rows),
        "epoch_s": [round(row["time"], 1) for row in rows],
        "median_epoch_s": round(statistics.median(row["time"] for row in rows), 1) if rows else None,
        "cpu_s": round(usage.ru_utime + usage.ru_stime, 1),
        "periods": int(stat["nr_periods"]),
        "throttled": int(stat["nr_throttled"]),
        "sizing": state.get("sizing"),
        "final_map50": round(rows[-1].get("metrics/mAP50", 0.0), 3) if rows else None,
    }


Config = tuple[str, Path, dict[str, str]]


def pair(first: Config, second: Config, scratch: Path, view: str, limit: float | None) -> list[dict[str, Any]]:
    load = os.getloadavg()[0]
    runs = [start(name, tree, scratch, extra, view) for name, tree, extra in (first, second)]
    wait_all(runs, None if limit is None else time.monotonic() + limit)
    done = [finish(run) for run in runs]
    for result in done:
        result["load_before"] = round(load, 2)
    return done


def table(report: dict[str, Any]) -> str:
    lines = [
        "| pair | run | wall (s) | training (s) | median epoch (s) | CPU (s) | throttled periods | ratio to omp1 |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for index, (a, b) in enumerate(report["pairs"], start=1):
        for run in (a, b):
            if run["name"].startswith("omp1"):
                ratio = ""
            elif run["stopped_at_limit"] or b["stopped_at_limit"]:  # only the epochs compare
                mine, theirs = run["median_epoch_s"], b["median_epoch_s"]
                ratio = f"median epoch {mine / theirs:.2f}" if mine and theirs else "no epoch to compare"
            else:
                ratio = f"wall {run['wall_s'] / b['wall_s']:.2f}, training {run['training_s'] / b['training_s']:.2f}"
            stopped = f", stopped after epoch {run['epochs']}" if run["stopped_at_limit"] else ""
            lines.append(
                f"| {index} | {run['name']}{stopped} | {run['wall_s']:.0f} | {run['training_s']:.0f} |"
                f" {run['median_epoch_s']} | {run['cpu_s']:.0f} | {run['throttled']} of {run['periods']} | {ratio} |"
            )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--before", type=Path, help="an older checkout's root, run as it was (no sizing)")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument(
        "--view", choices=tuple(VIEWS), default="container", help="how the runs see their group (default: container)"
    )
    parser.add_argument(
        "--limit-s", type=float, help="stop a pair's runs still going after this long (recorded by their epochs)"
    )
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "threads.json")
    args = parser.parse_args()
    if os.geteuid() != 0 or not (CPU_ROOT / "cpu.cfs_quota_us").is_file() or not shutil.which("unshare"):
        raise SystemExit("needs root, a cgroup v1 cpu hierarchy at /sys/fs/cgroup/cpu and unshare(1)")
    pairs: list[list[dict[str, Any]]] = []
    with tempfile.TemporaryDirectory(prefix="trainbox-threads-") as tmp:
        for round_ in range(args.rounds):
            scratch = Path(tmp) / f"round{round_}"
            scratch.mkdir()
            omp1 = ("omp1", ROOT, {"OMP_NUM_THREADS": "1"})
            pairs.append(pair(("sized", ROOT, {}), omp1, scratch, args.view, args.limit_s))
            save(args, pairs)
            if args.before is not None:
                before = ("before", args.before.resolve(), {})
                pairs.append(pair(before, omp1, scratch / "before", args.view, args.limit_s))
                save(args, pairs)
    print(table(save(args, pairs)))


def save(args: argparse.Namespace, pairs: list[list[dict[str, Any]]]) -> dict[str, Any]:
    """The report so far, written after each pair (a long run lost later keeps what was measured)."""
    report = {
        "benchmark": "threads",
        "date": time.strftime("%Y-%m-%d"),
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}",
        "quota_cpus": 1,
        "view": args.view,
        "load_average_after": round(os.getloadavg()[0], 2),
        "limit_s": args.limit_s,
        "pairs": pairs,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    return report


if __name__ == "__main__":
    main()
