"""A stand-in ``libreyolo`` executable for tests of the agent: no torch, an epoch in a fraction of a second.

``install(bin_dir)`` writes it as ``bin_dir/libreyolo`` (run by the test's interpreter); point
``TRAINBOX_LIBREYOLO`` at it. It lays out a run folder as libreyolo does, so the agent watches, uploads and
resumes it for real.

``libreyolo train KEY=VALUE ...`` works in ``<project>/<name>``: it writes its pid to ``fake-pid``, then per
epoch, every ``FAKE_EPOCH_SECONDS`` (default 0), tiny real checkpoints (``weights/epoch_N.pt``, ``last.pt``,
``best.pt``: a zip holding the pickled epoch, rewritten in place like ``torch.save``), a ``metrics.jsonl``
line, and ``status.json`` last (renamed into place). ``resume=true model=<checkpoint>`` continues after the
checkpoint's epoch; ``epochs=`` sets the length (default 2). A ``metrics.jsonl`` row carries the columns the
agent reads from libreyolo's (``epoch``, ``time``, ``train/loss``, ``validated``, ``is_best``, ``metrics/mAP50``,
``metrics/mAP50-95``, ``best_epoch``...; mAP rises every epoch, so each one is the best so far), plus ``loss``;
``status.json`` has libreyolo's per-epoch keys; the end of a run writes ``summary.json`` and ``results.csv``
and prints libreyolo's ``Training complete`` line. ``FAKE_TRAIN_MODE``:

    ok       (default) train, exit 0; SIGINT saves and exits 130, like libreyolo
    deaf     train, but ignore SIGINT and SIGTERM (stuck in native code)
    forever  train without end (status.json names no total)
    fail     one error line, exit 1
    hang     one line, then nothing; ignores SIGINT
    enospc   epoch 1, then fails writing epoch 2 with "No space left on device", exit 1

``FAKE_TORN=<file>@<epoch>`` writes that checkpoint as 0 bytes at that epoch, as a full disk leaves it.
``FAKE_SECRET=<file>@<epoch>`` writes that checkpoint whole with ``HF_TOKEN``'s value in it (a config that
captured the environment).
``FAKE_OUTPUT_BYTES=<n>`` prints about n bytes of progress lines per epoch (a progress bar's output).

``FAKE_EPOCH_GATE=<dir>``: after epoch N (not the last), wait for the file ``<dir>/N`` before the next epoch (at
most 120 s), so a test decides when training goes on (e.g. once the boundary is on the Hub).

``FAKE_PRINT_ENV=NAME,...`` prints ``env NAME=value`` for each at the start (what the agent passed on).

``FAKE_OOM_ABOVE=<N>``: a run whose ``batch`` (in ``train_config.yaml``, as libreyolo records it; -1 is
16) is above N runs out of GPU memory during epoch ``FAKE_OOM_EPOCH`` (default 2) as libreyolo 1.6.0 does:
``status.json`` ``failed`` with ``error.type`` ``OutOfMemoryError``, its ``Error [cuda_oom]`` line, exit 1.

``FAKE_MAP=0.1,0.2,0.2,...``: each epoch is validated, its metrics.jsonl row carrying libreyolo's columns
(``metrics/mAP50-95`` from the list, the last value again past its end; ``metrics/mAP50``; ``validated``,
``is_best``, ``best_metric``, ``best_epoch``) and ``time``: ``FAKE_EPOCH_SECONDS``, the epoch's seconds.

``--help-json`` fails as libreyolo 1.6.0's does with typer 0.29.2.
``export`` fails as libreyolo does without the format's package; ``FAKE_EXPORT_MODE=hang``: it never ends;
``FAKE_EXPORT_MODE=ok``: writes ``best.<format's suffix>`` in its folder and prints libreyolo's JSON naming it.

``val --model M --data D --split S --project P --name N --save-json --json`` answers as ``libreyolo val`` does:
``P/N/predictions.json`` (COCO results: ``image_id`` the image's index in the split, ``category_id`` the class,
``bbox`` x, y, width, height in pixels), the ``Speed: <ms>ms/image`` log line and the JSON result (``metrics``:
``mAP50``, ``mAP50_95``, ...; ``device``). The stand-in model has learnt the validation split by heart: image i of
any split gets the boxes of validation image i's labels, so a test split labelled otherwise scores visibly lower.
An exported model (not ``.pt``) loses the last ``FAKE_EXPORT_DRIFT`` share (0-1, default 0) of each image's boxes.
A model that is not there, or a folder without an ``.xml`` (OpenVINO's IR), fails as libreyolo does (exit 4).
``FAKE_VAL_MODE=hang``: ``val`` never ends.
Any other command (``doctor``) reports no findings, after ``FAKE_DOCTOR_SECONDS`` (default 0).
"""

