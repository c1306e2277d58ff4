"""trainbox.json: what the agent is doing and did, written atomically into the run folder.

Phases in order: ``starting → preflight → resume → dataset → training → finishing``; then one
terminal phase: ``done`` (trained, or already complete), ``failed``, ``preempted``
(SIGTERM), ``stalled`` (no progress for STALL_TIMEOUT) or ``timed_out`` (MAX_RUNTIME, or
MAX_COST: ``exit.reason`` tells them apart).
"""

from __future__ import annotations

import contextlib
import copy
import datetime as dt
import enum
import json
import os
import re
import secrets
import tempfile
import threading
import time
from collections.abc import Callable, Mapping
from importlib import metadata
from pathlib import Path
from typing import IO, Any

from . import __version__
from .log import logger, redact

STATE_FILE = "trainbox.json"
SCHEMA_VERSION = 1
_COMMIT = re.compile(r"[0-9a-f]{40}")
_RUN_ID_BYTES = 8  # 16 hex digits: a run's identity in its stores (the bucket's manifests and folder)


class Phase(enum.StrEnum):
    STARTING = "starting"
    PREFLIGHT = "preflight"
    RESUME = "resume"
    DATASET = "dataset"
    TRAINING = "training"
    FINISHING = "finishing"
    DONE = "done"
    FAILED = "failed"
    PREEMPTED = "preempted"
    STALLED = "stalled"
    TIMED_OUT = "timed_out"

    @property
    def terminal(self) -> bool:
        return self in TERMINAL_PHASES


TERMINAL_PHASES = frozenset({Phase.DONE, Phase.FAILED, Phase.PREEMPTED, Phase.STALLED, Phase.TIMED_OUT})


