"""`trainbox plan` prices the run `trainbox run` would start: the same model, epochs and imgsz as its dry run, the
dataset it names (counted, or estimated from the tar's size, said so), the demo only where the run would train it
(said so), and every line from the one set of arguments."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from entrypoint import dryrun
from entrypoint.cli import main
from entrypoint.report import plan as planning
from entrypoint.settings import from_env
from tests.support import make_dataset

OPTIONS = {"model": "str", "epochs": "int", "imgsz": "str", "save_period": "int", "batch": "int"}


def run_plan(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, env: dict[str, str], *args: str):
    for key in ("DATASET_REPO", "RUN_ARGS", "PRICE_PER_HOUR"):
        monkeypatch.delenv(key, raising=False)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    main(["plan", *args, "--json"])
    return json.loads(capsys.readouterr().out)


def dry_run_training(env: dict[str, str]) -> dict[str, str]:
    """The dry run's ``training`` line as model, epochs and imgsz."""
    lines = dryrun.report(from_env(env, options=OPTIONS), env)
    (line,) = [line for line in lines if line.startswith("training ")]
    found = re.match(r"training +model (\S+), (\d+) epochs, imgsz (\S+)", line)
    assert found, line
    return {"model": found.group(1), "epochs": found.group(2), "imgsz": found.group(3)}


@pytest.mark.parametrize(
    "run_args",
    ["", "model=LibreYOLO9s.pt imgsz=640", "epochs=40 imgsz=480x640", "model=LibreYOLO9m.pt epochs=7"],
    ids=["libreyolo-defaults", "model-and-imgsz", "epochs-and-rectangle", "model-and-epochs"],
)
@pytest.mark.parametrize("dataset", ["demo", "folder"])
def test_plan_and_the_dry_run_agree_on_epochs_model_and_imgsz(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path, run_args: str, dataset: str
) -> None:
    env = {"WORKDIR": str(tmp_path / "work"), "PROVIDER": "none", "GPUS": "cpu", "RUN_ARGS": run_args}
    if dataset == "folder":
        env["DATASET_REPO"] = str(make_dataset(tmp_path / "cones").parent)
    planned = run_plan(capsys, monkeypatch, env, "--gpu", "L4")
    shown = dry_run_training(env)

    assert {key: str(planned["run"][key]) for key in ("model", "epochs", "imgsz")} == shown
    # every line of the plan prices that run: the cost and the disk's checkpoints alike
    assert planned["estimate"]["epochs"] == int(shown["epochs"]) == planned["disk"]["epochs"]
    assert planned["disk"]["model"] == shown["model"]


def test_libreyolos_defaults_where_run_args_name_none(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    folder = str(make_dataset(tmp_path / "cones", train=6).parent)
    env = {"WORKDIR": str(tmp_path / "work"), "PROVIDER": "none", "DATASET_REPO": folder}
    planned = run_plan(capsys, monkeypatch, env, "--gpu", "L40S")
    defaults = {"model": "yolox-s", "epochs": 300, "imgsz": "640"}  # libreyolo 1.6.0's `train`
    assert planned["run"] == {**defaults, "defaulted": ["model", "epochs", "imgsz"]}
    assert planned["dataset"]["images"] == 6 and "counted" in planned["dataset"]["basis"]
    # --epochs reaches the cost and the disk's checkpoints alike
    again = run_plan(capsys, monkeypatch, env, "--gpu", "L40S", "--epochs", "100")
    assert again["estimate"]["epochs"] == again["disk"]["epochs"] == again["run"]["epochs"] == 100


def test_it_says_plainly_when_it_prices_the_demo(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    env = {"WORKDIR": str(tmp_path / "work"), "PROVIDER": "none", "RUN_ARGS": "model=LibreYOLO9s.pt imgsz=640"}
    demo = run_plan(capsys, monkeypatch, env, "--gpu", "L40S")
    assert demo["run"]["epochs"] == 8 and demo["dataset"]["images"] == 240  # what `trainbox run` would train
    assert demo["dataset"]["basis"].startswith("DATASET_REPO is unset: pricing the bundled demo")
    # --images without DATASET_REPO: RUN_ARGS on a dataset that size, libreyolo's epochs, and why it is not the demo
    own = run_plan(capsys, monkeypatch, env, "--gpu", "L40S", "--images", "5000")
    assert (own["run"]["epochs"], own["estimate"]["images"], own["disk"]["epochs"]) == (300, 5000, 300)
    assert "`trainbox run` would train the bundled demo instead" in own["dataset"]["basis"]
    assert "not named" in own["disk"]["dataset"]


def test_a_tar_is_sized_into_images_and_the_disk_to_rent_is_the_templates() -> None:
    settings = from_env({"WORKDIR": "/w", "PROVIDER": "none", "DATASET_REPO": "acme/cones"}, options=OPTIONS)
    disk = {"tar_bytes": int(1.52e9)}
    images, basis = planning._images(settings, None, disk, None)
    assert images == 9988  # 1.52 GB at COCO's 18 GB / 118,287 images
    assert "about 9988 images at COCO train2017's 152 KB an image" in basis and "--images N" in basis
    from entrypoint.dataset.disk import DiskNeed

    assert DiskNeed(0, 0, int(2e9)).rent_gb(int(10e9)) == 55  # 2.5 x 10 GB + 30 GB, as templates/README.md says
    assert DiskNeed(int(60e9), int(90e9), 0).rent_gb(int(60e9)) == 195  # the need, when larger than the rule
