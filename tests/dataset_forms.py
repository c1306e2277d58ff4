"""Tiny detection datasets in the forms people have them: a Roboflow YOLO export, a Roboflow COCO export, the
classic COCO layout, and parquet as ``datasets.push_to_hub`` writes it. Same images and boxes in each (the demo's
coloured rectangles), so a test can compare what the agent made of them."""

from __future__ import annotations

import json
import random
import zipfile
from pathlib import Path

from entrypoint.dataset.demo import IMAGE_SIZE, _image

CLASSES = ("red", "green", "blue")


def samples(count: int, seed: int) -> list[tuple[bytes, list[tuple[int, float, float, float, float]]]]:
    """(png, [(class, x, y, w, h) in pixels]) for ``count`` images."""
    rng = random.Random(seed)
    found = []
    for _ in range(count):
        png, rows = _image(rng)
        boxes = []
        for row in rows:
            cls, cx, cy, w, h = row.split()
            pw, ph = float(w) * IMAGE_SIZE, float(h) * IMAGE_SIZE
            boxes.append((int(cls), float(cx) * IMAGE_SIZE - pw / 2, float(cy) * IMAGE_SIZE - ph / 2, pw, ph))
        found.append((png, boxes))
    return found


def split_samples(train: int = 8, val: int = 4) -> dict[str, list]:
    return {"train": samples(train, 1), "valid": samples(val, 2)}


def yolo_roboflow(root: Path) -> Path:
    """data.yaml at the root naming ``../train/images`` and ``../valid/images`` (and a test split it lacks)."""
    for split, items in split_samples().items():
        for index, (png, boxes) in enumerate(items):
            (root / split / "images").mkdir(parents=True, exist_ok=True)
            (root / split / "labels").mkdir(parents=True, exist_ok=True)
            (root / split / "images" / f"{index:03d}.png").write_bytes(png)
            side = IMAGE_SIZE
            rows = [f"{c} {(x + w / 2) / side} {(y + h / 2) / side} {w / side} {h / side}" for c, x, y, w, h in boxes]
            (root / split / "labels" / f"{index:03d}.txt").write_text("\n".join(rows) + "\n")
    (root / "data.yaml").write_text(
        "train: ../train/images\nval: ../valid/images\ntest: ../test/images\n\nnc: 3\nnames: ['red', 'green', 'blue']\n"
        "roboflow:\n  workspace: someone\n  project: shapes\n  version: 1\n"
    )
    return root


def coco_document(items: list, *, category_ids: tuple[int, ...], placeholder: int | None) -> dict:
    """COCO JSON for ``items``; ``placeholder``: Roboflow's supercategory id with no box of its own."""
    pairs = zip(category_ids, CLASSES, strict=True)
    categories = [{"id": cid, "name": name, "supercategory": "shapes"} for cid, name in pairs]
    if placeholder is not None:
        categories.insert(0, {"id": placeholder, "name": "shapes", "supercategory": "none"})
    images, annotations = [], []
    for index, (_png, boxes) in enumerate(items):
        images.append({"id": index, "file_name": f"{index:03d}.png", "width": IMAGE_SIZE, "height": IMAGE_SIZE})
        for cls, x, y, w, h in boxes:
            annotations.append(
                {
                    "id": len(annotations),
                    "image_id": index,
                    "category_id": category_ids[cls],
                    "bbox": [x, y, w, h],
                    "area": w * h,
                    "iscrowd": 0,
                }
            )
    return {"images": images, "annotations": annotations, "categories": categories}


def coco_roboflow(root: Path) -> Path:
    """A folder per split, each with ``_annotations.coco.json`` beside its images; ids 1-3, placeholder 0."""
    for split, items in split_samples().items():
        (root / split).mkdir(parents=True)
        for index, (png, _boxes) in enumerate(items):
            (root / split / f"{index:03d}.png").write_bytes(png)
        document = coco_document(items, category_ids=(1, 2, 3), placeholder=0)
        (root / split / "_annotations.coco.json").write_text(json.dumps(document))
    return root


def coco_classic(root: Path) -> Path:
    """``annotations/instances_{train,val}2017.json`` and ``images/{train,val}2017/``; ids 7, 3, 11 (not indexes)."""
    (root / "annotations").mkdir(parents=True)
    for split, items in (("train2017", split_samples()["train"]), ("val2017", split_samples()["valid"])):
        (root / "images" / split).mkdir(parents=True)
        for index, (png, _boxes) in enumerate(items):
            (root / "images" / split / f"{index:03d}.png").write_bytes(png)
        document = coco_document(items, category_ids=(7, 3, 11), placeholder=None)
        (root / "annotations" / f"instances_{split}.json").write_text(json.dumps(document))
    return root


def parquet_table(items: list, *, fmt: str = "xywh") -> object:
    """One split as ``push_to_hub`` writes it: image struct, objects (bbox, ClassLabel category), features metadata."""
    import pyarrow as pa

    rows = []
    for index, (png, boxes) in enumerate(items):
        formats = {"xywh": lambda x, y, w, h: [x, y, w, h], "xyxy": lambda x, y, w, h: [x, y, x + w, y + h]}
        formats["cxcywh"] = lambda x, y, w, h: [x + w / 2, y + h / 2, w, h]
        bbox = [formats[fmt](x, y, w, h) for _cls, x, y, w, h in boxes]
        rows.append(
            {
                "image": {"bytes": png, "path": f"{index:03d}.png"},
                "image_id": index,
                "objects": {"bbox": bbox, "category": [cls for cls, *_ in boxes]},
            }
        )
    features = {
        "image": {"_type": "Image"},
        "image_id": {"dtype": "int64", "_type": "Value"},
        "objects": {
            "feature": {
                "bbox": {"feature": {"dtype": "float32", "_type": "Value"}, "length": 4, "_type": "Sequence"},
                "category": {"names": list(CLASSES), "_type": "ClassLabel"},
            },
            "_type": "Sequence",
        },
    }
    table = pa.Table.from_pylist(rows)
    return table.replace_schema_metadata({"huggingface": json.dumps({"info": {"features": features}})})


def parquet_dataset(root: Path, *, fmt: str = "xywh", row_group_size: int = 3) -> Path:
    """``data/train-00000-of-00001.parquet`` and ``data/test-00000-of-00001.parquet``: train and test only."""
    import pyarrow.parquet as pq

    (root / "data").mkdir(parents=True)
    for split, items in (("train", split_samples()["train"]), ("test", split_samples()["valid"])):
        pq.write_table(
            parquet_table(items, fmt=fmt),  # type: ignore[arg-type]
            root / "data" / f"{split}-00000-of-00001.parquet",
            row_group_size=row_group_size,
        )
    return root


def zipped(source: Path, target: Path) -> Path:
    """``source``'s files in a zip, under the folder's own name (as `zip -r` of a folder)."""
    with zipfile.ZipFile(target, "w") as archive:
        for path in sorted(source.rglob("*")):
            if path.is_file():
                archive.write(path, f"{source.name}/{path.relative_to(source).as_posix()}")
    return target