from __future__ import annotations

import io
import json
import os
import pickle
import signal
import sys
import time
import zipfile
from pathlib import Path


def install(bin_dir: Path) -> Path:
    """This file as an executable ``libreyolo`` in ``bin_dir``; returns its path."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    script = bin_dir / "libreyolo"
    script.write_text(f"#!{sys.executable}\n" + Path(__file__).read_text())
    script.chmod(0o755)
    return script


def _checkpoint(epoch: int, total: int, note: str = "") -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        payload = {"epoch": epoch - 1, "config": {"epochs": total, "note": note}, "pad": "x" * 4096}
        archive.writestr("ckpt/data.pkl", pickle.dumps(payload, protocol=2))
    return buffer.getvalue()


def _epoch_of(path: str) -> int:
    with zipfile.ZipFile(path) as archive:
        return pickle.loads(archive.read("ckpt/data.pkl"))["epoch"] + 1


def _interrupted(*_: object) -> None:
    print("interrupted: saving last.pt", flush=True)
    sys.exit(130)


def train(args: dict[str, str], mode: str) -> int:
    run_dir = os.path.join(args["project"], args["name"])
    os.makedirs(run_dir, exist_ok=True)
    with open(os.path.join(run_dir, "fake-pid"), "w") as f:
        f.write(str(os.getpid()))
    for name in filter(None, os.environ.get("FAKE_PRINT_ENV", "").split(",")):
        print(f"env {name}={os.environ.get(name)}", flush=True)
    if mode == "fail":
        print("RuntimeError: CUDA out of memory", flush=True)
        return 1
    if mode == "hang":
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        print("loading the model", flush=True)
        while True:
            time.sleep(3600)
    if mode == "deaf":
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    else:
        signal.signal(signal.SIGINT, _interrupted)
    weights = os.path.join(run_dir, "weights")
    os.makedirs(weights, exist_ok=True)
    total = int(args.get("epochs", "2"))
    batch = int(args.get("batch", "16"))
    batch = 16 if batch == -1 else batch
    with open(os.path.join(run_dir, "train_config.yaml"), "w") as f:
        f.write(f"epochs: {total}\nbatch: {batch}\n")
    oom_above = int(os.environ.get("FAKE_OOM_ABOVE", "0"))
    oom_epoch = int(os.environ.get("FAKE_OOM_EPOCH", "2"))
    pause = float(os.environ.get("FAKE_EPOCH_SECONDS", "0"))
    first = _epoch_of(args["model"]) + 1 if args.get("resume") == "true" else 1
    epoch = first
    chatter = int(os.environ.get("FAKE_OUTPUT_BYTES", "0"))
    curve = [float(value) for value in os.environ.get("FAKE_MAP", "").split(",") if value.strip()]
    while mode == "forever" or epoch <= total:
        time.sleep(pause)
        for step in range(chatter // 100):
            print(f"epoch {epoch} batch {step:6d} " + "=" * 80, flush=True)
        if oom_above and batch > oom_above and epoch == oom_epoch:
            return _out_of_memory(run_dir, epoch)
        data = _checkpoint(epoch, total)
        if mode == "enospc" and epoch == 2:
            print("OSError: [Errno 28] No space left on device: 'last.pt'", flush=True)
            return 1
        for name in (f"epoch_{epoch}.pt", "last.pt", "best.pt"):
            torn = os.environ.get("FAKE_TORN") == f"{name}@{epoch}"
            leaks = os.environ.get("FAKE_SECRET") == f"{name}@{epoch}"
            content = b"" if torn else _checkpoint(epoch, total, os.environ["HF_TOKEN"]) if leaks else data
            with open(os.path.join(weights, name), "wb") as f:  # in place, like torch.save
                f.write(content)
        row = _row(epoch, pause)
        if curve:  # FAKE_MAP's scripted mAP50-95
            row.update(_validated(run_dir, epoch, curve, pause))
        with open(os.path.join(run_dir, "metrics.jsonl"), "a") as f:
            f.write(json.dumps(row) + "\n")
        progress = {
            "current_epoch": epoch,
            "epoch_seconds": pause,
            "mean_epoch_seconds": pause,
            "train_loss": row["train/loss"],
            "metrics": {"mAP50": row["metrics/mAP50"], "mAP50-95": row["metrics/mAP50-95"]},
            "validated": True,
            "best_metric": row["best_metric"],
            "best_metric_name": row["best_metric_name"],
            "best_epoch": epoch,
        }
        if mode == "forever":
            status = {"state": "running", "completed_epochs": epoch, "pid": os.getpid(), **progress}
        else:
            state = "completed" if epoch == total else "running"
            status = {"state": state, "completed_epochs": epoch, "total_epochs": total, "pid": os.getpid()}
            status |= progress | {"eta_seconds": pause * (total - epoch)}
        tmp = os.path.join(run_dir, ".status.json.tmp")
        with open(tmp, "w") as f:
            json.dump(status, f)
        os.replace(tmp, os.path.join(run_dir, "status.json"))
        print(f"epoch {epoch}/{'?' if mode == 'forever' else total} done", flush=True)
        _wait_at_the_gate(epoch, total)
        epoch += 1
    _finish(run_dir, total)
    return 0


def _wait_at_the_gate(epoch: int, total: int) -> None:
    gate = os.environ.get("FAKE_EPOCH_GATE")
    if gate and epoch < total:
        deadline = time.monotonic() + 120
        while not os.path.exists(os.path.join(gate, str(epoch))) and time.monotonic() < deadline:
            time.sleep(0.05)


def _validated(run_dir: str, epoch: int, curve: list[float], seconds: float) -> dict[str, object]:
    """libreyolo's columns of a validated epoch, with the scripted mAP50-95 (the best so far read back)."""
    value = curve[min(epoch, len(curve)) - 1]
    best, best_epoch = value, epoch
    try:
        with open(os.path.join(run_dir, "metrics.jsonl")) as f:
            for line in f:
                earlier = json.loads(line)
                if earlier.get("epoch", epoch) < epoch and earlier.get("metrics/mAP50-95", -1.0) >= best:
                    best, best_epoch = earlier["metrics/mAP50-95"], earlier["epoch"]
    except (OSError, ValueError):
        pass
    return {
        "time": seconds,
        "validated": True,
        "is_best": best_epoch == epoch,
        "metrics/mAP50-95": value,
        "metrics/mAP50": min(1.0, value * 1.5),
        "current_metric": value,
        "current_metric_name": "mAP50-95",
        "best_metric": best,
        "best_metric_name": "mAP50-95",
        "best_epoch": best_epoch,
    }


