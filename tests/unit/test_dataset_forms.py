"""The dataset forms, read without a Hub: a YOLO export's paths, COCO's category ids, parquet's box formats and
the check that catches the wrong one, the refusals, and the zip's safety rules."""

from __future__ import annotations

import shutil
import stat
import zipfile
from pathlib import Path

import pytest
import yaml

from entrypoint import errors
from entrypoint.dataset import forms, parquet, unzip, verify
from entrypoint.dataset.boxes import to_cxcywh_normalised
from entrypoint.parsing import BoxFormat
from tests import dataset_forms as make
from tests.support import make_dataset


def label_rows(folder: Path) -> dict[str, list[list[float]]]:
    return {
        path.name: [[float(value) for value in line.split()] for line in path.read_text().splitlines()]
        for path in sorted(folder.glob("*.txt"))
    }


def test_a_roboflow_yolo_export_gets_absolute_paths_inside_the_dataset(tmp_path: Path) -> None:
    root = make.yolo_roboflow(tmp_path / "export")
    config = yaml.safe_load(forms.libreyolo_yaml(root, None, None, tmp_path / "out").read_text())
    assert config["train"] == str((root / "train" / "images").resolve())
    assert config["val"] == str((root / "valid" / "images").resolve())
    assert "test" not in config  # named, but not in the export: left out, not refused
    assert config["names"] == ["red", "green", "blue"]


def test_a_split_outside_the_dataset_is_not_taken(tmp_path: Path) -> None:
    root = make.yolo_roboflow(tmp_path / "export")
    outside = tmp_path / "elsewhere" / "images"
    outside.mkdir(parents=True)
    (root / "data.yaml").write_text(f"train: ../train/images\nval: {outside}\nnames: [a]\n")
    with pytest.raises(errors.NoValidationError, match=r"data.yaml names val: .*elsewhere"):
        forms.libreyolo_yaml(root, None, None, tmp_path / "out")


def test_roboflow_coco_drops_the_placeholder_category_and_maps_ids_to_names(tmp_path: Path) -> None:
    root = make.coco_roboflow(tmp_path / "export")
    config = yaml.safe_load(forms.libreyolo_yaml(root, None, None, tmp_path / "out").read_text())
    assert config["names"] == {0: "red", 1: "green", 2: "blue"}  # ids 1-3; the supercategory 0 is not a class
    rows = label_rows(Path(config["path"]) / "labels" / "train")
    expected = make.split_samples()["train"]
    for index, (_png, boxes) in enumerate(expected):
        assert [int(row[0]) for row in rows[f"{index:03d}.txt"]] == [cls for cls, *_ in boxes]
    assert (Path(config["train"]) / "000.png").read_bytes() == expected[0][0]


def test_classic_coco_orders_classes_by_category_id(tmp_path: Path) -> None:
    root = make.coco_classic(tmp_path / "export")
    config = yaml.safe_load(forms.libreyolo_yaml(root, None, None, tmp_path / "out").read_text())
    # red, green, blue carry ids 7, 3, 11: in id order green (3), red (7), blue (11)
    assert config["names"] == {0: "green", 1: "red", 2: "blue"}
    index_of = {0: 1, 1: 0, 2: 2}  # the generator's class → the index its category id gets
    rows = label_rows(Path(config["path"]) / "labels" / "val")
    for index, (_png, boxes) in enumerate(make.split_samples()["valid"]):
        got = rows[f"{index:03d}.txt"]
        assert [int(row[0]) for row in got] == [index_of[cls] for cls, *_ in boxes]
        _cls, x, y, w, h = boxes[0]
        assert got[0][1:] == pytest.approx([(x + w / 2) / 128, (y + h / 2) / 128, w / 128, h / 128], abs=1e-5)


def test_coco_annotation_with_an_unlisted_category_is_refused(tmp_path: Path) -> None:
    root = make.coco_roboflow(tmp_path / "export")
    path = root / "train" / "_annotations.coco.json"
    path.write_text(path.read_text().replace('"category_id": 2', '"category_id": 42', 1))
    with pytest.raises(errors.ClassIdError, match=r"train/_annotations.coco.json: annotation \d+ has category_id 42"):
        forms.libreyolo_yaml(root, None, None, tmp_path / "out")


