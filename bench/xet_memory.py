"""Benchmark: peak memory (VmHWM) of a Xet dataset fetch as the tar grows, against the CAS served over HTTP.

For each tar size, the local Hub (tests/fakes/hub/, its CAS over HTTP on loopback, as hf_xet's network
client sees the real Hub) serves one tar, and each of these runs as its own process:

  guide    hf_hub_download alone (the guide's recipe, its download half)
  default  `trainbox fetch`, with hf_xet's own download buffer (2 GB + 512 MB per file) forced
  agent    `trainbox fetch` as shipped (the agent bounds hf_xet's buffer for its own process: cli.py)

Then the other way: `trainbox sync --once` of a run folder holding one torch checkpoint of random weights
(0.1, 0.5, 1 GB: weights barely compress) to the Hub through the same CAS ("upload" rows): the agent's own
peak, the peak of the child process it uploads large files from (entrypoint/xet/child.py), and the peak of
the two together (their RSS summed at each sample); beside it, a bare `HfApi.upload_file` of the same file
in one process with hf_xet's defaults ("inprocess" rows: what the agent held before the child).

Goal: the agent's peak RSS ≤ 300 MB at every size (stretch ≤ 150 MB). Writes
bench/results/xet_memory.json and prints a Markdown table for docs/benchmarks.md. From the repository root:
``python -m bench.xet_memory [--gib 0.5,2,4] [--files-per-gib 4000]``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

from bench.dataset import GUIDE, NAME, REPO, ROOT, TOKEN, make_tar, tar_on_hub
from bench.measure import Child, run_child, settle
from tests.fakes.hub import HubServer

# hf_xet's defaults, set explicitly: what the agent's process would hold without its own bound.
HF_XET_DEFAULTS = {
    "HF_XET_RECONSTRUCTION_DOWNLOAD_BUFFER_SIZE": "2gb",
    "HF_XET_RECONSTRUCTION_DOWNLOAD_BUFFER_PERFILE_SIZE": "512mb",
}
MODES = ("guide", "default", "agent")


def measure(
    hub: HubServer, scratch: Path, env: dict[str, str], mode: str, agent_env: dict[str, str] | None = None
) -> dict[str, Any]:
    python, work, hf_home = sys.executable, scratch / "work", scratch / "hf"
    settle(work, hf_home)
    hub.reset_log()
    if mode == "guide":
        child = run_child([python, "-c", GUIDE, REPO, NAME], {**env, "HF_HOME": str(hf_home)})
    else:
        fetch_env = {**env, "WORKDIR": str(work), "DATASET_REPO": REPO, "RUN_ARGS": "imgsz=640"}
        if mode == "default":
            fetch_env.update(HF_XET_DEFAULTS)
        elif agent_env:
            fetch_env.update(agent_env)
        child = run_child([python, "-m", "entrypoint", "fetch", "--json"], fetch_env)
    cas_bytes = hub.bytes_served(r"^/cas/xorbs/")
    settle(work, hf_home)
    return {"mode": mode, **_peaks(child), "cas_bytes": cas_bytes}


def _peaks(child: Child) -> dict[str, float]:
    return {
        "peak_rss_mib": round(child.peak_mib, 1),
        "peak_anon_mib": round(child.peak_anon_mib, 1),
        "wall_s": round(child.wall_s, 2),
    }


def write_checkpoint(path: Path, size: int) -> None:
    """A torch checkpoint of about ``size`` bytes of random weights (the agent inspects what it uploads)."""
    import torch

    weights = {f"layer{i}": torch.randint(0, 256, (min(1 << 26, size - at),), dtype=torch.uint8)
               for i, at in enumerate(range(0, size, 1 << 26))}  # fmt: skip
    torch.save({"epoch": 1, "model": weights}, path)


INPROCESS = """
import sys
from huggingface_hub import HfApi
HfApi().upload_file(path_or_fileobj=sys.argv[1], path_in_repo="weights/epoch_1.pt", repo_id=sys.argv[2])
"""


def measure_upload(gb: float, where: Path | None, base: dict[str, str]) -> list[dict[str, Any]]:
    scratch = Path(tempfile.mkdtemp(prefix="trainbox-xetmem-", dir=where))
    rows = []
    try:
        run_dir = scratch / "runs" / "exp"
        (run_dir / "weights").mkdir(parents=True)
        checkpoint = run_dir / "weights" / "epoch_1.pt"
        write_checkpoint(checkpoint, int(gb * 1e9))
        for mode in ("upload", "inprocess"):
            with HubServer(scratch / f"hub-{mode}") as hub:
                hub.add_token(TOKEN, REPO.split("/")[0], "write")
                repo = f"{REPO.split('/')[0]}/run"
                env = {
                    **base,
                    "HF_ENDPOINT": hub.url,
                    "HF_HUB_DISABLE_TELEMETRY": "1",
                    "HF_HUB_DISABLE_PROGRESS_BARS": "1",
                    "HF_TOKEN": TOKEN,
                    "OUTPUT_REPO": repo,
                    "WORKDIR": str(scratch / f"work-{mode}"),
                    "HF_HOME": str(scratch / f"hf-{mode}"),
                    "PYTHONPATH": str(ROOT),
                }
                if mode == "upload":
                    argv = [sys.executable, "-m", "entrypoint", "sync", "--once", str(run_dir)]
                else:
                    hub.create_repo(repo)
                    argv = [sys.executable, "-c", INPROCESS, str(checkpoint), repo]
                child = run_child(argv, env, tree=True)
                sent = sum(r.bytes_in for r in hub.find_requests("POST", r"^/cas/v1/xorbs/"))
            rows.append(
                {
                    "gb": gb,
                    "mode": mode,
                    **_peaks(child),
                    "child_peak_rss_mib": round(child.upload_child_peak_mib, 1),
                    "total_peak_rss_mib": round(child.together_peak_mib, 1),
                    "other_child_peak_rss_mib": round(child.other_peak_mib, 1),
                    "cas_bytes": sent,
                }
            )
        return rows
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gib", default="0.5,2,4", help="tar sizes in GiB (comma-separated)")
    parser.add_argument("--files-per-gib", type=int, default=4000, help="files in the tar per GiB")
    parser.add_argument("--modes", default=",".join(MODES))
    parser.add_argument("--upload-gb", default="0.1,0.5,1", help="checkpoint sizes in GB for `trainbox sync`")
    parser.add_argument("--scratch", type=Path, help="where to work (default: the temp dir)")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "xet_memory.json")
    parser.add_argument(
        "--agent-env", action="append", default=[], metavar="NAME=VALUE", help="set for the agent mode (a trial)"
    )
    args = parser.parse_args(argv)
    agent_env = dict(item.split("=", 1) for item in args.agent_env)
    sizes = [float(s) for s in args.gib.split(",") if s]
    modes = [m for m in args.modes.split(",") if m]
    if set(modes) - set(MODES):
        parser.error(f"--modes: some of {','.join(MODES)}")
    rows: list[dict[str, Any]] = []
    base = {key: value for key, value in os.environ.items() if not key.startswith(("HF_", "HUGGING"))}
    for gib in sizes:
        scratch = Path(tempfile.mkdtemp(prefix="trainbox-xetmem-", dir=args.scratch))
        try:
            tar = scratch / NAME
            print(f"{gib} GiB: building the tar…", file=sys.stderr)
            make_tar(tar, max(2, int(args.files_per_gib * gib)), int(gib * 1024**3))
            with tar_on_hub(scratch, tar) as (hub, env):
                for mode in modes:
                    print(f"{gib} GiB: {mode}…", file=sys.stderr)
                    row = measure(hub, scratch, env, mode, agent_env)
                    rows.append({"gib": gib, "tar_bytes": tar.stat().st_size, **row})
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
    for gb in [float(s) for s in args.upload_gb.split(",") if s]:
        print(f"{gb} GB checkpoint: sync…", file=sys.stderr)
        rows.extend(measure_upload(gb, args.scratch, base))
    report = {
        "benchmark": "xet_memory",
        "cas": "http (loopback)",
        "cpus": os.cpu_count(),
        "load_average_1m": round(os.getloadavg()[0], 2),
        "agent_env": agent_env,
        "rows": rows,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(table(report))
    return 0


def table(report: dict[str, Any]) -> str:
    by_size: dict[float, dict[str, dict[str, Any]]] = {}
    uploads = [row for row in report["rows"] if row["mode"] == "upload"]
    inprocess = {row["gb"]: row for row in report["rows"] if row["mode"] == "inprocess"}
    for row in report["rows"]:
        if row["mode"] not in ("upload", "inprocess"):
            by_size.setdefault(row["gib"], {})[row["mode"]] = row
    head = "| tar | " + " | ".join(f"{m}: peak RSS (MiB) / s" for m in MODES) + " |"
    lines = [head, "|" + "---|" * (len(MODES) + 1)]
    for gib, cells in by_size.items():
        values = [f"{cells[m]['peak_rss_mib']:.0f} / {cells[m]['wall_s']:.1f}" if m in cells else "–" for m in MODES]
        lines.append(f"| {gib:g} GiB | " + " | ".join(values) + " |")
    if uploads:
        lines += [
            "",
            "| checkpoint | `trainbox sync --once`: the agent, peak RSS (MiB) / s | its upload child | both at once"
            " | bytes to the CAS | one process (`upload_file`), peak RSS (MiB) / s |",
            "|---|---|---|---|---|---|",
        ]
        for row in uploads:
            alone = inprocess.get(row["gb"])
            before = f"{alone['peak_rss_mib']:.0f} / {alone['wall_s']:.1f}" if alone else "–"
            lines.append(
                f"| {row['gb']:g} GB | {row['peak_rss_mib']:.0f} / {row['wall_s']:.1f}"
                f" | {row['child_peak_rss_mib']:.0f} | {row['total_peak_rss_mib']:.0f}"
                f" | {row['cas_bytes']:,} | {before} |"
            )
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
