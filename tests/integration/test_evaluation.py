"""The evaluation end to end, the real agent against the test Hub with the stand-in libreyolo (whose model has
learnt the validation split by heart): a test split labelled otherwise is truly what is scored, a dataset without
one says "validation", an export that does not score like best.pt is not published, and `trainbox eval --repo`
prints the numbers the box wrote."""

from __future__ import annotations

import json
import shutil
import signal
from pathlib import Path

import pytest
from huggingface_hub import HfApi

from tests.hubfixtures import HubContext
from tests.integration.test_export import standin_env
from tests.support import TINY_RUN_ARGS, make_dataset, run_trainbox, start_trainbox

pytestmark = pytest.mark.slow  # `trainbox run` with the stand-in libreyolo


def with_test_split(root: Path) -> Path:
    """make_dataset's set with a test split: the validation images again, every class label moved by one."""
    data_yaml = make_dataset(root)
    shutil.copytree(root / "images" / "val", root / "images" / "test")
    (root / "labels" / "test").mkdir()
    for label in (root / "labels" / "val").iterdir():
        rows = [row.split() for row in label.read_text().splitlines() if row.strip()]
        moved = [" ".join([str((int(row[0]) + 1) % 3), *row[1:]]) for row in rows]
        (root / "labels" / "test" / label.name).write_text("\n".join(moved) + "\n")
    data_yaml.write_text(data_yaml.read_text() + "test: images/test\n")
    return data_yaml


def _run(hub_ctx: HubContext, tmp_path: Path, data_yaml: Path, repo: str, **extra: str) -> dict[str, str]:
    scored = {"EVAL": "1"} | extra
    env = standin_env(hub_ctx, tmp_path, tmp_path / "work", repo, RUN_ARGS=f"{TINY_RUN_ARGS} epochs=2", **scored)
    env["DATASET_REPO"] = str(data_yaml.parent)
    result = run_trainbox("run", env=env)
    assert result.returncode == 0, result.output[-3000:]
    return env | {"_stderr": result.stderr}


def test_the_test_split_is_what_is_scored_and_trainbox_eval_prints_the_same(
    hub_ctx: HubContext, tmp_path: Path
) -> None:
    repo = hub_ctx.repo_id("held-out")
    env = _run(hub_ctx, tmp_path, with_test_split(tmp_path / "held-out-data"), repo, EXPORT="off")
    assert "dataset: the model will be scored on its test split" in env["_stderr"], env["_stderr"][-6000:]
    (line,) = [row for row in env["_stderr"].splitlines() if "evaluation weights/best.pt:" in row]
    assert "scored on the test split" in line
    evaluation = json.loads(hub_ctx.hub.file_bytes(repo, "eval.json"))
    assert evaluation["split"] == "test"
    best = evaluation["files"]["weights/best.pt"]
    # Every box in its place, every class wrong: the validation split would have scored 1.0.
    assert best["map50_95"] == 0.0 and best["recall"] == 0.0
    matrix = best["confusion_matrix"]["matrix"]
    assert sum(matrix[i][i] for i in range(3)) == 0 and sum(matrix[(i + 2) % 3][i] for i in range(3)) > 0
    state = json.loads(hub_ctx.hub.file_bytes(repo, "trainbox.json"))
    assert state["evaluation"]["settled"] and state["evaluation"]["split"] == "test"
    card_text = hub_ctx.hub.file_bytes(repo, "README.md").decode()
    assert (
        "Scored on the test split." in card_text and "![Confusion matrix of best.pt](confusion_matrix.png)" in card_text
    )

    env.pop("_stderr")
    shown = run_trainbox("eval", "--repo", repo, "--json", env=env)
    assert shown.returncode == 0, shown.output[-3000:]
    again = json.loads(shown.stdout)
    assert again["split"] == "test" and again["files"]["weights/best.pt"] == best
    table = run_trainbox("eval", "--repo", repo, env=env)
    assert "scored on the test split" in table.stdout and "weights/best.pt" in table.stdout
    val_only = make_dataset(tmp_path / "val-only").parent
    missing = run_trainbox("eval", "--repo", repo, "--dataset", str(val_only), "--split", "test", env=env)
    assert missing.returncode == 24, missing.output[-2000:]
    assert "the dataset has no test split (it has: val) — use --split val" in missing.stderr.splitlines()[-1]
    renamed = make_dataset(tmp_path / "renamed").parent
    (renamed / "data.yaml").write_text((renamed / "data.yaml").read_text().replace("blue", "purple"))
    other = run_trainbox("eval", "--repo", repo, "--dataset", str(renamed), env=env)
    assert other.returncode == 26, other.output[-2000:]
    assert "are not the model's (red, green, blue)" in other.stderr.splitlines()[-1]


