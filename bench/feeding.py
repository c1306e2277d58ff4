"""Benchmark: the agent's DataLoader ``workers`` / ``cache`` choice against libreyolo's defaults, side by side.

``--device cpu`` (default): the bundled demo's images (240 train, 128 px) as a local dataset folder, YOLO9-t
from scratch with the demo's recipe but validation off, ``trainbox run`` twice at a time, each process tree
pinned to a CPU of its own (swapped every round): the agent's choice (it adds ``workers=0 cache=ram`` and its
threads) against libreyolo's defaults for YOLO9 (``workers=8``, no cache; the same threads). Only the two
keys differ.

``--device gpu`` (tests/gpu/test_feeding.py; one GPU, one run at a time): a generated dataset of
``--images`` 640-px JPEGs, YOLO9-s from scratch, a fixed batch, validation off: the agent's choice, the
agent with libreyolo's defaults (``workers=8``, no cache), and bare ``libreyolo train`` with its defaults
(no agent: no thread variables either). Besides images/s, the GPU's busy fraction (``nvidia-smi``
utilization, sampled every 0.2 s from the end of epoch 1 to the end of training).

Images/s: train images over the median epoch time of epochs 2..N (libreyolo's metrics.jsonl ``time``).
Writes bench/results/feeding-<device>.json and prints a Markdown table.
``python -m bench.feeding [--device cpu|gpu] [--rounds N] [--epochs N] [--images N]``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from bench.overhead import pinned
from entrypoint.dataset.demo import write_demo_dataset
from entrypoint.training import sizing
from tests.support import trainbox_env

ROOT = Path(__file__).resolve().parents[1]
LIBREYOLO_DEFAULTS = "workers=8 cache=false"  # YOLO9's family default workers; libreyolo caches nothing
CPU_ARGS = "model=LibreYOLO9t.pt pretrained=false imgsz=128 warmup_epochs=1 mosaic=0 aux_weight=0 batch=8 val=false"
GPU_ARGS = "model=LibreYOLO9s.pt pretrained=false imgsz=640 warmup_epochs=1 batch=32 val=false"


# -- data ---------------------------------------------------------------------------------------------
def gpu_dataset(root: Path, images: int) -> Path:
    """``images`` train and a tenth as many val 640-px JPEGs: noisy backgrounds, 1-6 boxes in 3 classes."""
    from concurrent.futures import ProcessPoolExecutor

    for split in ("train", "val"):
        (root / "images" / split).mkdir(parents=True, exist_ok=True)
        (root / "labels" / split).mkdir(parents=True, exist_ok=True)
    jobs = [("train", i) for i in range(images)] + [("val", i) for i in range(max(1, images // 10))]
    with ProcessPoolExecutor() as pool:
        list(pool.map(_gpu_image, [root] * len(jobs), *zip(*jobs, strict=True), chunksize=32))
    data_yaml = root / "data.yaml"
    data_yaml.write_text(f"path: {root}\ntrain: images/train\nval: images/val\nnames: [red, green, blue]\n")
    return data_yaml


def _gpu_image(root: Path, split: str, index: int) -> None:
    from PIL import Image, ImageDraw

    rng = random.Random(f"{split}{index}")
    size = 640
    image = Image.effect_noise((size, size), 24).convert("RGB")
    draw = ImageDraw.Draw(image)
    labels = []
    for _ in range(rng.randint(1, 6)):
        cls = rng.randrange(3)
        w, h = rng.randint(40, 240), rng.randint(40, 240)
        x, y = rng.randint(0, size - w), rng.randint(0, size - h)
        draw.rectangle((x, y, x + w, y + h), fill=((220, 40, 40), (40, 180, 60), (50, 70, 220))[cls])
        labels.append(f"{cls} {(x + w / 2) / size:.6f} {(y + h / 2) / size:.6f} {w / size:.6f} {h / size:.6f}")
    image.save(root / "images" / split / f"{index:05d}.jpg", quality=90)
    (root / "labels" / split / f"{index:05d}.txt").write_text("\n".join(labels) + "\n")


# -- runs ---------------------------------------------------------------------------------------------
def agent_argv() -> list[str]:
    return [sys.executable, "-m", "entrypoint", "run"]


def bare_argv(data_yaml: Path, args: str, project: Path) -> list[str]:
    libreyolo = shutil.which("libreyolo", path=str(Path(sys.executable).parent)) or "libreyolo"
    owned = [f"data={data_yaml}", f"project={project}", "name=bare", "exist_ok=true", "device=0"]
    return [libreyolo, "train", *args.split(), *owned]


def epoch_rate(run_dir: Path, train_images: int) -> dict[str, Any]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    times = [float(row["time"]) for row in rows[1:]] or [float(rows[-1]["time"])]
    return {
        "epoch_s": [round(float(row["time"]), 2) for row in rows],
        "images_per_s": train_images / statistics.median(times),
    }


class GpuBusy(threading.Thread):
    """``nvidia-smi`` utilization samples taken while ``status`` says an epoch is done and training goes on."""

    def __init__(self, status_glob: tuple[Path, str]) -> None:
        super().__init__(daemon=True)
        self.folder, self.pattern = status_glob
        self.samples: list[float] = []
        self._smi = subprocess.Popen(
            ["nvidia-smi", "--query-gpu=utilization.gpu", "--format=csv,noheader,nounits", "-lms", "200", "-i", "0"],
            stdout=subprocess.PIPE,
            text=True,
        )

    def _training(self) -> bool:
        for path in self.folder.glob(self.pattern):
            try:
                status = json.loads(path.read_text())
            except (OSError, ValueError):
                continue
            return status.get("state") == "running" and (status.get("completed_epochs") or 0) >= 1
        return False

    def run(self) -> None:
        assert self._smi.stdout is not None
        for line in self._smi.stdout:
            if line.strip().isdigit() and self._training():
                self.samples.append(float(line) / 100)

    def stop(self) -> float | None:
        self._smi.terminate()
        self._smi.wait()
        self.join(timeout=5)
        return round(statistics.mean(self.samples), 3) if self.samples else None


def run_gpu(name: str, argv: list[str], env: dict[str, str], cwd: Path, status: tuple[Path, str]) -> dict[str, Any]:
    busy = GpuBusy(status)
    busy.start()
    started = time.monotonic()
    log = cwd / f"{name}.log"
    with log.open("w") as out:
        code = subprocess.run(argv, env=env, cwd=cwd, stdout=out, stderr=subprocess.STDOUT).returncode
    wall = time.monotonic() - started
    fraction = busy.stop()
    if code != 0:
        raise SystemExit(f"{name} failed ({code}): {log.read_text()[-3000:]}")
    return {"name": name, "wall_s": round(wall, 1), "gpu_busy": fraction}


def gpu_bench(tmp: Path, images: int, epochs: int) -> dict[str, Any]:
    data_yaml = gpu_dataset(tmp / "data", images)
    args = f"{GPU_ARGS} epochs={epochs}"
    results = []
    for name, extra in (("agent", ""), ("agent, libreyolo's defaults", f" {LIBREYOLO_DEFAULTS}")):
        workdir = tmp / name.replace(" ", "_").replace(",", "").replace("'", "")
        env = trainbox_env(workdir, DATASET_REPO=str(data_yaml.parent), RUN_ARGS=args + extra, GPUS="0")
        run = run_gpu(name, agent_argv(), env, ROOT, (workdir / "runs", "*/status.json"))
        (state_file,) = (workdir / "runs").glob("*/trainbox.json")
        state = json.loads(state_file.read_text())
        run |= epoch_rate(state_file.parent, images) | {
            "sizing": state.get("sizing"),
            "argv": state["training"]["argv"],
        }
        results.append(run)
    project = tmp / "bare"
    project.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in sizing.THREAD_VARS}
    run = run_gpu(
        "bare libreyolo train", bare_argv(data_yaml, args, project), env, project, (project, "bare/status.json")
    )
    results.append(run | epoch_rate(project / "bare", images))
    gpu = subprocess.run(
        ["nvidia-smi", "--query-gpu=name", "--format=csv,noheader", "-i", "0"], capture_output=True, text=True
    )
    return {"gpu": gpu.stdout.strip(), "images": images, "epochs": epochs, "run_args": args, "runs": results}


# -- the CPU: side by side ----------------------------------------------------------------------------
def cpu_bench(tmp: Path, rounds: int, epochs: int) -> dict[str, Any]:
    data_yaml = write_demo_dataset(tmp / "demo-data")
    train_images = len(list((data_yaml.parent / "images" / "train").iterdir()))
    cpus = sorted(os.sched_getaffinity(0))[:2]
    configs = (("agent", ""), ("libreyolo's defaults", f" {LIBREYOLO_DEFAULTS}"))
    runs: list[dict[str, Any]] = []
    for round_ in range(rounds):
        started = []
        for index, (name, extra) in enumerate(configs):
            workdir = tmp / f"round{round_}-{index}"
            args = f"{CPU_ARGS} epochs={epochs}{extra}"
            env = trainbox_env(workdir, DATASET_REPO=str(data_yaml.parent), RUN_ARGS=args, GPUS="cpu")
            for variable in sizing.THREAD_VARS:
                env.pop(variable, None)
            cpu = cpus[(index + round_) % len(cpus)] if len(cpus) > 1 else None
            with pinned(cpu):
                process = subprocess.Popen(
                    agent_argv(), env=env, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
                )
            started.append((name, workdir, process, cpu, time.monotonic()))
        for name, workdir, process, cpu, at in started:
            _, err = process.communicate()
            if process.returncode != 0:
                raise SystemExit(f"{name} failed ({process.returncode}): {err[-3000:]}")
            (state_file,) = (workdir / "runs").glob("*/trainbox.json")
            state = json.loads(state_file.read_text())
            runs.append(
                {"round": round_, "name": name, "cpu": cpu, "wall_s": round(time.monotonic() - at, 1)}
                | epoch_rate(state_file.parent, train_images)
                | {"argv": state["training"]["argv"], "sizing": state.get("sizing")}
            )
    return {"images": train_images, "epochs": epochs, "run_args": CPU_ARGS, "runs": runs}


def table(report: dict[str, Any]) -> str:
    lines = ["| run | images/s (median of rounds) | rounds | GPU busy | workers, cache |", "|---|---|---|---|---|"]
    names = list(dict.fromkeys(run["name"] for run in report["runs"]))
    for name in names:
        mine = [run for run in report["runs"] if run["name"] == name]
        rates = [run["images_per_s"] for run in mine]
        sizing = mine[0].get("sizing") or {}
        chosen = (
            f"{(sizing.get('workers') or {}).get('value')}, {(sizing.get('cache') or {}).get('value') or 'off'}"
            if sizing
            else "libreyolo's (8, off)"
        )
        busy = mine[0].get("gpu_busy")
        lines.append(
            f"| {name} | {statistics.median(rates):.1f} | {', '.join(f'{r:.1f}' for r in rates)} |"
            f" {'—' if busy is None else f'{busy:.0%}'} | {chosen} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--device", choices=("cpu", "gpu"), default="cpu")
    parser.add_argument("--rounds", type=int, default=2, help="side-by-side rounds (the CPU)")
    parser.add_argument("--epochs", type=int, default=None, help="default: 6 on the CPU, 3 on a GPU")
    parser.add_argument("--images", type=int, default=2000, help="train images of the GPU's dataset")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    load_before = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="trainbox-feeding-") as tmp:
        if args.device == "cpu":
            found = cpu_bench(Path(tmp), args.rounds, args.epochs or 6)
        else:
            found = gpu_bench(Path(tmp), args.images, args.epochs or 3)
    report = {
        "benchmark": f"feeding-{args.device}",
        "date": time.strftime("%Y-%m-%d"),
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}",
        "load_average": [round(load_before, 2), round(os.getloadavg()[0], 2)],
        **found,
    }
    out = args.out or ROOT / "bench" / "results" / f"feeding-{args.device}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n")
    print(table(report))
    return report


if __name__ == "__main__":
    main()
