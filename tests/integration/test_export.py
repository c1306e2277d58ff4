"""EXPORT end to end: refused up front, a failing export never fails the run, a real two-epoch training whose
ONNX file reaches the model repo, runs in ONNX Runtime and computes what the .pt computes (and the same file, its
head's weights doubled, does not)."""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from huggingface_hub import HfApi

from entrypoint import procs
from entrypoint.evaluation.rawcheck import RESULT as RAW_RESULT
from tests.hubfixtures import HubContext
from tests.integration.test_card import stand_in
from tests.support import TINY_RUN_ARGS, make_dataset, run_trainbox, start_trainbox, trainbox_env


def _warnings(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if " WARNING: " in line]


def standin_env(hub_ctx: HubContext, tmp_path: Path, workdir: Path, repo: str, **extra: str) -> dict[str, str]:
    """`trainbox run` on the CPU with the stand-in libreyolo (an epoch in 0.1 s), a tiny dataset, the test Hub."""
    return trainbox_env(
        workdir,
        HF_TOKEN=hub_ctx.token,
        HF_HUB_CACHE=str(hub_ctx.cache_dir),
        DATASET_REPO=str(make_dataset(tmp_path / "data").parent),
        OUTPUT_REPO=repo,
        GPUS="cpu",
        **extra,
        **stand_in(tmp_path, epoch_seconds=0.1),
    )


@pytest.mark.parametrize(
    ("extra", "line", "dry_run"),
    [
        ({"EXPORT": "foo"}, "EXPORT: format 'foo': unknown — use onnx, openvino, tensorrt, torchscript", False),
        ({"EXPORT": "foo"}, "EXPORT: format 'foo': unknown", True),
        ({"EXPORT": "onnx,tensorrt", "GPUS": "cpu"}, "EXPORT=tensorrt needs a GPU", False),
        ({"EXPORT": "openvino"}, "EXPORT=openvino needs openvino, which this image lacks", False),
    ],
)
def test_an_export_the_run_cannot_make_is_refused_before_the_dataset(
    tmp_path: Path, extra: dict[str, str], line: str, dry_run: bool
) -> None:
    if extra["EXPORT"] == "openvino" and importlib.util.find_spec("openvino") is not None:
        pytest.skip("openvino is installed here")
    env = trainbox_env(tmp_path / "work", DATASET_REPO="nobody/not-fetched", OUTPUT_REPO="nobody/model", **extra)
    result = run_trainbox("run", *(["--dry-run"] if dry_run else []), env=env, timeout=60)
    assert result.returncode == 10, result.output[-2000:]
    (said,) = result.stderr.splitlines()  # one line, before any step (the dataset's would log its own)
    assert line in said
    assert not (tmp_path / "work" / "data").exists()


@pytest.mark.slow  # `trainbox run` with the stand-in libreyolo
def test_a_failing_export_is_one_warning_and_the_run_still_succeeds(hub_ctx: HubContext, tmp_path: Path) -> None:
    repo = hub_ctx.repo_id("cones")
    workdir = tmp_path / "work"
    env = standin_env(
        hub_ctx,
        tmp_path,
        workdir,
        repo,
        RUN_ARGS=f"{TINY_RUN_ARGS} epochs=2",
        EXPORT="onnx",
        EVAL="1",
    )
    result = run_trainbox("run", env=env)
    assert result.returncode == 0, result.output[-3000:]
    (warning,) = [line for line in _warnings(result.stderr) if "export" in line]
    assert "export onnx: not published: libreyolo export onnx exited with 1" in warning
    (run_dir,) = (workdir / "runs").iterdir()
    record = json.loads((run_dir / "trainbox.json").read_text())["exports"]["onnx"]
    assert record["status"] == "failed" and "export_dep_missing" in record["why"]
    api = HfApi(endpoint=hub_ctx.url, token=hub_ctx.token)
    files = api.list_repo_files(repo)
    assert "weights/best.pt" in files and not any(name.endswith(".onnx") for name in files)
    assert (
        "| onnx | not published: libreyolo export onnx exited with 1"
        in hub_ctx.hub.file_bytes(repo, "README.md").decode()
    )
    config = json.loads(hub_ctx.hub.file_bytes(repo, "config.json"))
    assert config["names"] == ["red", "green", "blue"] and config["exports"] == {}


