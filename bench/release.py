"""Benchmark: from the final commit on the Hub to the release call, and to the agent's exit.

Runs the real ``trainbox run`` (demo dataset, a stand-in ``libreyolo`` that finishes at once)
against the local Hub (tests/fakes/hub/) and a local Vast.ai API (tests/fakes/providers.py) with
ON_EXIT=destroy, several times, and measures per run:

  commit → release   the last Hub commit before the DELETE, to the DELETE reaching the provider
  commit → exit      the same commit, to the agent's process having exited

Goal: commit → exit ≤ 10 s. Writes bench/results/release.json and prints a Markdown table for
docs/benchmarks.md. Run from the repository root: ``python -m bench.release [--runs 5]``.
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
import time
from pathlib import Path

from tests.fakes.hub import HubServer
from tests.fakes.providers import FakeVast

ROOT = Path(__file__).resolve().parents[1]

GOAL_S = 10.0
STAND_IN_LIBREYOLO = """\
import json, os, sys
args = dict(a.split("=", 1) for a in sys.argv[2:] if "=" in a)
run_dir = os.path.join(args["project"], args["name"])
os.makedirs(run_dir, exist_ok=True)
with open(os.path.join(run_dir, "status.json"), "w") as f:
    json.dump({"state": "completed", "current_epoch": 1, "pid": os.getpid()}, f)
print("epoch 1 done", flush=True)
"""


def one_run(hub: HubServer, token: str, repo: str, scratch: Path) -> dict[str, float]:
    script = scratch / "libreyolo"
    script.write_text(f"#!{sys.executable}\n{STAND_IN_LIBREYOLO}")
    script.chmod(0o755)
    with FakeVast("4242", "bench-provider-key-0123456789") as vast:
        env = {
            **os.environ,
            **vast.env(),
            "PROVIDER": "vast",
            "ON_EXIT": "destroy",
            "OUTPUT_REPO": repo,
            "HF_TOKEN": token,
            "HF_ENDPOINT": hub.url,
            "HF_HUB_DISABLE_XET": "1",
            "HF_HOME": str(scratch / "hf"),
            "WORKDIR": str(scratch / "work"),
            "GPUS": "cpu",
            "TRAINBOX_LIBREYOLO": str(script),
        }
        result = subprocess.run(
            [sys.executable, "-m", "entrypoint", "run"], env=env, capture_output=True, text=True, cwd=ROOT
        )
        exited = time.time()
        if result.returncode != 0:
            raise SystemExit(f"trainbox run failed ({result.returncode}):\n{result.stderr}")
        (destroy,) = vast.actions()
    final = next(commit for commit in hub.commits(repo) if commit.timestamp < destroy.at)
    return {
        "commit_to_release_s": round(destroy.at - final.timestamp, 3),
        "commit_to_exit_s": round(exited - final.timestamp, 3),
    }


def table(runs: list[dict[str, float]]) -> str:
    lines = ["| measure | median | max | goal |", "|---|---|---|---|"]
    for key, label in (
        ("commit_to_release_s", "final commit → release call"),
        ("commit_to_exit_s", "final commit → exit"),
    ):
        values = [run[key] for run in runs]
        goal = f"≤ {GOAL_S:.0f} s" if key == "commit_to_exit_s" else ""
        lines.append(f"| {label} | {statistics.median(values):.2f} s | {max(values):.2f} s | {goal} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "release.json")
    args = parser.parse_args()
    runs = []
    with tempfile.TemporaryDirectory(prefix="trainbox-bench-") as tmp, HubServer(Path(tmp) / "hub") as hub:
        token = "hf_bench_write_token_0123456789"
        hub.add_token(token, "bench", "write")
        for index in range(args.runs):
            scratch = Path(tmp) / f"run{index}"
            scratch.mkdir()
            runs.append(one_run(hub, token, f"bench/release-{index}", scratch))
    report = {
        "benchmark": "release",
        "date": time.strftime("%Y-%m-%d"),
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}",
        "runs": runs,
        "goal_s": GOAL_S,
        "met": all(run["commit_to_exit_s"] <= GOAL_S for run in runs),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(table(runs))
    print(f"\n{len(runs)} runs on {report['machine']}; goal met: {report['met']}; written to {args.out}")


if __name__ == "__main__":
    main()
