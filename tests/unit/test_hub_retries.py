"""The Hub retry policy and the sync budget: the server's Retry-After is honoured, bounded only by
a deadline; a 429 empties the commit budget; a trainer whose pid is not visible is not ended early."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import httpx2
import pytest
from huggingface_hub.errors import HfHubHTTPError

from entrypoint.hub import MAX_WAIT, with_retries
from entrypoint.sync import watcher
from entrypoint.sync.ledger import CommitBudget
from entrypoint.sync.watcher import training_finished


def http_error(status: int, retry_after: str | None = None) -> HfHubHTTPError:
    headers = {"Retry-After": retry_after} if retry_after is not None else {}
    response = httpx2.Response(status, headers=headers, request=httpx2.Request("POST", "http://hub.test/api"))
    return HfHubHTTPError(f"HTTP {status}", response=response)


def scripted(*answers: object):
    answers_left = list(answers)

    def call() -> object:
        answer = answers_left.pop(0)
        if isinstance(answer, BaseException):
            raise answer
        return answer

    return call


def test_retry_after_longer_than_our_backoff_is_honoured() -> None:
    slept: list[float] = []
    result = with_retries(scripted(http_error(429, "120"), "ok"), "test", sleep=slept.append)
    assert result == "ok"
    assert slept == [120.0] and slept[0] > MAX_WAIT


def test_a_retry_after_past_the_deadline_fails_at_once() -> None:
    slept: list[float] = []
    with pytest.raises(HfHubHTTPError):
        with_retries(scripted(http_error(503, "120"), "ok"), "test", sleep=slept.append, deadline=time.monotonic() + 30)
    assert slept == []  # no hammering, and no waiting beyond the deadline either


def test_a_429_drains_the_budget_until_retry_after() -> None:
    budget = CommitBudget(per_hour=100, burst=20)
    assert budget.wait_time() == 0
    budget.drain(600)
    assert 590 < budget.hold() <= 600
    assert budget.wait_time() >= budget.hold()
    budget.held_until = time.monotonic()  # the hold is over; the bucket is still empty
    assert budget.wait_time() > 0


def _status(run_dir: Path, **fields: object) -> None:
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "status.json").write_text(json.dumps({"state": "running", **fields}))


def _unused_pid() -> int:
    pid = 4_000_000
    while True:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return pid
        except PermissionError:
            pass
        pid -= 1


def test_a_trainer_in_another_pid_namespace_is_not_taken_for_dead(tmp_path: Path) -> None:
    # `trainbox sync` as a sidecar: the trainer's pid does not exist here, but it is training.
    _status(tmp_path, pid=_unused_pid(), epoch_seconds=120.0)
    assert training_finished(tmp_path) is False
    # Silent for longer than its epochs take (and SILENCE): it really ended without a word.
    assert training_finished(tmp_path, now=time.time() + watcher.SILENCE + 1) is True
    _status(tmp_path, pid=_unused_pid(), epoch_seconds=3600.0)
    assert training_finished(tmp_path, now=time.time() + watcher.SILENCE + 1) is False


def test_a_finished_or_failed_status_ends_the_sync(tmp_path: Path) -> None:
    for state in ("completed", "failed"):
        (tmp_path / "status.json").write_text(json.dumps({"state": state, "pid": os.getpid()}))
        assert training_finished(tmp_path)
    _status(tmp_path, pid=os.getpid())
    assert training_finished(tmp_path, now=time.time() + 10 * watcher.SILENCE) is False  # alive here


def test_huggingface_hubs_own_backoff_is_wrapped_by_its_private_name() -> None:
    """huggingface_hub has no public knob to turn its own retries off (entrypoint/hub.py, ``_install_one_try``):
    a release that renames the function it wraps fails here, not as minutes of nested retries on a refused call."""
    from huggingface_hub.utils import _http

    import entrypoint.hub  # noqa: F401 - installs the wrapper

    assert getattr(_http._http_backoff_base, "trainbox_one_try", False)
