"""What a person opens after a run: the model card, the plot, the receipt and the log.

The stand-in libreyolo (tests/fakes/libreyolo.py) trains: its ``metrics.jsonl`` rows carry the columns the card
and the plot read, which test_run.py checks real libreyolo writes (the contract lane).
"""

from __future__ import annotations

import io
import json
import re
import time
from pathlib import Path

import pytest
from huggingface_hub import ModelCard, metadata_load
from PIL import Image

from entrypoint.report import card, plot
from entrypoint.report.receipt import PARTS
from tests.fakes import libreyolo as fake_libreyolo
from tests.fakes import rawcheck as fake_rawcheck
from tests.hubfixtures import HubContext
from tests.integration.test_dataset_hub import dataset_tar, publish
from tests.support import TINY_RUN_ARGS, run_trainbox, trainbox_env

pytestmark = pytest.mark.slow  # `trainbox run` with the stand-in libreyolo

# trainbox.json gives the receipt's parts and its billed time to the hundredth of a second each: on a run of a
# second or two, the rounding alone is a few percent of the bill.
ROUNDING = 0.005 * (len(PARTS) + 1)


def stand_in(tmp_path: Path, epoch_seconds: float = 0.2) -> dict[str, str]:
    """The environment that makes the agent run the stand-in libreyolo, ``epoch_seconds`` an epoch."""
    return {
        "TRAINBOX_LIBREYOLO": str(fake_libreyolo.install(tmp_path / "bin")),
        "TRAINBOX_RAW_CHECK": str(fake_rawcheck.install(tmp_path / "bin")),
        "FAKE_EPOCH_SECONDS": str(epoch_seconds),
    }


USER_CARD = """---
license: mit
tags:
- cones
---

# Cone detector

Written by hand before the run; Trainbox must keep this line.
"""