@pytest.mark.slow
@pytest.mark.contract  # libreyolo's own export, and its ONNX backend reading the file
def test_a_finished_run_publishes_a_scored_onnx_file_that_onnxruntime_runs(hub_ctx: HubContext, tmp_path: Path) -> None:
    import onnxruntime as ort

    repo = hub_ctx.repo_id("cones")
    data_yaml = make_dataset(tmp_path / "data", train=4, val=2)
    env = trainbox_env(
        tmp_path / "work",
        HF_TOKEN=hub_ctx.token,
        HF_HUB_CACHE=str(hub_ctx.cache_dir),
        DATASET_REPO=str(data_yaml.parent),
        OUTPUT_REPO=repo,
        GPUS="cpu",
        RUN_ARGS=f"{TINY_RUN_ARGS} epochs=2 batch=2",
        EXPORT="onnx",
        EVAL="1",
    )
    result = run_trainbox("run", env=env)
    assert result.returncode == 0, result.output[-3000:]
    assert not [line for line in _warnings(result.stderr) if "export" in line], result.stderr[-2000:]

    api = HfApi(endpoint=hub_ctx.url, token=hub_ctx.token)
    assert {"weights/best.pt", "weights/best.onnx", "config.json"} <= set(api.list_repo_files(repo))
    onnx_path = api.hf_hub_download(repo, "weights/best.onnx", cache_dir=hub_ctx.cache_dir)

    session = ort.InferenceSession(onnx_path, providers=["CPUExecutionProvider"])
    (model_input,) = session.get_inputs()
    assert model_input.shape == [1, 3, 64, 64]
    # Scored on the same split by the real `libreyolo val`: the export within 0.5 point of best.pt.
    evaluation = json.loads(hub_ctx.hub.file_bytes(repo, "eval.json"))
    assert evaluation["split"] == "val" and set(evaluation["files"]) == {"weights/best.pt", "weights/best.onnx"}
    pt, onnx = evaluation["files"]["weights/best.pt"], evaluation["files"]["weights/best.onnx"]
    assert abs(pt["map50_95"] - onnx["map50_95"]) <= 0.005
    # ...and computes what best.pt computes: the raw outputs of the split's images (both) within FP32's tolerance,
    # on a barely trained model the box-by-box comparison of the top detections once refused
    raw = onnx["raw_outputs"]
    assert raw["within"] is True and raw["images"] == 2 and (raw["atol"], raw["rtol"]) == (0.001, 0.001), raw
    assert 0 <= raw["max_abs_diff"] <= 0.001
    assert set(pt["per_class"]) == {"red", "green", "blue"} and pt["device"] == "cpu"
    assert isinstance(pt["ms_per_image"], float) and pt["ms_per_image"] > 0
    assert sum(map(sum, pt["confusion_matrix"]["matrix"])) >= sum(c["instances"] for c in pt["per_class"].values())
    card_text = hub_ctx.hub.file_bytes(repo, "README.md").decode()
    assert "### Exported models" in card_text and "| onnx | `weights/best.onnx` |" in card_text
    assert f'hf_hub_download("{repo}", "weights/best.onnx")' in card_text
    config = json.loads(hub_ctx.hub.file_bytes(repo, "config.json"))
    assert config["names"] == ["red", "green", "blue"] and config["imgsz"] == 64
    assert config["exports"] == {"onnx": "weights/best.onnx"}

    # The same check, by the same child, refuses that file with its detection head's weights doubled: a model this
    # barely trained scores about the same either way, its raw outputs give it away.
    best = api.hf_hub_download(repo, "weights/best.pt", cache_dir=hub_ctx.cache_dir)
    broken = _head_doubled(Path(onnx_path), tmp_path / "broken.onnx")
    images = sorted((data_yaml.parent / "images" / "val").iterdir())
    check = [sys.executable, "-m", "entrypoint.evaluation.rawcheck", "--weights", best, "--export", str(broken)]
    check += ["--format", "onnx", "--atol", "0.001", "--rtol", "0.001", "--images", *map(str, images)]
    done = subprocess.run(check, capture_output=True, text=True, timeout=600, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    (line,) = [row for row in done.stdout.splitlines() if row.startswith(RAW_RESULT)]
    refused = json.loads(line[len(RAW_RESULT) :])
    assert refused["within"] is False and refused["images"] == 2 and refused["max_abs_diff"] > 0.001, refused


def exporting(agent: int) -> list[int]:
    """The processes below ``agent``, once one of them runs ``libreyolo export``."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        below = procs.descendants(agent)
        for pid in below:
            with contextlib.suppress(OSError):
                if b"\0export\0--model\0" in Path(f"/proc/{pid}/cmdline").read_bytes():
                    return below
        time.sleep(0.05)
    raise AssertionError("the agent never ran its export")


def _head_doubled(source: Path, target: Path) -> Path:
    """A copy of an ONNX file whose detection head's convolution weights are doubled."""
    import numpy as np
    import onnx
    from onnx import numpy_helper

    model = onnx.load(str(source))
    head = {node.input[1] for node in model.graph.node if node.op_type == "Conv" and node.name.startswith("/head/")}
    assert head, "no /head/ convolutions in the exported graph"
    for weight in model.graph.initializer:
        if weight.name in head:
            doubled = numpy_helper.to_array(weight) * np.float32(2)
            weight.CopyFrom(numpy_helper.from_array(doubled, weight.name))
    onnx.save(model, str(target))
    return target


@pytest.mark.slow  # `trainbox run` with the stand-in libreyolo
def test_kill_9_during_an_export_then_a_restart_makes_it(hub_ctx: HubContext, tmp_path: Path) -> None:
    repo = hub_ctx.repo_id("cones")
    workdir = tmp_path / "work"
    env = standin_env(
        hub_ctx,
        tmp_path,
        workdir,
        repo,
        RUN_ARGS=f"{TINY_RUN_ARGS} epochs=1",
        EXPORT="onnx",
        EVAL="1",
        LEASE_PERIOD="4s",  # the killed agent's lease: the restart takes the run over after it
        FAKE_EXPORT_MODE="hang",
    )

    def killed_while_exporting() -> None:
        process = start_trainbox("run", env=env)
        assert process.stdout is not None
        for line in process.stdout:
            if " export --model " in line:
                break
        below = exporting(process.pid)  # the agent prints the command, then spawns it: once it runs
        process.kill()
        process.wait(timeout=30)
        for pid in below:  # the machine goes whole, as a container does: the export child with its agent
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)

    killed_while_exporting()  # the training's attempt
    (run_dir,) = (workdir / "runs").iterdir()
    assert "exports" not in json.loads((run_dir / "trainbox.json").read_text())
    killed_while_exporting()  # a start that found the run trained, killed too: what it carried stays on record

    again = run_trainbox("run", env=env | {"FAKE_EXPORT_MODE": "fail"})
    assert again.returncode == 0, again.output[-3000:]
    assert "already trained 1/1 epochs" in again.stderr
    record = json.loads((run_dir / "trainbox.json").read_text())["exports"]["onnx"]
    assert record["status"] == "failed" and "export_dep_missing" in record["why"]  # tried, not left out
    assert "| onnx | not published:" in hub_ctx.hub.file_bytes(repo, "README.md").decode()


