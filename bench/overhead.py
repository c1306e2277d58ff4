"""Benchmark: what the agent costs a training run.

The same tiny training (a generated dataset, YOLO9-t from scratch on the CPU, the same
``libreyolo train`` arguments) runs bare and through ``trainbox run`` (GPUS=cpu, no OUTPUT_REPO).
Each round runs the two side by side, each process tree pinned to a CPU of its own (swapped every
round, who starts first alternating): load from other jobs on a shared machine then hits both
alike, and all the agent's own work lands on its training's CPU, the least favourable case for it.
``--sequential`` runs them one after the other on every CPU instead (for a quiet machine).

  throughput       train images per second over epochs 2..N, from libreyolo's own metrics.jsonl
                   (epoch 1 carries one-time warm-up): the median epoch, and the fastest one;
                   wall time from spawn to exit beside it
  CPU seconds      the agent's own and its children's, read when it exits (load stretches wall
                   time, much less these); and the agent's own from its child's start to its end
  start → child    from the agent's process being created to its ``libreyolo train`` child's (both
                   start times from /proc/<pid>/stat, in clock ticks), by launch probes each alone
                   on the machine and stopped with SIGTERM once the child exists: cold = a fresh
                   WORKDIR (libreyolo doctor runs), warm = the dataset check cached
  agent peak RSS   VmHWM of the trainbox process alone, not its children, read from
                   /proc/<pid>/status every 0.1 s until it exits

Goals: throughput ratio ≥ 0.97, start → child ≤ 3 s, agent peak RSS ≤ 150 MB. Writes
bench/results/overhead.json and prints a Markdown table for docs/benchmarks.md. Run from the
repository root: ``python -m bench.overhead [--rounds 6] [--epochs 12] [--probes 3] [--sequential]``;
``--rounds 0`` runs the launch probes only (minutes less, and meaningful on a busy machine, where the
throughput rounds are not), best with ``--out`` elsewhere than the full results.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.support import make_dataset, trainbox_env

ROOT = Path(__file__).resolve().parents[1]

THROUGHPUT_GOAL = 0.97
LAUNCH_GOAL_S = 3.0
RSS_GOAL_MB = 150.0
TICKS_PER_S = os.sysconf("SC_CLK_TCK")
POLL_S = 0.1
TRAIN_IMAGES, VAL_IMAGES = 16, 4


def command(name: str) -> str:
    """A console script of this interpreter's environment, else PATH's."""
    beside = Path(sys.executable).parent / name
    found = str(beside) if beside.is_file() else shutil.which(name)
    if found is None:
        raise SystemExit(f"{name} is not installed in this environment")
    return found


def bench_dataset(root: Path) -> Path:
    """The generated dataset, its data.yaml pointing at its absolute root (as trainbox's own copy does)."""
    data_yaml = make_dataset(root, train=TRAIN_IMAGES, val=VAL_IMAGES)
    data_yaml.write_text(data_yaml.read_text().replace("path: .", f"path: {root.resolve()}", 1))
    return data_yaml


def train_args(epochs: int, imgsz: int, batch: int) -> list[str]:
    """Validation off: epochs then measure training alone. ``batch`` explicit: trainbox would add batch=-1."""
    return [
        "model=LibreYOLO9t.pt",
        "pretrained=false",
        f"imgsz={imgsz}",
        f"epochs={epochs}",
        "workers=0",
        f"batch={batch}",
        "val=false",
    ]


def start_ticks(pid: int) -> int:
    """When ``pid`` was created, in clock ticks since boot (field 22 of /proc/<pid>/stat)."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    return int(stat.rsplit(")", 1)[1].split()[19])  # fields after the command name start at field 3


def peak_rss_kb(pid: int) -> int | None:
    """VmHWM of ``pid``: its own peak resident set, children excluded; None once it is a zombie."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    return None


def cpu_seconds(pid: int) -> tuple[float, float]:
    """``pid``'s own CPU seconds (user + system, all its threads) and its waited-for children's (fields 14..17)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    utime, stime, cutime, cstime = (int(value) / TICKS_PER_S for value in fields[11:15])
    return utime + stime, cutime + cstime


def wait_with_cpu(process: subprocess.Popen[bytes]) -> tuple[int, dict[str, float]]:
    """Wait for ``process``; read its own CPU seconds and its waited-for children's while it is a zombie
    (load on the machine stretches wall time, not these), then reap it."""
    os.waitid(os.P_PID, process.pid, os.WEXITED | os.WNOWAIT)
    own, children = cpu_seconds(process.pid)
    code = process.wait()
    return code, {"own_cpu_s": round(own, 2), "children_cpu_s": round(children, 2)}


def epoch_stats(run_dir: Path, train_images: int = TRAIN_IMAGES) -> dict[str, Any]:
    """Per-epoch seconds as libreyolo logged them; train images per second over epochs 2..N from their fastest
    epoch (bursts of load from elsewhere on the machine only ever slow an epoch down), median and mean."""
    seconds = [json.loads(line)["time"] for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line]
    measured = seconds[1:] or seconds
    return {
        "epoch_s": [round(value, 3) for value in seconds],
        "images_per_s_best": round(train_images / min(measured), 4),
        "images_per_s": round(train_images / statistics.median(measured), 4),
        "images_per_s_mean": round(train_images * len(measured) / sum(measured), 4),
    }


class AgentWatch(threading.Thread):
    """Beside a running agent: its peak RSS, and its training child's start once trainbox.json names it."""

    def __init__(self, pid: int, state_file: Path) -> None:
        super().__init__(name="agent-watch", daemon=True)
        self.pid = pid
        self.state_file = state_file
        self.agent_ticks = start_ticks(pid)
        self.peak_kb = 0
        self.child_pid: int | None = None
        self.child_ticks: int | None = None
        self.cpu_at_launch: float | None = None  # the agent's own CPU seconds when its child was found
        self.child_seen = threading.Event()
        self.done = threading.Event()

    @property
    def launch_s(self) -> float | None:
        if self.child_ticks is None:
            return None
        return (self.child_ticks - self.agent_ticks) / TICKS_PER_S

    def run(self) -> None:
        while True:
            with contextlib.suppress(OSError):  # gone once reaped
                self.peak_kb = max(self.peak_kb, peak_rss_kb(self.pid) or 0)
            if self.child_ticks is None:
                self._look_for_child()
            if self.done.wait(POLL_S):
                return

    def _look_for_child(self) -> None:
        try:
            pid = json.loads(self.state_file.read_text())["training"]["pid"]
            self.child_ticks = start_ticks(pid)
            self.cpu_at_launch = cpu_seconds(self.pid)[0]
        except (OSError, ValueError, KeyError, TypeError):
            return
        self.child_pid = pid
        self.child_seen.set()


def logged_times(stderr: str) -> dict[str, float]:
    """From the agent's JSON log: its first line, and the line it logs just before starting training."""
    found: dict[str, float] = {}
    for line in stderr.splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        found.setdefault("first_log", record["time"])
        message = record.get("message", "")
        if message.startswith("+ ") and " train " in message:
            found["train_logged"] = record["time"]
    return found


@contextlib.contextmanager
def pinned(cpu: int | None) -> Iterator[None]:
    """Processes started inside run on ``cpu`` alone: a child inherits the affinity of the thread that forks it."""
    if cpu is None:
        yield
        return
    before = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {cpu})
    try:
        yield
    finally:
        os.sched_setaffinity(0, before)


