"""Benchmark: getting a dataset tar from the Hub onto the volume, the guide's way and Trainbox's way.

A tar of about 1 GiB holding about 20k small files (JPEG-valid images padded with random bytes,
and their label files) is served by the local Hub (tests/fakes/hub/) on loopback. Measured in
one run, each as a separate process, in rounds (so background load hits every measure alike):

  a  guide      hf_hub_download, then tarfile.extractall (LibreYOLO's "Training on a rented GPU")
  b  download   hf_hub_download alone
  c  extract    tarfile.extractall alone, from the local file
  d  curl|tar   curl … | tar -x: streaming, the practical limit
  e  fetch      `trainbox fetch`, cold: until the data is extracted and verified (libreyolo doctor,
                which `fetch` runs next, is reported apart: it is not part of the transfer)
  f  warm       `trainbox fetch` again on the same volume (bytes of the tar downloaded: must be 0)

Each measure runs with the tar stored in Xet (the Hub today: hf_hub_download and `trainbox fetch` read
the Xet CAS, which the local Hub serves over HTTP) and in LFS (a Hub or mirror without Xet, clients with
HF_HUB_DISABLE_XET=1: plain HTTP), side by side; ``d`` is plain HTTP in both.

Goals: e ≤ 0.5 × a (per transfer); stretch e ≤ 1.5 × d; f ≤ 2 s with no bytes downloaded; the agent's
own peak RSS ≤ 150 MB. Writes bench/results/dataset.json and prints a Markdown table for
docs/benchmarks.md. Run from the repository root:
``python -m bench.dataset [--rounds 5] [--files 20000] [--mib 1024] [--transfer xet,lfs] [--link-mbit 1000]
[--measures abcdef]``.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import platform
import shutil
import statistics
import struct
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from bench.measure import run_child, settle
from tests.fakes.hub import HubServer

ROOT = Path(__file__).resolve().parents[1]

TOKEN = "hf_bench_dataset_token_0123456789"
REPO = "bench/dataset"
NAME = "bench.tar"
CAS_DATA = r"^/cas/xorbs/"  # the CAS data URLs (tests/fakes/hub/cas.py)
MEASURES = "abcdef"

GUIDE = """\
import sys, tarfile
from huggingface_hub import hf_hub_download
path = hf_hub_download(sys.argv[1], sys.argv[2], repo_type="dataset")
if len(sys.argv) > 3:
    with tarfile.open(path) as archive:
        archive.extractall(sys.argv[3])
"""
EXTRACT = """\
import sys, tarfile
with tarfile.open(sys.argv[1]) as archive:
    archive.extractall(sys.argv[2])
"""


# -- the dataset ------------------------------------------------------------------------------------
def tiny_jpeg() -> bytes:
    """A valid 8x8 baseline JPEG (grey), made once with Pillow (a libreyolo dependency)."""
    from PIL import Image

    buffer = io.BytesIO()
    Image.new("RGB", (8, 8), (120, 120, 120)).save(buffer, "JPEG", quality=90)
    return buffer.getvalue()


def padded_jpeg(base: bytes, size: int) -> bytes:
    """``base`` with APP15 segments of random bytes after SOI: a valid JPEG of ``size`` bytes."""
    parts, room = [base[:2]], size - len(base)
    while room > 4:
        length = min(room - 4, 65531)
        parts.append(b"\xff\xef" + struct.pack(">H", length + 2) + os.urandom(length))
        room -= length + 4
    parts.append(base[2:])
    return b"".join(parts)


def make_tar(path: Path, files: int, total_bytes: int) -> None:
    images = files // 2
    image_size = max(1024, (total_bytes - files * 1024) // images)
    base = tiny_jpeg()

    def add(archive: tarfile.TarFile, name: str, data: bytes) -> None:
        member = tarfile.TarInfo(name)
        member.size, member.mode, member.mtime = len(data), 0o644, 1_700_000_000
        archive.addfile(member, io.BytesIO(data))

    tmp = path.with_suffix(".tmp")
    with tarfile.open(tmp, "w") as archive:
        add(archive, "bench/data.yaml", b"train: images/train\nval: images/val\nnames:\n  0: box\n")
        for index in range(images):
            split = "val" if index % 5 == 0 else "train"
            add(archive, f"bench/images/{split}/{index:06d}.jpg", padded_jpeg(base, image_size))
            box = f"0 {0.2 + (index % 7) / 10:.3f} 0.5 0.2 0.3\n".encode()
            add(archive, f"bench/labels/{split}/{index:06d}.txt", box)
    tmp.rename(path)


# -- measuring: bench/measure.py ------------------------------------------------------------------
@contextlib.contextmanager
def tar_on_hub(scratch: Path, tar: Path) -> Iterator[tuple[HubServer, dict[str, str]]]:
    """A local Hub under ``scratch`` serving ``tar`` in dataset ``REPO`` (Xet-backed), and the clients' env."""
    with HubServer(scratch / "hub") as hub:
        hub.add_token(TOKEN, REPO.split("/")[0], "write")
        hub.create_repo(REPO, repo_type="dataset")
        hub.upload_file(REPO, NAME, tar, repo_type="dataset")
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
        }
        # As the image's build does: libreyolo's train options (RUN_ARGS are checked against them) are read
        # once, here, not by every cold fetch (starting libreyolo to ask costs ~4.5 s, which no user pays).
        fill = "from entrypoint import libreyolo; assert libreyolo.train_options()"
        subprocess.run([sys.executable, "-c", fill], env=env, check=True, cwd=ROOT)
        yield hub, env


