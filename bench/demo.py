"""Benchmark: does README command 1 show a model that learns, and how long does it take?

Runs ``trainbox run`` exactly as README command 1 does (a fresh WORKDIR, no other variable: the
bundled demo and every demo default; no GPU here, so the CPU), then reads the run back:

  mAP50 per epoch  libreyolo's own metrics.jsonl; the last epoch is the figure the README states
  training time    trainbox.json's ``phases.training`` (libreyolo train, from spawn to exit)
  total time       the agent's process, from spawn to exit (dataset generation and check included)
  CPU seconds      user + system of the agent and everything it ran, read when it exits: other jobs on a
                   shared machine stretch the wall times, much less these (with OMP_NUM_THREADS=1, the
                   wall time the same command takes alone on one core)
  CPU load         the 1-minute load average before and after, and the CPU count (the mAP does not
                   depend on it: a fixed seed and a fixed data set)

Goal: final mAP50 ≥ 0.5 within 5 minutes of training on a 2-core CPU (stretch: 2 minutes). Writes
bench/results/demo.json and prints a Markdown table for docs/benchmarks.md. Run from the repository
root: ``python -m bench.demo``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from entrypoint.settings import DEMO_RUN_ARGS
from tests.support import trainbox_env

ROOT = Path(__file__).resolve().parents[1]
MAP50_GOAL = 0.5
TRAINING_GOAL_S, TRAINING_STRETCH_S = 300.0, 120.0


def measure() -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="trainbox-demo-") as tmp:
        workdir = Path(tmp) / "workspace"
        load_before = os.getloadavg()[0]
        cpu_before = resource.getrusage(resource.RUSAGE_CHILDREN)
        started = time.monotonic()
        process = subprocess.run(
            [sys.executable, "-m", "entrypoint", "run"], env=trainbox_env(workdir), capture_output=True, text=True
        )
        total = time.monotonic() - started
        cpu_after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu = (cpu_after.ru_utime - cpu_before.ru_utime) + (cpu_after.ru_stime - cpu_before.ru_stime)
        load_after = os.getloadavg()[0]
        if process.returncode != 0:
            raise SystemExit(f"trainbox run failed ({process.returncode}):\n{process.stderr[-3000:]}")
        (state_file,) = (workdir / "runs").glob("*/trainbox.json")
        state = json.loads(state_file.read_text())
        rows = [json.loads(line) for line in (state_file.parent / "metrics.jsonl").read_text().splitlines() if line]
    return {
        "run_args": DEMO_RUN_ARGS,
        "argv": state["training"]["argv"],  # what libreyolo train got (the CPU's batch included)
        "map50": [round(row.get("metrics/mAP50", 0.0), 4) for row in rows],
        "epoch_s": [round(row["time"], 1) for row in rows],
        "final_map50": round(rows[-1].get("metrics/mAP50", 0.0), 4),
        "best_map50": round(max(row.get("metrics/mAP50", 0.0) for row in rows), 4),
        "training_s": round(state["phases"]["training"]["seconds"], 1),
        "total_s": round(total, 1),
        "cpu_s": round(cpu, 1),
        "load_before": round(load_before, 2),
        "load_after": round(load_after, 2),
        "cpus": os.cpu_count(),
        "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),  # 1 keeps torch's threads from spinning on a busy CPU
        "sizing": state.get("sizing"),  # what the agent gave the training: threads, workers, cache
        "machine": platform.machine(),
        "python": platform.python_version(),
        "date": time.strftime("%Y-%m-%d"),
    }


def table(report: dict[str, Any]) -> str:
    def meets(value: float, goal: float, stretch: float | None = None) -> str:
        return "stretch met" if stretch is not None and value <= stretch else ("met" if value <= goal else "missed")

    final = report["final_map50"]
    return "\n".join(
        [
            "| measure | value | goal |",
            "|---|---|---|",
            f"| final mAP50 (epoch {len(report['map50'])}) | {final:.2f} | ≥ {MAP50_GOAL} "
            f"({'met' if final >= MAP50_GOAL else 'missed'}) |",
            f"| training (`libreyolo train`) | {report['training_s']:.0f} s | ≤ {TRAINING_GOAL_S:.0f} s, stretch "
            f"≤ {TRAINING_STRETCH_S:.0f} s ({meets(report['training_s'], TRAINING_GOAL_S, TRAINING_STRETCH_S)}) |",
            f"| README command 1 without the install (`trainbox run`) | {report['total_s']:.0f} s |  |",
            f"| CPU time of that command, all processes | {report['cpu_s']:.0f} s |  |",
            "",
            "mAP50 per epoch: " + ", ".join(f"{value:.2f}" for value in report["map50"]),
            f"{report['date']}, {report['machine']}, {report['cpus']} CPUs, Python {report['python']}, "
            f"OMP_NUM_THREADS={report.get('omp_num_threads') or 'unset'}, load average {report['load_before']} "
            f"before and {report['load_after']} after.",
        ]
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "demo.json")
    args = parser.parse_args()
    report = measure()
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(table(report))


if __name__ == "__main__":
    main()