def now_iso() -> str:
    return dt.datetime.now(dt.UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


def versions() -> dict[str, str | None]:
    """Installed versions, read from package metadata (importing torch would cost seconds)."""

    def version(name: str) -> str | None:
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            return None

    return {
        "trainbox": __version__,
        "libreyolo": version("libreyolo"),
        "torch": version("torch"),
        "torchvision": version("torchvision"),
        "huggingface_hub": version("huggingface_hub"),
    }


def write_json_atomic(path: Path, data: Any) -> None:
    """trainbox.json and friends, scrubbed of secrets, written whole or not at all."""
    path.parent.mkdir(parents=True, exist_ok=True)
    text = redact(json.dumps(data, indent=2, sort_keys=False) + "\n")
    replace_atomically(path, lambda handle: handle.write(text.encode()))


def replace_atomically(path: Path, write: Callable[[IO[bytes]], object]) -> None:
    """Write via a hidden temporary file in the same folder and rename, so readers (the uploader
    among them) never see half a file; the dot prefix keeps the uploader off the temporary one."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as handle:
            write(handle)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def read_state(path: Path) -> dict[str, Any] | None:
    try:
        state = json.loads(path.read_text())
    except (OSError, ValueError, RecursionError):  # RecursionError: nested too deep to parse
        return None
    return state if isinstance(state, dict) else None  # valid JSON but not ours: as unreadable


def _history(previous: dict[str, Any] | None) -> list[dict[str, Any]]:
    """The earlier attempts a trainbox.json lists; entries that do not parse are dropped, never fatal
    (a damaged history must not keep the job from starting, and so from releasing the machine)."""
    entries = (previous or {}).get("attempts")
    return [dict(entry) for entry in entries if isinstance(entry, dict)] if isinstance(entries, list) else []


def _lost_attempt(previous: dict[str, Any] | None) -> list[dict[str, Any]]:
    """An attempt that never wrote its end (SIGKILL, power loss) is recorded as lost."""
    if not previous:
        return []
    try:
        if Phase(previous.get("phase", "done")).terminal:
            return []
    except (ValueError, TypeError):  # a phase this version does not know: it never wrote an end we can read
        pass
    if any(entry.get("attempt") == previous.get("attempt") for entry in _history(previous)):
        return []
    progress = previous.get("progress")
    spent = lost_spend(previous)  # its last record of its spend, plus one interval: an upper estimate
    return [
        {
            "attempt": previous.get("attempt"),
            "started_at": previous.get("started_at"),
            "finished_at": previous.get("updated_at"),
            "phase": previous.get("phase"),
            "exit_code": None,
            "reason": "lost",
            "epochs_done": progress.get("epochs_done") if isinstance(progress, dict) else None,
            **({"cost": spent} if spent is not None else {}),
        }
    ]


LOST_SPEND_NOTE = "upper estimate: killed after its last record, counted up to it plus one interval between records"


def lost_spend(previous: dict[str, Any]) -> dict[str, Any] | None:
    """The spend of an attempt that never wrote its end, from its trainbox.json's ``cost`` block: its last record
    plus one ``interval_seconds`` (how far apart its records were), at its price. None when it recorded none."""
    block = previous.get("cost")
    if not isinstance(block, dict) or _number(block.get("hours")) is None:
        return None
    hours = float(block["hours"]) + (_number(block.get("interval_seconds")) or 0.0) / 3600
    price = _number(block.get("price_per_hour"))
    dollars = None if price is None else round(hours * price, 4)
    return {
        "hours": round(hours, 4),
        "price_per_hour": price,
        "price_source": block.get("price_source"),
        "dollars": dollars,
        "estimate": LOST_SPEND_NOTE,
    }


def _number(value: object) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def _run_id(data: dict[str, Any] | None) -> str | None:
    value = (data or {}).get("run_id")
    return value if isinstance(value, str) and value.isalnum() and 8 <= len(value) <= 64 else None


def recorded_dataset_revision(data: Mapping[str, Any] | None) -> str | None:
    """The dataset commit a run trains on: ``dataset_revision``, kept from its first start; else (a trainbox.json
    from before it was kept) the commit its last dataset stage recorded."""
    data = data or {}
    dataset = data.get("dataset")
    value = data.get("dataset_revision") or (dataset.get("revision") if isinstance(dataset, dict) else None)
    return value if isinstance(value, str) and _COMMIT.fullmatch(value) else None


def _settled(attempts: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """An attempt whose outcome was still provisional (``final: false``: killed during its final
    upload, before the outcome was known) is recorded as lost, not as what it hoped for."""
    settled = []
    for entry in attempts:
        if entry.get("final") is False:
            entry = {**entry, "exit_code": None, "reason": "lost", "provisional_reason": entry.get("reason")}
            entry.pop("final")
        settled.append(entry)
    return settled


class RunState:
    """The in-memory trainbox.json and its phases; every change is saved at once. Thread-safe. What the run is
    (its run id, its dataset commit) is ``identity``; the attempts before this one and this one's end, ``history``."""

    def __init__(self, run_dir: Path, run_name: str, previous: dict[str, Any] | None = None) -> None:
        self.path = run_dir / STATE_FILE
        self._lock = threading.Lock()
        self._phase_started = time.monotonic()
        self._listeners: list[Callable[[], None]] = []
        self.previous = previous  # the file as the last attempt left it
        attempts = _settled(_history(previous)) + _lost_attempt(previous)
        self._data: dict[str, Any] = {
            "schema_version": SCHEMA_VERSION,
            "run_name": run_name,
            # Minted at the run's first start (ensure_run_id) and kept: the volume's, else the repo's (adopt).
            "run_id": _run_id(previous),
            # The dataset repo's commit resolved at the run's first start: every later start trains on it.
            "dataset_revision": recorded_dataset_revision(previous),
            "phase": Phase.STARTING.value,
            "started_at": now_iso(),
            "updated_at": now_iso(),
            "finished_at": None,
            "attempt": len(attempts) + 1,
            "attempts": attempts,
            "versions": versions(),
            "phases": {},
            "exit": None,
        }
        # The settings the run was started with stay recorded until this start's pass the check (Attempt.begin):
        # a start refused as another run leaves them as they were.
        recorded = (previous or {}).get("settings")
        if isinstance(recorded, dict):
            self._data["settings"] = copy.deepcopy(recorded)
        self.identity = RunIdentity(self)
        self.history = History(self)

    @classmethod
    def load(cls, run_dir: Path, run_name: str) -> RunState:
        """A new attempt of this run, keeping the history of earlier attempts."""
        return cls(run_dir, run_name, read_state(run_dir / STATE_FILE))

    @property
    def phase(self) -> Phase:
        return Phase(self._data["phase"])

    def snapshot(self) -> dict[str, Any]:
        with self._lock:
            return copy.deepcopy(self._data)

    def on_phase(self, listener: Callable[[], None]) -> None:
        """Call ``listener()`` after each change of phase (the uploader publishes those at once;
        other updates travel with the next epoch boundary)."""
        self._listeners.append(listener)

    def set_phase(self, phase: Phase) -> None:
        with self._lock:
            self._close_phase()
            self._data["phase"] = phase.value
            if not phase.terminal:
                self._data["phases"][phase.value] = {"started_at": now_iso(), "seconds": None}
                self._phase_started = time.monotonic()
        self.save()
        self._phase_changed()

    def update(self, **fields: Any) -> None:
        with self._lock:
            for key, value in fields.items():
                if isinstance(value, dict) and isinstance(self._data.get(key), dict):
                    self._data[key].update(value)
                else:
                    self._data[key] = value
        self.save()

    def finish(self, phase: Phase, exit_code: int, reason: str, message: str | None = None, **fields: Any) -> None:
        """The job's outcome; ``fields`` join its entry in ``attempts`` (a halved batch for the next start)."""
        with self._lock:
            self._close_phase()
            self._data["phase"] = phase.value
            self._data["finished_at"] = now_iso()
            # Provisional until the final upload returns (``confirm_exit``/``amend_exit``): a kill
            # during that upload must not leave "success" behind on the volume.
            self._data["exit"] = {"code": exit_code, "reason": reason, "message": message, "final": False}
            self._data["attempts"].append(
                {
                    "attempt": self._data["attempt"],
                    "started_at": self._data["started_at"],
                    "finished_at": self._data["finished_at"],
                    "phase": phase.value,
                    "exit_code": exit_code,
                    "reason": reason,
                    "epochs_done": (self._data.get("progress") or {}).get("epochs_done"),
                    **self.history.batch(),
                    **fields,
                    "final": False,
                }
            )
        self.save()
        self._phase_changed()

    def save(self) -> None:
        with self._lock:
            self._save_locked()

    def _save_locked(self) -> None:
        self._data["updated_at"] = now_iso()
        try:
            write_json_atomic(self.path, self._data)
        except OSError as error:
            # A full or failing disk must not stop the job short of its final upload and
            # release: the state stays whole in memory and the next save that can writes it.
            logger.warning("cannot write %s: %s; trying again at the next change", self.path, error.strerror or error)

    def _phase_changed(self) -> None:
        for listener in self._listeners:
            listener()

    def _close_phase(self) -> None:
        current = self._data["phases"].get(self._data["phase"])
        if current is not None and current.get("seconds") is None:
            current["seconds"] = round(time.monotonic() - self._phase_started, 3)


class RunIdentity:
    """What makes the run this run in its stores: its run id and the dataset commit of its first start, kept in
    the trainbox.json of ``state`` (its lock, its file)."""

    def __init__(self, state: RunState) -> None:
        self._state = state

    @property
    def run_id(self) -> str | None:
        with self._state._lock:
            value: str | None = self._state._data["run_id"]
            return value

    def ensure_run_id(self) -> bool:
        """Give the run its id if neither the volume nor the repo knew one: True when minted now (the
        run's first start, or its repo made again), so the caller puts it on the repo before training."""
        with self._state._lock:
            if self._state._data["run_id"] is not None:
                return False
            self._state._data["run_id"] = secrets.token_hex(_RUN_ID_BYTES)
        self._state.save()
        return True

    @property
    def dataset_revision(self) -> str | None:
        with self._state._lock:
            value: str | None = self._state._data["dataset_revision"]
            return value

    def pin_dataset(self, commit: str) -> None:
        """The run's first start resolved its dataset to ``commit``: the run trains on it from now on."""
        with self._state._lock:
            if self._state._data["dataset_revision"] is not None:
                return
            self._state._data["dataset_revision"] = commit
        self._state.save()

    def follow_run_id(self, leader: dict[str, Any] | None) -> None:
        """A node other than 0 takes node 0's run id (from its trainbox.json on the repo), if it names one."""
        run_id = _run_id(leader)
        with self._state._lock:
            if run_id is None or run_id == self._state._data["run_id"]:
                return
            self._state._data["run_id"] = run_id
        self._state.save()


class History:
    """The attempts of the run in the trainbox.json of ``state``: the earlier ones (its own, or a store's record
    of the run adopted), a failure the job mends itself, and whether this attempt's end is final."""

    def __init__(self, state: RunState) -> None:
        self._state = state

    @property
    def attempts(self) -> list[dict[str, Any]]:
        with self._state._lock:
            return copy.deepcopy(self._state._data["attempts"])

    def adopt(self, remote: dict[str, Any] | None, *, authoritative: bool = False) -> None:
        """Continue the attempt count of a store's trainbox.json of this run (OUTPUT_REPO's, the bucket's)
        when it knows more (a new disk), or whenever it has one (``authoritative``: a node other than 0, whose
        own record is not the run's); take its run id when this volume had none."""
        # An attempt killed without a word is known from its non-terminal trainbox.json on the Hub.
        attempts = _settled(_history(remote)) + _lost_attempt(remote)
        state, data = self._state, self._state._data
        with state._lock:
            adopted = data["run_id"] is None and _run_id(remote) is not None
            if adopted:
                data["run_id"] = _run_id(remote)
            if data["dataset_revision"] is None and recorded_dataset_revision(remote) is not None:
                data["dataset_revision"] = recorded_dataset_revision(remote)
                adopted = True
            if not attempts or (len(attempts) <= len(data["attempts"]) and not authoritative):
                if adopted:
                    state._save_locked()
                return
            data["attempts"] = attempts
            data["attempt"] = len(attempts) + 1
            if state.previous is None:
                state.previous = remote
        state.save()

    def batch(self) -> dict[str, Any]:
        """The batch this attempt trained with, for its entry in ``attempts``."""
        batch = (self._state._data.get("training") or {}).get("batch")
        return {"batch": batch} if batch is not None else {}

    def next_attempt(self, exit_code: int, reason: str, **fields: Any) -> None:
        """The job goes on after a failure it mends itself (out of memory → a smaller batch): the
        failed try is an attempt of its own in ``attempts``, and a new one begins now."""
        data = self._state._data
        with self._state._lock:
            data["attempts"].append(
                {
                    "attempt": data["attempt"],
                    "started_at": data["started_at"],
                    "finished_at": now_iso(),
                    "phase": data["phase"],
                    "exit_code": exit_code,
                    "reason": reason,
                    "epochs_done": (data.get("progress") or {}).get("epochs_done"),
                    **self.batch(),
                    **fields,
                }
            )
            data["attempt"] += 1
            data["started_at"] = now_iso()
        self._state.save()

    def confirm_exit(self) -> None:
        """The final upload returned: the outcome ``finish`` wrote is the one the process exits with."""
        data = self._state._data
        with self._state._lock:
            if data.get("exit"):
                data["exit"]["final"] = True
            if data["attempts"]:
                data["attempts"][-1].pop("final", None)
        self._state.save()

    def amend_exit(self, exit_code: int, reason: str, message: str | None = None) -> None:
        """The job's end changed after ``finish`` (the final upload failed): the file states the
        code the process exits with; the job's own outcome stays in ``exit.job``."""
        data = self._state._data
        with self._state._lock:
            previous = data.get("exit") or {}
            data["exit"] = {
                "code": exit_code,
                "reason": reason,
                "message": message,
                "job": {"code": previous.get("code"), "reason": previous.get("reason")},
                "final": True,
            }
            if data["attempts"]:
                data["attempts"][-1].update(exit_code=exit_code, reason=reason)
                data["attempts"][-1].pop("final", None)
        self._state.save()
