"""What a run is: its run id, the settings a derived RUN_NAME hashes (``Settings.identity``: all but ``epochs``)
and the dataset commit its first start resolved. A start that names a recorded run with another of these is
another run, refused at start in one line (exit 10) naming what differs; a higher ``epochs`` extends the run.

``refusal`` is the one comparison, pure (the protocol's simulation uses it too): a run's record (its
trainbox.json, from the volume or a store) against what this start brings. The callers raise ``refuse``'s error.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .. import run_args
from ..errors import ConfigError, NotThisRunError
from ..state import recorded_dataset_revision

RUN_ID = "run id"
DATASET_REVISION = "DATASET_REVISION"


@dataclass(frozen=True)
class Mismatch:
    """One thing that makes this start another run: its key (``RUN_ARGS imgsz``, ``OUTPUT_REPO``,
    ``DATASET_REVISION``, ``run id``), this start's value and the run's recorded one."""

    key: str
    here: str | None
    there: str | None

    def phrase(self) -> str:
        return f"{self.key} is {self.here or 'unset'} here, {self.there or 'unset'} in that run"


def refusal(
    record: Mapping[str, Any] | None,
    settings: Mapping[str, Any],
    *,
    run_id: str | None = None,
    dataset_commit: str | None = None,
) -> Mismatch | None:
    """The first thing that makes this start another run than the one ``record`` (a trainbox.json of it) describes,
    or None: the run id (``run_id``: the one this start holds, None: it knows none yet), the run-defining settings
    (``settings``: ``Settings.record()`` now), the dataset commit (``dataset_commit``: the one an explicit
    DATASET_REVISION names; None: not given, the run's own is taken). A record without one of these says nothing
    of it (an older trainbox.json, a run whose first start never resolved its dataset)."""
    if not record:
        return None
    theirs = record.get("run_id")
    if run_id is not None and isinstance(theirs, str) and theirs != run_id:
        return Mismatch(RUN_ID, run_id, theirs)
    if isinstance(record.get("settings"), dict):
        found = setting_mismatches(settings, record["settings"])
        if found:
            return found[0]
    pinned = recorded_dataset_revision(record)
    if dataset_commit is not None and pinned is not None and dataset_commit != pinned:
        return Mismatch(DATASET_REVISION, dataset_commit, pinned)
    return None


def setting_mismatches(ours: Mapping[str, Any], theirs: Any) -> list[Mismatch]:
    """What defines the run and differs between two trainbox.json ``settings`` records, by key (``identity``; an
    older record has only its dataset, repo and RUN_ARGS as libreyolo got them). ``epochs`` never differs."""
    theirs = theirs if isinstance(theirs, dict) else {}
    if isinstance(theirs.get("identity"), dict):
        mine, other = dict(ours.get("identity") or {}), dict(theirs["identity"])
    else:
        keys = {"DATASET_REPO": "dataset", "OUTPUT_REPO": "output_repo", "RUN_ARGS": "run_args"}
        mine = {name: ours.get(key) for name, key in keys.items()}
        other = {name: theirs.get(key) for name, key in keys.items()}
    found: list[Mismatch] = []
    for name in sorted(set(mine) | set(other)):
        if name == "RUN_ARGS":
            found += _arg_mismatches(str(mine.get(name) or ""), str(other.get(name) or ""))
        elif mine.get(name) != other.get(name):
            found.append(Mismatch(name, _text(mine.get(name)), _text(other.get(name))))
    return found


def _arg_mismatches(mine: str, theirs: str) -> list[Mismatch]:
    try:
        here, there = dict(run_args.parse(mine).defining().pairs), dict(run_args.parse(theirs).defining().pairs)
    except ConfigError:
        return [] if mine == theirs else [Mismatch("RUN_ARGS", repr(mine), repr(theirs))]
    return [
        Mismatch(f"RUN_ARGS {key}", here.get(key), there.get(key))
        for key in sorted(set(here) | set(there))
        if here.get(key) != there.get(key)
    ]


def _text(value: Any) -> str | None:
    return None if value is None else str(value)


def refuse(mismatch: Mismatch, run_name: str, where: str) -> NotThisRunError:
    """The one line of a refusal: ``where`` holds run ``run_name`` (this volume, OUTPUT_REPO …), which differs so."""
    if mismatch.key == RUN_ID:
        return NotThisRunError(
            f"{where} holds run {run_name!r} with run id {mismatch.there}, not this volume's {mismatch.here}:"
            " another run of that name",
            "use a new RUN_NAME (or OUTPUT_REPO) for this volume's run, or a new WORKDIR to continue the other",
        )
    if mismatch.key == DATASET_REVISION:
        return NotThisRunError(
            f"run {run_name!r} trains on dataset commit {mismatch.there}, resolved at its first start;"
            f" DATASET_REVISION names commit {mismatch.here}",
            "unset DATASET_REVISION to continue the run on its commit, or set a new RUN_NAME for a new dataset",
        )
    return NotThisRunError(
        f"{where} holds run {run_name!r} started with other settings: {mismatch.phrase()}",
        "start it with its own settings to continue it (more epochs extend it), or set a new RUN_NAME for a new run",
    )
