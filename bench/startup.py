"""Benchmark: the agent's start-up on a fresh volume outside the image (no ``TRAINBOX_CACHE_DIR``), time and
peak memory of the whole process tree.

Two commands on a fresh WORKDIR each time, this checkout and (``--before DIR``) an older one alternating:

  trainbox fetch        of a small local dataset folder (12 PNGs): settings (libreyolo's train options among
                        them), the dataset stage, and its check (``libreyolo doctor``, a child that imports
                        torch: the dataset's own work, run beside the training's start by ``trainbox run``)
  trainbox run --dry-run  settings and the plan alone

Per command: the wall time from spawn to exit; **start-up**, from spawn until the first ``libreyolo doctor``
child appears (the whole command for the dry run); the peak of the whole tree's summed RSS during start-up
and over the whole command, sampled every 20 ms; the largest peak (VmHWM) of any child asking libreyolo for
its options (``train --help-json``) and of the doctor. Goal: start-up ≤ 3 s and ≤ 150 MB for the whole tree.
Writes bench/results/startup.json and prints a Markdown table. ``python -m bench.startup [--before DIR]``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from entrypoint.procs import descendants
from tests.support import make_dataset

ROOT = Path(__file__).resolve().parents[1]
GOAL_S, GOAL_MB = 3.0, 150.0


def _status(pid: int) -> dict[str, int]:
    try:
        lines = Path(f"/proc/{pid}/status").read_text().splitlines()
    except OSError:
        return {}
    return {line.split(":")[0]: int(line.split()[1]) for line in lines if line.startswith(("VmHWM:", "VmRSS:"))}


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


class TreeWatch(threading.Thread):
    """The summed RSS of a process and its descendants, sampled; when the first doctor child appeared."""

    def __init__(self, pid: int, started: float) -> None:
        super().__init__(daemon=True)
        self.pid, self.started = pid, started
        self.peak_kb = self.startup_peak_kb = self.options_kb = self.doctor_kb = 0
        self.doctor_at: float | None = None
        self._done = threading.Event()

    def run(self) -> None:
        while not self._done.is_set():
            total = _status(self.pid).get("VmRSS", 0)
            for pid in descendants(self.pid):
                status, argv = _status(pid), _cmdline(pid)
                total += status.get("VmRSS", 0)
                if b"--help-json" in argv:
                    self.options_kb = max(self.options_kb, status.get("VmHWM", 0))
                elif b"doctor" in argv:
                    self.doctor_kb = max(self.doctor_kb, status.get("VmHWM", 0))
                    if self.doctor_at is None:
                        self.doctor_at = time.monotonic() - self.started
            self.peak_kb = max(self.peak_kb, total)
            if self.doctor_at is None:
                self.startup_peak_kb = max(self.startup_peak_kb, total)
            time.sleep(0.02)

    def stop(self) -> None:
        self._done.set()
        self.join()


def measure(tree: Path, command: list[str], env: dict[str, str]) -> dict[str, Any]:
    started = time.monotonic()
    process = subprocess.Popen(
        [sys.executable, "-m", "entrypoint", *command],
        cwd=tree,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    watch = TreeWatch(process.pid, started)
    watch.start()
    _, err = process.communicate()
    wall = time.monotonic() - started
    watch.stop()
    if process.returncode != 0:
        raise SystemExit(f"{command} in {tree} failed ({process.returncode}): {err.decode()[-2000:]}")
    return {
        "wall_s": round(wall, 2),
        "startup_s": round(watch.doctor_at if watch.doctor_at is not None else wall, 2),
        "startup_tree_peak_mb": round(watch.startup_peak_kb / 1024, 1),
        "tree_peak_mb": round(watch.peak_kb / 1024, 1),
        "options_child_peak_mb": round(watch.options_kb / 1024, 1),
        "doctor_peak_mb": round(watch.doctor_kb / 1024, 1),
    }


def environment(workdir: Path, data: Path, tree: Path) -> dict[str, str]:
    env = {key: value for key, value in os.environ.items() if not key.startswith(("TRAINBOX_", "HF_", "DATASET_"))}
    return env | {
        "WORKDIR": str(workdir),
        "DATASET_REPO": str(data),
        "GPUS": "cpu",
        "PROVIDER": "none",
        "PYTHONPATH": str(tree),
        "HOME": str(workdir.parent / "home"),  # nothing cached under the real $HOME either
    }


def summary(runs: list[dict[str, Any]]) -> dict[str, Any]:
    keys = runs[0].keys()
    return {key: {"median": statistics.median(r[key] for r in runs), "max": max(r[key] for r in runs)} for key in keys}


def table(report: dict[str, Any]) -> str:
    lines = [
        "| command | checkout | start-up | start-up tree peak | whole command | tree peak | options child | doctor |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for command, by_tree in report["summary"].items():
        for tree, s in by_tree.items():
            lines.append(
                f"| `trainbox {command}` | {tree} | {s['startup_s']['median']:.2f} s (max {s['startup_s']['max']:.2f})"
                f" | {s['startup_tree_peak_mb']['median']:.0f} MB | {s['wall_s']['median']:.2f} s"
                f" | {s['tree_peak_mb']['median']:.0f} MB | {s['options_child_peak_mb']['median']:.0f} MB"
                f" | {s['doctor_peak_mb']['median']:.0f} MB |"
            )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--before", type=Path, help="an older checkout's root, measured alternately")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "startup.json")
    args = parser.parse_args()
    trees = {"this": ROOT} | ({"before": args.before.resolve()} if args.before else {})
    commands = {"fetch": ["fetch"], "run --dry-run": ["run", "--dry-run"]}
    runs: dict[str, dict[str, list[dict[str, Any]]]] = {c: {t: [] for t in trees} for c in commands}
    loads = [os.getloadavg()[0]]
    with tempfile.TemporaryDirectory(prefix="trainbox-startup-") as tmp:
        data = make_dataset(Path(tmp) / "cones").parent
        for round_ in range(args.rounds):
            order = list(trees.items()) if round_ % 2 == 0 else list(reversed(trees.items()))
            for name, tree in order:
                for command, argv in commands.items():
                    workdir = Path(tmp) / f"{name}-{round_}-{argv[0]}" / "workspace"
                    runs[command][name].append(measure(tree, argv, environment(workdir, data, tree)))
            loads.append(os.getloadavg()[0])
    report = {
        "benchmark": "startup",
        "date": time.strftime("%Y-%m-%d"),
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}",
        "load_average": [round(load, 2) for load in loads],
        "runs": runs,
        "summary": {c: {t: summary(r) for t, r in by_tree.items()} for c, by_tree in runs.items()},
        "goal": {"startup_s": GOAL_S, "tree_peak_mb": GOAL_MB},
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(table(report))
    print(f"\nload average {report['load_average']}; written to {args.out}")


if __name__ == "__main__":
    main()
