"""Benchmark: how much the Dockerfile adds on top of its base image.

Builds (or reuses) the project image exactly as the container tests do: on ``TRAINBOX_TEST_BASE_IMAGE`` if
set, else on the offline stand-in for the PyTorch runtime image. Then reads the layers above the base from
`docker history` and sums them. Goal: <= 450 MB added.

Writes bench/results/image_layers.json and prints a Markdown table for docs/benchmarks.md.
Run from the repository root: ``python -m bench.image_layers``.
"""

from __future__ import annotations

import json
import platform
import re
import sys
import tempfile
import time
from pathlib import Path

from tests.container import images

ROOT = Path(__file__).resolve().parents[1]

GOAL_MB = 450
MB = 1000**2  # Docker reports sizes in SI units


def history(tag: str) -> list[dict]:
    """Layers, newest first, sizes in bytes."""
    out = images.docker("history", "--no-trunc", "--human=false", "--format", "{{json .}}", tag, check=True).stdout
    return [json.loads(line) for line in out.splitlines()]


def describe(created_by: str) -> str:
    """A Dockerfile step as `docker history` shows it, without the shell and build-arg prefixes."""
    text = re.sub(r"^\|\d+ (\S+=\S* )*", "", created_by)  # build args the step ran with
    text = text.split("#(nop)", 1)[-1].strip().removeprefix("/bin/bash -o pipefail -c").strip()
    text = re.sub(r"(COPY (?:file|dir)):\w+", r"\1", text)
    return (text[:60] + "…") if len(text) > 61 else text


def main() -> None:
    reason = images.engine_unavailable()
    if reason:
        sys.exit(reason)
    base = images.base_image()
    with tempfile.TemporaryDirectory() as scratch:
        tag = images.project_image(base, Path(scratch) / "build.log")
    ours = history(tag)
    added = ours[: len(ours) - len(history(base))]
    layers = [{"bytes": int(layer["Size"]), "step": describe(layer["CreatedBy"])} for layer in reversed(added)]
    total = sum(layer["bytes"] for layer in layers)
    result = {
        "image": tag,
        "base": base,
        "added_bytes": total,
        "goal_bytes": GOAL_MB * MB,
        "layers": [layer for layer in layers if layer["bytes"]],
        "date": time.strftime("%Y-%m-%d"),
        "machine": f"{platform.machine()}, Python {platform.python_version()}",
    }
    out = ROOT / "bench" / "results" / "image_layers.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")

    print("| layer | size | goal |\n|---|---|---|")
    for layer in result["layers"]:
        print(f"| `{layer['step']}` | {layer['bytes'] / MB:.0f} MB |  |")
    print(f"| **added over the base** | **{total / MB:.0f} MB** | ≤ {GOAL_MB} MB |")
    print(f"\nbase: {base}; {result['date']}, {result['machine']}")


if __name__ == "__main__":
    main()
