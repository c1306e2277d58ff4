"""MONITOR=1: libreyolo's dashboard answers during training and is gone afterwards."""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path

import pytest

from entrypoint.training.monitor import MONITOR_PORT
from tests.support import TINY_RUN_ARGS, make_dataset, start_trainbox, trainbox_env

pytestmark = pytest.mark.contract  # `trainbox run` with a real training: MONITOR=1 is passed on to libreyolo


def runs_listed(port: int) -> list | None:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/runs", timeout=1) as response:
            return json.loads(response.read())
    except OSError:
        return None


def test_dashboard_runs_beside_training(tmp_path: Path) -> None:
    data = make_dataset(tmp_path / "cones", train=16)
    env = trainbox_env(tmp_path / "work", DATASET_REPO=str(data.parent), GPUS="cpu", MONITOR="1",
                       RUN_ARGS=f"{TINY_RUN_ARGS} epochs=6")  # fmt: skip
    process = start_trainbox("run", env=env)
    seen = None
    try:
        while process.poll() is None and seen is None:
            # libreyolo moves to the next port when 8420 is taken
            for port in range(MONITOR_PORT, MONITOR_PORT + 20):
                listed = runs_listed(port)
                if listed and "cones-" in json.dumps(listed):
                    seen = port
                    break
        output, _ = process.communicate(timeout=600)
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode == 0, output[-2000:]
    assert seen is not None, "the dashboard never listed the run"
    assert runs_listed(seen) is None, "the dashboard outlived the job"
