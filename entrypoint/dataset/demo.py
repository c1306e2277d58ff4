"""The bundled demo dataset: synthetic, deterministic, generated on the spot.

Coloured rectangles on a grey background, one class per colour, written as PNG with the
standard library only, so the agent needs no imaging package of its own. It is made to be
learned from scratch at 128 px within the demo's few epochs on a CPU (docs/benchmarks.md has
the measured mAP50 and time), so the first run shows a model that learns.
"""

from __future__ import annotations

import random
import shutil
import struct
import zlib
from pathlib import Path

CLASSES = ("red", "green", "blue")
# Each colour is far darker than any background (luminance 60-100 against 150-220) as well as a hue of
# its own: a green as bright as the grey behind it took a model trained from scratch many epochs to find.
_COLOURS = ((210, 30, 30), (30, 150, 40), (40, 60, 210))
_BACKGROUND = (150, 220)
IMAGE_SIZE = 128
# Enough images that a model trained from scratch sees each class a few hundred times within the
# demo's epochs; the validation split is drawn the same way, from the same generator.
TRAIN_IMAGES = 240
VAL_IMAGES = 60
_MIN_SIDE, _MAX_SIDE = 20, 56  # 16-44 % of the image: every object spans several of the model's cells
_NOISE = 8  # a faint texture, far below the contrast between an object and the background
# Bumped whenever the generated content changes, so a cached copy is regenerated.
DEMO_VERSION = 3


def _png(width: int, height: int, rows: list[bytearray]) -> bytes:
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    raw = b"".join(b"\x00" + bytes(row) for row in rows)
    # Level 1: the noisy background barely compresses, and level 6 took most of the generation time.
    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(raw, 1)) + chunk(b"IEND", b"")


def _image(rng: random.Random) -> tuple[bytes, list[str]]:
    """A grey background with 1-3 filled rectangles that never overlap (a hidden box is unlearnable)."""
    size = IMAGE_SIZE
    base = rng.randint(*_BACKGROUND)
    # Random bytes mapped onto base ± _NOISE in C (bytes.translate): a pure-Python loop per pixel is slow.
    noise = bytes(base - _NOISE + value % (2 * _NOISE + 1) for value in range(256))
    rows = [bytearray(rng.randbytes(3 * size).translate(noise)) for _ in range(size)]
    placed: list[tuple[int, int, int, int]] = []
    labels: list[str] = []
    for _ in range(rng.randint(1, 3)):
        for _attempt in range(20):
            w, h = rng.randint(_MIN_SIDE, _MAX_SIDE), rng.randint(_MIN_SIDE, _MAX_SIDE)
            x0, y0 = rng.randint(0, size - w), rng.randint(0, size - h)
            if all(x0 + w <= x or x + pw <= x0 or y0 + h <= y or y + ph <= y0 for x, y, pw, ph in placed):
                break
        else:
            continue  # no room left for another one
        placed.append((x0, y0, w, h))
        cls = rng.randrange(len(CLASSES))
        colour = bytes(_COLOURS[cls])
        for y in range(y0, y0 + h):
            rows[y][3 * x0 : 3 * (x0 + w)] = colour * w
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
