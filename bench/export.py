"""Benchmark: what EXPORT=onnx adds to the end of a finished run on the CPU, for YOLOv9-t and -s at 640 px.

For each size: a fresh model's checkpoint (``LibreYOLO9(None, size=…).save``: the export's cost does not depend
on the weights' values), then the two child processes the agent runs (entrypoint/export/run.py), timed from
spawn to exit with their CPU seconds: ``libreyolo export --format onnx --imgsz 640`` and the check
(``python -m entrypoint.export.verify``: the .pt and the ONNX file in ONNX Runtime on 3 validation images).
``OMP_NUM_THREADS=1`` unless set: the wall time one core gives.

Writes bench/results/export.json and prints a Markdown table for docs/benchmarks.md. Run from the repository
root: ``python -m bench.export``.
"""

from __future__ import annotations

import json
import os
import platform
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tests.support import make_dataset

ROOT = Path(__file__).resolve().parents[1]
SIZES = ("t", "s")
IMGSZ = 640


def timed(argv: list[str], cwd: Path, env: dict[str, str]) -> dict[str, float]:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.monotonic()
    done = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True)
    wall = time.monotonic() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        sys.exit(f"{argv[:3]} failed ({done.returncode}): {done.stderr[-2000:]}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return {"wall_s": round(wall, 2), "cpu_s": round(cpu, 2)}


def main() -> None:
    env = os.environ | {"PYTHONPATH": str(ROOT)}
    env.setdefault("OMP_NUM_THREADS", "1")
    libreyolo = str(Path(sys.executable).parent / "libreyolo")
    results = []
    with tempfile.TemporaryDirectory() as scratch:
        work = Path(scratch)
        data_yaml = make_dataset(work / "data", train=1, val=3)
        for size in SIZES:
            checkpoint = work / f"yolov9{size}.pt"
            saver = f"from libreyolo import LibreYOLO9; LibreYOLO9(None, size={size!r}).save({str(checkpoint)!r})"
            subprocess.run([sys.executable, "-c", saver], env=env, check=True, capture_output=True)
            export = timed(
                [libreyolo, "export", "--model", str(checkpoint), "--format", "onnx", "--imgsz", str(IMGSZ), "--json"],
                work,
                env,
            )
            onnx = work / "weights" / f"yolov9{size}.onnx"
            verify = [sys.executable, "-m", "entrypoint.export.verify", "--weights", str(checkpoint)]
            verify += ["--export", str(onnx), "--data", str(data_yaml), "--format", "onnx", "--imgsz", str(IMGSZ)]
            check = timed(verify, work, env)
            results.append(
                {"model": f"YOLOv9-{size}", "export": export, "check": check, "onnx_mb": onnx.stat().st_size / 1e6}
            )
    record = {
        "imgsz": IMGSZ,
        "omp_num_threads": env["OMP_NUM_THREADS"],
        "results": results,
        "date": time.strftime("%Y-%m-%d"),
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}",
        "load_average": os.getloadavg()[0],
    }
    out = ROOT / "bench" / "results" / "export.json"
    out.write_text(json.dumps(record, indent=2) + "\n")
    print("| model | libreyolo export (wall / CPU) | the check (wall / CPU) | best.onnx |")
    print("|---|---|---|---|")
    for row in results:
        e, c = row["export"], row["check"]
        print(
            f"| {row['model']} | {e['wall_s']:.1f} s / {e['cpu_s']:.1f} s | {c['wall_s']:.1f} s / {c['cpu_s']:.1f} s"
            f" | {row['onnx_mb']:.1f} MB |"
        )


if __name__ == "__main__":
    main()
