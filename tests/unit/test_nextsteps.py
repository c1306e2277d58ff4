"""The last lines of a run: the weights, a prediction command, and the way to the Hub and one's own data."""

from __future__ import annotations

import shlex
from pathlib import Path

from entrypoint.report import nextsteps
from entrypoint.settings import Settings, from_env

TOKEN = "hf_nextStepsTestTokenValue1234567890"


def trained(tmp_path: Path, **env: str) -> Settings:
    settings = from_env({"WORKDIR": str(tmp_path / "my work"), "PROVIDER": "none"} | env)
    weights = settings.run_dir / "weights"
    weights.mkdir(parents=True)
    for name in ("best.pt", "last.pt"):
        (weights / name).write_bytes(b"weights")
    return settings


def test_a_local_demo_run_says_where_the_weights_are_and_how_to_go_on(tmp_path: Path) -> None:
    settings = trained(tmp_path)
    lines = nextsteps.lines(settings)
    assert all(line.startswith("next: ") for line in lines)
    assert str(settings.run_dir / "weights") in lines[0] and "best.pt" in lines[0]
    # the prediction runs on the demo's own validation images at the size it was trained at
    words = shlex.split(lines[1].split(": ", 2)[2])
    assert words[:2] == ["libreyolo", "predict"]
    assert f"model={settings.run_dir / 'weights' / 'best.pt'}" in words  # quoted: the path has a space
    assert f"source={settings.workdir / 'data' / 'demo' / 'images' / 'val'}" in words
    assert "imgsz=128" in words
    text = "\n".join(lines)
    assert f"trainbox sync --once {shlex.quote(str(settings.run_dir))}" in text
    assert "tar -cf data.tar" in text and "hf upload YOUR_ORG/my-data data.tar --repo-type dataset" in text
    assert "DATASET_REPO=YOUR_ORG/my-data" in text
    assert "Hub is not known" not in text


def test_a_run_with_an_output_repo_points_at_it_instead(tmp_path: Path) -> None:
    settings = trained(
        tmp_path,
        HF_TOKEN=TOKEN,
        OUTPUT_REPO="acme/model",
        DATASET_REPO=str(tmp_path),
        HF_ENDPOINT="http://127.0.0.1:9/",
    )
    lines = nextsteps.lines(settings)
    assert lines[-1] == "next: the run and its model card: http://127.0.0.1:9/acme/model"
    assert "source=IMAGE_OR_FOLDER" in lines[1]
    assert not any("trainbox sync" in line or "hf upload" in line for line in lines)
    assert TOKEN not in "\n".join(lines)


def test_no_weights_no_next_steps(tmp_path: Path) -> None:
    settings = from_env({"WORKDIR": str(tmp_path), "PROVIDER": "none"})
    assert nextsteps.lines(settings) == []