def test_three_epochs_leave_a_card_a_plot_a_receipt_and_a_readable_log(hub_ctx: HubContext, tmp_path: Path) -> None:
    hub = hub_ctx.hub
    data_repo = publish(hub_ctx, {"cones.tar": dataset_tar(tmp_path)})
    repo = hub_ctx.repo_id("cones-yolo")
    hub.create_repo(repo, private=True)
    hub.commit(repo, {"README.md": USER_CARD.encode()}, message="the user's own card")
    workdir = tmp_path / "work"
    env = trainbox_env(
        workdir,
        HF_TOKEN=hub_ctx.token,
        HF_HUB_CACHE=str(hub_ctx.cache_dir),
        DATASET_REPO=data_repo,
        OUTPUT_REPO=repo,
        GPUS="cpu",
        PRICE_PER_HOUR="2.5",
        RUN_ARGS=f"{TINY_RUN_ARGS} epochs=3",
        EVAL="1",  # the card's scores
        **stand_in(tmp_path, epoch_seconds=2),  # long enough for the log to see each epoch, as a real one
    )
    started = time.time()
    result = run_trainbox("run", env=env)
    wall = time.time() - started
    assert result.returncode == 0, result.output[-3000:]
    (run_dir,) = (workdir / "runs").iterdir()
    state = json.loads((run_dir / "trainbox.json").read_text())
    rows = plot.read_rows(run_dir / "metrics.jsonl")
    assert [row["epoch"] for row in rows] == [1, 2, 3]

    # The card on the Hub parses, with our metadata merged into the user's, and their text kept.
    readme = tmp_path / "README.md"
    readme.write_bytes(hub.file_bytes(repo, "README.md"))
    meta = metadata_load(readme)
    assert meta is not None
    assert meta["library_name"] == "libreyolo" and meta["license"] == "mit"
    assert {"cones", "libreyolo", "object-detection"} <= set(meta["tags"])
    assert meta["datasets"] == [data_repo]
    loaded = ModelCard.load(readme)
    assert "Written by hand before the run; Trainbox must keep this line." in loaded.text
    assert loaded.text.count(card.BEGIN) == 1 and "**State: done** after 3/3 epochs" in loaded.text
    (result_entry,) = meta["model-index"][0]["results"]
    assert result_entry["dataset"]["revision"] == state["dataset"]["revision"]
    metrics = {metric["name"]: metric["value"] for metric in result_entry["metrics"]}
    # best.pt's score at the end (eval.json), on the split it names: this dataset has no test split.
    scored = json.loads(hub.file_bytes(repo, "eval.json"))
    assert result_entry["dataset"]["split"] == scored["split"] == "val"
    assert metrics == {
        "mAP50": scored["files"]["weights/best.pt"]["map50"],
        "mAP50-95": scored["files"]["weights/best.pt"]["map50_95"],
    }
    assert f'LibreYOLO("hf://{repo}/weights/best.pt")' in loaded.text
    assert f"![Loss and mAP per epoch]({card.PLOT_FILE})" in loaded.text
    assert "billing efficiency" in loaded.text.lower()
    assert hub_ctx.token not in loaded.content

    # The plot on the Hub is a real picture of these three epochs.
    image = Image.open(io.BytesIO(hub.file_bytes(repo, card.PLOT_FILE)))
    image.load()
    assert image.format == "PNG" and image.size == (1000, 400)
    assert len(image.convert("RGB").getcolors(maxcolors=1 << 16) or []) > 20, "a blank image"
    plotted = json.loads(image.info[plot.SERIES_KEY])
    assert plotted["train/loss"] == [[row["epoch"], row["train/loss"]] for row in rows]
    assert [epoch for epoch, _ in plotted["metrics/mAP50"]] == [1, 2, 3]

    # The receipt: its parts add up to the billed time, which is the agent's lifetime.
    receipt = state["receipt"]
    parts = sum(part["seconds"] for part in receipt["parts"].values())
    assert abs(parts - receipt["billed_seconds"]) <= 0.02 * receipt["billed_seconds"] + ROUNDING, receipt
    assert 0 < receipt["billed_seconds"] <= wall
    assert receipt["parts"]["training"]["seconds"] > 0
    assert receipt["billed_dollars"] == pytest.approx(receipt["billed_seconds"] / 3600 * 2.5, abs=1e-3)
    assert 0 < receipt["billing_efficiency"] < 1

    # One line per epoch, then the summary, and the receipt last.
    log = result.stderr.splitlines()
    epoch_lines = [line for line in log if re.search(r"epoch \d+/3 · ", line)]
    assert [int(re.search(r"epoch (\d+)/3", line).group(1)) for line in epoch_lines] == [1, 2, 3], epoch_lines
    assert all(" s/epoch · " in line and "mAP50 " in line and "so far" in line for line in epoch_lines)
    assert "ETA" in epoch_lines[0] and "on the Hub" in epoch_lines[-1]
    assert any("summary: done · 3/3 epochs" in line for line in log)
    assert "receipt: setup" in log[-1] and "billing efficiency" in log[-1]

    # `trainbox status` shows the same receipt.
    shown = run_trainbox("status", str(run_dir), env=env)
    assert shown.returncode == 0 and "receipt: setup" in shown.stdout and "epoch 3/3" in shown.stdout


def test_without_output_repo_the_card_and_plot_stay_in_the_run_folder(tmp_path: Path) -> None:
    from tests.support import make_dataset

    data = make_dataset(tmp_path / "cones")
    env = trainbox_env(
        tmp_path / "work",
        DATASET_REPO=str(data.parent),
        GPUS="cpu",
        RUN_ARGS=f"{TINY_RUN_ARGS} epochs=2",
        **stand_in(tmp_path),
    )
    result = run_trainbox("run", env=env)
    assert result.returncode == 0, result.output[-3000:]
    (run_dir,) = (tmp_path / "work" / "runs").iterdir()
    assert "local only (no OUTPUT_REPO)" in result.stderr
    loaded = ModelCard.load(run_dir / "README.md")
    assert loaded.data.library_name == "libreyolo" and "**State: done** after 2/2 epochs" in loaded.text
    with Image.open(run_dir / card.PLOT_FILE) as image:
        assert image.size == (1000, 400)
    state = json.loads((run_dir / "trainbox.json").read_text())
    parts = sum(part["seconds"] for part in state["receipt"]["parts"].values())
    assert abs(parts - state["receipt"]["billed_seconds"]) <= 0.02 * state["receipt"]["billed_seconds"] + ROUNDING
