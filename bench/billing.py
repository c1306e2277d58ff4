"""Benchmark: billing efficiency, billed seconds against training seconds, of a long job end to end.

Runs the real ``trainbox run`` with the stand-in libreyolo (tests/fakes/libreyolo.py: ``--epochs`` epochs of
``--epoch-seconds`` each, tiny checkpoints, its doctor answering at once) against the local Hub
(tests/fakes/hub/: the dataset tar from a Hub dataset repo over Xet, every epoch committed to OUTPUT_REPO)
and a local Vast.ai API (tests/fakes/providers.py) with ``ON_EXIT=destroy`` and ``PRICE_PER_HOUR``: every
stage a rented machine runs, the GPU check aside (no GPU here; ``GPUS=cpu``). The parts are the receipt's
(trainbox.json ``receipt``): setup, GPU check, dataset, training, uploads after training, release; billed
runs from the agent's start to the provider's confirmation that the machine is gone.

The overhead (billed − training) does not grow with the training: the 1-hour figure is training 3600 s plus
the measured overhead. Writes bench/results/billing.json and prints a Markdown table.
``python -m bench.billing [--epochs 20] [--epoch-seconds 15]``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path
from typing import Any

from tests.fakes import libreyolo as fake_libreyolo
from tests.fakes.hub import HubServer
from tests.fakes.providers import FakeVast
from tests.support import make_dataset

ROOT = Path(__file__).resolve().parents[1]
TOKEN = "hf_bench_write_token_0123456789"
PRICE = 2.49
PARTS = ("setup", "gpu_check", "dataset", "training", "uploads", "release")


def dataset_tar(scratch: Path, images: int) -> Path:
    """A detection dataset of ``images`` train and a quarter as many val PNGs, as one tar."""
    root = scratch / "cones"
    make_dataset(root, train=images, val=max(1, images // 4))
    tar = scratch / "cones.tar"
    with tarfile.open(tar, "w") as archive:
        archive.add(root, arcname="cones")
    return tar


def one_run(hub: HubServer, scratch: Path, epochs: int, epoch_seconds: float) -> dict[str, Any]:
    script = fake_libreyolo.install(scratch / "bin")
    with FakeVast("4242", "bench-provider-key-0123456789") as vast:
        env = {key: value for key, value in os.environ.items() if not key.startswith(("HF_", "TRAINBOX_"))}
        env |= {
            **vast.env(),
            "PROVIDER": "vast",
            "ON_EXIT": "destroy",
            "PRICE_PER_HOUR": str(PRICE),
            "DATASET_REPO": "bench/cones",
            "OUTPUT_REPO": "bench/billing",
            "CHECKPOINT_BUCKET": "off",
            "RUN_ARGS": f"epochs={epochs}",
            "HF_TOKEN": TOKEN,
            "HF_ENDPOINT": hub.url,
            "HF_HUB_DISABLE_PROGRESS_BARS": "1",
            "HF_HOME": str(scratch / "hf"),
            "WORKDIR": str(scratch / "work"),
            "GPUS": "cpu",
            "TRAINBOX_LIBREYOLO": str(script),
            "FAKE_EPOCH_SECONDS": str(epoch_seconds),
            "PYTHONPATH": str(ROOT),
        }
        started = time.monotonic()
        result = subprocess.run(
            [sys.executable, "-m", "entrypoint", "run"], env=env, capture_output=True, text=True, cwd=ROOT
        )
        wall = time.monotonic() - started
        if result.returncode != 0:
            raise SystemExit(f"trainbox run failed ({result.returncode}):\n{result.stderr[-3000:]}")
        destroyed = [f"{call.method} {call.path}" for call in vast.actions()]
    (state_file,) = (scratch / "work" / "runs").glob("*/trainbox.json")
    receipt = json.loads(state_file.read_text())["receipt"]
    return {
        "parts_s": {part: receipt["parts"][part]["seconds"] for part in PARTS},
        "billed_s": receipt["billed_seconds"],
        "billed_dollars": receipt["billed_dollars"],
        "billing_efficiency": receipt["billing_efficiency"],
        "agent_wall_s": round(wall, 2),
        "provider_actions": destroyed,
    }


def one_hour(run: dict[str, Any]) -> dict[str, float]:
    overhead = run["billed_s"] - run["parts_s"]["training"]
    return {"overhead_s": round(overhead, 1), "efficiency": round(3600 / (3600 + overhead), 4)}


def table(report: dict[str, Any]) -> str:
    run = report["run"]
    lines = ["| part | seconds | share of billed |", "|---|---|---|"]
    for part in PARTS:
        seconds = run["parts_s"][part]
        lines.append(f"| {part} | {seconds:.1f} | {seconds / run['billed_s']:.1%} |")
    lines.append(f"| **billed** | **{run['billed_s']:.1f}** (${run['billed_dollars']:.4f}) | |")
    hour = report["one_hour"]
    lines += [
        "",
        f"Billing efficiency of this run (training ÷ billed): {run['billing_efficiency']:.1%}; overhead"
        f" {hour['overhead_s']:.1f} s; a 1-hour training with the same overhead: {hour['efficiency']:.2%}.",
    ]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--epochs", type=int, default=20)
    parser.add_argument("--epoch-seconds", type=float, default=15.0)
    parser.add_argument("--images", type=int, default=240, help="train images in the dataset tar")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "billing.json")
    args = parser.parse_args()
    load_before = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="trainbox-billing-") as tmp, HubServer(Path(tmp) / "hub") as hub:
        hub.add_token(TOKEN, "bench", "write")
        hub.create_repo("bench/cones", repo_type="dataset")
        tar = dataset_tar(Path(tmp), args.images)
        hub.upload_file("bench/cones", tar.name, tar, repo_type="dataset")
        scratch = Path(tmp) / "run"
        scratch.mkdir()
        run = one_run(hub, scratch, args.epochs, args.epoch_seconds)
        tar_bytes = tar.stat().st_size
    report = {
        "benchmark": "billing",
        "date": time.strftime("%Y-%m-%d"),
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}",
        "load_average": [round(load_before, 2), round(os.getloadavg()[0], 2)],
        "job": {"epochs": args.epochs, "epoch_seconds": args.epoch_seconds, "dataset_tar_bytes": tar_bytes},
        "price_per_hour": PRICE,
        "run": run,
        "one_hour": one_hour(run),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(table(report))


if __name__ == "__main__":
    main()
