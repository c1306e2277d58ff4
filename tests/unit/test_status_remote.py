"""`trainbox status --repo`'s view: everything it shows comes from trainbox.json alone, wherever it was read."""

from __future__ import annotations

import calendar
import json
import time
from pathlib import Path
from typing import Any

from entrypoint.report import status

NOW = calendar.timegm(time.strptime("2026-03-01T12:00:00", "%Y-%m-%dT%H:%M:%S"))


def live(**extra: Any) -> dict[str, Any]:
    return {
        "run_name": "cones-1a2b3c4d",
        "phase": "training",
        "attempt": 2,
        "updated_at": "2026-03-01T11:59:20Z",
        "settings": {"output_repo": "acme/yolo"},
        "storage": {"mode": "bucket", "bucket": "acme/yolo-checkpoints", "prefix": "cones-1a2b3c4d"},
        "gpus": {"gpus": [{"index": index, "name": "NVIDIA H100 80GB HBM3"} for index in (0, 1)]},
        "timeline": {"agent_started_at": NOW - 3600, "price_per_hour": 2.5, "marks": {"training": NOW - 3000}},
        "progress": {"epochs_done": 12, "epochs_total": 100},
        "metrics": {"seconds_per_epoch": 41.0, "mAP50": 0.61, "best": {"epoch": 9, "mAP50": 0.634, "mAP50-95": 0.412}},
        **extra,
    }


def test_a_live_run_in_a_few_lines() -> None:
    text = status.render_remote(live(), NOW, "acme/yolo")
    lines = dict(line.split(None, 1) for line in text.splitlines())
    assert lines["run"] == "cones-1a2b3c4d (attempt 2) · acme/yolo"
    assert lines["phase"] == "training · last heard 40 s ago"
    assert lines["epoch"] == "12/100 · 41 s/epoch · ETA 1h00 · mAP50 0.610 (best 0.634 @ 9, mAP50-95 0.412)"
    assert lines["cost"] == "$2.50 so far at $2.50/h"
    assert lines["GPU"] == "2 × NVIDIA H100 80GB HBM3"
    assert lines["working"] == "bucket hf://buckets/acme/yolo-checkpoints/cones-1a2b3c4d, as of 40 s ago"
    assert "exit" not in lines and status.exit_code_of(live()) is None


def test_an_ended_run_shows_its_outcome_and_its_exit_code() -> None:
    ended = live(
        phase="preempted",
        storage={"mode": "repo"},
        cost={"hours": 1.0, "price_per_hour": 2.5, "price_source": "PRICE_PER_HOUR", "dollars": 2.5},
        exit={"code": 143, "reason": "preempted", "message": "received SIGTERM", "final": True},
    )
    text = status.render_remote(ended, NOW)
    assert "working   repo acme/yolo, as of 40 s ago" in text
    assert "cost      1.00 h, $2.50 at $2.50/h (PRICE_PER_HOUR)" in text
    assert "exit      143 (preempted): received SIGTERM" in text
    assert "outcome   preempted (the machine was taken back)" in text
    assert "ETA" not in text  # it will not go on by itself
    assert status.exit_code_of(ended) == 143


def test_before_any_epoch_and_on_a_cpu() -> None:
    early = live(phase="dataset", progress={}, metrics={}, gpus={"device": "cpu", "checked": False}, storage={})
    text = status.render_remote(early, NOW)
    assert "epoch     0/?" in text and "GPU       CPU" in text
    assert status.gpu_text(None) == "not checked yet"


def test_progress_fields_carry_the_epoch_line_in_trainbox_json(tmp_path: Path) -> None:
    rows = [
        {"epoch": 1, "time": 40.0, "metrics/mAP50": 0.2, "metrics/mAP50-95": 0.1, "is_best": True},
        {"epoch": 2, "time": 42.0, "metrics/mAP50": 0.5, "metrics/mAP50-95": 0.31, "is_best": True},
        {"epoch": 3, "time": 44.0, "metrics/mAP50": 0.52, "metrics/mAP50-95": 0.3, "is_best": False},
        {"epoch": 4, "time": 42.0},  # not validated this epoch
    ]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows) + '{"epoch": 5, "ti')
    fields = status.progress_fields(tmp_path, 4, 10)
    assert fields["progress"] == {"epochs_done": 4, "epochs_total": 10}  # as before: the epochs alone
    assert fields["metrics"] == {
        "seconds_per_epoch": 42.0,
        "mAP50": 0.52,
        "best": {"epoch": 2, "mAP50": 0.5, "mAP50-95": 0.31},  # the epoch best.pt holds (LibreYOLO's is_best)
    }
    assert status.progress_fields(tmp_path / "nothing-yet", 0, None)["metrics"] == {}


def test_a_manifest_far_larger_than_one_is_never_downloaded() -> None:
    from typing import cast

    from entrypoint.sync.bucket import MANIFEST_MAX_BYTES, Bucket, RunFolder

    class Listed:
        bucket_id = "acme/yolo-checkpoints"

        def listing(self, prefix: str, *, recursive: bool = True, deadline: float | None = None) -> dict[str, int]:
            return {
                f"{prefix}/1700000000000-abcdef-000001.json": 900,
                f"{prefix}/1700000000000-abcdef-000002.json": MANIFEST_MAX_BYTES + 1,
            }

    folder = RunFolder(cast(Bucket, Listed()), "cones", "0123456789abcdef")
    assert folder.manifest_keys() == ["cones/0123456789abcdef/manifests/1700000000000-abcdef-000001.json"]


def test_hostile_fields_are_read_as_absent() -> None:
    from entrypoint.report.remote import sanitized

    clean = sanitized(live(progress=[3, 9], metrics={"best": "x"}, gpus="H100", storage="bucket", run_name=7))
    assert "progress" not in clean and "gpus" not in clean and "storage" not in clean
    assert clean["metrics"] == {} and clean["run_name"] == "7"
    text = status.render_remote(clean, NOW)
    assert "epoch     0/?" in text and "GPU       not checked yet" in text
