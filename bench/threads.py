"""Benchmark: README command 1 in a container granted one CPU by quota, the agent's thread sizing against
``OMP_NUM_THREADS=1`` set by hand (and, with ``--before DIR``, against an older checkout that did not size them).

Each run is ``trainbox run`` exactly as README command 1 runs it (a fresh WORKDIR, no other variable: the
bundled demo on the CPU), in a cgroup v1 ``cpu`` group of its own whose quota is one CPU per period, seen as
a container sees it: a private mount namespace binds the group over ``/sys/fs/cgroup/cpu`` (``docker run
--cpus=1`` on cgroup v1 shows the container its own group there), so libreyolo's own cap on torch's threads,
which reads that path, works as it does in a container. Two runs at a time, side by side, each in its own
one-CPU group (on a 2-core machine they share nothing but the memory bus, and other jobs' load hits both):

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


def start(name: str, tree: Path, scratch: Path, extra: dict[str, str]) -> dict[str, Any]:
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
    argv = ["unshare", "--mount", "sh", "-c", ENTER, "sh", str(group), sys.executable, "-m", "entrypoint", "run"]
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


def finish(run: dict[str, Any]) -> dict[str, Any]:
    process: subprocess.Popen[bytes] = run["process"]
    _, status, usage = os.wait4(process.pid, 0)
    wall = time.monotonic() - run["started"]
    run["log"].close()
    process.returncode = os.waitstatus_to_exitcode(status)
    group: Path = run["group"]
    stat = dict(line.split() for line in (group / "cpu.stat").read_text().splitlines())
    for _ in range(50):
        try:
            group.rmdir()
            break
        except OSError:
            time.sleep(0.1)
    if process.returncode != 0:
        raise SystemExit(f"{run['name']}: trainbox run failed ({process.returncode}); see its log")
    (state_file,) = (run["workdir"] / "runs").glob("*/trainbox.json")
    state = json.loads(state_file.read_text())
    rows = [json.loads(line) for line in (state_file.parent / "metrics.jsonl").read_text().splitlines() if line]
    return {
        "name": run["name"],
        "wall_s": round(wall, 1),
        "training_s": round(state["phases"]["training"]["seconds"], 1),
        "cpu_s": round(usage.ru_utime + usage.ru_stime, 1),
        "periods": int(stat["nr_periods"]),
        "throttled": int(stat["nr_throttled"]),
        "sizing": state.get("sizing"),
        "final_map50": round(rows[-1].get("metrics/mAP50", 0.0), 3),
    }


Config = tuple[str, Path, dict[str, str]]


def pair(first: Config, second: Config, scratch: Path) -> list[dict[str, Any]]:
    load = os.getloadavg()[0]
    runs = [start(name, tree, scratch, extra) for name, tree, extra in (first, second)]
    done = [finish(run) for run in runs]
    for result in done:
        result["load_before"] = round(load, 2)
    return done


def table(report: dict[str, Any]) -> str:
    lines = [
        "| pair | run | wall (s) | training (s) | CPU (s) | throttled periods | ratio to omp1 (wall, training) |",
        "|---|---|---|---|---|---|---|",
    ]
    for index, (a, b) in enumerate(report["pairs"], start=1):
        for run in (a, b):
            ratio = (
                ""
                if run["name"].startswith("omp1")
                else f"{run['wall_s'] / b['wall_s']:.2f}, {run['training_s'] / b['training_s']:.2f}"
            )
            lines.append(
                f"| {index} | {run['name']} | {run['wall_s']:.0f} | {run['training_s']:.0f} | {run['cpu_s']:.0f} |"
                f" {run['throttled']} of {run['periods']} | {ratio} |"
            )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--before", type=Path, help="an older checkout's root, run as it was (no sizing)")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "threads.json")
    args = parser.parse_args()
    if os.geteuid() != 0 or not (CPU_ROOT / "cpu.cfs_quota_us").is_file() or not shutil.which("unshare"):
        raise SystemExit("needs root, a cgroup v1 cpu hierarchy at /sys/fs/cgroup/cpu and unshare(1)")
    pairs = []
    with tempfile.TemporaryDirectory(prefix="trainbox-threads-") as tmp:
        for round_ in range(args.rounds):
            scratch = Path(tmp) / f"round{round_}"
            scratch.mkdir()
            omp1 = ("omp1", ROOT, {"OMP_NUM_THREADS": "1"})
            pairs.append(pair(("sized", ROOT, {}), omp1, scratch))
            if args.before is not None:
                pairs.append(pair(("before", args.before.resolve(), {}), omp1, scratch / "before"))
    report = {
        "benchmark": "threads",
        "date": time.strftime("%Y-%m-%d"),
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}",
        "quota_cpus": 1,
        "pairs": pairs,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(table(report))


if __name__ == "__main__":
    main()