def timed(argv: list[str], env: dict[str, str], *, shell: bool = False) -> tuple[float, str, float]:
    """Run a child; (wall seconds, stdout, peak RSS MiB of the child itself)."""
    child = run_child(argv, env, shell=shell)
    return child.wall_s, child.stdout, child.peak_mib


def one_round(hub: HubServer, tar: Path, scratch: Path, env: dict[str, str], measures: str) -> dict[str, Any]:
    """One round of ``measures`` (letters of ``MEASURES``; f needs e), each from a clean, synced disk."""
    python = sys.executable
    out, hf_home, work = scratch / "out", scratch / "hf", scratch / "work"
    guide_env = {**env, "HF_HOME": str(hf_home)}
    row: dict[str, Any] = {}
    cleaning = settle(out, hf_home, work)

    if "a" in measures:
        row["a_guide_s"], _, _ = timed([python, "-c", GUIDE, REPO, NAME, str(out)], guide_env)
        cleaning += settle(out, hf_home)
    if "b" in measures:
        row["b_download_s"], _, _ = timed([python, "-c", GUIDE, REPO, NAME], guide_env)
        cleaning += settle(hf_home)
    if "c" in measures:
        row["c_extract_s"], _, _ = timed([python, "-c", EXTRACT, str(tar), str(out)], env)
        cleaning += settle(out)
    if "d" in measures:
        out.mkdir()
        url = f"{hub.url}/datasets/{REPO}/resolve/main/{NAME}"
        curl = f"curl -sSf -H 'authorization: Bearer {TOKEN}' '{url}' | tar -x -C '{out}'"
        row["d_curl_tar_s"], _, _ = timed([curl], env, shell=True)
        cleaning += settle(out)
    if "e" in measures:
        fetch_env = {**env, "WORKDIR": str(work), "DATASET_REPO": REPO, "RUN_ARGS": "imgsz=640"}
        hub.reset_log()
        wall, stdout, peak = timed([python, "-m", "entrypoint", "fetch", "--json"], fetch_env)
        seconds = json.loads(stdout)["seconds"]
        row["e_fetch_s"] = wall - seconds["check"]  # start of the process → data extracted and verified
        row["e_fetch_total_s"] = wall
        row["e_doctor_s"] = seconds["check"]
        row["e_transfer_s"] = seconds.get("transfer", 0.0)  # download + extraction; e minus it: start-up, pinning
        row["e_agent_peak_rss_mb"] = peak
        row["e_downloaded_bytes"] = hub.bytes_served("/resolve/") + hub.bytes_served(CAS_DATA)
        row["e_xet_tokens"] = len(hub.find_requests("GET", "/xet-read-token/"))
        if "f" in measures:
            hub.reset_log()
            row["f_warm_s"], _, _ = timed([python, "-m", "entrypoint", "fetch", "--json"], fetch_env)
            row["f_downloaded_bytes"] = (
                hub.bytes_served("/resolve/")
                + hub.bytes_served(CAS_DATA)
                + len(hub.find_requests("GET", "/xet-read-token/"))
            )
        cleaning += settle(work)
    measured = sum(row.get(key, 0.0) for key in ("a_guide_s", "b_download_s", "c_extract_s", "d_curl_tar_s"))
    measured += row.get("e_fetch_total_s", 0.0) + row.get("f_warm_s", 0.0)
    print(f"  measured {measured:.0f} s (e with the doctor), cleaned up {cleaning:.0f} s", file=sys.stderr)
    return row


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--files", type=int, default=20_000, help="files in the tar (half images, half labels)")
    parser.add_argument("--mib", type=int, default=1024, help="tar size in MiB")
    parser.add_argument("--scratch", type=Path, help="where to work (default: the temp dir); e.g. /dev/shm for RAM")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "dataset.json", help="results file")
    parser.add_argument("--transfer", default="xet,lfs", help="xet, lfs or both (comma-separated)")
    parser.add_argument(
        "--measures", default=MEASURES, help="which of a-f (default all; f needs e), e.g. adef for the growth table"
    )
    parser.add_argument(
        "--link-mbit", type=float, help="a link of this speed: the CAS (all connections) and each /resolve/ GET"
    )
    args = parser.parse_args(argv)
    transfers = [t.strip() for t in args.transfer.split(",") if t.strip()]
    if not transfers or set(transfers) - {"xet", "lfs"}:
        parser.error("--transfer: xet, lfs or xet,lfs")
    measures = "".join(m for m in MEASURES if m in args.measures)
    if not measures or set(args.measures) - set(MEASURES) or ("f" in measures and "e" not in measures):
        parser.error("--measures: letters of abcdef, f only with e")
    if shutil.which("curl") is None or shutil.which("tar") is None:
        parser.error("needs curl and tar on PATH")

    scratch = Path(tempfile.mkdtemp(prefix="trainbox-bench-", dir=args.scratch))
    try:
        tar = scratch / NAME
        print(f"building a {args.mib} MiB tar of {args.files} files…", file=sys.stderr)
        started = time.monotonic()
        make_tar(tar, args.files, args.mib * 1024 * 1024)
        print(f"  {time.monotonic() - started:.0f} s; storing it in the local Hub…", file=sys.stderr)
        started = time.monotonic()
        with tar_on_hub(scratch, tar) as (hub, env):
            print(f"  {time.monotonic() - started:.0f} s", file=sys.stderr)
            if args.link_mbit:  # loopback has no network time for the download/extraction overlap to hide
                rate = int(args.link_mbit * 1e6 / 8)
                hub.set_cas_bandwidth(rate)
                hub.inject("slow", method="GET", path="/resolve/", rate=rate)
            load_before = os.getloadavg()[0]
            rounds: dict[str, list[dict[str, Any]]] = {transfer: [] for transfer in transfers}
            for index in range(args.rounds):
                for transfer in transfers:  # alternating, so background load hits both alike
                    print(f"round {index + 1}/{args.rounds}, {transfer}…", file=sys.stderr)
                    hub.set_xet(transfer == "xet")
                    mode_env = env if transfer == "xet" else {**env, "HF_HUB_DISABLE_XET": "1"}
                    rounds[transfer].append(one_round(hub, tar, scratch, mode_env, measures))
            load_after = os.getloadavg()[0]
        report = {
            "benchmark": "dataset",
            "transfers": {
                transfer: summarize(rows, args, tar.stat().st_size, (load_before, load_after))
                for transfer, rows in rounds.items()
            },
            "filesystem": filesystem(scratch),
        }
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(table(report))
    return 0


