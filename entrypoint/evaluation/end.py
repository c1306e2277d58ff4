"""The end of a finished run: ``best.pt`` scored on the held-out split, and each export judged before it is
published (``Scorer.judge``, which export/run.py calls): its raw outputs against best.pt's on the split's first
images (parity.py, in a child: rawcheck.py), and its score; one outside either tolerance (``record.judge``) is
never published (one WARNING line, its record says both numbers, the run still succeeds);
``eval.json`` in the run folder, which the final publish carries to OUTPUT_REPO.

A start that finds the run trained and its evaluation unsettled (a preemption during it) scores without training
again: trainbox.json's ``evaluation`` says what is settled, kept over by ``carried``.
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
from . import parity, record
from .run import RAW_CHECK, EvaluationFailed, EvaluationStopped, evaluate_file, raw_outputs
from .score import Truth
from .split import Split, choose, truths


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
    best: str  # best.pt's path in the run folder (and the repo)
    raw_check: tuple[str, ...] = RAW_CHECK  # the raw-output check's child


def carried(previous: dict[str, Any] | None) -> dict[str, Any]:
    """A settled evaluation of the attempt before, for a start that finds the run trained."""
    found = (previous or {}).get("evaluation")
    return {"evaluation": found} if isinstance(found, dict) and found.get("settled") else {}


def settled(snapshot: dict[str, Any], run_dir: Path) -> bool:
    found = snapshot.get("evaluation")
    return isinstance(found, dict) and bool(found.get("settled")) and (run_dir / record.EVAL_FILE).is_file()


class Scorer:
    """Scores best.pt once, then each file it is given; ``finish`` writes eval.json and the record."""

    def __init__(self, job: Job, save: Callable[[dict[str, Any]], None]) -> None:
        self.job, self.save = job, save
        self.files: dict[str, dict[str, Any]] = {}
        self.stopped = False
        self.started = time.monotonic()
        self.split: Split | None = None
        self.ground: list[list[Truth]] = []
        self.broken: str | None = None
        try:
            self.split = choose(job.data_yaml)
            self.ground = truths(self.split)
        except (AgentError, OSError, ValueError) as error:  # checked at the dataset stage; a courtesy here
            self.broken = str(error)
            logger.warning("evaluation: not done: %s", error)

    def judge(self, fmt: str, made: Path, path: str) -> tuple[bool, str, dict[str, Any]]:
        """An export made at ``made``, to be published at ``path``: does it compute what best.pt computes (its raw
        outputs on the split's first images, parity.py), and score like it? (passed, in words, for its record)."""
        reference = self._best()
        if reference is None:
            return False, f"not scored: best.pt could not be scored ({self.broken or 'see the log'})", {}
        raw = self._raw(fmt, made)
        if raw is None:
            return False, f"raw outputs not compared: {self.broken or 'see the log'}", {}
        found = self._score(path, made)
        if found is None:
            return False, f"not scored: {self.broken or 'see the log'}; {parity.words(raw)}", {"raw_outputs": raw}
        verdict = record.judge(reference, found, fmt, raw)
        if verdict is not None:
            self._line(path, found, "not published")
            return False, verdict, {"raw_outputs": raw}
        self.files[path] = found | {"raw_outputs": raw}
        self._line(path, found, None)
        return (
            True,
            (
                f"scored: mAP50-95 {found['map50_95'] * 100:.2f} against best.pt's {reference['map50_95'] * 100:.2f}"
                f" on the same split (allowed ± {record.tolerance(fmt) * 100:.2f} points); {parity.words(raw)}"
            ),
            {"raw_outputs": raw},
        )

    def finish(self, exports: dict[str, dict[str, Any]]) -> dict[str, Any] | None:
        """best.pt scored if it is not yet, and the published exports an earlier attempt judged; eval.json."""
        self._best()
        for entry in exports.values():
            file = entry.get("file")
            if entry.get("status") != "published" or not isinstance(file, str) or file in self.files:
                continue
            if (found := self._score(file, self.job.run_dir / file)) is not None:
                raw = entry.get("raw_outputs")  # compared when it was made, by the attempt that published it
                self.files[file] = found | ({"raw_outputs": raw} if parity.valid(raw) else {})
                self._line(file, found, None)
        if self.split is None or self.job.best not in self.files:
            self.save({"settled": False, "error": self.broken or "best.pt was not scored"})
            return None
        evaluation = record.document(self.split.name, self.job.revision, self.files)
        record.write(self.job.run_dir, evaluation)
        best = self.files[self.job.best]
        self.save(
            {
                "settled": not self.stopped,
                "split": self.split.name,
                "seconds": round(time.monotonic() - self.started, 1),
                "best": {"map50_95": best["map50_95"], "map50": best["map50"]},
            }
        )
        return evaluation

    def _best(self) -> dict[str, Any] | None:
        if self.job.best not in self.files:
            found = self._score(self.job.best, self.job.run_dir / self.job.best)
            if found is None:
                return None
            self.files[self.job.best] = found
            self._line(self.job.best, found, None)
        return self.files[self.job.best]

    def _raw(self, fmt: str, made: Path) -> dict[str, Any] | None:
        if self.split is None or self.stopped:
            return None
        scratch = self.job.scratch / f"raw-{made.name}"
        try:
            return raw_outputs(
                self.job.raw_check,
                self.job.run_dir / self.job.best,
                made,
                fmt,
                self.split.images[: parity.IMAGES],
                device=self.job.device,
                scratch=scratch,
                env=self.job.env,
                stopping=self.job.stopping,
            )
        except EvaluationFailed as error:  # the export's own WARNING line says it (export/run.py)
            self.stopped = self.stopped or isinstance(error, EvaluationStopped)
            self.broken = str(error)
            return None
        finally:
            shutil.rmtree(scratch, ignore_errors=True)

    def _score(self, path: str, local: Path) -> dict[str, Any] | None:
        if self.split is None or self.stopped:
            return None
        scratch = self.job.scratch / Path(path).name
        try:
            return evaluate_file(
                self.job.executable,
                local,
                self.job.data_yaml,
                self.split,
                imgsz=self.job.imgsz,
                device=self.job.device,
                scratch=scratch,
                env=self.job.env,
                stopping=self.job.stopping,
                ground=self.ground,
            )
        except EvaluationFailed as error:
            self.stopped = self.stopped or isinstance(error, EvaluationStopped)
            self.broken = str(error)
            logger.warning("evaluation %s: not scored: %s", path, error)
            return None
        finally:
            shutil.rmtree(scratch, ignore_errors=True)

    def _line(self, path: str, found: dict[str, Any], note: str | None) -> None:
        assert self.split is not None
        ms = "—" if found["ms_per_image"] is None else f"{found['ms_per_image']:.1f}"
        logger.info(
            "evaluation %s: mAP50-95 %.1f, mAP50 %.1f, P %.1f, R %.1f, %s ms/image on %s; scored on the %s%s",
            path,
            found["map50_95"] * 100,
            found["map50"] * 100,
            found["precision"] * 100,
            found["recall"] * 100,
            ms,
            found["device"],
            self.split.words,
            f" ({note})" if note else "",
        )
