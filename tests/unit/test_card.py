"""The model card: metadata through huggingface_hub, a user's card kept, our section replaced in place."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from huggingface_hub import ModelCard, metadata_load

from entrypoint.report import card
from entrypoint.report.card_facts import card_info

ROWS = [
    {"epoch": 1, "time": 9.0, "train/loss": 0.9, "metrics/mAP50": 0.20, "metrics/mAP50-95": 0.10, "is_best": True},
    {"epoch": 2, "time": 8.0, "train/loss": 0.7, "metrics/mAP50": 0.45, "metrics/mAP50-95": 0.30, "is_best": True},
    {"epoch": 3, "time": 8.0, "train/loss": 0.6, "metrics/mAP50": 0.40, "metrics/mAP50-95": 0.28, "is_best": False},
]


def state(**extra: Any) -> dict[str, Any]:
    return {
        "run_name": "cones-1a2b3c4d",
        "phase": "training",
        "settings": {"dataset": "acme/cones", "output_repo": "acme/yolo", "run_args": "epochs=10 imgsz=640"},
        "dataset": {"source": "acme/cones@abc123", "revision": "abc123"},
        "training": {"argv": ["train", "epochs=10", "imgsz=640", "data=/w/data.yaml", "device=0"]},
        "versions": {"trainbox": "0.1.0", "libreyolo": "1.6.0", "torch": "2.14.1"},
        "gpus": {"gpus": [{"index": 0, "name": "NVIDIA H100 80GB HBM3"}], "driver": "580.65"},
        "progress": {"epochs_done": 3, "epochs_total": 10},
        "updated_at": "2026-01-01T00:00:00Z",
        **extra,
    }


def info(rows: list[dict[str, Any]] = ROWS, **extra: Any) -> card.CardInfo:
    return card_info(state(**extra), rows, repo_id="acme/yolo", receipt=None, plot=True, total=10)


def parse(text: str, tmp_path: Path) -> tuple[dict[str, Any], ModelCard]:
    path = tmp_path / "README.md"
    path.write_text(text)
    return metadata_load(path) or {}, ModelCard.load(path)


def test_a_new_card_has_the_hub_metadata_and_the_page(tmp_path: Path) -> None:
    meta, loaded = parse(card.render(info()), tmp_path)
    assert meta["library_name"] == "libreyolo"
    assert meta["pipeline_tag"] == "object-detection"
    assert {"libreyolo", "object-detection"} <= set(meta["tags"])
    assert meta["datasets"] == ["acme/cones"]
    (entry,) = meta["model-index"]
    assert entry["name"] == "yolo"
    (result,) = entry["results"]
    assert result["dataset"] == {"name": "acme/cones", "type": "acme/cones", "split": "val", "revision": "abc123"}
    # the best epoch is LibreYOLO's (is_best, mAP50-95), not the highest mAP50 row alone
    assert {m["name"]: m["value"] for m in result["metrics"]} == {"mAP50": 0.45, "mAP50-95": 0.3}
    # metric ids, not free text: COCO's mAP@[.5:.95] and mAP@.5
    assert {m["name"]: m["type"] for m in result["metrics"]} == {"mAP50": "map_50", "mAP50-95": "map"}
    text = loaded.text
    assert "**State: running** (training), 3/10 epochs so far." in text
    assert 'model = LibreYOLO("hf://acme/yolo/weights/best.pt")' in text
    assert "libreyolo train epochs=10 imgsz=640 data=/w/data.yaml device=0" in text
    assert "NVIDIA H100 80GB HBM3, driver 580.65" in text
    assert "![Loss and mAP per epoch](training.png)" in text
    assert text.count(card.BEGIN) == 1 and text.count(card.END) == 1


def test_without_a_validated_epoch_there_is_no_model_index(tmp_path: Path) -> None:
    rows = [{"epoch": 1, "time": 9.0, "train/loss": 0.9}]
    meta, loaded = parse(card.render(info(rows)), tmp_path)
    assert "model-index" not in meta and meta["library_name"] == "libreyolo"
    assert "No validated epoch yet." in loaded.text


USER_CARD = """---
license: apache-2.0
tags:
- traffic
library_name: my-fork
---

# My traffic-cone detector

