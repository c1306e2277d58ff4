"""The evaluation's pure parts: per-class AP as pycocotools computes it, the confusion matrix, the split chosen and
the refusals, eval.json's format, an export's judgement, the card's section and picture."""

from __future__ import annotations

import random
import shutil
from pathlib import Path

import pytest
from PIL import Image

from entrypoint.errors import EvalSplitMissingError, HeldOutClassesError, HeldOutUnlabelledError
from entrypoint.evaluation import parity, record, score, split
from entrypoint.evaluation.score import Guess, Truth
from entrypoint.report import card_eval


def _random_case(seed: int, images: int = 12, classes: int = 3) -> tuple[list[list[Truth]], list[list[Guess]]]:
    rng = random.Random(seed)
    truths: list[list[Truth]] = []
    guesses: list[list[Guess]] = []
    for _ in range(images):
        image_truths = []
        for _ in range(rng.randint(0, 4)):
            x, y = rng.uniform(0, 80), rng.uniform(0, 80)
            image_truths.append(Truth(rng.randrange(classes), (x, y, x + rng.uniform(5, 40), y + rng.uniform(5, 40))))
        image_guesses = []
        for truth in image_truths:  # near misses, class swaps, and boxes where there is none
            if rng.random() < 0.8:
                jitter = [rng.uniform(-4, 4) for _ in range(4)]
                box = tuple(v + j for v, j in zip(truth.box, jitter, strict=True))
                cls = truth.cls if rng.random() < 0.85 else rng.randrange(classes)
                image_guesses.append(Guess(cls, rng.random(), box))  # type: ignore[arg-type]
        for _ in range(rng.randint(0, 2)):
            x, y = rng.uniform(0, 80), rng.uniform(0, 80)
            image_guesses.append(Guess(rng.randrange(classes), rng.random(), (x, y, x + 20, y + 20)))
        truths.append(image_truths)
        guesses.append(image_guesses)
    return truths, guesses


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_per_class_ap_is_what_pycocotools_computes(seed: int) -> None:
    pytest.importorskip("pycocotools")
    from pycocotools.coco import COCO
    from pycocotools.cocoeval import COCOeval

    truths, guesses = _random_case(seed)
    gt = COCO()
    gt.dataset = {
        "images": [{"id": i, "width": 128, "height": 128} for i in range(len(truths))],
        "categories": [{"id": c, "name": str(c)} for c in range(3)],
        "annotations": [
            {
                "id": n + 1,
                "image_id": i,
                "category_id": t.cls,
                "bbox": [t.box[0], t.box[1], t.box[2] - t.box[0], t.box[3] - t.box[1]],
                "area": (t.box[2] - t.box[0]) * (t.box[3] - t.box[1]),
                "iscrowd": 0,
            }
            for n, (i, t) in enumerate((i, t) for i, image in enumerate(truths) for t in image)
        ],
    }
    gt.createIndex()
    results = [
        {
            "image_id": i,
            "category_id": g.cls,
            "bbox": [g.box[0], g.box[1], g.box[2] - g.box[0], g.box[3] - g.box[1]],
            "score": g.score,
        }
        for i, image in enumerate(guesses)
        for g in image
    ]
    evaluator = COCOeval(gt, gt.loadRes(results), "bbox")
    evaluator.evaluate()
    evaluator.accumulate()
    evaluator.summarize()
    found = score.score(truths, guesses, 3)
    assert found.map50_95 == pytest.approx(evaluator.stats[0], abs=1e-6)
    assert found.map50 == pytest.approx(evaluator.stats[1], abs=1e-6)
    precision = evaluator.eval["precision"]  # [iou, recall, class, area, maxdets]
    for cls, per in enumerate(found.per_class):
        column = precision[:, :, cls, 0, -1]
        assert per.ap50_95 == pytest.approx(column[column > -1].mean(), abs=1e-6)


def test_the_confusion_matrix_counts_swaps_misses_and_boxes_where_there_is_none() -> None:
    truths = [[Truth(0, (0, 0, 10, 10)), Truth(1, (50, 50, 60, 60)), Truth(1, (80, 80, 90, 90))]]
    guesses = [[Guess(0, 0.9, (0, 0, 10, 10)), Guess(0, 0.8, (50, 50, 60, 60)), Guess(1, 0.9, (20, 20, 30, 30))]]
    found = score.score(truths, guesses, 2)
    # [predicted][true]: a red hit, a blue taken for red, a blue missed, a blue box on nothing
    assert found.matrix == ((1, 1, 0), (0, 0, 1), (0, 1, 0))
    assert found.precision == pytest.approx(1 / 3) and found.recall == pytest.approx(1 / 3)


