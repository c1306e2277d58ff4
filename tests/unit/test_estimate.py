"""What a run should cost: `trainbox plan`'s dollars from epochs, images, a GPU and its seconds per image (measured
or tabled, with the source), then the first epoch's measured pace in its place, in the log line and on the card."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from pathlib import Path

import pytest

from entrypoint.cli import main
from entrypoint.report import estimate, progress
from entrypoint.report.card_facts import card_info
from entrypoint.settings import from_env
from entrypoint.state import RunState

# YOLOv5s: 2 days on a V100 for 300 epochs of COCO's 118,287 training images
V100_S = 2 * 86400 / (300 * 118_287)


@pytest.fixture(autouse=True)
def _restore_logging() -> Iterator[None]:
    logger = logging.getLogger("trainbox")
    handlers, propagate, level = logger.handlers[:], logger.propagate, logger.level
    yield
    logger.handlers[:] = handlers
    logger.propagate = propagate
    logger.setLevel(level)


def test_the_tabled_figure_scales_the_published_v100_time_by_image_size_and_bandwidth() -> None:
    a100 = estimate.find_gpu("A100-80GB")
    assert a100 is not None and a100.price_per_hour == 2.50
    per_image, source = estimate.seconds_per_image(a100, "LibreYOLO9s.pt", 640)
    assert per_image == pytest.approx(V100_S * 900 / 2039)
    assert "YOLOv5 README" in source and "2039 GB/s" in source
    half, _ = estimate.seconds_per_image(a100, "LibreYOLO9s.pt", 320)
    assert half == pytest.approx(per_image / 4)
    tiny, _ = estimate.seconds_per_image(a100, "LibreYOLO9t.pt", 640)
    assert tiny == pytest.approx(per_image / 2)  # t is taken as YOLOv5n: 1 day
    unknown, said = estimate.seconds_per_image(a100, "hf://acme/weights/best.pt", 640)
    assert unknown == per_image and "model size unknown" in said


@pytest.mark.parametrize(
    ("reported", "name"),
    [
        ("NVIDIA H100 80GB HBM3", "H100"),
        ("NVIDIA H100 PCIe", "H100 PCIe"),
        ("NVIDIA A100-SXM4-80GB", "A100 80GB"),
        ("NVIDIA A100-SXM4-40GB", "A100 40GB"),
        ("NVIDIA L40S", "L40S"),
        ("NVIDIA L4", "L4"),
        ("Tesla T4", "T4"),
        ("NVIDIA GeForce RTX 4090", "RTX 4090"),
        ("NVIDIA A10G", "A10G"),
    ],
)
def test_cards_are_found_by_the_names_people_and_nvidia_smi_use(reported: str, name: str) -> None:
    found = estimate.find_gpu(reported)
    assert found is not None and found.name == name


def test_model_sizes() -> None:
    assert [estimate.model_size(m) for m in ("LibreYOLO9s.pt", "yolo9-t", "yolox-m", "LibreYOLO9e.pt")] == list("stme")
    assert estimate.model_size("best.pt") is None and estimate.model_size(None) is None


def test_the_dollars() -> None:
    found = estimate.Estimate(100, 5000, 0.002, "tabled", 2.0, "somewhere, 2026-05-07")
    assert found.seconds == pytest.approx(1000) and found.dollars == pytest.approx(1000 / 3600 * 2)
    assert found.as_dict()["dollars"] == 0.56 and estimate.from_record(found.as_dict()) == found
    assert found.line().startswith("estimate: ~$0.56 for 100 epochs of 5000 images (~17 min at $2.00/h)")
    assert estimate.from_record({"images": 5}) is None


def test_training_images_are_counted_from_the_data_yaml(tmp_path: Path) -> None:
    for index in range(3):
        (tmp_path / "images" / "train").mkdir(parents=True, exist_ok=True)
        (tmp_path / "images" / "train" / f"{index}.jpg").write_bytes(b"x")
    (tmp_path / "images" / "train" / "notes.txt").write_text("not an image")
    (tmp_path / "extra.txt").write_text("a.jpg\nb.jpg\n\n")
    (tmp_path / "data.yaml").write_text("path: .\ntrain: [images/train, extra.txt]\nval: images/val\nnames: [a]\n")
    assert estimate.train_images(tmp_path / "data.yaml") == 5
    (tmp_path / "bad.yaml").write_text("train: [unclosed")
    assert estimate.train_images(tmp_path / "bad.yaml") is None


def plan(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path, *args: str) -> str:
    monkeypatch.setenv("WORKDIR", str(tmp_path))
    monkeypatch.setenv("PROVIDER", "none")
    monkeypatch.setenv("RUN_ARGS", "model=LibreYOLO9s.pt imgsz=640")
    main(["plan", *args])
    return capsys.readouterr().out


def test_plan_prints_dollars_for_a_gpu_and_a_run(capsys, monkeypatch, tmp_path) -> None:
    out = plan(capsys, monkeypatch, tmp_path, "--gpu", "L40S", "--images", "5000", "--epochs", "100", "--disk-gb", "50")
    dollars = 100 * 5000 * V100_S * 900 / 864 / 3600 * 1.95
    assert f"cost: ~${dollars:.2f} for 100 epochs of 5000 images: ~42 min of training at $1.95/h (modal.com" in out
    assert "an estimate from 0.00507 s/image: YOLOv5 README" in out and "first epoch" in out


def test_plan_with_a_measured_figure_and_a_price_as_json(capsys, monkeypatch, tmp_path) -> None:
    args = ("--seconds-per-image", "0.01", "--price", "0.5", "--images", "1000", "--epochs", "36", "--disk-gb", "50")
    report = json.loads(plan(capsys, monkeypatch, tmp_path, *args, "--json"))["estimate"]
    assert report["training_hours"] == 0.1 and report["dollars"] == 0.05
    assert report["speed_source"] == "measured, --seconds-per-image" and report["price_source"] == "--price"


def test_plan_says_what_it_still_needs(capsys, monkeypatch, tmp_path) -> None:
    assert "cost: add --gpu NAME" in plan(capsys, monkeypatch, tmp_path, "--images", "10", "--disk-gb", "1")
    assert "cost: add --gpu NAME" in plan(capsys, monkeypatch, tmp_path)  # the disk's question reads them too
    assert "cost:" not in plan(capsys, monkeypatch, tmp_path, "--disk-gb", "1", "--storage-price", "0.2")
    monkeypatch.setenv("DATASET_REPO", "acme/cones")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    settings = from_env({"WORKDIR": str(tmp_path), "PROVIDER": "none", "DATASET_REPO": "acme/cones"}, options={})
    assert estimate.for_plan(settings, "L40S", None, None, None, None).startswith("add --images N")
    assert "no figures for GPU 'Voodoo2'" in str(estimate.for_plan(settings, "Voodoo2", None, None, 5, None))
    assert estimate.for_plan(settings, None, None, None, 5, None).startswith("add --gpu NAME")
    demo = from_env({"WORKDIR": str(tmp_path), "PROVIDER": "none"}, options={})
    found = estimate.for_plan(demo, "T4", None, None, None, None)
    assert isinstance(found, estimate.Estimate) and (found.images, found.epochs) == (240, 8)  # the demo, counted


@pytest.fixture
def job(tmp_path: Path) -> progress.Progress:
    env = {"WORKDIR": str(tmp_path), "PROVIDER": "none", "PRICE_PER_HOUR": "2", "RUN_ARGS": "epochs=10 imgsz=640"}
    settings = from_env(env, options={"epochs": "int", "imgsz": "int"})
    settings.run_dir.mkdir(parents=True)
    return progress.Progress(settings, RunState.load(settings.run_dir, settings.run_name))


def test_the_estimate_at_start_then_the_measured_pace_on_the_card(job, tmp_path, caplog) -> None:
    caplog.set_level(logging.INFO, logger="trainbox")
    data = tmp_path / "data"
    (data / "images" / "train").mkdir(parents=True)
    for index in range(50):
        (data / "images" / "train" / f"{index}.png").write_bytes(b"x")
    (data / "data.yaml").write_text(f"path: {data}\ntrain: images/train\nval: images/train\nnames: [a]\n")
    job.state.update(gpus={"gpus": [{"index": 0, "name": "NVIDIA A100-SXM4-80GB"}]}, cost={"price_per_hour": 2.0})
    job.estimate(data / "data.yaml")
    snapshot = job.state.snapshot()
    planned = snapshot["estimate"]
    assert (planned["epochs"], planned["images"], planned["price_per_hour"]) == (10, 50, 2.0)
    assert planned["seconds_per_image"] == pytest.approx(V100_S / 2 * 900 / 2039, rel=1e-3)  # the demo's 9t
    assert any(record.getMessage().startswith("estimate: ") for record in caplog.records)
    before = card_info(snapshot, [], repo_id=None, receipt=None, plot=False, total=10).cost_outlook
    assert before is not None and "an estimate until the first epoch is measured" in before
    rows = [{"epoch": 1, "time": 30.0}]
    after = card_info(snapshot, rows, repo_id=None, receipt=None, plot=False, total=10).cost_outlook
    # 10 epochs at the measured 30 s: 300 s at $2/h; 30 s for 50 images
    assert after == "Training all 10 epochs: ~$0.17 (~5 min at the measured 30 s/epoch, 0.6 s/image)."


def test_on_the_cpu_or_an_unknown_card_only_the_images_are_kept(job, tmp_path) -> None:
    (tmp_path / "d" / "images").mkdir(parents=True)
    (tmp_path / "d" / "images" / "a.jpg").write_bytes(b"x")
    (tmp_path / "d" / "data.yaml").write_text("train: images\nnames: [a]\n")
    job.estimate(tmp_path / "d" / "data.yaml")
    assert job.state.snapshot()["estimate"] == {"images": 1}
