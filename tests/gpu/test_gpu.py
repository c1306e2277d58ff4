"""On a real GPU machine: the whole GPU check, and a short real training on every GPU.

Run with ``pytest -m gpu -s tests/gpu`` to see the check's table in the output. Skipped, with
the reason, where there is no GPU (tests/gpu/conftest.py).
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support import Result, run_trainbox, trainbox_env

pytestmark = [pytest.mark.gpu, pytest.mark.slow]  # trains real models


@pytest.fixture(scope="module")
def check(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """`trainbox check --json` with GPUS=all, once for the module."""
    result = run_trainbox("check", "--json", env=trainbox_env(tmp_path_factory.mktemp("check")), timeout=600)
    assert result.returncode == 0, result.output[-3000:]
    return json.loads(result.stdout)


def test_check_proves_every_visible_gpu(check: dict[str, Any]) -> None:
    assert check["ok"] is True and "problem" not in check
    assert check["available"] is True
    assert re.fullmatch(r"\d+\.\d+(\.\d+)?", check["driver"] or ""), check["driver"]
    assert re.fullmatch(r"\d+\.\d+", check["cuda"] or ""), check["cuda"]
    assert check["arch_list"]
    assert len(check["gpus"]) == check["visible"] >= 1
    assert check["indices"] == [gpu["index"] for gpu in check["gpus"]]
    for gpu in check["gpus"]:
        assert gpu["name"] and re.fullmatch(r"sm_\d+", gpu["sm"])
        assert gpu["arch_supported"] is True
        assert 0 < gpu["free_gib"] <= gpu["total_gib"]
        assert gpu["matmul"]["ok"] is True and gpu["matmul"]["max_rel_error"] < 1e-3
        assert gpu["matmul"]["tflops_fp32"] > 0
        assert "error" not in gpu
    if len(check["gpus"]) > 1:
        assert check["all_reduce"]["ok"] is True, check["all_reduce"]
        assert check["all_reduce"]["busbw_gbps"] > 0
    else:
        assert "all_reduce" not in check


def test_check_prints_a_table(tmp_path: Path, check: dict[str, Any]) -> None:
    result = run_trainbox("check", env=trainbox_env(tmp_path), timeout=600)
    print(result.stdout)  # the record of what the check saw on this machine
    assert result.returncode == 0, result.output[-3000:]
    for gpu in check["gpus"]:
        row = next(line for line in result.stdout.splitlines() if line.startswith(f"{gpu['index']} "))
        assert gpu["name"] in row and "matmul ok" in row
    indices = ",".join(str(gpu["index"]) for gpu in check["gpus"])
    assert f"result    ok: training would use GPUs {indices}" in result.stdout


def test_the_check_leaves_no_process_on_the_gpus(check: dict[str, Any]) -> None:
    smi = shutil.which("nvidia-smi")
    if smi is None:
        pytest.skip("nvidia-smi is not installed")
    listed = subprocess.run(
        [smi, "--query-compute-apps=pid", "--format=csv,noheader"], capture_output=True, text=True, timeout=30
    ).stdout
    for pid in (line.strip() for line in listed.splitlines() if line.strip().isdigit()):
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue  # another container's process
        assert b"entrypoint.gpu.probe" not in cmdline


def test_gpus_selects_one_card(tmp_path: Path) -> None:
    result = run_trainbox("check", "--json", env=trainbox_env(tmp_path, GPUS="0"), timeout=600)
    assert result.returncode == 0, result.output[-3000:]
    report = json.loads(result.stdout)
    assert [gpu["index"] for gpu in report["gpus"]] == [0]
    assert "all_reduce" not in report


def test_a_gpu_the_machine_lacks_is_a_config_error(tmp_path: Path, check: dict[str, Any]) -> None:
    missing = check["visible"]
    result = run_trainbox("check", env=trainbox_env(tmp_path, GPUS=f"0,{missing}"), timeout=600)
    assert result.returncode == 10, result.output[-3000:]
    assert f"GPUS=0,{missing} names GPU {missing}" in result.stderr


@pytest.fixture(scope="module")
def demo_run(tmp_path_factory: pytest.TempPathFactory, check: dict[str, Any]) -> tuple[Result, Path]:
    """The bundled demo, two epochs, GPUS=all, once for the module: ``(result, workdir)``."""
    workdir = tmp_path_factory.mktemp("demo") / "work"
    result = run_trainbox("run", env=trainbox_env(workdir, GPUS="all", RUN_ARGS="epochs=2"), timeout=900)
    return result, workdir


def test_short_training_on_every_gpu(demo_run: tuple[Result, Path], check: dict[str, Any]) -> None:
    """device=0,…,n-1 and batch=-1 reach libreyolo, and the run finishes on the cards."""
    result, workdir = demo_run
    assert result.returncode == 0, result.output[-5000:]
    (state_file,) = (workdir / "runs").glob("*/trainbox.json")
    state = json.loads(state_file.read_text())
    assert state["phase"] == "done"
    assert state["gpus"]["checked"] is True
    assert [gpu["index"] for gpu in state["gpus"]["gpus"]] == check["indices"]
    argv = state["training"]["argv"]
    assert f"device={','.join(map(str, check['indices']))}" in argv
    assert "batch=-1" in argv
    run_dir = workdir / "runs" / state["run_name"]
    assert (run_dir / "weights" / "last.pt").stat().st_size > 0
    status = json.loads((run_dir / "status.json").read_text())
    assert status["state"] == "completed" and status["completed_epochs"] == 2
    assert "NO GPU FOUND" not in result.stderr
    assert f"GPU {check['indices'][0]}: " in result.stderr  # the check's summary in the run log


def test_batch_minus_one_is_sized_on_the_card(demo_run: tuple[Result, Path], check: dict[str, Any]) -> None:
    """libreyolo's AutoBatch ran on the GPU (not the CPU fallback that keeps 16) and chose a batch that
    splits across the GPUs; the figure is printed for the record."""
    result, workdir = demo_run
    assert result.returncode == 0, result.output[-3000:]
    (run_dir,) = (path.parent for path in (workdir / "runs").glob("*/trainbox.json"))
    logs = (run_dir / "console.log").read_text() + (run_dir / "train.log").read_text()
    chosen = re.search(r"AutoBatch: resolved global batch size = (\d+)", logs)
    assert chosen is not None, logs[-3000:]
    assert "non-CUDA device" not in logs
    batch = int(chosen.group(1))
    config = yaml.safe_load((run_dir / "train_config.yaml").read_text())
    assert config["batch"] == batch > 0
    assert batch % len(check["indices"]) == 0
    print(f"batch=-1 chose {batch} on {len(check['indices'])} GPU(s): {', '.join(g['name'] for g in check['gpus'])}")


def test_profile_gives_a_verdict_on_the_card(
    tmp_path: Path, demo_run: tuple[Result, Path], check: dict[str, Any]
) -> None:
    """PROFILE=1: `libreyolo profile run` on the first GPU before training; its verdict in trainbox.json.
    The profiler loads weights (it has no from-scratch mode): the demo run's own last.pt, as this machine
    cannot download the published ones."""
    _, demo_workdir = demo_run
    (last,) = (demo_workdir / "runs").glob("*/weights/last.pt")
    workdir = tmp_path / "work"
    env = trainbox_env(workdir, GPUS="all", PROFILE="1", RUN_ARGS=f"model={last} epochs=1")
    result = run_trainbox("run", env=env, timeout=900)
    assert result.returncode == 0, result.output[-5000:]
    (state_file,) = (workdir / "runs").glob("*/trainbox.json")
    verdict = json.loads(state_file.read_text()).get("profile")
    assert verdict is not None, result.output[-5000:]
    assert verdict["bound"], verdict
    assert isinstance(verdict["img_per_s"], (int, float)) and verdict["img_per_s"] > 0, verdict
    print(f"profile on GPU {check['indices'][0]}: {verdict}")


def test_a_batch_that_does_not_split_across_the_gpus_stops_before_training(
    tmp_path: Path, check: dict[str, Any]
) -> None:
    count = len(check["indices"])
    if count < 2:
        pytest.skip("one GPU: every batch splits")
    workdir = tmp_path / "work"
    env = trainbox_env(workdir, GPUS="all", RUN_ARGS=f"epochs=1 batch={4 * count + 1}")
    result = run_trainbox("run", env=env, timeout=600)
    assert result.returncode == 10, result.output[-3000:]
    assert f"does not divide by the {count} GPUs" in result.stderr
    (state_file,) = (workdir / "runs").glob("*/trainbox.json")
    assert "training" not in json.loads(state_file.read_text())["phases"]


def test_check_reports_the_host_with_every_figure_measured_on_the_card(check: dict[str, Any]) -> None:
    """The host report beside the GPU check (HOST_CHECK=warn): the GPU figures come from the check's child."""
    from entrypoint.host import datasheet, judge

    host = check["host"]
    print("\n".join(judge.lines(host)))  # the record of what this machine delivered
    assert [gpu["index"] for gpu in host["gpus"]] == [gpu["index"] for gpu in check["gpus"]]
    for gpu in host["gpus"]:
        assert gpu["bf16_tflops"]["measured"] > 0 and gpu["fp16_tflops"]["measured"] > 0
        assert gpu["copy_gbps"]["measured"] > 0
        card = datasheet.lookup(gpu["name"])
        if card is not None:  # a card of the table: its dense datasheet figure beside the measured one
            assert gpu["bf16_tflops"]["expected"] == card.bf16_tflops
        if shutil.which("nvidia-smi"):
            assert re.fullmatch(r"gen\d+ x\d+", gpu["pcie"]["current"]) and isinstance(gpu["throttle"], list)
    assert host["disk"]["write_mbps"]["measured"] > 0 and host["cpu_cores"]["measured"] >= 1
    assert isinstance(host["shortfalls"], list)
