"""On a GPU machine: a realistic training (2000 generated 640-px images, YOLO9-s) fed three ways: the agent's
choice of workers and cache, the agent with libreyolo's defaults, and bare `libreyolo train`; images/s and the
GPU's busy fraction of each, with the card's name (bench/feeding.py --device gpu; the table goes to
docs/benchmarks.md). Skipped, with the reason, where there is no GPU (tests/gpu/conftest.py).

The figures are recorded, not asserted (speed goals live in bench/): the test proves the three runs train and
that the agent fed the GPU as it says, its choice in trainbox.json and on the command line."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from bench import feeding
from entrypoint.host import grant
from entrypoint.training import sizing

pytestmark = [pytest.mark.gpu, pytest.mark.slow]  # trains real models
IMAGES = 2000


def test_the_agents_feeding_against_libreyolos_defaults_and_bare_libreyolo(tmp_path: Path) -> None:
    out = Path(os.environ.get("GPU_RESULTS_DIR") or tmp_path) / "feeding-gpu.json"
    report = feeding.main(["--device", "gpu", "--images", str(IMAGES), "--epochs", "3", "--out", str(out)])
    print(f"\n{report['gpu']}, {report['machine']}: results in {out}")

    agent, defaults, bare = report["runs"]
    assert "sizing" not in bare  # libreyolo alone: no agent, its own defaults
    assert [run["name"] for run in report["runs"]] == ["agent", "agent, libreyolo's defaults", "bare libreyolo train"]
    for run in report["runs"]:
        assert run["images_per_s"] > 0 and len(run["epoch_s"]) == 3, run
        assert run["gpu_busy"] is not None and 0 <= run["gpu_busy"] <= 1, run
    # the agent's own choice: workers from the CPUs of this machine, one left for it; no RAM cache with workers
    expected = sizing.workers(grant.cpus(), 1, on_gpu=True)
    assert agent["sizing"]["workers"] == {
        "value": expected,
        "source": "sized",
        "why": agent["sizing"]["workers"]["why"],
    }
    assert f"workers={expected}" in agent["argv"] and agent["sizing"]["cache"]["value"] is None
    assert agent["sizing"]["threads"]["per_process"] == grant.cpus().cpus
    assert defaults["sizing"]["workers"]["source"] == "RUN_ARGS" and "workers=8" in defaults["argv"]
