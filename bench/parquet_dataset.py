"""Benchmark: a parquet dataset (as ``datasets.push_to_hub`` writes it) against a tar of the same images, from
the Hub to data ready for training.

The same images (JPEG-valid, padded with random bytes to the size asked) and boxes go into a tar (YOLO layout,
data.yaml) and into parquet shards (``data/train-0000K-of-0000N.parquet`` and ``data/validation-…``, shards of at
most 500 MB and row groups of 100 rows, as ``push_to_hub`` writes image datasets; ``image`` struct with bytes,
``objects`` with COCO-pixel ``bbox`` and a ClassLabel ``category``). The local Hub (tests/fakes/hub/) serves both,
Xet-backed, on loopback. Each round runs `trainbox fetch` cold on each (its own process, from a clean and synced
disk), alternating, and measures the wall time from the process start to the data ready (the dataset check that
`fetch` runs next, the stand-in's here, is left out) and the agent's peak RSS (VmHWM).

Goals: parquet within 1.25 × the tar's time; the agent's peak RSS ≤ 300 MB on parquet. Writes
bench/results/parquet_dataset.json and prints a Markdown table for docs/benchmarks.md. Run from the repository
root: ``python -m bench.parquet_dataset [--rounds 3] [--mib 2048] [--image-kib 200]``.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import platform
import shutil
import statistics
import sys
import tarfile
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.dataset import ROOT, padded_jpeg, tiny_jpeg
from bench.measure import run_child, settle
from tests.fakes import libreyolo as fake_libreyolo
from tests.fakes.hub import HubServer

TOKEN = "hf_bench_parquet_token_0123456789"
TAR_REPO, PARQUET_REPO = "bench/tar", "bench/parquet"
SHARD_BYTES = 500 * 10**6  # push_to_hub's default max_shard_size
ROW_GROUP = 100  # datasets' row group size for image datasets


def images(count: int, size: int) -> list[tuple[str, bytes, list[float]]]:
    """(split, jpeg, [x, y, w, h] in pixels of the 8x8 image) for ``count`` images; every fifth is validation."""
    base = tiny_jpeg()
    return [
        ("validation" if index % 5 == 0 else "train", padded_jpeg(base, size), [1.0, 1.0 + index % 3, 4.0, 3.0])
        for index in range(count)
    ]


def make_tar(path: Path, items: list[tuple[str, bytes, list[float]]]) -> None:
    def add(archive: tarfile.TarFile, name: str, data: bytes) -> None:
        member = tarfile.TarInfo(name)
        member.size, member.mode, member.mtime = len(data), 0o644, 1_700_000_000
        archive.addfile(member, io.BytesIO(data))

    with tarfile.open(path, "w") as archive:
        add(archive, "bench/data.yaml", b"train: images/train\nval: images/val\nnames:\n  0: box\n")
        for index, (split, jpeg, (x, y, w, h)) in enumerate(items):
            folder = "val" if split == "validation" else "train"
            add(archive, f"bench/images/{folder}/{index:06d}.jpg", jpeg)
            row = f"0 {(x + w / 2) / 8:.6f} {(y + h / 2) / 8:.6f} {w / 8:.6f} {h / 8:.6f}\n"
            add(archive, f"bench/labels/{folder}/{index:06d}.txt", row.encode())


def make_parquet(folder: Path, items: list[tuple[str, bytes, list[float]]]) -> list[Path]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    features = {
        "image": {"_type": "Image"},
        "objects": {
            "feature": {
                "bbox": {"feature": {"dtype": "float32", "_type": "Value"}, "length": 4, "_type": "Sequence"},
                "category": {"names": ["box"], "_type": "ClassLabel"},
            },
            "_type": "Sequence",
        },
    }
    metadata = {"huggingface": json.dumps({"info": {"features": features}})}
    written = []
    for split in ("train", "validation"):
        rows = [(jpeg, box) for name, jpeg, box in items if name == split]
        per_shard = max(ROW_GROUP, SHARD_BYTES // max(1, len(rows[0][0])) // ROW_GROUP * ROW_GROUP)
        shards = [rows[start : start + per_shard] for start in range(0, len(rows), per_shard)]
        for index, shard in enumerate(shards):
            path = folder / "data" / f"{split}-{index:05d}-of-{len(shards):05d}.parquet"
            path.parent.mkdir(parents=True, exist_ok=True)
            table = pa.Table.from_pylist(
                [
                    {"image": {"bytes": jpeg, "path": f"{n:06d}.jpg"}, "objects": {"bbox": [box], "category": [0]}}
                    for n, (jpeg, box) in enumerate(shard)
                ]
            ).replace_schema_metadata(metadata)
            pq.write_table(table, path, row_group_size=ROW_GROUP)
            written.append(path)
    return written


def fetch_once(env: dict[str, str], repo: str, work: Path) -> dict[str, float]:
    fetch_env = {**env, "WORKDIR": str(work), "DATASET_REPO": repo, "RUN_ARGS": "model=LibreYOLO9t.pt imgsz=640"}
    child = run_child([sys.executable, "-m", "entrypoint", "fetch", "--json"], fetch_env, tree=True)
    seconds = json.loads(child.stdout)["seconds"]
    # other_peak_mib: the conversion child's (parquet), or the stand-in doctor's (both: a few MB)
    ready = child.wall_s - seconds["check"]
    return {"ready_s": ready, "peak_rss_mb": child.peak_mib, "child_peak_mb": child.other_peak_mib}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--mib", type=int, default=2048, help="the images' total size in MiB")
    parser.add_argument("--image-kib", type=int, default=200, help="one image's size")
    parser.add_argument("--scratch", type=Path, help="where to work (default: the temp dir)")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "parquet_dataset.json")
    args = parser.parse_args(argv)
    scratch = Path(tempfile.mkdtemp(prefix="trainbox-bench-parquet-", dir=args.scratch))
    try:
        count = args.mib * 1024 // args.image_kib
        print(f"building {count} images of {args.image_kib} KiB as a tar and as parquet…", file=sys.stderr)
        items = images(count, args.image_kib * 1024)
        tar = scratch / "bench.tar"
        make_tar(tar, items)
        shards = make_parquet(scratch / "parquet", items)
        del items
        with HubServer(scratch / "hub") as hub:
            hub.add_token(TOKEN, "bench", "write")
            for repo in (TAR_REPO, PARQUET_REPO):
                hub.create_repo(repo, repo_type="dataset")
            hub.upload_file(TAR_REPO, "bench.tar", tar, repo_type="dataset")
            files = {str(path.relative_to(scratch / "parquet")): path for path in shards}
            hub.commit(PARQUET_REPO, files, repo_type="dataset", message="parquet")  # type: ignore[arg-type]
            base = {key: value for key, value in os.environ.items() if not key.startswith(("HF_", "HUGGING"))}
            env = {
                **base,
                "HF_ENDPOINT": hub.url,
                "HF_HUB_DISABLE_PROGRESS_BARS": "1",
                "HF_HUB_DISABLE_TELEMETRY": "1",
                "HF_TOKEN": TOKEN,
                "GPUS": "cpu",
                "PYTHONPATH": str(ROOT),
                "TRAINBOX_CACHE_DIR": str(scratch / "image-cache"),
                # the stand-in's doctor: the check is not part of time-to-ready, and libreyolo's takes minutes here
                "TRAINBOX_LIBREYOLO": str(fake_libreyolo.install(scratch / "stand-in")),
            }
            load_before = os.getloadavg()[0]
            rounds: dict[str, list[dict[str, float]]] = {"tar": [], "parquet": []}
            for index in range(args.rounds):
                for name, repo in (("tar", TAR_REPO), ("parquet", PARQUET_REPO)):
                    print(f"round {index + 1}/{args.rounds}, {name}…", file=sys.stderr)
                    settle(scratch / "work")
                    rounds[name].append(fetch_once(env, repo, scratch / "work"))
                    print(f"  {rounds[name][-1]}", file=sys.stderr)
            settle(scratch / "work")
            load_after = os.getloadavg()[0]
        median = {
            name: {key: statistics.median(row[key] for row in rows) for key in rows[0]} for name, rows in rounds.items()
        }
        ratio = median["parquet"]["ready_s"] / median["tar"]["ready_s"]
        peak = max(row["peak_rss_mb"] for row in rounds["parquet"])
        report = {
            "benchmark": "parquet_dataset",
            "date": time.strftime("%Y-%m-%d"),
            "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}",
            "load_average_1m": {"before": round(load_before, 2), "after": round(load_after, 2)},
            "images": count,
            "tar_bytes": tar.stat().st_size,
            "parquet_bytes": sum(path.stat().st_size for path in shards),
            "parquet_files": len(shards),
            "rounds": rounds,
            "median": median,
            "parquet_over_tar": round(ratio, 3),
            "goals": {"parquet <= 1.25 x tar": ratio <= 1.25, "parquet peak RSS <= 300 MB": peak <= 300},
        }
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(table(report))
    return 0


def table(report: dict[str, Any]) -> str:
    lines = [
        "| form | time to ready, median | best | agent peak RSS | its children's peak RSS |",
        "|---|---|---|---|---|",
    ]
    for name in ("tar", "parquet"):
        rows = report["rounds"][name]
        lines.append(
            f"| {name} | {report['median'][name]['ready_s']:.2f} s | {min(row['ready_s'] for row in rows):.2f} s"
            f" | {max(row['peak_rss_mb'] for row in rows):.0f} MB"
            f" | {max(row['child_peak_mb'] for row in rows):.0f} MB |"
        )
    lines.append(f"\nparquet / tar = {report['parquet_over_tar']:.2f}; goals: {report['goals']}")
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
