"""Extending a run: more ``epochs`` than its checkpoint was trained towards, under the same RUN_NAME.

``epochs`` does not define the run (run_args.EXTENDS_THE_RUN), so raising it finds the run's own
checkpoint on the volume, in its bucket or in OUTPUT_REPO, finished or not. libreyolo 1.6.0 resumes a
checkpoint with a new total (``resume=true epochs=N``: its explicit arguments override the saved ones;
tests/integration/test_extend.py holds it to that): weights, optimizer, EMA and best-metric tracking
carry on, its learning-rate schedule runs to the new total, and the run folder keeps every epoch once.
So an extension is an ordinary resume; this module only notices one and records it in trainbox.json
(``extensions``, kept across attempts) for the log and the model card.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..log import logger
from ..state import RunState
from ..sync import checkpoint

# How the run went on: through libreyolo's own resume (the only way used while libreyolo allows a new total).
HOW = "resume"


def note(state: RunState, path: Path, completed: int, total: int) -> None:
    """At a resume point: record in trainbox.json the extension this start makes, if any, after the earlier ones."""
    new = detect(path, completed, total)
    found = record(history(state.snapshot()) or history(state.previous), new)
    if new is not None and found[-1] is new:
        logger.info("run %s: %s", state.snapshot().get("run_name"), describe(new))
    if found:
        state.update(extensions=found)


def saved_total(path: Path) -> int | None:
    """The epochs the checkpoint at ``path`` was trained towards (its saved ``epochs``)."""
    try:
        return checkpoint.inspect(path).total_epochs
    except (OSError, checkpoint.InvalidCheckpoint):
        return None


def detect(path: Path, completed: int, total: int) -> dict[str, Any] | None:
    """The extension this start makes, or None: the checkpoint at ``path`` (``completed`` epochs done) was
    trained towards fewer epochs than ``total``. Read before training writes that checkpoint again."""
    before = saved_total(path)
    if before is None or total <= before:
        return None
    return {"from_epochs": before, "to_epochs": total, "after_epoch": completed, "how": HOW}


def history(previous: dict[str, Any] | None) -> list[dict[str, Any]]:
    """The extensions an earlier attempt's trainbox.json recorded (entries that do not parse are dropped)."""
    found = (previous or {}).get("extensions")
    return [dict(entry) for entry in found if _valid(entry)] if isinstance(found, list) else []


def record(previous: list[dict[str, Any]], new: dict[str, Any] | None) -> list[dict[str, Any]]:
    """``previous`` plus ``new`` unless already there (a restart of an extended run does not extend it again)."""
    if new is None or any(entry.get("to_epochs") == new["to_epochs"] for entry in previous):
        return previous
    return [*previous, new]


def describe(entry: dict[str, Any]) -> str:
    """One sentence for the log and the card."""
    return (
        f"Extended from {entry['from_epochs']} to {entry['to_epochs']} epochs after epoch {entry['after_epoch']},"
        f" through libreyolo's resume with the new total (weights, optimizer and EMA carry on)."
    )


def _valid(entry: Any) -> bool:
    keys = ("from_epochs", "to_epochs", "after_epoch")
    return isinstance(entry, dict) and all(isinstance(entry.get(key), int) for key in keys)
