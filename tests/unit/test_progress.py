"""The epoch line, the plot and when it is drawn, and the agent's progress log."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
from PIL import Image

from entrypoint.report import epochs, plot, progress
from entrypoint.settings import from_env
from entrypoint.state import Phase, RunState

NOW = 1_800_000_000.0


def rows_until(epoch: int, *, pace: float = 41.0) -> list[dict]:
    rows = []
    for n in range(1, epoch + 1):
        mAP50 = 0.63 if n == 9 else min(0.61, 0.05 * n)
        rows.append(
            {"epoch": n, "time": pace, "train/loss": 1.0 / n, "metrics/mAP50": mAP50, "metrics/mAP50-95": mAP50 / 2}
        )
    return rows


def test_the_epoch_line() -> None:
    line = epochs.epoch_line(
        rows_until(12),
        100,
        started_at=NOW - 0.42 * 3600,
        now=NOW,
        price_per_hour=1.0,
        hub="acme/yolo",
        last_commit_at=NOW - 3,
    )
    # in all: $0.42 spent, then 88 epochs left at the measured 41 s each, 3608 s at $1/h
    assert line == (
        "epoch 12/100 · 41 s/epoch · ETA 1h00 · mAP50 0.60 (best 0.63 @ 9) · $0.42 so far, ~$1.42 in all"
        " · on the Hub 3 s ago"
    )


def test_the_epoch_line_without_price_validation_or_hub() -> None:
    rows = [{"epoch": 1, "time": 130.0, "train/loss": 2.0}]
    line = epochs.epoch_line(rows, 3, started_at=NOW - 200, now=NOW, price_per_hour=None, hub=None, last_commit_at=None)
    assert line == (
        "epoch 1/3 · 2m10/epoch · ETA 4m20 · mAP50 — (not validated yet) · 3m20 billed so far"
        " · local only (no OUTPUT_REPO)"
    )
    assert epochs.hub_text("acme/yolo", None, NOW) == "not on the Hub yet"


def test_read_rows_keeps_the_later_row_of_a_repeated_epoch_and_skips_a_torn_line(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    lines = [json.dumps({"epoch": 1, "train/loss": 1.0}), json.dumps({"epoch": 2, "train/loss": 0.9})]
    lines += [json.dumps({"epoch": 2, "train/loss": 0.8}), '{"epoch": 3, "train/lo']
    path.write_text("\n".join(lines))
    assert plot.read_rows(path) == [{"epoch": 1, "train/loss": 1.0}, {"epoch": 2, "train/loss": 0.8}]


def test_the_plot_is_a_png_of_the_rows(tmp_path: Path) -> None:
    target = tmp_path / "training.png"
    rows = rows_until(5)
    assert plot.draw(rows, target, "run: loss and mAP")
    with Image.open(target) as image:
        assert image.size == (1000, 400)
        assert len(image.convert("RGB").getcolors(maxcolors=1 << 16) or []) > 20
        data = json.loads(image.info[plot.SERIES_KEY])
    assert data["train/loss"] == [[row["epoch"], row["train/loss"]] for row in rows]
    assert data["metrics/mAP50"] == [[row["epoch"], row["metrics/mAP50"]] for row in rows]
    assert not list(tmp_path.glob(".*")), "the temporary file is gone"
    assert not plot.draw([{"epoch": 1}], tmp_path / "empty.png", "nothing")


def test_the_plot_draws_each_series_where_its_numbers_are(tmp_path: Path) -> None:
    target = tmp_path / "training.png"
    rows = rows_until(6)
    rows[3]["train/loss"] = 2 * rows[0]["train/loss"]  # a spike: the line must follow the data, not a trend
    assert plot.draw(rows, target, "run: loss and mAP")
    data = plot.series(rows)
    loss_panel, map_panel = plot.panels(data)
    with Image.open(target) as image:
        pixels = image.convert("RGB")
    for panel, name in ((loss_panel, "train/loss"), (map_panel, "metrics/mAP50")):
        for epoch, value in data[name]:
            x, y = panel.point(epoch, value)
            assert pixels.getpixel((round(x), round(y))) == plot.COLOURS[0], (name, epoch, value)
    # The spike's point is above the first epoch's, and the panel's top-left corner (no data) stays blank.
    assert loss_panel.point(4, rows[3]["train/loss"])[1] < loss_panel.point(1, rows[0]["train/loss"])[1]
    left, top, _, _ = loss_panel.box
    assert pixels.getpixel((left + 3, top + 40)) == plot.BACKGROUND
    # mAP starts at 0, and every value lies inside its panel.
    assert map_panel.ys[0] == 0
    for panel, names in ((loss_panel, plot.LOSSES), (map_panel, plot.MAPS)):
        for name in names:
            for epoch, value in data.get(name, []):
                x, y = panel.point(epoch, value)
                left, top, right, bottom = panel.box
                assert left - 0.5 <= x <= right + 0.5 and top - 0.5 <= y <= bottom + 0.5, (name, epoch)


def test_the_plot_of_one_epoch_or_a_flat_series_is_drawn(tmp_path: Path) -> None:
    one = [{"epoch": 1, "train/loss": 0.5, "metrics/mAP50": 0.0}]
    assert plot.draw(one, tmp_path / "one.png", "one epoch")
    loss_panel, _ = plot.panels(plot.series(one))
    with Image.open(tmp_path / "one.png") as image:
        x, y = loss_panel.point(1, 0.5)
        assert image.convert("RGB").getpixel((round(x), round(y))) == plot.COLOURS[0]
    assert not plot.draw([{"epoch": 1, "train/loss": float("nan")}], tmp_path / "nan.png", "nothing finite")


@pytest.fixture
def job(tmp_path: Path) -> progress.Progress:
    settings = from_env(
        {"WORKDIR": str(tmp_path), "PROVIDER": "none", "GPUS": "cpu", "PRICE_PER_HOUR": "2"}, options={}
    )
    settings.run_dir.mkdir(parents=True)
    return progress.Progress(settings, RunState.load(settings.run_dir, settings.run_name))


def append(job: progress.Progress, rows: list[dict]) -> None:
    with (job.run_dir / "metrics.jsonl").open("a") as handle:
        for row in rows:
            handle.write(json.dumps(row) + "\n")


def test_one_line_per_epoch_and_history_is_not_news(job: progress.Progress, caplog: pytest.LogCaptureFixture) -> None:
    rows = rows_until(4, pace=1.0)
    append(job, rows[:1])  # restored from an earlier attempt before training starts
    job.state.set_phase(Phase.TRAINING)
    caplog.set_level(logging.INFO, logger="trainbox")
    job.tick()
    append(job, rows[1:3])  # two epochs between two looks
    job.tick()
    job.tick()
    append(job, rows[3:])
    job.tick()
    lines = [record.getMessage() for record in caplog.records if record.getMessage().startswith("epoch ")]
    assert [line.split(" ·")[0] for line in lines] == ["epoch 2/?", "epoch 3/?", "epoch 4/?"]
    assert "local only (no OUTPUT_REPO)" in lines[-1]
    timeline = job.state.snapshot()["timeline"]
    assert set(timeline["marks"]) == {"training"} and timeline["price_per_hour"] == 2.0


def test_a_plot_that_cannot_keep_up_is_skipped_but_never_the_last(job: progress.Progress) -> None:
    target = job.run_dir / "training.png"
    rows = rows_until(2, pace=1.0)
    job.page._plot_seconds = 5.0  # the last drawing took five epochs' worth of time
    job.page.maybe_plot(rows, final=False)
    assert not target.exists()
    job.page.maybe_plot(rows, final=True)
    assert target.exists() and job.page._plotted_epoch == 2


def test_finished_writes_the_receipt_and_logs_it_last(job: progress.Progress, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="trainbox")
    for phase in (Phase.PREFLIGHT, Phase.DATASET, Phase.TRAINING):
        job.state.set_phase(phase)
    append(job, rows_until(2, pace=1.0))
    job.state.set_phase(Phase.FINISHING)
    job.state.finish(Phase.DONE, 0, "success", "training finished")
    job.finished()
    state = job.state.snapshot()
    parts = sum(part["seconds"] for part in state["receipt"]["parts"].values())
    assert parts == pytest.approx(state["receipt"]["billed_seconds"], abs=0.05)
    messages = [record.getMessage() for record in caplog.records]
    assert messages[-1].startswith("receipt: setup") and messages[-2].startswith("summary: done · 2/? epochs")
    # no OUTPUT_REPO: the card and the plot are written into the run folder
    assert (job.run_dir / "README.md").read_text().count("library_name: libreyolo") == 1
    assert (job.run_dir / "training.png").is_file()


def test_the_card_changes_only_with_an_epoch_or_a_phase(
    job: progress.Progress, monkeypatch: pytest.MonkeyPatch
) -> None:
    job.state.set_phase(Phase.TRAINING)
    append(job, rows_until(1, pace=1.0))
    job.publish()
    card = job.run_dir / "README.md"
    first = card.read_text()
    clock = progress.time.time
    monkeypatch.setattr(progress.time, "time", lambda: clock() + 500)  # much later, nothing new
    job.publish()
    assert card.read_text() == first, "an unchanged run must not produce a new card to upload"
    append(job, rows_until(2, pace=1.0)[1:])
    job.publish()
    assert card.read_text() != first


def test_a_new_attempt_card_keeps_the_last_attempts_command_until_it_has_its_own(tmp_path: Path) -> None:
    settings = from_env({"WORKDIR": str(tmp_path), "PROVIDER": "none", "GPUS": "cpu"}, options={})
    settings.run_dir.mkdir(parents=True)
    earlier = RunState.load(settings.run_dir, settings.run_name)
    earlier.update(training={"argv": ["train", "epochs=3", "device=cpu"]}, dataset={"source": "x", "revision": "r1"})
    earlier.finish(Phase.DONE, 0, "success")
    job = progress.Progress(settings, RunState.load(settings.run_dir, settings.run_name))
    append(job, rows_until(3, pace=1.0))
    job.publish()
    text = (job.run_dir / "README.md").read_text()
    # (a dataset that is not a Hub repo is named on the page, not in the model-index)
    assert "libreyolo train epochs=3 device=cpu" in text and "| dataset | x @ `r1` |" in text