def _row(epoch: int, seconds: float) -> dict[str, object]:
    """A ``metrics.jsonl`` row with (a subset of) the columns of libreyolo 1.6.0's, on a rising mAP curve."""
    map50 = round(0.9 * (1 - 0.6**epoch), 4)
    map50_95 = round(0.6 * map50, 4)
    return {
        "epoch": epoch,
        "loss": 1.0 / epoch,
        "time": seconds,
        "train/loss": round(1.0 / epoch, 4),
        "validated": True,
        "is_best": True,
        "current_metric": map50_95,
        "current_metric_name": "mAP50-95",
        "best_metric": map50_95,
        "best_metric_name": "mAP50-95",
        "best_epoch": epoch,
        "metrics/precision": map50,
        "metrics/recall": map50,
        "metrics/mAP50": map50,
        "metrics/mAP50-95": map50_95,
    }


def _finish(run_dir: str, total: int) -> None:
    """What libreyolo leaves at the end of a run: ``results.csv`` (its rows), ``summary.json``, one line."""
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        rows = [json.loads(line) for line in f if line.strip()]
    columns = list(rows[-1]) if rows else []
    with open(os.path.join(run_dir, "results.csv"), "w") as f:
        f.write(",".join(columns) + "\n")
        for row in rows:
            f.write(",".join(str(int(v) if isinstance(v, bool) else v) for v in (row.get(c, "") for c in columns)))
            f.write("\n")
    last = rows[-1] if rows else {}
    summary = {
        "total_epochs": total,
        "completed_epochs": last.get("epoch", 0),
        "best_metric": last.get("best_metric"),
        "best_epoch": last.get("best_epoch"),
        "checkpoints": {"best": "weights/best.pt", "last": "weights/last.pt"},
    }
    with open(os.path.join(run_dir, "summary.json"), "w") as f:
        json.dump(summary, f)
    print(f"Training complete: {last.get('epoch', 0)} epochs, results in {run_dir}", flush=True)


def _out_of_memory(run_dir: str, epoch: int) -> int:
    message = "CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79.10 GiB"
    status = {"state": "failed", "current_epoch": epoch, "error": {"type": "OutOfMemoryError", "message": message}}
    tmp = os.path.join(run_dir, ".status.json.tmp")
    with open(tmp, "w") as f:
        json.dump(status, f)
    os.replace(tmp, os.path.join(run_dir, "status.json"))
    print(f"ERROR    Error [cuda_oom]: Training failed: {message}", flush=True)
    return 1


def export(mode: str) -> int:
    """``libreyolo export``: fails as libreyolo does on a missing dependency (``fail``), or never ends (``hang``)."""
    if mode == "hang":
        time.sleep(3600)
    print("ERROR    Error [export_dep_missing]: ONNX export requires the 'onnx' package.", flush=True)
    return 1


