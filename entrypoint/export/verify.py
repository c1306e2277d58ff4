"""The export check's child process: run ``best.pt`` and its export on a few validation images (the export loads and
runs in its runtime; whether it scores like the ``.pt`` is the evaluation's judgement), print both sides'
detections as one JSON line (``RESULT`` first). Run by the agent as ``python -m entrypoint.export.verify``: torch,
CUDA and the format's runtime live in this child only. For a TensorRT engine it also says which GPU architecture
and TensorRT version built it (the engine runs on those only)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import yaml

RESULT = "TRAINBOX_EXPORT_CHECK "
CONF_FLOOR = 0.0  # every box NMS keeps: what the runtime gives, shown, not judged (the evaluation judges)
IMAGES = 3
_SUFFIXES = {".jpg", ".jpeg", ".png", ".bmp", ".webp", ".tif", ".tiff"}


def validation_images(data_yaml: Path, count: int = IMAGES) -> list[Path]:
    """The first ``count`` images of the dataset's ``val`` split (a folder, a list file, or a list of them)."""
    data = yaml.safe_load(data_yaml.read_text())
    root = Path(data.get("path") or data_yaml.parent)
    root = root if root.is_absolute() else data_yaml.parent / root
    entries = data.get("val") or data.get("test") or []
    found: list[Path] = []
    for entry in entries if isinstance(entries, list) else [entries]:
        where = root / str(entry)
        if where.is_dir():
            found += sorted(p for p in where.rglob("*") if p.suffix.lower() in _SUFFIXES)
        elif where.suffix == ".txt" and where.is_file():
            lines = [line.strip() for line in where.read_text().splitlines() if line.strip()]
            found += [p if p.is_absolute() else root / p for p in map(Path, lines)]
        elif where.suffix.lower() in _SUFFIXES:
            found.append(where)
    return found[:count]


def detections(model: Any, image: Path, imgsz: int | None) -> list[list[float]]:
    extra = {"imgsz": imgsz} if imgsz else {}
    result = model.predict(str(image), conf=CONF_FLOOR, **extra)
    result = result[0] if isinstance(result, list) else result
    boxes = result.boxes
    rows = zip(boxes.cls.tolist(), boxes.conf.tolist(), boxes.xyxy.tolist(), strict=True)
    return [[int(cls), float(conf), *map(float, xyxy)] for cls, conf, xyxy in rows]


def built_for() -> dict[str, str]:
    """The GPU architecture and TensorRT version an engine built here runs on."""
    import tensorrt  # type: ignore[import-not-found]
    import torch

    major, minor = torch.cuda.get_device_capability()
    return {"arch": f"sm{major}{minor}", "tensorrt": str(tensorrt.__version__)}


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m entrypoint.export.verify")
    parser.add_argument("--weights", type=Path, required=True)
    parser.add_argument("--export", type=Path, required=True)
    parser.add_argument("--data", type=Path, required=True)
    parser.add_argument("--format", required=True)
    parser.add_argument("--imgsz", type=int)
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args(argv)
    from libreyolo import LibreYOLO  # type: ignore[import-untyped]

    images = validation_images(args.data)
    if not images:
        print(f"no validation image found through {args.data}", file=sys.stderr)
        return 3
    reference = LibreYOLO(str(args.weights), device=args.device)
    names = getattr(reference, "names", None)
    on_gpu = {"device": args.device} if args.format == "tensorrt" else {}  # the other runtimes pick their own
    exported = LibreYOLO(str(args.export), nb_classes=len(names) if names else None, **on_gpu)
    record: dict[str, Any] = {
        "images": [image.name for image in images],
        "reference": [detections(reference, image, args.imgsz) for image in images],
        "candidate": [detections(exported, image, args.imgsz) for image in images],
    }
    if args.format == "tensorrt":
        record |= built_for()
    print(RESULT + json.dumps(record), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
