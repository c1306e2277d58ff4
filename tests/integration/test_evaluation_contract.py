"""What the evaluation assumes of libreyolo, checked against libreyolo itself: a prediction's ``image_id`` is the
image's index in the split as libreyolo lists it; a folder export (OpenVINO's) is scored as a folder."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest
from PIL import Image

from entrypoint import libreyolo
from entrypoint.evaluation import split
from tests.hubfixtures import HubContext
from tests.integration.test_run import two_epoch_run
from tests.support import run_trainbox, trainbox_env


@pytest.mark.contract
def test_the_split_lists_its_images_in_libreyolos_order(tmp_path: Path) -> None:
    from libreyolo.data.utils import get_img_files

    folder = tmp_path / "images" / "test"
    for name in ("b.png", "a.JPG", "sub/c.jpg", "z.webp", "notes.txt", "sub/deeper/0.png"):
        path = folder / name
        path.parent.mkdir(parents=True, exist_ok=True)
        if name.endswith(".txt"):
            path.write_text("not an image\n")
        else:
            Image.new("RGB", (8, 8)).save(path, format="PNG")
    listing = tmp_path / "test.txt"
    listing.write_text("images/test/z.webp\n# a comment\nimages/test/b.png\n")
    for entry in (folder, listing, [str(folder), str(listing)]):
        wanted = get_img_files(entry if isinstance(entry, list) else str(entry))
        assert split.listed(entry, tmp_path) == [Path(p) for p in wanted], entry


@pytest.mark.slow
@pytest.mark.contract  # libreyolo's OpenVINO export, and `libreyolo val` loading the folder
def test_trainbox_eval_scores_a_real_openvino_folder_from_the_hub(hub_ctx: HubContext, tmp_path: Path) -> None:
    """A repo whose export is a folder (OpenVINO's IR: model.xml, model.bin, metadata.yaml), made by libreyolo from
    the shared two-epoch run's best.pt: `trainbox eval --repo` brings the folder down whole and scores it."""
    pytest.importorskip("openvino")
    trained = two_epoch_run()
    stage = tmp_path / "repo"
    (stage / "weights").mkdir(parents=True)
    shutil.copy2(trained.run_dir / libreyolo.BEST_CHECKPOINT, stage / libreyolo.BEST_CHECKPOINT)
    argv = [libreyolo.executable(), "export", "--model", str(stage / libreyolo.BEST_CHECKPOINT), "--format"]
    argv += ["openvino", "--imgsz", "64", "--device", "cpu", "--json"]
    made = subprocess.run(argv, cwd=tmp_path, capture_output=True, text=True, timeout=600, check=False)
    assert made.returncode == 0, made.stderr[-3000:]
    folder = tmp_path / json.loads(made.stdout.strip().splitlines()[-1])["output_path"]
    assert folder.is_dir() and any(folder.glob("*.xml")), folder
    shutil.move(str(folder), stage / "weights" / "best_openvino")
    config = {"names": ["red", "green", "blue"], "imgsz": 64, "exports": {"openvino": "weights/best_openvino"}}
    (stage / "config.json").write_text(json.dumps(config))
    repo = hub_ctx.repo_id("openvino-folder")
    api = hub_ctx.api()
    api.create_repo(repo, exist_ok=True)
    api.upload_folder(folder_path=str(stage), repo_id=repo)

    env = trainbox_env(tmp_path / "work", HF_TOKEN=hub_ctx.token, HF_HUB_CACHE=str(hub_ctx.cache_dir))
    dataset = trained.env["DATASET_REPO"]
    shown = run_trainbox("eval", "--repo", repo, "--dataset", dataset, "--device", "cpu", "--json", env=env)
    assert shown.returncode == 0, shown.output[-3000:]
    files = json.loads(shown.stdout)["files"]
    assert set(files) == {"weights/best.pt", "weights/best_openvino"}, shown.output[-3000:]
    pt, openvino = files["weights/best.pt"], files["weights/best_openvino"]
    assert abs(pt["map50_95"] - openvino["map50_95"]) <= 0.005
    assert isinstance(openvino["ms_per_image"], float) and openvino["ms_per_image"] > 0