_SUFFIX = {"onnx": ".onnx", "openvino": "_openvino_model", "torchscript": ".torchscript", "tensorrt": ".engine"}
_IMAGES = (".jpg", ".jpeg", ".png", ".bmp", ".webp", ".tiff", ".tif", ".gif")


def _options(argv: list[str]) -> dict[str, str]:
    found: dict[str, str] = {}
    for index, arg in enumerate(argv):
        if arg.startswith("--"):
            following = argv[index + 1] if index + 1 < len(argv) else ""
            found[arg[2:]] = "" if following.startswith("--") else following
    return found


def exported(fmt: str) -> int:
    name = "best" + _SUFFIX.get(fmt, "." + fmt)
    Path(name).write_bytes(b"stand-in export\n")
    print(json.dumps({"output_path": name, "format": fmt}), flush=True)
    return 0


def _split_images(config: dict[str, object], split: str, root: Path) -> list[Path]:
    entry = config.get(split)
    where = Path(str(entry))
    where = where if where.is_absolute() else root / where
    return sorted({path for path in where.iterdir() if path.suffix.lower() in _IMAGES}) if where.is_dir() else []


def _rows(image: Path) -> list[str]:
    parts = list(image.parts)
    parts[len(parts) - 1 - parts[::-1].index("images")] = "labels"
    label = Path(*parts).with_suffix(".txt")
    return [line for line in label.read_text().splitlines() if line.split()] if label.is_file() else []


def val(argv: list[str]) -> int:
    import yaml
    from PIL import Image

    if os.environ.get("FAKE_VAL_MODE") == "hang":
        time.sleep(3600)
    opts = _options(argv)
    model = Path(opts["model"])
    if not model.exists() or (model.is_dir() and not any(model.glob("*.xml"))):  # a folder: OpenVINO's IR
        print(f"ERROR    Error [model_not_found]: no model at {model}", flush=True)
        return 4
    data = Path(opts["data"])
    config = yaml.safe_load(data.read_text())
    root = Path(str(config.get("path") or data.parent))
    root = root if root.is_absolute() else data.parent / root
    split = opts.get("split") or "val"
    images = _split_images(config, split, root)
    learnt = _split_images(config, "val", root)
    drift = 0.0 if opts["model"].endswith(".pt") else float(os.environ.get("FAKE_EXPORT_DRIFT", "0"))
    results: list[dict[str, object]] = []
    same = total = 0
    for index, image in enumerate(images):
        truth = _rows(image)
        guess = _rows(learnt[index]) if index < len(learnt) else []
        guess = guess[: round(len(guess) * (1 - drift))]
        total += len(truth)
        same += sum(1 for row in guess if row in truth)
        with Image.open(image) as opened:
            width, height = opened.size
        for row in guess:
            cls, cx, cy, w, h = row.split()[:5]
            box = [(float(cx) - float(w) / 2) * width, (float(cy) - float(h) / 2) * height]
            box += [float(w) * width, float(h) * height]
            results.append({"image_id": index, "category_id": int(cls), "bbox": box, "score": 0.9})
    out = Path(opts.get("project") or "runs/val") / (opts.get("name") or "exp")
    out.mkdir(parents=True, exist_ok=True)
    (out / "predictions.json").write_text(json.dumps(results))
    score = round(same / total, 4) if total else 0.0
    print(f"INFO     |   Images processed: {len(images)}", file=sys.stderr)
    print("INFO     |   Speed: 12.5ms/image", file=sys.stderr, flush=True)
    metrics = {"mAP50": score, "mAP50_95": score, "precision": score, "recall": score}
    answer = {"model": opts["model"], "model_family": "yolo9", "data": str(data), "split": split, "device": "cpu"}
    print(json.dumps(answer | {"eval_backend": None, "metrics": metrics, "schema_version": 1}), flush=True)
    return 0


def main(argv: list[str]) -> int:
    if "--help-json" in argv:  # as libreyolo 1.6.0 with typer 0.29.2: the agent reads the source instead
        print("AttributeError: 'TyperOption' object has no attribute 'type'", file=sys.stderr)
        return 1
    if argv and argv[0] == "export":
        mode = os.environ.get("FAKE_EXPORT_MODE", "fail")
        return exported(_options(argv).get("format", "onnx")) if mode == "ok" else export(mode)
    if argv and argv[0] == "val":
        return val(argv[1:])
    if not argv or argv[0] != "train":
        time.sleep(float(os.environ.get("FAKE_DOCTOR_SECONDS", "0")))
        print(json.dumps({"findings": [], "summary": {}}))
        return 0
    args = dict(a.split("=", 1) for a in argv[1:] if "=" in a)
    return train(args, os.environ.get("FAKE_TRAIN_MODE", "ok"))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