def test_trainbox_eval_downloads_and_scores_a_folder_export(hub_ctx: HubContext, tmp_path: Path) -> None:
    """An OpenVINO export is a folder (its .xml, .bin and metadata): `trainbox eval --repo` brings every file under
    it down and scores the folder. (The stand-in libreyolo scores it as libreyolo would load it: a folder holding an
    .xml; this venv has no OpenVINO runtime to make or run a real one.)"""
    repo = hub_ctx.repo_id("folder-export")
    env = _run(hub_ctx, tmp_path, make_dataset(tmp_path / "own-data"), repo, EXPORT="off")
    env.pop("_stderr")
    folder = "weights/best_openvino"
    evaluation = json.loads(hub_ctx.hub.file_bytes(repo, "eval.json"))
    evaluation["files"][folder] = evaluation["files"]["weights/best.pt"]  # as a box that made it writes it
    files = {
        f"{folder}/best.xml": b"<net/>\n",
        f"{folder}/best.bin": b"\0" * 4096,
        f"{folder}/metadata.yaml": b"a: 1\n",
    }
    hub_ctx.hub.commit(repo, files | {"eval.json": json.dumps(evaluation).encode()}, message="an OpenVINO export")

    shown = run_trainbox("eval", "--repo", repo, "--json", env=env)
    assert shown.returncode == 0, shown.output[-3000:]
    assert " WARNING: " not in shown.stderr, shown.stderr[-3000:]
    again = json.loads(shown.stdout)
    assert set(again["files"]) == {"weights/best.pt", folder}
    assert again["files"][folder]["map50_95"] == 1.0  # the stand-in, given the folder, scored it
    assert f"/files/{folder} --data " in shown.stderr  # libreyolo val given the folder itself
    table = run_trainbox("eval", "--repo", repo, env=env)
    (row,) = [line for line in table.stdout.splitlines() if line.startswith(folder)]
    assert row.endswith("0.0 MB")  # the folder's files summed (4 KiB)


def test_without_a_test_split_the_validation_split_is_scored_and_said_so(hub_ctx: HubContext, tmp_path: Path) -> None:
    repo = hub_ctx.repo_id("val-only")
    env = _run(hub_ctx, tmp_path, make_dataset(tmp_path / "own-data"), repo, EXPORT="off")
    evaluation = json.loads(hub_ctx.hub.file_bytes(repo, "eval.json"))
    assert evaluation["split"] == "val"
    assert evaluation["files"]["weights/best.pt"]["map50_95"] == 1.0  # the stand-in knows this split by heart
    card_text = hub_ctx.hub.file_bytes(repo, "README.md").decode()
    assert "Scored on the validation split (also used to pick best.pt)." in card_text
    assert "validation split (also used to pick best.pt)" in env["_stderr"]


def test_eval_0_scores_nothing_and_refuses_an_export_it_could_not_judge(hub_ctx: HubContext, tmp_path: Path) -> None:
    repo = hub_ctx.repo_id("unscored")
    env = _run(hub_ctx, tmp_path, with_test_split(tmp_path / "held-out-data"), repo, EXPORT="off", EVAL="0")
    assert "the model will not be scored (EVAL=0)" in env["_stderr"]
    assert "evaluation weights/best.pt" not in env["_stderr"]
    files = HfApi(endpoint=hub_ctx.url, token=hub_ctx.token).list_repo_files(repo)
    assert "weights/best.pt" in files and "eval.json" not in files
    refused = run_trainbox("run", env=env | {"EXPORT": "onnx", "_stderr": ""})
    assert refused.returncode == 10, refused.output[-2000:]
    (said,) = refused.stderr.splitlines()
    assert "EVAL=0 with EXPORT=onnx: an export is published only once it scored like best.pt" in said
    assert "set EXPORT=off as well" in said


def test_an_export_that_does_not_score_like_best_pt_is_not_published(hub_ctx: HubContext, tmp_path: Path) -> None:
    repo = hub_ctx.repo_id("drift")
    env = _run(
        hub_ctx,
        tmp_path,
        make_dataset(tmp_path / "data"),
        repo,
        EXPORT="onnx",
        FAKE_EXPORT_MODE="ok",
        FAKE_EXPORT_DRIFT="0.5",
    )
    (warning,) = [line for line in env["_stderr"].splitlines() if " WARNING: " in line and "export" in line]
    assert "export onnx: not published: mAP50-95" in warning and "against best.pt's 100.00" in warning
    files = HfApi(endpoint=hub_ctx.url, token=hub_ctx.token).list_repo_files(repo)
    assert "weights/best.onnx" not in files
    state = json.loads(hub_ctx.hub.file_bytes(repo, "trainbox.json"))
    assert state["exports"]["onnx"]["status"] == "failed" and "allowed ± 0.50" in state["exports"]["onnx"]["why"]
    evaluation = json.loads(hub_ctx.hub.file_bytes(repo, "eval.json"))
    assert set(evaluation["files"]) == {"weights/best.pt"}
    assert json.loads(hub_ctx.hub.file_bytes(repo, "config.json"))["exports"] == {}