def _dataset(root: Path, splits: dict[str, list[str]], names: str = "{0: red, 1: blue}") -> Path:
    lines = ["path: ."]
    for name, labels in splits.items():
        (root / "images" / name).mkdir(parents=True)
        (root / "labels" / name).mkdir(parents=True)
        for index, label in enumerate(labels):
            Image.new("RGB", (100, 50)).save(root / "images" / name / f"{index:03d}.png")
            if label:
                (root / "labels" / name / f"{index:03d}.txt").write_text(label + "\n")
        lines.append(f"{name}: images/{name}")
    (root / "data.yaml").write_text("\n".join([*lines, f"names: {names}"]) + "\n")
    return root / "data.yaml"


def test_the_test_split_is_scored_when_there_is_one_else_validation_said_so(tmp_path: Path) -> None:
    both = _dataset(tmp_path / "a", {"train": ["0 .5 .5 .2 .2"], "val": ["0 .5 .5 .2 .2"], "test": ["1 .5 .5 .4 .2"]})
    chosen = split.choose(both)
    assert chosen.name == "test" and chosen.words == "test split" and chosen.names == ("red", "blue")
    (boxes,) = split.truths(chosen)
    assert boxes == [Truth(1, (30.0, 20.0, 70.0, 30.0))]  # normalised to the image's 100x50 pixels
    val_only = _dataset(tmp_path / "b", {"train": ["0 .5 .5 .2 .2"], "val": ["0 .5 .5 .2 .2"]})
    assert split.choose(val_only).words == "validation split (also used to pick best.pt)"


def test_a_split_that_cannot_be_scored_is_refused_in_one_line_with_its_own_code(tmp_path: Path) -> None:
    val_only = _dataset(tmp_path / "a", {"train": ["0 .5 .5 .2 .2"], "val": ["0 .5 .5 .2 .2"]})
    with pytest.raises(EvalSplitMissingError) as missing:
        split.choose(val_only, "test")
    assert missing.value.exit_code == 24 and "no test split (it has: val)" in str(missing.value)
    unlabelled = _dataset(tmp_path / "b", {"train": ["0 .5 .5 .2 .2"], "val": ["0 .5 .5 .2 .2"], "test": ["", ""]})
    with pytest.raises(HeldOutUnlabelledError) as bare:
        split.choose(unlabelled)
    assert bare.value.exit_code == 25 and "2 image(s) and not one label" in str(bare.value)
    with pytest.raises(HeldOutClassesError) as other:
        split.choose(val_only, trained=["red", "green"])
    assert other.value.exit_code == 26 and "(red, blue) are not the model's (red, green)" in str(other.value)
    assert len({missing.value.exit_code, bare.value.exit_code, other.value.exit_code}) == 3
    assert all("\n" not in str(e.value) for e in (missing, bare, other))


def test_eval_json_has_the_documented_format_and_reads_back(tmp_path: Path) -> None:
    truths = [[Truth(0, (0, 0, 10, 10)), Truth(1, (50, 50, 60, 60))]]
    found = score.score(truths, [[Guess(0, 0.9, (0, 0, 10, 10))]], 2)
    one = record.file_record(0.5, 0.5, found, ("red", "blue"), 12.345, "cuda:0")
    document = record.document("test", "a" * 40, {"weights/best.pt": one})
    assert set(document) == {"split", "dataset_revision", "files"}
    assert set(one) == set(record.KEYS)
    assert one["per_class"] == {
        "red": {"ap50_95": 1.0, "ap50": 1.0, "instances": 1},
        "blue": {"ap50_95": 0.0, "ap50": 0.0, "instances": 1},
    }
    assert one["confusion_matrix"]["labels"] == ["red", "blue", "background"]
    assert one["ms_per_image"] == 12.35 and one["precision"] == 1.0 and one["recall"] == 0.5
    assert record.read(record.write(tmp_path, document)) == document
    (tmp_path / "eval.json").write_text('{"split": "train", "files": {}}')
    assert record.read(tmp_path / "eval.json") is None


def test_an_export_passes_within_its_formats_tolerance_and_fails_outside_with_both_numbers() -> None:
    pt = {"map50_95": 0.4000}
    assert record.judge(pt, {"map50_95": 0.4049}, "onnx") is None
    why = record.judge(pt, {"map50_95": 0.3940}, "onnx")
    assert why == "mAP50-95 39.40 against best.pt's 40.00 on the same split (Δ -0.60 points, allowed ± 0.50), outside"
    assert record.judge(pt, {"map50_95": 0.3940}, "tensorrt") is None  # FP16: one point
    assert record.judge(pt, {"map50_95": 0.3890}, "tensorrt") is not None


