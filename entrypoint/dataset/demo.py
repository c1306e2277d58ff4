"""The bundled demo dataset: synthetic, deterministic, generated on the spot.

Coloured rectangles on a noisy background, one class per colour, written as PNG with
the standard library only, so the agent needs no imaging package of its own.
"""

from __future__ import annotations

import random
import shutil
import struct
import zlib
from pathlib import Path

CLASSES = ("red", "green", "blue")
_COLOURS = ((220, 40, 40), (40, 200, 60), (40, 70, 220))
IMAGE_SIZE = 128
TRAIN_IMAGES = 36
VAL_IMAGES = 12
# Bumped whenever the generated content changes, so a cached copy is regenerated.
DEMO_VERSION = 1


def _png(width: int, height: int, rows: list[bytearray]) -> bytes:
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    raw = b"".join(b"\x00" + bytes(row) for row in rows)
    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(raw, 6)) + chunk(b"IEND", b"")


def _image(rng: random.Random) -> tuple[bytes, list[str]]:
    size = IMAGE_SIZE
    base = rng.randint(90, 160)
    rows = [bytearray(v for _ in range(size) for v in [base + rng.randint(-12, 12)] * 3) for _ in range(size)]
    labels: list[str] = []
    for _ in range(rng.randint(1, 3)):
        cls = rng.randrange(len(CLASSES))
        w, h = rng.randint(18, 48), rng.randint(18, 48)
        x0, y0 = rng.randint(0, size - w), rng.randint(0, size - h)
        colour = _COLOURS[cls]
        for y in range(y0, y0 + h):
            rows[y][3 * x0 : 3 * (x0 + w)] = bytes(colour) * w
        labels.append(f"{cls} {(x0 + w / 2) / size:.6f} {(y0 + h / 2) / size:.6f} {w / size:.6f} {h / size:.6f}")
    return _png(size, size, rows), labels


def write_demo_dataset(root: Path) -> Path:
    """Create (or reuse) the demo dataset under ``root``; return its data.yaml."""
    data_yaml = root / "data.yaml"
    marker = root / ".trainbox-demo"
    if marker.is_file() and marker.read_text().strip() == str(DEMO_VERSION) and data_yaml.is_file():
        return data_yaml
    if root.exists():
        shutil.rmtree(root)
    try:
        _write(root)
    except BaseException:
        shutil.rmtree(root, ignore_errors=True)  # half a dataset would only fill the disk
        raise
    return data_yaml


def _write(root: Path) -> None:
    data_yaml = root / "data.yaml"
    marker = root / ".trainbox-demo"
    rng = random.Random(20261202)
    for split, count in (("train", TRAIN_IMAGES), ("val", VAL_IMAGES)):
        (root / "images" / split).mkdir(parents=True)
        (root / "labels" / split).mkdir(parents=True)
        for index in range(count):
            png, labels = _image(rng)
            (root / "images" / split / f"{index:03d}.png").write_bytes(png)
            (root / "labels" / split / f"{index:03d}.txt").write_text("\n".join(labels) + "\n")
    names = "\n".join(f"  {i}: {name}" for i, name in enumerate(CLASSES))
    data_yaml.write_text(
        f"path: {root.resolve()}\ntrain: images/train\nval: images/val\nnc: {len(CLASSES)}\nnames:\n{names}\n"
    )
    marker.write_text(f"{DEMO_VERSION}\n")
