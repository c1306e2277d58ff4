"""One file scored: ``libreyolo val`` in a child process (the agent never initialises CUDA), at batch 1 so its
``Speed`` line is the time per image on this machine, with ``--save-json`` for the predictions that ``score``
turns into per-class AP and the confusion matrix. The same on the box and in ``trainbox eval``."""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from .. import procs
from . import parity, record, score
from .rawcheck import RESULT
from .score import Guess
from .split import Split, truths

VAL_TIMEOUT = 30 * 60.0
RAW_TIMEOUT = 5 * 60.0  # two models loaded, parity.IMAGES images each
RAW_CHECK = (sys.executable, "-m", "entrypoint.evaluation.rawcheck")  # TRAINBOX_RAW_CHECK: the tests' stand-in
_SPEED = re.compile(r"Speed: ([0-9.]+) ?ms/image")
PREDICTIONS = "predictions.json"


class EvaluationFailed(Exception):
    """This file was not scored; the message says why, in one line."""


class EvaluationStopped(EvaluationFailed):
    """Stopped by a SIGTERM: the next start of the finished run scores it."""


def val_argv(
    executable: str, weights: Path, data_yaml: Path, split: str, imgsz: str | None, device: str, out: Path
) -> list[str]:
    argv = [executable, "val", "--model", str(weights), "--data", str(data_yaml), "--split", split]
    argv += ["--batch", "1", "--workers", "0", "--device", device, "--save-json", "--json", "--plot-samples", "0"]
    argv += ["--imgsz", imgsz] if imgsz else []
    return [*argv, "--project", str(out.parent), "--name", out.name, "--exist-ok"]


def evaluate_file(
    executable: str,
    weights: Path,
    data_yaml: Path,
    split: Split,
    *,
    imgsz: str | None,
    device: str,
    scratch: Path,
    env: Mapping[str, str],
    stopping: Callable[[], bool] = lambda: False,
    timeout: float = VAL_TIMEOUT,
    ground: Sequence[Sequence[score.Truth]] | None = None,
) -> dict[str, Any]:
    """``weights`` scored on ``split``: its eval.json record."""
    out = scratch / "val"
    scratch.mkdir(parents=True, exist_ok=True)
    argv = val_argv(executable, weights, data_yaml, split.name, imgsz, device, out)
    output = _run(argv, scratch, env, timeout, stopping, f"libreyolo val {weights.name}")
    answer = procs.last_json(output)
    metrics = (answer or {}).get("metrics")
    if not isinstance(metrics, dict):
        raise EvaluationFailed(f"libreyolo val gave no metrics: {procs.last_line(output)}")
    speeds = _SPEED.findall(output)
    guesses = predictions(out / PREDICTIONS, len(split.images))
    found = score.score(ground if ground is not None else truths(split), guesses, len(split.names))
    return record.file_record(
        float(metrics.get("mAP50_95", 0.0)),
        float(metrics.get("mAP50", 0.0)),
        found,
        split.names,
        float(speeds[-1]) if speeds else None,
        str((answer or {}).get("device") or device),
    )


def raw_outputs(
    command: Sequence[str],
    weights: Path,
    export: Path,
    fmt: str,
    images: Sequence[Path],
    *,
    device: str,
    scratch: Path,
    env: Mapping[str, str],
    stopping: Callable[[], bool] = lambda: False,
    timeout: float = RAW_TIMEOUT,
) -> dict[str, Any]:
    """``export``'s raw outputs against ``weights``' on ``images`` (rawcheck.py, a child): parity.compare's record,
    at the format's tolerance."""
    allowed = parity.tolerance(fmt)
    argv = [*command, "--weights", str(weights), "--export", str(export), "--format", fmt, "--device", device]
    argv += ["--atol", repr(allowed.atol), "--rtol", repr(allowed.rtol), "--images", *map(str, images)]
    scratch.mkdir(parents=True, exist_ok=True)
    output = _run(argv, scratch, env, timeout, stopping, f"the raw-output check of {export.name}")
    lines = [line for line in output.splitlines() if line.startswith(RESULT)]
    found = json.loads(lines[-1].removeprefix(RESULT)) if lines else None
    if not parity.valid(found):
        raise EvaluationFailed(f"the raw-output check compared nothing: {procs.last_line(output)}")
    assert isinstance(found, dict)
    return found


def predictions(path: Path, images: int) -> list[list[Guess]]:
    """libreyolo's COCO-format results (``image_id``: the image's index, ``category_id``: the class, ``bbox``:
    x, y, width, height in pixels) by image."""
    try:
        rows = json.loads(path.read_text())
    except (OSError, ValueError) as error:
        raise EvaluationFailed(f"libreyolo val wrote no readable {PREDICTIONS}: {error}") from None
    found: list[list[Guess]] = [[] for _ in range(images)]
    for row in rows if isinstance(rows, list) else []:
        index = int(row["image_id"])
        if not 0 <= index < images:
            raise EvaluationFailed(f"{PREDICTIONS} names image {index}; the split has {images}")
        x, y, w, h = map(float, row["bbox"])
        found[index].append(Guess(int(row["category_id"]), float(row["score"]), (x, y, x + w, y + h)))
    return found


def _run(
    argv: list[str], cwd: Path, env: Mapping[str, str], timeout: float, stopping: Callable[[], bool], label: str
) -> str:
    done = procs.run_logged(argv, cwd, env, timeout, stopping, label)
    if done.why:
        raise (EvaluationStopped if stopping() else EvaluationFailed)(f"{label} {done.why}")
    if done.code != 0:
        raise EvaluationFailed(f"{label} exited with {done.code}: {done.tail()}")
    return done.output