def test_raw_outputs_are_within_when_every_element_is_within_atol_plus_rtol_of_best_pts() -> None:
    import numpy as np

    reference = np.array([[0.0, 0.5, 300.0]], dtype=np.float32)
    fp32 = parity.tolerance("onnx")
    assert (fp32.atol, fp32.rtol) == (1e-3, 1e-3) and parity.tolerance("openvino") == fp32
    near = [([reference], [reference + np.array([[9e-4, -9e-4, 0.29]])])]  # 0.29 ≤ 0.001 + 0.001·300
    assert parity.compare(near * 8, fp32) == {
        "images": 8, "max_abs_diff": 0.29, "atol": 1e-3, "rtol": 1e-3, "within": True
    }  # fmt: skip
    far_score = [([reference], [reference + np.array([[0.0011, 0.0, 0.0]])])]  # a score near 0 moved by 0.0011
    assert not parity.compare(far_score, fp32)["within"]
    assert parity.compare(far_score, parity.tolerance("tensorrt"))["within"]  # FP16: 5 %
    nan = [([reference], [reference * np.array([[1.0, np.nan, 1.0]])])]
    assert parity.compare(nan, parity.tolerance("tensorrt")) == {
        "images": 1, "max_abs_diff": 0.0, "atol": 0.05, "rtol": 0.05, "within": False, "not_finite": 1
    }  # fmt: skip
    with pytest.raises(ValueError, match=r"best.pt's output is \(1, 3\), the export's \(3,\)"):
        parity.compare([([reference], [reference[0]])], fp32)
    with pytest.raises(ValueError, match=r"best\.pt gives 1 outputs, the export 2"):
        parity.compare([([reference], [reference, reference])], fp32)
    record = parity.compare(near, fp32)
    assert parity.valid(record) and not parity.valid({"within": True})
    assert parity.words(record) == "raw outputs: max Δ 0.29 on 1 image(s) (atol 0.001, rtol 0.001)"


def test_an_export_whose_raw_outputs_differ_fails_with_both_numbers_even_when_it_scores_the_same() -> None:
    near = {"images": 8, "max_abs_diff": 6.1e-05, "atol": 0.001, "rtol": 0.001, "within": True}
    far = near | {"max_abs_diff": 0.068, "within": False}
    barely_trained = {"map50_95": 0.0}  # a 2-epoch model: its export scores 0 whatever it computes
    assert record.judge(barely_trained, {"map50_95": 0.0}, "onnx", near) is None
    why = record.judge(barely_trained, {"map50_95": 0.0}, "onnx", far)
    assert why == (
        "mAP50-95 0.00 against best.pt's 0.00 on the same split (Δ 0.00 points, allowed ± 0.50);"
        " raw outputs: max Δ 0.068 on 8 image(s) (atol 0.001, rtol 0.001), outside"
    )
    why = record.judge({"map50_95": 0.4}, {"map50_95": 0.39}, "onnx", near)
    assert why is not None and "(Δ -1.00 points, allowed ± 0.50), outside; raw outputs: max Δ 6.1e-05" in why
    assert not why.endswith("outside")


def test_the_card_shows_each_file_the_classes_worst_first_and_the_matrix(tmp_path: Path) -> None:
    truths = [[Truth(0, (0, 0, 10, 10)), Truth(1, (50, 50, 60, 60))]]
    found = score.score(truths, [[Guess(0, 0.9, (0, 0, 10, 10))]], 2)
    files = {
        "weights/best.pt": record.file_record(0.5, 0.5, found, ("red", "blue"), 8.0, "cpu"),
        "weights/best.onnx": record.file_record(0.498, 0.5, found, ("red", "blue"), 5.0, "cpu")
        | {"raw_outputs": {"images": 8, "max_abs_diff": 6.1e-05, "atol": 0.001, "rtol": 0.001, "within": True}},
    }
    (tmp_path / "weights").mkdir()
    (tmp_path / "weights" / "best.pt").write_bytes(b"x" * 2_000_000)
    record.write(tmp_path, record.document("val", None, files))
    evaluation = card_eval.gather(tmp_path)
    text = "\n".join(card_eval.section(evaluation))
    assert "Scored on the validation split (also used to pick best.pt)." in text
    assert "| `weights/best.pt` | 50.0 | 50.0 | 100.0 | 50.0 | 8.0 | cpu | 2.0 MB | the reference |" in text
    assert "| `weights/best.onnx` | 49.8 |" in text and "| — | max Δ 6.1e-05 (atol 0.001, rtol 0.001) |" in text
    assert "Raw outputs: each export and best.pt on the same preprocessed input (the first 8 images" in text
    assert text.index("| blue | 0.0") < text.index("| red | 100.0")
    with Image.open(tmp_path / card_eval.MATRIX_FILE) as picture:
        assert picture.format == "PNG" and picture.width > 200
    assert card_eval.headline(evaluation) == (0.5, 0.5, "val")


