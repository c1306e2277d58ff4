"""trainbox.json: atomic, phases timed, attempts kept, never a secret."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest

from entrypoint import log
from entrypoint.state import STATE_FILE, Phase, RunState, read_state, write_json_atomic


def test_phases_are_timed_and_the_end_recorded(tmp_path: Path) -> None:
    state = RunState(tmp_path, "run1")
    state.set_phase(Phase.PREFLIGHT)
    state.set_phase(Phase.TRAINING)
    state.finish(Phase.DONE, 0, "success", "training finished")
    state.history.confirm_exit()
    data = json.loads((tmp_path / STATE_FILE).read_text())
    assert data["phase"] == "done"
    assert data["exit"] == {"code": 0, "reason": "success", "message": "training finished", "final": True}
    assert data["phases"]["preflight"]["seconds"] is not None
    assert data["phases"]["training"]["seconds"] is not None
    assert data["versions"]["libreyolo"] == "1.6.0"
    assert data["versions"]["torch"]
    assert data["attempt"] == 1 and len(data["attempts"]) == 1


def test_a_new_attempt_keeps_the_history(tmp_path: Path) -> None:
    first = RunState.load(tmp_path, "run1")
    first.finish(Phase.PREEMPTED, 143, "preempted")
    first.history.confirm_exit()
    second = RunState.load(tmp_path, "run1")
    second.finish(Phase.DONE, 0, "success")
    second.history.confirm_exit()
    data = read_state(tmp_path / STATE_FILE)
    assert data is not None
    assert data["attempt"] == 2
    assert [a["reason"] for a in data["attempts"]] == ["preempted", "success"]


def test_an_attempt_killed_during_its_final_upload_is_lost_not_a_success(tmp_path: Path) -> None:
    # finish() is written before the final upload; SIGKILL lands before that upload returns.
    first = RunState.load(tmp_path, "run1")
    first.finish(Phase.DONE, 0, "success", "training finished")
    left = read_state(tmp_path / STATE_FILE)
    assert left is not None and left["exit"]["final"] is False
    second = RunState.load(tmp_path, "run1")
    [lost] = second.history.attempts
    assert lost["reason"] == "lost" and lost["exit_code"] is None
    # The same file read from the Hub by an attempt on a new disk.
    fresh = RunState.load(tmp_path / "new-disk", "run1")
    fresh.history.adopt(left)
    assert [(a["exit_code"], a["reason"]) for a in fresh.history.attempts] == [(None, "lost")]


def test_secrets_are_scrubbed_from_the_file(tmp_path: Path) -> None:
    secret = "hf_stateCanaryToken0987654321"
    log.register_secret(secret)
    write_json_atomic(tmp_path / "x.json", {"message": f"failed with token {secret}"})
    assert secret not in (tmp_path / "x.json").read_text()


def test_readers_never_see_half_a_file(tmp_path: Path) -> None:
    path = tmp_path / STATE_FILE
    stop = threading.Event()
    bad: list[str] = []

    def reader() -> None:
        while not stop.is_set():
            try:
                text = path.read_text()
            except FileNotFoundError:
                continue
            try:
                json.loads(text)
            except ValueError:
                bad.append(text)

    thread = threading.Thread(target=reader)
    thread.start()
    for index in range(300):
        write_json_atomic(path, {"index": index, "padding": "x" * 20000})
    stop.set()
    thread.join()
    assert bad == []
    assert not list(tmp_path.glob(".*.tmp")), "temporary files left behind"


def test_a_state_file_that_is_json_but_not_an_object_reads_as_unreadable(tmp_path: Path) -> None:
    for text in ("[]", '"done"', "3"):
        (tmp_path / STATE_FILE).write_text(text)
        assert read_state(tmp_path / STATE_FILE) is None


DAMAGED_HISTORIES = [
    {"phase": "bogus", "attempt": 1, "attempts": "not a list", "progress": [3]},
    {"phase": ["training"], "attempt": 2, "attempts": [1, "x", None, {"attempt": 1, "reason": "lost"}]},
    {"phase": "training", "attempt": 1, "attempts": {"1": "x"}, "progress": None},
]


@pytest.mark.parametrize("history", DAMAGED_HISTORIES)
def test_a_history_that_does_not_parse_never_stops_the_start(tmp_path: Path, history: dict[str, object]) -> None:
    (tmp_path / STATE_FILE).write_text(json.dumps(history))
    state = RunState.load(tmp_path, "run1")
    attempts = state.history.attempts
    # What can be read is kept; the earlier attempt never wrote an end we can read: it counts as lost.
    assert attempts[-1]["reason"] == "lost" and attempts[-1]["exit_code"] is None
    assert all(isinstance(entry, dict) for entry in attempts)
    assert state.snapshot()["attempt"] == len(attempts) + 1
    state.history.adopt(history)  # the same file on the Hub (a new disk): no crash either


def test_a_history_nested_too_deep_reads_as_unreadable(tmp_path: Path) -> None:
    (tmp_path / STATE_FILE).write_text("[" * 100_000 + "]" * 100_000)
    assert read_state(tmp_path / STATE_FILE) is None