@pytest.mark.slow  # `trainbox run` with the stand-in libreyolo
def test_sigterm_during_an_export_stops_it_and_the_final_upload_goes_on(hub_ctx: HubContext, tmp_path: Path) -> None:
    repo = hub_ctx.repo_id("cones")
    workdir = tmp_path / "work"
    env = standin_env(
        hub_ctx,
        tmp_path,
        workdir,
        repo,
        RUN_ARGS=f"{TINY_RUN_ARGS} epochs=1",
        EXPORT="onnx,torchscript",
        EVAL="1",
        FAKE_EXPORT_MODE="hang",  # its `libreyolo export` never ends
    )
    process = start_trainbox("run", env=env)
    assert process.stdout is not None
    seen = []
    for line in process.stdout:
        seen.append(line)
        if " export --model " in line:
            break
    time.sleep(0.5)  # the export child runs
    process.send_signal(signal.SIGTERM)
    rest, _ = process.communicate(timeout=60)
    output = "".join(seen) + rest
    assert process.returncode == 0, output[-3000:]  # the training had finished: the run is done, the extras cut
    assert "--format torchscript" not in output  # the next format is skipped, not started
    (run_dir,) = (workdir / "runs").iterdir()
    exports = json.loads((run_dir / "trainbox.json").read_text())["exports"]
    assert exports["onnx"]["why"] == "libreyolo export onnx stopped: the machine is being taken back (SIGTERM)"
    assert exports["onnx"]["status"] == "skipped"
    assert exports["torchscript"] == {"status": "skipped", "why": "the machine is being taken back (SIGTERM)"}
    assert "weights/best.pt" in HfApi(endpoint=hub_ctx.url, token=hub_ctx.token).list_repo_files(repo)

    # The next start finds the run trained, and makes the exports the SIGTERM cut (the stand-in's fail as
    # libreyolo's do without the format's package: each is tried, and its record says so).
    again = run_trainbox("run", env=env | {"FAKE_EXPORT_MODE": "fail"})
    assert again.returncode == 0, again.output[-3000:]
    assert "already trained 1/1 epochs" in again.stderr
    exports = json.loads((run_dir / "trainbox.json").read_text())["exports"]
    assert {name: record["status"] for name, record in exports.items()} == {"onnx": "failed", "torchscript": "failed"}
    assert "export_dep_missing" in exports["torchscript"]["why"]
    # Settled now: a third start tries neither again, and keeps their records for the card.
    third = run_trainbox("run", env=env | {"FAKE_EXPORT_MODE": "hang"})
    assert third.returncode == 0 and " export --model " not in third.output, third.output[-3000:]
    assert json.loads((run_dir / "trainbox.json").read_text())["exports"] == exports
    assert "| torchscript | not published:" in hub_ctx.hub.file_bytes(repo, "README.md").decode()
