"""The end of a finished run: each EXPORT format made from ``best.pt``, run once in its own runtime, then moved beside
it in the run folder, so the final publish carries it to OUTPUT_REPO; and ``config.json`` at the run folder's root.
Before it is published it is judged against the ``.pt`` (the ``judge`` the wrap-up passes in: evaluation/end.py):
its raw outputs on the scored split's first images, and its score on that split; it is kept only if both are within
their tolerance.

``libreyolo export`` and the check (export/verify.py) are child processes with a time limit: the agent never
imports torch or initialises CUDA. An export that fails, times out or does not pass its check is never
published and never fails the run (the weights are the product): one WARNING line, and trainbox.json's
``exports`` (which the card shows) says why. After a SIGTERM the machine is going away: exports are skipped,
and one under way is stopped.
"""

from __future__ import annotations

import json
import shutil
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .. import libreyolo, procs
from ..errors import ConfigError
from ..libreyolo import EXPORT_FORMATS, ExportFormat
from ..log import logger
from ..runtimes import fetch as runtimes
from ..settings import Settings
from ..state import RunState
from . import verify

# libreyolo's ONNX export of a YOLOv9-s takes seconds on a CPU (docs/benchmarks.md); a TensorRT engine build
# takes minutes on a large model. Past these the format is given up, the run goes on.
EXPORT_TIMEOUT = 15 * 60.0
CHECK_TIMEOUT = 5 * 60.0


# The evaluation's judgement of a made file (format, its path here, its path in the repo): (passed, in words, more
# keys for its record: the raw outputs compared with best.pt's).
Judge = Callable[[str, Path, str], tuple[bool, str, dict[str, Any]]]