@dataclass
class Started:
    process: subprocess.Popen[bytes]
    spawned: float
    name: str
    run_dir: Path
    log: Path
    cpu: int | None
    load1: float
    watch: AgentWatch | None = None


def start_bare(workdir: Path, data_yaml: Path, args: Sequence[str], name: str, cpu: int | None) -> Started:
    argv = [
        command("libreyolo"),
        "train",
        *args,
        f"data={data_yaml}",
        f"project={workdir / 'runs'}",
        f"name={name}",
        "exist_ok=true",
        "device=cpu",
    ]
    # Like the agent's child: cwd on the work dir, unbuffered output, a session of its own (with the kernel's
    # autogroup scheduling, a session is what shares the CPU fairly against other jobs on the machine).
    env = trainbox_env(workdir) | {"PYTHONUNBUFFERED": "1"}
    load = os.getloadavg()[0]
    log = workdir / f"{name}.log"
    with pinned(cpu), open(log, "wb") as out:
        spawned = time.time()
        process = subprocess.Popen(
            argv, cwd=workdir, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
    return Started(process, spawned, name, workdir / "runs" / name, log, cpu, load)


def start_agent(env: dict[str, str], workdir: Path, name: str, cpu: int | None = None) -> Started:
    """``trainbox --log-json run`` with RUN_NAME=``name``, its output into files, watched."""
    load = os.getloadavg()[0]
    log = workdir / f"{name}.err"
    with pinned(cpu), open(workdir / f"{name}.out", "wb") as out, open(log, "wb") as err:
        spawned = time.time()
        process = subprocess.Popen(
            [command("trainbox"), "--log-json", "run"], env=env | {"RUN_NAME": name}, stdout=out, stderr=err
        )
    run_dir = workdir / "runs" / name
    watch = AgentWatch(process.pid, run_dir / "trainbox.json")
    watch.start()
    return Started(process, spawned, name, run_dir, log, cpu, load, watch)


def finish_bare(run: Started) -> dict[str, Any]:
    code, cpu = wait_with_cpu(run.process)
    wall = time.time() - run.spawned
    if code != 0:
        raise SystemExit(f"bare libreyolo train failed ({code}): see {run.log}")
    return {
        "mode": "bare",
        "name": run.name,
        "cpu": run.cpu,
        "wall_s": round(wall, 3),
        "load1": run.load1,
        "training_cpu_s": round(cpu["own_cpu_s"] + cpu["children_cpu_s"], 2),
        **epoch_stats(run.run_dir),
    }


def finish_agent(run: Started) -> dict[str, Any]:
    assert run.watch is not None
    code, cpu = wait_with_cpu(run.process)
    wall = time.time() - run.spawned
    run.watch.done.set()
    run.watch.join()
    if code != 0:
        raise SystemExit(f"trainbox run failed ({code}): see {run.log}")
    return {
        "mode": "trainbox",
        "name": run.name,
        "cpu": run.cpu,
        "wall_s": round(wall, 3),
        "load1": run.load1,
        "agent_cpu_s": cpu["own_cpu_s"],
        # From the child's start to the end (to within one 0.1 s poll): the agent beside training.
        "agent_cpu_beside_training_s": round(cpu["own_cpu_s"] - (run.watch.cpu_at_launch or 0.0), 2),
        "training_cpu_s": cpu["children_cpu_s"],
        **epoch_stats(run.run_dir),
        **agent_report(run),
    }


def agent_report(run: Started) -> dict[str, Any]:
    """What the agent itself cost: start → child (ticks; and by its log), peak RSS, and its phases."""
    assert run.watch is not None
    logged = logged_times(run.log.read_text())
    state = json.loads((run.run_dir / "trainbox.json").read_text())
    phases = {name: phase.get("seconds") for name, phase in (state.get("phases") or {}).items()}
    launch = run.watch.launch_s
    return {
        "launch_s": round(launch, 3) if launch is not None else None,
        "launch_logged_s": round(logged["train_logged"] - run.spawned, 3) if "train_logged" in logged else None,
        "first_log_s": round(logged["first_log"] - run.spawned, 3) if "first_log" in logged else None,
        "peak_rss_mb": round(run.watch.peak_kb * 1024 / 1e6, 1),
        "phases_s": {name: phases.get(name) for name in ("preflight", "resume", "dataset")},
    }


def launch_probe(env: dict[str, str], workdir: Path, name: str, *, cold: bool) -> dict[str, Any]:
    """Start → child alone: the agent is stopped with SIGTERM once its training child exists."""
    workdir.mkdir(parents=True, exist_ok=True)
    run = start_agent(env | {"WORKDIR": str(workdir)}, workdir, name)
    assert run.watch is not None
    if not run.watch.child_seen.wait(300):
        run.process.kill()
        raise SystemExit(f"launch probe {name}: no training child within 300 s")
    run.process.send_signal(signal.SIGTERM)
    try:
        code = run.process.wait(60)
    except subprocess.TimeoutExpired:
        stop(run.process)
        raise SystemExit(f"launch probe {name}: the agent did not exit within 60 s of SIGTERM") from None
    run.watch.done.set()
    run.watch.join()
    return {"name": name, "cold": cold, "exit_code": code, "load1": run.load1, **agent_report(run)}


def one_round(
    index: int, env: dict[str, str], workdir: Path, data_yaml: Path, args: Sequence[str], cpus: Sequence[int] | None
) -> list[dict[str, Any]]:
    """Bare and trainbox side by side on a CPU each (swapped every round), so bursts of load from other jobs
    hit both alike; or with ``cpus`` None one after the other. Who starts first alternates."""
    bare_cpu, agent_cpu = (None, None) if cpus is None else (cpus[index % 2], cpus[(index + 1) % 2])

    def bare() -> Started:
        return start_bare(workdir, data_yaml, args, f"bare-{index}", bare_cpu)

    def agent() -> Started:
        return start_agent(env, workdir, f"trainbox-{index}", agent_cpu)

    starters: list[tuple[Callable[[], Started], Callable[[Started], dict[str, Any]]]] = [
        (bare, finish_bare),
        (agent, finish_agent),
    ]
    if index % 2:
        starters.reverse()
    if cpus is None:
        return [finish(start()) for start, finish in starters]
    started: list[tuple[Started, Callable[[Started], dict[str, Any]]]] = []
    try:
        for start, finish in starters:
            started.append((start(), finish))
        return [finish(run) for run, finish in started]
    except BaseException:
        for run, _ in started:
            stop(run.process)
        raise


def stop(process: subprocess.Popen[bytes]) -> None:
    """A run the benchmark gives up on: SIGTERM (the agent then stops its own child), SIGKILL if need be."""
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def _median_max(values: list[float]) -> dict[str, float]:
    return {"median": round(statistics.median(values), 3), "max": round(max(values), 3), "n": len(values)}


def _ratios(by: dict[tuple[int, str], dict[str, Any]], rounds: list[int], key: str) -> dict[str, Any]:
    ratios = [by[r, "trainbox"][key] / by[r, "bare"][key] for r in rounds]
    return {"median": round(statistics.median(ratios), 4), "per_round": [round(x, 4) for x in ratios]}


def summarize(runs: list[dict[str, Any]], probes: list[dict[str, Any]]) -> dict[str, Any]:
    if not runs:  # --rounds 0: the launch probes only
        return _launch_summary(probes, probes)
    rounds = sorted({run["round"] for run in runs})
    by = {(run["round"], run["mode"]): run for run in runs}
    paired = [by[r, "trainbox"] for r in rounds]
    return {
        "throughput_ratio": _ratios(by, rounds, "images_per_s"),
        "throughput_ratio_best_epoch": _ratios(by, rounds, "images_per_s_best"),
        "bare_images_per_s": _median_max([by[r, "bare"]["images_per_s"] for r in rounds]),
        "trainbox_images_per_s": _median_max([run["images_per_s"] for run in paired]),
        "bare_wall_s": _median_max([by[r, "bare"]["wall_s"] for r in rounds]),
        "trainbox_wall_s": _median_max([run["wall_s"] for run in paired]),
        **_launch_summary(probes, paired + probes),
        # Load-independent: the CPU the agent spent itself, against what its training spent.
        "agent_cpu_s": _median_max([run["agent_cpu_s"] for run in paired]),
        "agent_cpu_beside_training_s": _median_max([run["agent_cpu_beside_training_s"] for run in paired]),
        "agent_cpu_share": _median_max([run["agent_cpu_s"] / run["training_cpu_s"] for run in paired]),
        "bare_training_cpu_s": _median_max([by[r, "bare"]["training_cpu_s"] for r in rounds]),
        "trainbox_training_cpu_s": _median_max([run["training_cpu_s"] for run in paired]),
    }


def _launch_summary(probes: list[dict[str, Any]], agents: list[dict[str, Any]]) -> dict[str, Any]:
    """Launch: the probes, each alone on the machine (the paired runs' own are in `runs`)."""
    return {
        "launch_cold_s": _median_max([probe["launch_s"] for probe in probes if probe["cold"]]),
        "launch_warm_s": _median_max([probe["launch_s"] for probe in probes if not probe["cold"]]),
        "first_log_s": _median_max([probe["first_log_s"] for probe in probes]),
        "peak_rss_mb": _median_max([agent["peak_rss_mb"] for agent in agents]),
    }


def launch_rows(summary: dict[str, Any]) -> list[str]:
    cold, warm, rss = summary["launch_cold_s"], summary["launch_warm_s"], summary["peak_rss_mb"]
    return [
        f"| agent start → training child, cold (n={cold['n']}) | | {cold['median']:.2f} s (max {cold['max']:.2f}) "
        f"| libreyolo doctor runs beside the training's start | ≤ {LAUNCH_GOAL_S:.0f} s |",
        f"| agent start → training child, warm (n={warm['n']}) | | {warm['median']:.2f} s (max {warm['max']:.2f}) "
        f"| first log line at {summary['first_log_s']['median']:.2f} s | ≤ {LAUNCH_GOAL_S:.0f} s |",
        f"| agent peak RSS, VmHWM (n={rss['n']}) | | {rss['median']:.0f} MB (max {rss['max']:.0f}) | | "
        f"≤ {RSS_GOAL_MB:.0f} MB |",
    ]


def table(summary: dict[str, Any]) -> str:
    if "throughput_ratio" not in summary:
        header = ["| measure | bare | trainbox | result | goal |", "|---|---|---|---|---|"]
        return "\n".join([*header, *launch_rows(summary)])
    ratio, best = summary["throughput_ratio"], summary["throughput_ratio_best_epoch"]
    share = summary["agent_cpu_share"]

    def rounds(values: list[float]) -> str:
        return ", ".join(f"{x:.3f}" for x in values)

    lines = [
        "| measure | bare | trainbox | result | goal |",
        "|---|---|---|---|---|",
        f"| training throughput, median of epochs 2..N (median of rounds) "
        f"| {summary['bare_images_per_s']['median']:.2f} img/s "
        f"| {summary['trainbox_images_per_s']['median']:.2f} img/s "
        f"| ratio {ratio['median']:.3f} (rounds: {rounds(ratio['per_round'])}) | ≥ {THROUGHPUT_GOAL} |",
        f"| the same from each run's fastest epoch | | | ratio {best['median']:.3f} "
        f"(rounds: {rounds(best['per_round'])}) | |",
        f"| wall time, spawn → exit (median) | {summary['bare_wall_s']['median']:.1f} s "
        f"| {summary['trainbox_wall_s']['median']:.1f} s | | |",
        f"| CPU seconds per run (median) | training {summary['bare_training_cpu_s']['median']:.1f} s "
        f"| training {summary['trainbox_training_cpu_s']['median']:.1f} s + agent "
        f"{summary['agent_cpu_s']['median']:.2f} s | agent = {100 * share['median']:.1f} % of training "
        f"(max {100 * share['max']:.1f} %); {summary['agent_cpu_beside_training_s']['median']:.2f} s of it "
        "beside training | |",
        *launch_rows(summary),
    ]
    return "\n".join(lines)


def training_options(parser: argparse.ArgumentParser, *, rounds: int, epochs: int, sequential_help: str) -> None:
    """The options both benchmarks share: the tiny training, and how rounds are laid out on the CPUs."""
    parser.add_argument("--rounds", type=int, default=rounds)
    parser.add_argument("--epochs", type=int, default=epochs)
    parser.add_argument("--imgsz", type=int, default=64)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--sequential", action="store_true", help=sequential_help)


def round_cpus(args: argparse.Namespace) -> list[int] | None:
    """Two CPUs for side-by-side rounds (None: one after the other, unpinned)."""
    cpus = None if args.sequential else sorted(os.sched_getaffinity(0))[:2]
    if cpus is not None and len(cpus) < 2:
        raise SystemExit("side-by-side rounds need 2 CPUs: use --sequential")
    return cpus


def prepare_workspace(root: Path, args: argparse.Namespace) -> tuple[Path, Path, list[str], dict[str, str]]:
    """The dataset, an empty workspace, the training arguments and trainbox's env, dataset checked once
    (so that both sides of every round start training at once). Returns (data.yaml, workdir, args, env)."""
    dataset = root / "dataset"
    data_yaml = bench_dataset(dataset)
    workdir = root / "work"
    workdir.mkdir()
    targs = train_args(args.epochs, args.imgsz, args.batch)
    env = trainbox_env(workdir, GPUS="cpu", DATASET_REPO=str(dataset), RUN_ARGS=" ".join(targs))
    subprocess.run([command("trainbox"), "fetch"], env=env, check=True, capture_output=True)
    return data_yaml, workdir, targs, env


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    training_options(
        parser,
        rounds=6,
        epochs=12,
        sequential_help="bare and trainbox one after the other on every CPU (a quiet machine)",
    )
    parser.add_argument("--probes", type=int, default=3, help="launch probes, cold and warm each")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "overhead.json")
    args = parser.parse_args()
    cpus = round_cpus(args)
    started = time.time()
    loads = [os.getloadavg()]
    runs: list[dict[str, Any]] = []
    probes: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="trainbox-bench-") as tmp:
        data_yaml, workdir, targs, env = prepare_workspace(Path(tmp), args)
        for index in range(args.rounds):
            for run in one_round(index, env, workdir, data_yaml, targs, cpus):
                runs.append({"round": index, **run})
                print(
                    f"round {index} {run['mode']}: {run['images_per_s']:.2f} img/s, wall {run['wall_s']:.1f} s",
                    flush=True,
                )
        for index in range(args.probes):
            for cold in (True, False):
                probe_dir = Path(tmp) / f"probe-cold-{index}" if cold else workdir
                probe = launch_probe(env, probe_dir, f"probe-{'cold' if cold else 'warm'}-{index}", cold=cold)
                probes.append(probe)
                print(f"probe {probe['name']}: start → child {probe['launch_s']:.2f} s", flush=True)
    loads.append(os.getloadavg())
    args.out.parent.mkdir(parents=True, exist_ok=True)
    summary = summarize(runs, probes)
    report = {
        "benchmark": "overhead",
        "date": time.strftime("%Y-%m-%d"),
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}",
        "design": "sequential" if cpus is None else f"side by side, one CPU each of {cpus}, swapped every round",
        "load_avg_start_end": [[round(x, 2) for x in load] for load in loads],
        "seconds": round(time.time() - started, 1),
        "training": {"args": targs, "train_images": TRAIN_IMAGES, "val_images": VAL_IMAGES, "device": "cpu"},
        "runs": runs,
        "launch_probes": probes,
        "summary": summary,
        "goals": {"throughput_ratio": THROUGHPUT_GOAL, "launch_s": LAUNCH_GOAL_S, "peak_rss_mb": RSS_GOAL_MB},
        "met": {
            "throughput_ratio": summary["throughput_ratio"]["median"] >= THROUGHPUT_GOAL if runs else None,
            "launch_cold": summary["launch_cold_s"]["max"] <= LAUNCH_GOAL_S,
            "launch_warm": summary["launch_warm_s"]["max"] <= LAUNCH_GOAL_S,
            "peak_rss": summary["peak_rss_mb"]["max"] <= RSS_GOAL_MB,
        },
    }
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(table(summary))
    print(f"\n{args.rounds} rounds ({report['design']}) on {report['machine']} in {report['seconds']:.0f} s")
    print(f"goals met: {report['met']}; written to {args.out}")


if __name__ == "__main__":
    main()