Hand-written introduction that must survive.
"""


def test_a_users_card_keeps_their_text_and_keys(tmp_path: Path) -> None:
    meta, loaded = parse(card.render(info(), USER_CARD), tmp_path)
    assert meta["license"] == "apache-2.0"
    assert meta["library_name"] == "my-fork"  # theirs wins where they set it
    assert meta["tags"][0] == "traffic" and "libreyolo" in meta["tags"]
    assert "model-index" in meta
    assert loaded.text.startswith("\n# My traffic-cone detector\n\nHand-written introduction that must survive.")
    assert loaded.text.count(card.BEGIN) == 1


def test_each_sync_replaces_only_the_marked_section(tmp_path: Path) -> None:
    first = card.render(info(), USER_CARD)
    # the user edits their part between two syncs
    edited = first.replace("Hand-written introduction", "Edited introduction")
    edited += "\n## Notes added after the section\n\nKept too.\n"
    later_rows = [
        *ROWS,
        {"epoch": 4, "time": 8.0, "train/loss": 0.5, "metrics/mAP50": 0.7, "metrics/mAP50-95": 0.5, "is_best": True},
    ]
    second = card.render(
        info(later_rows, phase="done", exit={"code": 0, "reason": "success", "message": "training finished"}), edited
    )
    meta, loaded = parse(second, tmp_path)
    assert "Edited introduction that must survive." in loaded.text
    assert "## Notes added after the section\n\nKept too." in loaded.text
    assert loaded.text.count(card.BEGIN) == 1 and loaded.text.count(card.END) == 1
    assert "**State: done** after 3/10 epochs." in loaded.text and "running" not in loaded.text
    metrics = {m["name"]: m["value"] for m in meta["model-index"][0]["results"][0]["metrics"]}
    assert metrics == {"mAP50": 0.7, "mAP50-95": 0.5}
    assert meta["tags"].count("libreyolo") == 1 and meta["license"] == "apache-2.0"


def test_a_card_without_metadata_gets_ours(tmp_path: Path) -> None:
    meta, loaded = parse(card.render(info(), "# Just a title\n\nSome words.\n"), tmp_path)
    assert meta["library_name"] == "libreyolo"
    assert "Some words." in loaded.text and card.BEGIN in loaded.text


def test_a_failed_run_says_why(tmp_path: Path) -> None:
    failed = info(phase="failed", exit={"code": 60, "reason": "training_failed", "message": "CUDA out of memory"})
    _, loaded = parse(card.render(failed), tmp_path)
    assert "**State: failed** after 3/10 epochs: CUDA out of memory." in loaded.text


def info_with(rows: list[dict[str, Any]] = ROWS, *, license: str | None = None, base: str | None = None, **extra: Any):
    return card_info(
        state(**extra), rows, repo_id="acme/yolo", receipt=None, plot=True, total=10, license=license, base_model=base
    )


def test_license_and_base_model_reach_the_hub_metadata(tmp_path: Path) -> None:
    meta, _ = parse(card.render(info_with(license="apache-2.0", base="LibreYOLO/LibreYOLO9s")), tmp_path)
    assert meta["license"] == "apache-2.0" and meta["base_model"] == "LibreYOLO/LibreYOLO9s"
    # neither known: no key at all (an empty or made-up value would be refused)
    meta, _ = parse(card.render(info_with()), tmp_path)
    assert "license" not in meta and "base_model" not in meta
    # the user's own choice wins
    meta, _ = parse(card.render(info_with(license="mit", base="LibreYOLO/LibreYOLO9s"), USER_CARD), tmp_path)
    assert meta["license"] == "apache-2.0" and meta["base_model"] == "LibreYOLO/LibreYOLO9s"


def test_no_nan_or_infinity_reaches_the_metadata(tmp_path: Path) -> None:
    from tests.fakes.hub import card_rules

    nan, inf = float("nan"), float("inf")
    rows = [
        {"epoch": 1, "time": 9.0, "train/loss": nan, "metrics/mAP50": nan, "metrics/mAP50-95": inf, "is_best": True},
    ]
    text = card.render(info_with(rows))
    meta, loaded = parse(text, tmp_path)
    assert "model-index" not in meta
    assert "| best | 1 | — | — | — |" in loaded.text
    assert card_rules.errors(text) == []
    # one finite metric: that one alone
    rows[0]["metrics/mAP50"] = 0.5
    meta, _ = parse(card.render(info_with(rows)), tmp_path)
    assert [m["name"] for m in meta["model-index"][0]["results"][0]["metrics"]] == ["mAP50"]


def test_results_name_only_a_hub_dataset(tmp_path: Path) -> None:
    local = state()
    local["settings"]["dataset"] = "/data/cones"
    local["dataset"] = {"source": "/data/cones", "revision": None}
    meta, loaded = parse(
        card.render(card_info(local, ROWS, repo_id="acme/yolo", receipt=None, plot=False, total=10)), tmp_path
    )
    assert "model-index" not in meta and "datasets" not in meta
    assert "0.4500" in loaded.text, "the page still shows the metrics"


def test_the_hub_accepts_every_card_trainbox_writes() -> None:
    from tests.fakes.hub import card_rules

    for text in (
        card.render(info()),
        card.render(info(), USER_CARD),
        card.render(info_with(license="mit", base="a/b")),
    ):
        assert card_rules.errors(text) == [], text


def test_the_card_names_the_bucket_and_how_to_load_from_it() -> None:
    text = card.page(info(storage={"mode": "bucket", "bucket": "acme/yolo-checkpoints", "prefix": "cones-1a2b3c4d"}))
    assert "`hf://buckets/acme/yolo-checkpoints/cones-1a2b3c4d/`" in text
    assert 'api, bucket, prefix = HfApi(), "acme/yolo-checkpoints", "cones-1a2b3c4d"' in text
    assert "overwritten in place" not in text  # each boundary's files go to new keys (sync/bucket.py)
    assert "buckets" not in card.page(info(storage={"mode": "repo", "unavailable": "no buckets"}))


def test_the_status_line_says_how_fresh_it_is_and_where_the_live_state_is(tmp_path: Path) -> None:
    _, loaded = parse(card.render(info()), tmp_path)
    assert (
        "**State: running** (training), 3/10 epochs so far. As of 2026-01-01 00:00 UTC;"
        " live: `trainbox status --repo acme/yolo --watch`." in loaded.text
    )
    done = info(phase="done", exit={"code": 0, "reason": "success", "message": "training finished"})
    _, loaded = parse(card.render(done), tmp_path)
    assert "**State: done** after 3/10 epochs. As of 2026-01-01 00:00 UTC." in loaded.text
    assert "trainbox status" not in loaded.text  # nothing live to follow once it ended