@pytest.mark.parametrize("fmt", list(BoxFormat))
def test_every_box_format_gives_the_same_normalised_box(fmt: BoxFormat) -> None:
    x, y, w, h, size = 10.0, 20.0, 30.0, 40.0, 100.0
    pixels = {"xywh": [x, y, w, h], "xyxy": [x, y, x + w, y + h], "cxcywh": [x + w / 2, y + h / 2, w, h]}
    box = pixels[fmt.value.removesuffix("n")]
    if fmt.normalised:
        box = [value / size for value in box]
    assert to_cxcywh_normalised(box, fmt, size, size) == pytest.approx((0.25, 0.4, 0.3, 0.4))


def convert_parquet(root: Path, out: Path, fmt: BoxFormat) -> Path:
    files = sorted(str(path.relative_to(root)) for path in root.rglob("*.parquet"))
    train, validation = parquet.chosen_splits(files, "someone/shapes")
    parquet.convert(
        train,
        validation,
        lambda name, local: shutil.copyfile(root / name, local),
        out.parent / "scratch",
        out,
        bbox=fmt,
        readme=None,
        max_bytes=None,
    )
    return out


def test_parquet_with_train_and_test_becomes_images_and_labels(tmp_path: Path) -> None:
    out = convert_parquet(make.parquet_dataset(tmp_path / "repo"), tmp_path / "tree", BoxFormat.XYWH)
    config = yaml.safe_load((out / "data.yaml").read_text())
    assert config["names"] == {0: "red", 1: "green", 2: "blue"}
    expected = make.split_samples()
    assert len(list((out / "images" / "train").iterdir())) == len(expected["train"])
    assert (out / "images" / "val" / "0000000.png").read_bytes() == expected["valid"][0][0]  # test → validation
    row = label_rows(out / "labels" / "val")["0000000.txt"][0]
    cls, x, y, w, h = expected["valid"][0][1][0]
    assert row == pytest.approx([cls, (x + w / 2) / 128, (y + h / 2) / 128, w / 128, h / 128], abs=1e-5)
    assert not (tmp_path / "scratch").exists() or not any((tmp_path / "scratch").iterdir())


def test_parquet_boxes_read_in_the_wrong_format_are_refused_naming_dataset_bbox(tmp_path: Path) -> None:
    root = make.parquet_dataset(tmp_path / "repo", fmt="xyxy")
    with pytest.raises(errors.BoxesOutsideError, match=r"read as DATASET_BBOX=xywh") as caught:
        convert_parquet(root, tmp_path / "tree", BoxFormat.XYWH)
    assert "set DATASET_BBOX" in str(caught.value)
    assert convert_parquet(root, tmp_path / "tree2", BoxFormat.XYXY).is_dir()  # the right format passes


def test_parquet_without_a_validation_split_is_refused() -> None:
    with pytest.raises(errors.NoValidationError, match="only a train split"):
        parquet.chosen_splits(["data/train-00000-of-00001.parquet"], "someone/shapes")
    assert parquet.splits_of(["data/validation-00000-of-00002.parquet", "train/0000.parquet"]) == {
        "train": ["train/0000.parquet"],
        "validation": ["data/validation-00000-of-00002.parquet"],
    }


# -- the refusals on a YOLO dataset ------------------------------------------------------------------
def resolved(root: Path, tmp_path: Path) -> Path:
    return forms.libreyolo_yaml(root, None, None, tmp_path / "out")


def test_a_dataset_without_labels_is_refused_naming_where_labels_were_looked_for(tmp_path: Path) -> None:
    root = tmp_path / "cones"
    make_dataset(root)
    for label in (root / "labels").rglob("*.txt"):
        label.write_text("")
    with pytest.raises(errors.NoLabelsError, match=r"none of the 12 images has a label \(looked for labels/train/"):
        verify.refuse(resolved(root, tmp_path), root, "x")