def filesystem(path: Path) -> str:
    """The type of the filesystem holding ``path`` (ext4, tmpfs, …), from /proc/mounts."""
    best, kind = "", "unknown"
    try:
        mounts = Path("/proc/mounts").read_text().splitlines()
    except OSError:
        return kind
    for line in mounts:
        fields = line.split()
        if len(fields) > 2 and str(path).startswith(fields[1]) and len(fields[1]) > len(best):
            best, kind = fields[1], fields[2]
    return kind


def summarize(
    rounds: list[dict[str, Any]], args: argparse.Namespace, size: int, load: tuple[float, float]
) -> dict[str, Any]:
    median = {key: statistics.median(row[key] for row in rounds) for key in rounds[0]}
    best = {key: min(row[key] for row in rounds) for key in rounds[0]}
    ratios = {
        name: median["e_fetch_s"] / median[key]
        for name, key in (("e_over_a", "a_guide_s"), ("e_over_d", "d_curl_tar_s"))
        if "e_fetch_s" in median and key in median
    }
    if "e_fetch_s" in median:
        ratios["e_s_per_gib"] = median["e_fetch_s"] / (size / 2**30)
    goals = {}
    if "e_over_a" in ratios:
        goals["e <= 0.5 a"] = ratios["e_over_a"] <= 0.5
        if args.link_mbit:  # the growth goal, set for a capped link
            goals["e <= 0.6 a"] = ratios["e_over_a"] <= 0.6
    if "e_over_d" in ratios:
        goals["e <= 1.5 d (stretch)"] = ratios["e_over_d"] <= 1.5
    if "f_warm_s" in median:
        goals["f <= 2 s, 0 bytes"] = median["f_warm_s"] <= 2.0 and max(row["f_downloaded_bytes"] for row in rounds) == 0
    if "e_agent_peak_rss_mb" in median:
        goals["agent RSS <= 150 MB"] = max(row["e_agent_peak_rss_mb"] for row in rounds) <= 150
    return {
        "benchmark": "dataset",
        "date": time.strftime("%Y-%m-%d"),
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}",
        "load_average_1m": {"before": round(load[0], 2), "after": round(load[1], 2)},
        "tar": {"bytes": size, "files": args.files},
        "link_mbit": args.link_mbit,
        "measures": args.measures,
        "rounds": [{key: round(value, 3) for key, value in row.items()} for row in rounds],
        "median": {key: round(value, 3) for key, value in median.items()},
        "best": {key: round(value, 3) for key, value in best.items()},
        "ratios": {key: round(value, 3) for key, value in ratios.items()},
        "goals": goals,
    }