def _coco_with_test(root: Path, renamed: bool) -> Path:
    import json

    from tests import dataset_forms as make

    make.coco_roboflow(root)
    shutil.copytree(root / "valid", root / "test")
    document = json.loads((root / "test" / "_annotations.coco.json").read_text())
    if renamed:
        document["categories"][-1]["name"] = "purple"
    (root / "test" / "_annotations.coco.json").write_text(json.dumps(document))
    return root


def test_a_coco_test_split_is_converted_and_scored(tmp_path: Path) -> None:
    from entrypoint.dataset import forms

    root = _coco_with_test(tmp_path / "export", renamed=False)
    data_yaml = forms.libreyolo_yaml(root, None, None, tmp_path / "out")
    chosen = split.choose(data_yaml)
    assert chosen.name == "test" and chosen.names == ("red", "green", "blue") and len(chosen.images) == 4
    assert sum(len(boxes) for boxes in split.truths(chosen)) > 0


def test_a_coco_test_split_with_other_classes_is_refused(tmp_path: Path) -> None:
    from entrypoint.dataset import forms

    root = _coco_with_test(tmp_path / "export", renamed=True)
    with pytest.raises(HeldOutClassesError) as refused:
        forms.libreyolo_yaml(root, None, None, tmp_path / "out")
    assert refused.value.exit_code == 26 and "purple" in str(refused.value)


def test_the_model_index_status_and_end_message_give_best_pts_held_out_score(tmp_path: Path) -> None:
    from entrypoint.report import card, status
    from entrypoint.report.card_facts import card_info
    from tests.unit.test_card import ROWS, state

    truths = [[Truth(0, (0, 0, 10, 10)), Truth(1, (50, 50, 60, 60))]]
    found = score.score(truths, [[Guess(0, 0.9, (0, 0, 10, 10))]], 2)
    files = {"weights/best.pt": record.file_record(0.3456, 0.5, found, ("red", "blue"), 8.0, "cpu")}
    evaluation = record.document("test", "abc123", files)
    info = card_info(state(), ROWS, repo_id="acme/yolo", receipt=None, plot=True, total=10, evaluation=evaluation)
    results = card.metadata(info).eval_results or []
    assert {(r.metric_name, r.metric_value, r.dataset_split) for r in results} == {
        ("mAP50-95", 0.3456, "test"),
        ("mAP50", 0.5, "test"),
    }
    snapshot = state(evaluation={"settled": True, "split": "test", "best": {"map50_95": 0.3456, "map50": 0.5}})
    assert "scored    mAP50-95 0.346 · mAP50 0.500 on the test split" in status.render_remote(snapshot, 0.0)
    fallback = state(evaluation={"settled": True, "split": "val", "best": {"map50_95": 0.1, "map50": 0.2}})
    assert "on the validation split (also used to pick best.pt)" in (card_eval.scored_text(fallback) or "")
    assert card_eval.scored_text(state()) is None


def test_a_parquet_test_split_beside_a_validation_split_is_held_out_and_scored(tmp_path: Path) -> None:
    pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    from entrypoint.dataset import parquet
    from entrypoint.parsing import BoxFormat
    from tests import dataset_forms as make

    root = make.parquet_dataset(tmp_path / "repo")  # train and test
    pq.write_table(
        make.parquet_table(make.split_samples()["valid"][:2]),  # type: ignore[arg-type]
        root / "data" / "validation-00000-of-00001.parquet",
    )
    files = sorted(str(path.relative_to(root)) for path in root.rglob("*.parquet"))
    train, validation, test = parquet.chosen_splits_with_test(files, "someone/shapes")
    assert validation == ["data/validation-00000-of-00001.parquet"] and test == ["data/test-00000-of-00001.parquet"]
    out = tmp_path / "tree"
    copy = lambda name, local: shutil.copyfile(root / name, local)  # noqa: E731
    parquet.convert(train, validation, copy, tmp_path / "scratch", out, bbox=BoxFormat.XYWH, readme=None,
                    max_bytes=None, test=test)  # fmt: skip
    chosen = split.choose(out / "data.yaml")
    assert chosen.name == "test" and len(chosen.images) == len(make.split_samples()["valid"])
    assert len(list((out / "images" / "val").iterdir())) == 2


def test_the_end_message_gives_best_pts_held_out_score(tmp_path: Path) -> None:
    from entrypoint.report.notify import end_message
    from entrypoint.settings import from_env

    settings = from_env({"WORKDIR": str(tmp_path), "PROVIDER": "none", "RUN_NAME": "cones"}, options={})
    snapshot = {
        "phase": "done",
        "exit": {"code": 0, "reason": "done", "message": "trained"},
        "evaluation": {"settled": True, "split": "test", "best": {"map50_95": 0.4123, "map50": 0.6}},
    }
    _, body, _ = end_message(settings, snapshot)
    assert "best.pt scored: mAP50-95 0.412 · mAP50 0.600 on the test split" in body.splitlines()