def test_a_class_outside_names_is_refused_with_its_file_and_line(tmp_path: Path) -> None:
    root = tmp_path / "cones"
    make_dataset(root)
    (root / "labels" / "val" / "001.txt").write_text("0 0.5 0.5 0.1 0.1\n9 0.5 0.5 0.2 0.2\n")
    with pytest.raises(errors.ClassIdError, match=r"labels/val/001.txt line 2: class 9, but the data.yaml names 3"):
        verify.refuse(resolved(root, tmp_path), root, "x")


def test_pixel_labels_are_refused_as_boxes_outside_the_image(tmp_path: Path) -> None:
    root = tmp_path / "cones"
    make_dataset(root)
    for label in (root / "labels").rglob("*.txt"):
        label.write_text("0 64 64 20 20\n")
    with pytest.raises(errors.BoxesOutsideError, match="12 of 12 boxes fall outside"):
        verify.refuse(resolved(root, tmp_path), root, "x")


def test_unreadable_images_are_refused_and_a_pass_is_remembered(tmp_path: Path) -> None:
    root = tmp_path / "cones"
    make_dataset(root)
    data_yaml = resolved(root, tmp_path)
    verify.refuse(data_yaml, root, "same")
    for image in (root / "images" / "train").iterdir():
        image.write_bytes(b"not an image")
    verify.refuse(data_yaml, root, "same")  # passed before with this fingerprint: not read again
    with pytest.raises(errors.UnreadableImagesError, match=r"8 of 8 train images checked cannot be read"):
        verify.refuse(data_yaml, root, "changed")


# -- zip safety -------------------------------------------------------------------------------------
def test_a_zip_is_extracted_and_its_data_yaml_noted(tmp_path: Path) -> None:
    source = make.yolo_roboflow(tmp_path / "export")
    report = unzip.extract_zip(make.zipped(source, tmp_path / "export.zip"), tmp_path / "out")
    assert report.data_yamls == ["export/data.yaml"] and report.files == 25
    assert (tmp_path / "out" / "export" / "train" / "images" / "000.png").is_file()


@pytest.mark.parametrize(
    ("name", "words"),
    [("../escaped.txt", "climbs out"), ("/etc/evil", "absolute"), ("link", "symlink")],
)
def test_a_zip_member_leaving_the_folder_is_refused_and_nothing_is_left(tmp_path: Path, name: str, words: str) -> None:
    archive = tmp_path / "bad.zip"
    with zipfile.ZipFile(archive, "w") as handle:
        handle.writestr("ok.txt", b"fine")
        member = zipfile.ZipInfo(name)
        if name == "link":
            member.external_attr = (stat.S_IFLNK | 0o777) << 16
        handle.writestr(member, b"/etc/passwd" if name == "link" else b"pwned")
    with pytest.raises(errors.UnsafeArchiveError, match=words):
        unzip.extract_zip(archive, tmp_path / "out")
    assert not (tmp_path / "out").exists() and not (tmp_path / "escaped.txt").exists()


def test_a_zip_larger_than_the_disk_left_is_refused(tmp_path: Path) -> None:
    archive = tmp_path / "big.zip"
    with zipfile.ZipFile(archive, "w", compression=zipfile.ZIP_DEFLATED) as handle:
        handle.writestr("zeros.bin", bytes(1 << 20))
    with pytest.raises(errors.DiskSpaceError):
        unzip.extract_zip(archive, tmp_path / "out", max_bytes=1000)


@pytest.mark.parametrize(("fmt", "options"), [("PNG", {}), ("JPEG", {}), ("JPEG", {"progressive": True}), ("WEBP", {})])
def test_image_sizes_read_from_the_header_match_pillows(fmt: str, options: dict) -> None:
    import io

    from PIL import Image

    buffer = io.BytesIO()
    Image.new("RGB", (37, 21), (9, 99, 199)).save(buffer, fmt, **options)
    assert parquet._size(buffer.getvalue()) == (37, 21)
    assert parquet._size(b"\xff\xd8 truncated") == (None, None)