def table(report: dict[str, Any]) -> str:
    transfers = report["transfers"]
    names = list(transfers)
    rows = [
        ("a  guide: hf_hub_download, then extractall", "a_guide_s", ""),
        ("b  download only (hf_hub_download)", "b_download_s", ""),
        ("c  extraction only (tarfile, local file)", "c_extract_s", ""),
        ("d  curl … \\| tar -x (plain HTTP)", "d_curl_tar_s", ""),
        ("e  `trainbox fetch`, cold (to data ready)", "e_fetch_s", "≤ 0.5 × a; stretch ≤ 1.5 × d"),
        ("f  `trainbox fetch`, warm", "f_warm_s", "≤ 2 s, 0 bytes"),
        ("   libreyolo doctor, after e", "e_doctor_s", ""),
    ]
    heads = " | ".join(f"{name.upper()} median (best)" for name in names)
    lines = [f"| measure | {heads} | goal |", "|---" * (len(names) + 2) + "|"]
    for label, key, goal in rows:
        if all(key in t["median"] for t in transfers.values()):
            cells = " | ".join(f"{t['median'][key]:.2f} s ({t['best'][key]:.2f})" for t in transfers.values())
            lines.append(f"| {label} | {cells} | {goal} |")
    lines.append("")
    for name, t in transfers.items():
        ratios, goals, rounds = t["ratios"], t["goals"], t["rounds"]
        said = ", ".join(f"{key} = {value:.2f}" for key, value in ratios.items())
        if "f_downloaded_bytes" in rounds[0]:
            said += f"; warm fetch downloaded {max(row['f_downloaded_bytes'] for row in rounds)} bytes"
        if "e_agent_peak_rss_mb" in rounds[0]:
            said += f"; the agent's peak RSS {max(row['e_agent_peak_rss_mb'] for row in rounds):.0f} MB"
        verdicts = ", ".join(f"{goal}: {'met' if met else 'NOT met'}" for goal, met in goals.items())
        lines.append(f"{name.upper()}: {said}. Goals: {verdicts}.")
    lines += ["", growth_rows(report), ""]
    first = next(iter(transfers.values()))
    lines.append(
        f"{first['date']}, {first['machine']}, on {report.get('filesystem', '?')}, "
        f"{first['tar']['bytes'] / 2**30:.2f} GiB tar of {first['tar']['files']} files, "
        f"{len(first['rounds'])} rounds per transfer, 1-minute load average "
        f"{first['load_average_1m']['before']} → {first['load_average_1m']['after']}."
    )
    return "\n".join(lines)


def _cell(median: dict[str, float], key: str, fmt: str = "{:.2f}") -> str:
    return fmt.format(median[key]) if key in median else "–"


def growth_rows(report: dict[str, Any]) -> str:
    """Rows of docs/benchmarks.md's growth table (a capped link), one per transfer, from medians."""
    lines = []
    for name, t in report["transfers"].items():
        m, r, tar = t["median"], t["ratios"], t["tar"]
        link = f"{t['link_mbit']:g} Mbit/s" if t.get("link_mbit") else "loopback"
        warm = "–"
        if "f_warm_s" in m:
            warm = f"{_cell(m, 'f_warm_s')}, {max(row['f_downloaded_bytes'] for row in t['rounds'])}"
        lines.append(
            f"| {link}, {tar['bytes'] / 2**30:.2g} GiB ({tar['files']:,} files) | {name.upper()} "
            f"| {_cell(m, 'a_guide_s')} "
            f"| {_cell(m, 'd_curl_tar_s')} | {_cell(m, 'e_fetch_s')} | {r.get('e_over_a', float('nan')):.2f} "
            f"| {r.get('e_s_per_gib', float('nan')):.1f} | {warm} | {_cell(m, 'e_agent_peak_rss_mb', '{:.0f} MB')} |"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