def test_an_export_that_scores_like_best_pt_is_published_with_its_score(hub_ctx: HubContext, tmp_path: Path) -> None:
    repo = hub_ctx.repo_id("same")
    _run(hub_ctx, tmp_path, make_dataset(tmp_path / "own-data"), repo, EXPORT="onnx", FAKE_EXPORT_MODE="ok")
    evaluation = json.loads(hub_ctx.hub.file_bytes(repo, "eval.json"))
    assert set(evaluation["files"]) == {"weights/best.pt", "weights/best.onnx"}
    state = json.loads(hub_ctx.hub.file_bytes(repo, "trainbox.json"))
    assert state["exports"]["onnx"]["status"] == "published"
    assert "against best.pt's 100.00 on the same split" in state["exports"]["onnx"]["check"]
    # its raw outputs compared with best.pt's on the split's first images (all 4 here), at FP32's tolerance
    raw = {"images": 4, "max_abs_diff": 0.0, "atol": 0.001, "rtol": 0.001, "within": True}
    assert evaluation["files"]["weights/best.onnx"]["raw_outputs"] == raw == state["exports"]["onnx"]["raw_outputs"]
    card_text = hub_ctx.hub.file_bytes(repo, "README.md").decode()
    assert "| max Δ 0 (atol 0.001, rtol 0.001) |" in card_text  # the evaluation's table
    assert "raw outputs: max Δ 0 on 4 image(s) (atol 0.001, rtol 0.001) |" in card_text  # the exports' table


def test_an_export_whose_raw_outputs_differ_is_not_published_though_it_scores_the_same(
    hub_ctx: HubContext, tmp_path: Path
) -> None:
    repo = hub_ctx.repo_id("raw-drift")
    env = _run(
        hub_ctx,
        tmp_path,
        make_dataset(tmp_path / "own-data"),
        repo,
        EXPORT="onnx",
        FAKE_EXPORT_MODE="ok",
        FAKE_RAW_DIFF="0.5",
    )
    (warning,) = [line for line in env["_stderr"].splitlines() if " WARNING: " in line and "export" in line]
    assert (
        "export onnx: not published: mAP50-95 100.00 against best.pt's 100.00 on the same split (Δ 0.00 points,"
        " allowed ± 0.50); raw outputs: max Δ 0.5 on 4 image(s) (atol 0.001, rtol 0.001), outside"
    ) in warning
    assert "weights/best.onnx" not in HfApi(endpoint=hub_ctx.url, token=hub_ctx.token).list_repo_files(repo)
    record = json.loads(hub_ctx.hub.file_bytes(repo, "trainbox.json"))["exports"]["onnx"]
    assert record["status"] == "failed" and record["raw_outputs"]["within"] is False
    assert record["raw_outputs"]["max_abs_diff"] == 0.5
    assert set(json.loads(hub_ctx.hub.file_bytes(repo, "eval.json"))["files"]) == {"weights/best.pt"}


def test_a_sigterm_during_the_evaluation_then_a_restart_scores_without_training(
    hub_ctx: HubContext, tmp_path: Path
) -> None:
    repo = hub_ctx.repo_id("preempted")
    workdir = tmp_path / "work"
    env = standin_env(
        hub_ctx,
        tmp_path,
        workdir,
        repo,
        RUN_ARGS=f"{TINY_RUN_ARGS} epochs=1",
        EXPORT="off",
        EVAL="1",
        FAKE_VAL_MODE="hang",
    )
    process = start_trainbox("run", env=env)
    assert process.stdout is not None
    for line in process.stdout:
        if " val --model " in line:
            break
    process.send_signal(signal.SIGTERM)
    process.communicate(timeout=60)
    (run_dir,) = (workdir / "runs").iterdir()
    assert not json.loads((run_dir / "trainbox.json").read_text())["evaluation"]["settled"]
    assert not (run_dir / "eval.json").exists()

    again = run_trainbox("run", env=env | {"FAKE_VAL_MODE": "ok"})
    assert again.returncode == 0, again.output[-3000:]
    assert "already trained 1/1 epochs" in again.stderr and " train model=" not in again.stderr
    assert json.loads((run_dir / "trainbox.json").read_text())["evaluation"]["settled"]
    assert json.loads(hub_ctx.hub.file_bytes(repo, "eval.json"))["split"] == "val"