class ExportFailed(Exception):
    """This format is not published; the message says why, in one line; ``details`` go into its record."""

    def __init__(self, message: str, details: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.details = details or {}


class ExportStopped(ExportFailed):
    """Stopped by a SIGTERM: skipped, not failed, so the next start of the finished run makes it."""


def fetch_runtimes(settings: Settings) -> None:
    """The runtimes EXPORT's formats need and the image lacks (onnx, onnxruntime), fetched at the start, before
    the dataset: an EXPORT the user set that cannot have them is exit 10 now, not a surprise after training; the
    default EXPORT (onnx, from OUTPUT_REPO) goes without: one WARNING, the run trains and publishes the weights."""
    for name in settings.export:
        for runtime in runtimes.providing(EXPORT_FORMATS[name].modules):
            try:
                runtimes.ensure(runtime, settings.workdir, settings.env)
            except runtimes.FetchFailed as error:
                if "EXPORT" in settings.env:
                    raise ConfigError(
                        f"EXPORT={name} needs {', '.join(runtime.wheels)}, and fetching them failed: {error}",
                        f"let the container reach PyPI (or set PIP_INDEX_URL/PIP_FIND_LINKS), build the image with"
                        f" --build-arg TRAINBOX_RUNTIMES={runtime.name}, or set EXPORT=off",
                    ) from None
                logger.warning(
                    "export %s: skipped: fetching %s failed: %s (allow PyPI, build the image with"
                    " --build-arg TRAINBOX_RUNTIMES=%s, or set EXPORT=off)",
                    name,
                    runtime.name,
                    error,
                    runtime.name,
                )


def export_all(
    settings: Settings,
    state: RunState,
    *,
    device: str,
    stopping: Callable[[], bool],
    data_yaml: Path | None,
    names: tuple[str, ...] | None = None,
    judge: Judge | None = None,
) -> dict[str, dict[str, Any]]:
    """Each of ``names`` (every EXPORT format by default), in order; each one's record (also in trainbox.json's
    ``exports``). ``judge`` scores a made file before it is published (evaluation/end.py): ``(passed, words)``."""
    best = settings.run_dir / libreyolo.BEST_CHECKPOINT
    records: dict[str, dict[str, Any]] = {}
    for name in settings.export if names is None else names:
        said = _said_at_the_start(name)
        if stopping():
            record: dict[str, Any] = {"status": "skipped", "why": "the machine is being taken back (SIGTERM)"}
        elif unfetched := _unfetched(settings, name):
            record = {"status": "skipped", "why": unfetched}
        elif not best.is_file():
            record = {"status": "failed", "why": f"{libreyolo.BEST_CHECKPOINT} is missing"}
        elif data_yaml is None or not data_yaml.is_file():
            record = {"status": "failed", "why": "no dataset on this volume to check the export on"}
        else:
            record = _one(settings, EXPORT_FORMATS[name], best, data_yaml, device, stopping, judge)
        if record["status"] != "published" and not (said and record["why"] == said):
            logger.warning("export %s: not published: %s", name, record["why"])
        records[name] = record
        state.update(exports={name: record})
    return records


def carried(previous: dict[str, Any] | None, settings: Settings) -> dict[str, Any]:
    """What a start that finds the run trained keeps of the attempt before it, for its end: the dataset the
    exports are checked on, and the exports already settled. Kept in its own record at once, so a start killed
    before its end leaves them to the next one too."""
    kept: dict[str, Any] = {}
    dataset = (previous or {}).get("dataset")
    if isinstance(dataset, dict):
        kept["dataset"] = dataset
    if done := settled(previous, settings):
        kept["exports"] = done
    return kept


def settled(previous: dict[str, Any] | None, settings: Settings) -> dict[str, dict[str, Any]]:
    """The EXPORT formats an earlier attempt of this finished run settled: published (its file still beside
    best.pt) or failed. A format it never reached (killed, even with -9, during the exports) or skipped
    (SIGTERM) is not settled: a start that finds the run already trained exports it then."""
    recorded = (previous or {}).get("exports")
    if not isinstance(recorded, dict):
        return {}
    found: dict[str, dict[str, Any]] = {}
    for name in settings.export:
        record = recorded.get(name)
        if not isinstance(record, dict):
            continue
        file = record.get("file")
        if record.get("status") == "failed" or (
            record.get("status") == "published" and isinstance(file, str) and (settings.run_dir / file).exists()
        ):
            found[name] = record
    return found


def _said_at_the_start(name: str) -> str | None:
    """The fetch that failed at the start (``fetch_runtimes`` logged its WARNING then): not said twice."""
    for runtime in runtimes.providing(EXPORT_FORMATS[name].modules):
        if (failed := runtimes.failure(runtime)) is not None:
            return _fetch_failed(runtime, failed)
    return None


def _fetch_failed(runtime: runtimes.Runtime, why: str) -> str:
    return f"fetching {', '.join(runtime.wheels)} failed: {why}"


def _unfetched(settings: Settings, name: str) -> str | None:
    """Why the runtimes of ``name`` are not here (fetched at the start, or now: the volume keeps them), or None."""
    for runtime in runtimes.providing(EXPORT_FORMATS[name].modules):
        try:
            runtimes.ensure(runtime, settings.workdir, settings.env)
        except runtimes.FetchFailed as error:
            return _fetch_failed(runtime, str(error))
    return None


def _one(
    settings: Settings,
    fmt: ExportFormat,
    best: Path,
    data_yaml: Path,
    device: str,
    stopping: Callable[[], bool],
    judge: Judge | None,
) -> dict[str, Any]:
    scratch = settings.agent_dir / "export" / fmt.name
    shutil.rmtree(scratch, ignore_errors=True)
    scratch.mkdir(parents=True)
    _forget_earlier(fmt, best)  # an earlier attempt's file was made from another best.pt
    started = time.monotonic()
    try:
        made = _export(settings, fmt, best, scratch, device, stopping)
        exported_at = time.monotonic() - started
        # An engine is run once here for the GPU and TensorRT that built it (its name); every format is judged
        # next, its raw outputs and its score on the held-out split against best.pt's (evaluation/end.py).
        checked = _check(settings, fmt, best, made, data_yaml, device, stopping) if fmt.name == "tensorrt" else {}
        name = _published_name(fmt, best, checked)
        ran, details = "made; not scored (no evaluation)", dict[str, Any]()
        if judge is not None:  # judged before it is published: a file that fails never reaches the stores
            passed, ran, details = judge(fmt.name, made, f"{libreyolo.WEIGHTS_DIR}/{name}")
            if not passed:  # cut by a SIGTERM: skipped, the next start of the finished run judges it
                raise (ExportStopped if stopping() else ExportFailed)(ran, details)
        published = _publish(settings.run_dir, made, name)
    except (ExportFailed, OSError, ValueError, KeyError) as error:  # a file or an answer not as expected too
        why = str(error) if isinstance(error, ExportFailed) else f"{type(error).__name__}: {error}"
        status = "skipped" if isinstance(error, ExportStopped) else "failed"
        more = error.details if isinstance(error, ExportFailed) else {}
        return {"status": status, "why": why, "seconds": round(time.monotonic() - started, 1)} | more
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    relative = published.relative_to(settings.run_dir).as_posix()
    logger.info("export %s: %s in %.1f s, %s", fmt.name, relative, exported_at, ran)
    record: dict[str, Any] = {
        "status": "published",
        "file": relative,
        "runtime": fmt.runtime,
        "seconds": round(exported_at, 1),
        "check": ran,
    } | details
    return record | {key: checked[key] for key in ("arch", "tensorrt") if key in checked}


def _export(
    settings: Settings, fmt: ExportFormat, best: Path, scratch: Path, device: str, stopping: Callable[[], bool]
) -> Path:
    argv = [libreyolo.executable(settings.libreyolo_command), "export", "--model", str(best), "--format", fmt.name]
    imgsz = settings.run_args.get("imgsz")
    argv += ["--imgsz", imgsz] if imgsz else []
    argv += ["--half"] if fmt.name == "tensorrt" else []  # what an engine is built for; the check allows FP16
    argv += ["--device", device, "--json"]
    done = _run(argv, scratch, settings, EXPORT_TIMEOUT, stopping, f"libreyolo export {fmt.name}")
    result = procs.last_json(done)
    path = result.get("output_path") if result else None
    if not isinstance(path, str) or not (scratch / path).exists():
        raise ExportFailed(f"libreyolo export named no file it wrote: {procs.last_line(done)}")
    return scratch / path


def _check(
    settings: Settings,
    fmt: ExportFormat,
    best: Path,
    made: Path,
    data_yaml: Path,
    device: str,
    stopping: Callable[[], bool],
) -> dict[str, Any]:
    argv = [sys.executable, "-m", "entrypoint.export.verify", "--weights", str(best), "--export", str(made)]
    argv += ["--data", str(data_yaml), "--format", fmt.name, "--device", device]
    imgsz = settings.run_args.get("imgsz")
    argv += ["--imgsz", imgsz] if imgsz and imgsz.isdigit() else []
    done = _run(argv, made.parent, settings, CHECK_TIMEOUT, stopping, f"the {fmt.runtime} check")
    lines = [line for line in done.splitlines() if line.startswith(verify.RESULT)]
    if not lines:
        raise ExportFailed(f"{fmt.runtime} could not run it: {procs.last_line(done)}")
    found: dict[str, Any] = json.loads(lines[-1].removeprefix(verify.RESULT))
    return found


def _run(
    argv: list[str], cwd: Path, settings: Settings, timeout: float, stopping: Callable[[], bool], label: str
) -> str:
    """``argv`` to its end, within ``timeout``, stopped at once when ``stopping()``; its output read from a file
    (no pipe a grandchild could hold open). A non-zero exit or a stop is ``ExportFailed``."""
    env = runtimes.child_env(settings.env)  # the fetched onnx, onnxruntime
    done = procs.run_logged(argv, cwd, env, timeout, stopping, label)
    if done.why:
        raise (ExportStopped if stopping() else ExportFailed)(f"{label} {done.why}")
    if done.code != 0:
        raise ExportFailed(f"{label} exited with {done.code}: {done.tail()}")
    return done.output


def _published_name(fmt: ExportFormat, best: Path, checked: dict[str, Any]) -> str:
    """Its name beside best.pt; an engine's names the GPU architecture and TensorRT version it runs on."""
    if fmt.name == "tensorrt":
        return f"{best.stem}.{checked['arch']}.trt{checked['tensorrt']}.engine"
    return fmt.artifact(best).name


def _forget_earlier(fmt: ExportFormat, best: Path) -> None:
    """Remove this format's file an earlier attempt published beside best.pt (an extended run has a new best.pt):
    a failed export must not leave a stale one to be published with the new weights."""
    earlier = [fmt.artifact(best), *best.parent.glob(f"{best.stem}.*.engine")] if fmt.name == "tensorrt" else []
    for path in earlier or [fmt.artifact(best)]:
        if path.is_dir():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)


def _publish(run_dir: Path, made: Path, name: str) -> Path:
    """Into the run folder's weights/, replacing an earlier export of the same name: what the sync uploads."""
    target = run_dir / libreyolo.WEIGHTS_DIR / name
    if target.is_dir():
        shutil.rmtree(target)
    shutil.move(str(made), str(target))
    return target
