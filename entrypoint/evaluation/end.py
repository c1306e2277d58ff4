"""The end of a finished run: ``best.pt`` and every published export scored on the same split; an export that
does not score like the ``.pt`` (``record.judge``) is taken back (one WARNING line, its record says both numbers,
the run still succeeds); ``eval.json`` in the run folder, which the final publish carries to OUTPUT_REPO.

A start that finds the run trained and its evaluation unsettled (a preemption during it) evaluates without
training again: trainbox.json's ``evaluation`` says what is settled, kept over by ``carried``.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import AgentError
from ..log import logger
from . import record
from .run import EvaluationFailed, EvaluationStopped, evaluate_file
from .split import choose, truths


@dataclass(frozen=True)
class Job:
    """What the evaluation needs of the run, as the caller knows it."""

    executable: str  # libreyolo
    run_dir: Path
    scratch: Path
    data_yaml: Path
    imgsz: str | None
    device: str
    env: Mapping[str, str]
    revision: str | None
    stopping: Callable[[], bool]


def carried(previous: dict[str, Any] | None) -> dict[str, Any]:
    """A settled evaluation of the attempt before (all its files scored), for a start that finds the run trained."""
    found = (previous or {}).get("evaluation")
    return {"evaluation": found} if isinstance(found, dict) and found.get("settled") else {}


def settled(snapshot: dict[str, Any], run_dir: Path) -> bool:
    found = snapshot.get("evaluation")
    return isinstance(found, dict) and bool(found.get("settled")) and (run_dir / record.EVAL_FILE).is_file()


def evaluate_run(
    job: Job, best: str, exports: dict[str, dict[str, Any]], save: Callable[[dict[str, Any]], None]
) -> tuple[dict[str, Any] | None, dict[str, dict[str, Any]]]:
    """``best`` (its path in the run folder) and each published export scored; the evaluation (None when
    nothing was scored) and the export records, a failed judgement made ``failed``. ``save`` records the
    state in trainbox.json as it goes."""
    try:
        split = choose(job.data_yaml)
        ground = truths(split)
    except (AgentError, OSError, ValueError) as error:  # checked at the dataset stage; a courtesy here
        logger.warning("evaluation: not done: %s", error)
        save({"settled": False, "error": str(error)})
        why = f"not scored: {error}"
        unjudged = {
            name: _taken_back(job.run_dir, entry, why) if entry.get("status") == "published" else entry
            for name, entry in exports.items()
        }
        return None, unjudged
    started = time.monotonic()
    files: dict[str, dict[str, Any]] = {}
    todo = [(best, None)] + [
        (str(entry["file"]), name) for name, entry in exports.items() if entry.get("status") == "published"
    ]
    judged = dict(exports)
    stopped = False
    for path, fmt in todo:
        try:
            found = evaluate_file(
                job.executable,
                job.run_dir / path,
                job.data_yaml,
                split,
                imgsz=job.imgsz,
                device=job.device,
                scratch=job.scratch / Path(path).name,
                env=job.env,
                stopping=job.stopping,
                ground=ground,
            )
        except EvaluationFailed as error:
            stopped = stopped or isinstance(error, EvaluationStopped)
            logger.warning("evaluation %s: not scored: %s", path, error)
            if fmt is not None and not stopped:
                judged[fmt] = _taken_back(job.run_dir, judged[fmt], f"it could not be scored: {error}")
            continue
        finally:
            shutil.rmtree(job.scratch / Path(path).name, ignore_errors=True)
        if fmt is not None and best not in files:
            judged[fmt] = _taken_back(job.run_dir, judged[fmt], "best.pt could not be scored to compare it with")
            continue
        if fmt is not None:
            verdict = record.judge(files[best], found, fmt)
            if verdict is not None:
                logger.warning("export %s: not published: %s", fmt, verdict)
                judged[fmt] = _taken_back(job.run_dir, judged[fmt], verdict)  # its record keeps both numbers
                _line(path, found, split.words, "not published")
                continue
            judged[fmt] = judged[fmt] | {"check": _agreement(files[best], found, fmt)}
        files[path] = found
        _line(path, found, split.words, None)
    if not files:
        save({"settled": False, "split": split.name})
        return None, judged
    evaluation = record.document(split.name, job.revision, files)
    record.write(job.run_dir, evaluation)
    save(
        {
            "settled": not stopped,
            "split": split.name,
            "seconds": round(time.monotonic() - started, 1),
            "best": {key: files[best][key] for key in ("map50_95", "map50")} if best in files else None,
        }
    )
    return evaluation, judged


def _line(path: str, found: dict[str, Any], words: str, note: str | None) -> None:
    logger.info(
        "evaluation %s: mAP50-95 %.1f, mAP50 %.1f, P %.1f, R %.1f, %s ms/image on %s, %s%s",
        path,
        found["map50_95"] * 100,
        found["map50"] * 100,
        found["precision"] * 100,
        found["recall"] * 100,
        "—" if found["ms_per_image"] is None else f"{found['ms_per_image']:.1f}",
        found["device"],
        words,
        f" ({note})" if note else "",
    )


def _agreement(reference: dict[str, Any], candidate: dict[str, Any], fmt: str) -> str:
    return (
        f"mAP50-95 {candidate['map50_95'] * 100:.2f} against best.pt's {reference['map50_95'] * 100:.2f}"
        f" on the same split (allowed ± {record.tolerance(fmt) * 100:.2f} points)"
    )


def _taken_back(run_dir: Path, entry: dict[str, Any], why: str) -> dict[str, Any]:
    """The export's file removed from the run folder (never published as good); its record says why."""
    file = entry.get("file")
    if isinstance(file, str):
        path = run_dir / file
        if path.is_dir():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)
    kept = {key: value for key, value in entry.items() if key not in ("file", "check")}
    return kept | {"status": "failed", "why": why}
