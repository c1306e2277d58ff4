"""Benchmark: what a dashboard that cannot be reached costs a run (TRACKIO).

Runs the real ``trainbox run`` (the bundled demo, the stand-in ``libreyolo`` of tests/fakes, 10 epochs of 0.2 s,
no OUTPUT_REPO: every epoch goes to the dashboard at once) three ways, several times each:

  none         TRACKIO unset
  hanging      TRACKIO at a loopback server that accepts the connection and never answers (a dashboard that hangs)
  refused      TRACKIO at a loopback port nobody listens on (a dashboard that is down)

and measures per run:

  boundary     the mean time from one epoch's status.json to the next one's, less the stand-in's 0.2 s: what the
               agent's watching of a boundary adds (the dashboard worker is not on that path)
  end          the last epoch's status.json to the agent's exit (the final work, the dashboard's second, the release)

Then, in this process, ``Dashboard.finish`` with 50 epochs pending against the hanging server: its bound (1 s).
Writes bench/results/dashboard.json and prints a Markdown table for docs/benchmarks.md. Run from the repository
root: ``python -m bench.dashboard [--runs 3]``.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import platform
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from entrypoint.report.dashboard import Client, Dashboard, Sources, Target
from tests.fakes import libreyolo as fake_libreyolo

ROOT = Path(__file__).resolve().parents[1]
EPOCHS, EPOCH_SECONDS = 10, 0.2
TOKEN = "trk_bench_write_token_0123456789"


class Hanging:
    """A TCP server on loopback that accepts and never answers."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.held: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                connection, _ = self.sock.accept()
            except OSError:
                return
            self.held.append(connection)


def refused_url() -> str:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{probe.getsockname()[1]}"  # closed again: nobody listens there


def one_run(scratch: Path, trackio: str | None) -> dict[str, float]:
    trainer = fake_libreyolo.install(scratch / "bin")
    env = {key: value for key, value in os.environ.items() if not key.startswith(("TRAINBOX_", "RUN_", "DATASET_"))}
    env |= {
        "WORKDIR": str(scratch / "work"),
        "GPUS": "cpu",
        "PROVIDER": "none",
        "TRAINBOX_LIBREYOLO": str(trainer),
        "FAKE_EPOCH_SECONDS": str(EPOCH_SECONDS),
        "RUN_ARGS": f"epochs={EPOCHS}",
    }
    if trackio is not None:
        env |= {"TRACKIO": trackio, "TRACKIO_WRITE_TOKEN": TOKEN}
    run_dir_glob = scratch / "work" / "runs"
    process = subprocess.Popen(
        [sys.executable, "-m", "entrypoint", "run"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        cwd=ROOT,
    )
    boundaries: list[float] = []
    seen: tuple[int, int] | None = None
    while process.poll() is None:  # each status.json replacement is one boundary
        for status in run_dir_glob.glob("*/status.json"):
            try:
                stat = status.stat()
            except OSError:
                continue
            if (stat.st_ino, stat.st_mtime_ns) != seen:
                seen = (stat.st_ino, stat.st_mtime_ns)
                boundaries.append(stat.st_mtime_ns / 1e9)
        time.sleep(0.002)
    exited = time.time()
    output = process.stdout.read() if process.stdout else ""
    assert process.returncode == 0, output[-3000:]
    assert TOKEN not in output
    gaps = [b - a for a, b in itertools.pairwise(boundaries[1:])]  # epoch to epoch (the first: the start)
    return {
        "boundary_s": statistics.mean(gaps) - EPOCH_SECONDS,
        "end_s": exited - boundaries[-1],
        "warnings": float(output.count("cannot be reached")),
    }


def finish_bound(url: str) -> float:
    with tempfile.TemporaryDirectory() as folder:
        metrics = Path(folder) / "metrics.jsonl"
        metrics.write_text("".join(json.dumps({"epoch": n, "time": 1.0}) + "\n" for n in range(1, 51)))
        sources = Sources(metrics=metrics, kept=lambda: None, price=lambda: None, config=dict, record=lambda _: None)
        board = Dashboard(Client(Target(url, "p", "r"), write_token=TOKEN, hf_token=None), sources, url)
        board.start()
        time.sleep(0.5)  # its first call is in flight, hanging
        started = time.monotonic()
        board.finish()
        return time.monotonic() - started


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=3)
    runs = parser.parse_args().runs
    hanging = Hanging()
    cases = {"none": None, "hanging": hanging.url, "refused": refused_url()}
    results: dict[str, list[dict[str, float]]] = {name: [] for name in cases}
    for _ in range(runs):
        for name, url in cases.items():
            with tempfile.TemporaryDirectory() as scratch:
                results[name].append(one_run(Path(scratch), url))
    finish = [finish_bound(hanging.url) for _ in range(runs)]
    summary = {
        name: {key: statistics.median(run[key] for run in found) for key in found[0]} for name, found in results.items()
    }
    record = {
        "machine": f"{platform.node()} {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs",
        "runs": runs,
        "summary": summary,
        "finish_s": {"median": statistics.median(finish), "max": max(finish)},
        "raw": results,
    }
    out = ROOT / "bench" / "results" / "dashboard.json"
    out.write_text(json.dumps(record, indent=2) + "\n")
    print("| TRACKIO | boundary, over the epoch (median) | last epoch → exit (median) | WARNING lines |")
    print("|---|---|---|---|")
    for name, found in summary.items():
        print(f"| {name} | {found['boundary_s'] * 1000:.0f} ms | {found['end_s']:.2f} s | {found['warnings']:.0f} |")
    median = statistics.median(finish)
    print(f"\n`Dashboard.finish`, hanging server, 50 epochs pending: median {median:.2f} s, max {max(finish):.2f} s")


if __name__ == "__main__":
    main()
