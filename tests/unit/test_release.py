"""Ending the bill: the providers' state answers, the retry helper, confirmation, and ON_EXIT/ON_FAILURE.

The provider here is a scripted in-memory instance; tests/integration/test_release_providers.py drives the
same code over HTTP against local provider APIs.
"""

from __future__ import annotations

import logging
import socket
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from entrypoint import settings
from entrypoint.errors import ReleaseError
from entrypoint.release import end as release
from entrypoint.release import providers
from entrypoint.release.providers import (
    InstanceState,
    Observed,
    ProviderHttpError,
    ReleaseRetry,
    UnclearAnswer,
)
from entrypoint.settings import ExitAction
from entrypoint.state import Phase, RunState

RUNNING = Observed(InstanceState.RUNNING, "running")
ERROR = Observed(InstanceState.ERROR, "status=ERROR")
STOPPED = Observed(InstanceState.STOPPED, "stopped")
GONE = Observed(InstanceState.GONE, "not found (HTTP 404)")


class Clock:
    """Time that moves only when the code under test sleeps."""

    def __init__(self) -> None:
        self.now = 0.0
        self.slept: list[float] = []

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds

    def policy(self, **overrides: Any) -> ReleaseRetry:
        return ReleaseRetry(sleep=self.sleep, clock=lambda: self.now, **overrides)


class ScriptedInstance:
    """An instance whose answers are scripted: each call pops the next outcome (an exception is raised)."""

    label = "Test instance 7"
    key_name = "TEST_API_KEY"

    def __init__(self, reads: list[Any], actions: list[Any] | None = None) -> None:
        self.reads = reads
        self.actions = actions if actions is not None else [None]
        self.log: list[str] = []

    def _next(self, queue: list[Any], name: str) -> Any:
        self.log.append(name)
        outcome = queue.pop(0) if len(queue) > 1 else queue[0]
        if isinstance(outcome, Exception):
            raise outcome
        return outcome

    def stop(self) -> None:
        self._next(self.actions, "stop")

    def destroy(self) -> None:
        self._next(self.actions, "destroy")

    def observe(self) -> Observed:
        return self._next(self.reads, "observe")


def http(status: int | None, retry_after: float | None = None) -> ProviderHttpError:
    return ProviderHttpError("calling the test API", status, "scripted", retry_after)


# -- the providers' answers ------------------------------------------------------------------
@pytest.mark.parametrize(
    ("body", "state"),
    [
        ({"instances": {"actual_status": "running", "intended_status": "running", "cur_state": "running"}}, "running"),
        ({"instances": {"actual_status": "loading", "intended_status": "running", "cur_state": "running"}}, "running"),
        ({"instances": {"actual_status": "running", "intended_status": "stopped", "cur_state": "running"}}, "stopped"),
        ({"instances": {"actual_status": "stopped", "intended_status": "stopped", "cur_state": "stopped"}}, "stopped"),
        ({"instances": {"actual_status": "exited", "intended_status": "running", "cur_state": "unloaded"}}, "gone"),
        ({"instances": [{"actual_status": "running", "cur_state": "running"}]}, "running"),
    ],
)
def test_vast_state(body: Any, state: str) -> None:
    assert providers.vast_state(body).state == state


@pytest.mark.parametrize(
    "body",
    [{"instances": None}, {"instances": {}}, {"instances": []}, {}, None, "<html>", {"instances": {"id": 7}}],
    ids=["null-record", "empty-record", "empty-list", "empty-object", "not-json", "a-string", "no-status"],
)
def test_a_vast_answer_without_a_record_proves_nothing(body: Any) -> None:
    """Only a 404 or a record that says so is "gone": silence is retried, never a confirmed release."""
    with pytest.raises(UnclearAnswer) as raised:
        providers.vast_state(body, "reading Vast.ai instance 7")
    assert raised.value.retryable and raised.value.status == 200


def test_vast_price_is_dph_total() -> None:
    record = {"actual_status": "running", "intended_status": "running", "cur_state": "running", "dph_total": 0.412}
    seen = providers.vast_state({"instances": record})
    assert (seen.price_per_hour, seen.price_source) == (0.412, "vast:dph_total")
    assert providers.vast_state({"instances": {**record, "dph_total": None}}).price_per_hour is None


@pytest.mark.parametrize(
    ("status", "state"),
    [
        ("PROVISIONING", "running"),
        ("STARTING", "running"),
        ("RUNNING", "running"),
        ("EXITED", "stopped"),
        ("ERROR", "error"),
        ("TERMINATED", "gone"),
        ("SOMETHING_NEW", "running"),  # an unknown status may still bill: never a confirmation
    ],
)
def test_runpod_state(status: str, state: str) -> None:
    assert providers.runpod_state({"id": "p1", "status": status, "cost": 0.0}).state == state


@pytest.mark.parametrize("body", [{"id": "p1", "desiredStatus": "EXITED"}, {}, None, []])
def test_a_runpod_answer_without_a_status_proves_nothing(body: Any) -> None:
    """v1's ``desiredStatus`` is not v2: a body without ``status`` is no answer."""
    with pytest.raises(UnclearAnswer):
        providers.runpod_state(body)


def test_runpod_price_is_the_pods_cost_while_it_runs() -> None:
    running = providers.runpod_state({"status": "RUNNING", "cost": 0.74, "locked": True})
    assert (running.price_per_hour, running.price_source) == (0.74, "runpod:cost")
    assert running.detail == "status=RUNNING locked"
    assert providers.runpod_state({"status": "EXITED", "cost": 0.0}).price_per_hour is None  # 0 when stopped
    assert providers.runpod_state({"status": "RUNNING", "cost": True}).price_per_hour is None


@pytest.mark.parametrize(
    ("payload", "message"),
    [
        ({"title": "Conflict", "status": 409, "detail": "not valid now"}, "Conflict: not valid now"),
        (
            {"title": "Unprocessable Entity", "status": 422, "detail": "failed", "errors": ["$: bogus"]},
            "Unprocessable Entity: failed ($: bogus)",
        ),
        ({"success": False, "error": "no_such_instance", "msg": "Instance not found"}, "Instance not found"),
        (None, None),
    ],
)
def test_error_messages(payload: Any, message: str | None) -> None:
    assert providers._message(payload) == message


@pytest.mark.parametrize(
    ("header", "wait"),
    [
        ('"minute";r=0;t=12, "hour";r=2800;t=1812, "day";r=49500;t=45012', 12.0),
        ('"minute";r=0;t=12, "hour";r=0;t=1812', 1812.0),
        ('"minute";r=5;t=12', None),
        ("garbage", None),
        (None, None),
    ],
)
def test_rate_limit_wait(header: str | None, wait: float | None) -> None:
    assert providers._rate_limit_wait(header) == wait


# -- the retry helper ------------------------------------------------------------------------
def test_backoff_doubles_and_is_capped() -> None:
    assert ReleaseRetry(attempts=7, first_wait=1, max_wait=16).waits() == [1, 2, 4, 8, 16, 16]


def test_retryable_failures_are_retried_until_an_answer() -> None:
    clock = Clock()
    answers: list[Any] = [http(500), http(None), http(503), "ok"]

    def call() -> str:
        outcome = answers.pop(0)
        if isinstance(outcome, Exception):
            raise outcome
        return outcome

    assert providers.with_provider_retries(call, "test", clock.policy()) == "ok"
    assert clock.slept == [1.0, 2.0, 4.0]


def test_retry_after_wins_and_is_capped() -> None:
    clock = Clock()
    answers: list[Any] = [http(429, retry_after=0), http(429, retry_after=30), http(503, retry_after=600), "ok"]

    def call() -> str:
        outcome = answers.pop(0)
        if isinstance(outcome, Exception):
            raise outcome
        return outcome

    providers.with_provider_retries(call, "test", clock.policy(max_wait=16))
    assert clock.slept == [0, 30, 60]  # the provider's wait, beyond our own backoff, up to a minute


def test_an_unclear_answer_is_retried() -> None:
    clock = Clock()
    answers: list[Any] = [UnclearAnswer("reading", "an answer without an instance record"), "ok"]

    def call() -> str:
        outcome = answers.pop(0)
        if isinstance(outcome, Exception):
            raise outcome
        return outcome

    assert providers.with_provider_retries(call, "test", clock.policy()) == "ok"
    assert clock.slept == [1.0]


@pytest.mark.parametrize("status", [400, 401, 403, 404, 409])
def test_refusals_are_not_retried(status: int) -> None:
    clock = Clock()
    calls: list[int] = []

    def call() -> None:
        calls.append(1)
        raise http(status)

    with pytest.raises(ProviderHttpError):
        providers.with_provider_retries(call, "test", clock.policy())
    assert len(calls) == 1 and clock.slept == []


def test_retries_end_after_the_attempts() -> None:
    clock = Clock()
    calls: list[int] = []

    def call() -> None:
        calls.append(1)
        raise http(500)

    with pytest.raises(ProviderHttpError):
        providers.with_provider_retries(call, "test", clock.policy(attempts=4))
    assert len(calls) == 4 and clock.slept == [1, 2, 4]


# -- act, then confirm -----------------------------------------------------------------------
def test_destroy_is_confirmed_by_reading_the_instance_back() -> None:
    instance = ScriptedInstance(reads=[RUNNING, RUNNING, RUNNING, GONE])
    clock = Clock()

    seen = providers.end_bill(instance, ExitAction.DESTROY, clock.policy())

    assert seen.state is InstanceState.GONE
    assert instance.log == ["observe", "destroy", "observe", "observe", "observe"]
    assert clock.slept == [0.5, 1.0]


def test_stop_is_confirmed_by_stopped_or_gone() -> None:
    for final in (STOPPED, GONE):
        instance = ScriptedInstance(reads=[RUNNING, final])
        assert providers.end_bill(instance, ExitAction.STOP, Clock().policy()) == final
        assert "stop" in instance.log and "destroy" not in instance.log


def test_a_stopped_instance_is_not_a_confirmed_destroy() -> None:
    clock = Clock()
    instance = ScriptedInstance(reads=[RUNNING, STOPPED])

    with pytest.raises(ReleaseError, match="NOT have ended"):
        providers.end_bill(instance, ExitAction.DESTROY, clock.policy(confirm_for=30))
    assert clock.now <= 30


def test_an_error_state_is_never_a_confirmation() -> None:
    clock = Clock()
    instance = ScriptedInstance(reads=[RUNNING, ERROR])

    with pytest.raises(ReleaseError, match="status=ERROR"):
        providers.end_bill(instance, ExitAction.STOP, clock.policy(confirm_for=30))


def test_unclear_reads_after_the_action_fail_the_release() -> None:
    clock = Clock()
    instance = ScriptedInstance(reads=[RUNNING, UnclearAnswer("reading", "an answer without an instance record")])

    with pytest.raises(ReleaseError, match="without an instance record") as raised:
        providers.end_bill(instance, ExitAction.DESTROY, clock.policy(attempts=3))
    assert "may still be billing" in str(raised.value)
    assert instance.log == ["observe", "destroy", "observe", "observe", "observe"]


def test_a_refused_action_is_a_release_error_at_once() -> None:
    clock = Clock()
    instance = ScriptedInstance(reads=[RUNNING], actions=[http(403)])

    with pytest.raises(ReleaseError) as raised:
        providers.end_bill(instance, ExitAction.DESTROY, clock.policy())

    assert raised.value.exit_code == 90
    assert "refused TEST_API_KEY" in str(raised.value) and "console" in str(raised.value)
    assert instance.log == ["observe", "destroy"] and clock.slept == []


def test_an_unknown_instance_is_never_taken_for_a_destroyed_one() -> None:
    """Gone before we asked: a wrong id or key scope, while this machine bills on."""
    instance = ScriptedInstance(reads=[GONE])

    with pytest.raises(ReleaseError, match="does not know"):
        providers.end_bill(instance, ExitAction.DESTROY, Clock().policy())
    assert instance.log == ["observe"]


def test_a_404_on_a_retried_destroy_means_the_first_one_landed() -> None:
    instance = ScriptedInstance(reads=[RUNNING, GONE], actions=[http(502), http(404)])

    assert providers.end_bill(instance, ExitAction.DESTROY, Clock().policy()) == GONE
    assert instance.log.count("destroy") == 2


def test_an_unreachable_provider_fails_after_the_retries() -> None:
    clock = Clock()
    instance = ScriptedInstance(reads=[http(None)])

    with pytest.raises(ReleaseError, match="may still be billing"):
        providers.end_bill(instance, ExitAction.STOP, clock.policy(attempts=3))
    assert clock.slept == [1, 2]


def test_instance_for_needs_an_instance() -> None:
    with pytest.raises(ReleaseError):
        providers.instance_for(settings.ProviderAccess(provider=settings.Provider.NONE))


# -- ON_EXIT / ON_FAILURE --------------------------------------------------------------------
def make_settings(tmp_path: Path, **env: str) -> settings.Settings:
    return settings.from_env({"WORKDIR": str(tmp_path), "GPUS": "cpu", "PROVIDER": "none", **env}, options={})


def finished_state(config: settings.Settings, code: int = 0) -> RunState:
    state = RunState(config.run_dir, config.run_name)
    state.finish(Phase.DONE if code == 0 else Phase.FAILED, code, "success" if code == 0 else "training_failed")
    return state


def test_failed_runs_use_on_failure(tmp_path: Path) -> None:
    config = make_settings(
        tmp_path,
        PROVIDER="runpod",
        RUNPOD_POD_ID="p1",
        RUNPOD_API_KEY="k" * 20,
        ON_EXIT="destroy",
        ON_FAILURE="stop",
        OUTPUT_REPO="acme/out",
    )
    assert release.action_for(config, failed=False) is ExitAction.DESTROY
    assert release.action_for(config, failed=True) is ExitAction.STOP


def test_exit_publishes_and_calls_no_provider(tmp_path: Path) -> None:
    config = make_settings(tmp_path)
    state = finished_state(config)
    published: list[dict[str, Any]] = []

    code = release.end_of_job(config, state, failed=False, publish=lambda: published.append(state.snapshot()))

    assert code is None
    assert len(published) == 1 and published[0]["release"] == {
        "action": "exit",
        "provider": "none",
        "instance": None,
        "status": "not_requested",
    }


def test_exit_on_a_provider_warns_that_the_bill_runs_on(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    config = make_settings(tmp_path, PROVIDER="vast", CONTAINER_ID="9", CONTAINER_API_KEY="k" * 20)
    with caplog.at_level(logging.WARNING, logger="trainbox"):
        release.end_of_job(config, finished_state(config), failed=False, publish=lambda: True)
    assert "keeps billing" in caplog.text


@pytest.mark.parametrize(
    "failing", [lambda: False, lambda: (_ for _ in ()).throw(OSError("hub down"))], ids=["returns-false", "raises"]
)
def test_a_failed_publish_never_blocks_the_exit(tmp_path: Path, failing: Callable[[], Any]) -> None:
    config = make_settings(tmp_path)
    assert release.end_of_job(config, finished_state(config), failed=False, publish=failing) is None


def test_check_access_is_skipped_when_nothing_will_be_released(tmp_path: Path) -> None:
    assert release.check_access(make_settings(tmp_path)) is None


def test_release_needs_a_provider(tmp_path: Path) -> None:
    config = make_settings(tmp_path)
    release.require_provider(config.provider, ExitAction.EXIT)
    with pytest.raises(settings.ConfigError, match="no provider"):
        release.require_provider(config.provider, ExitAction.DESTROY)


def test_record_in_state_file(tmp_path: Path) -> None:
    assert not release.record_in_state_file(tmp_path, {"status": "confirmed"})
    (tmp_path / "trainbox.json").write_text('{"phase": "done", "release": {"action": "stop"}}')
    assert release.record_in_state_file(tmp_path, {"status": "confirmed"})
    data = (tmp_path / "trainbox.json").read_text()
    assert '"action": "stop"' in data and '"status": "confirmed"' in data and '"phase": "done"' in data


@pytest.mark.parametrize("name", ["VAST_API_URL", "RUNPOD_API_URL"])
def test_a_provider_api_url_must_be_http(tmp_path: Path, name: str) -> None:
    with pytest.raises(settings.ConfigError, match=name):
        make_settings(tmp_path, **{name: "console.vast.ai"})


def test_a_long_retry_after_ends_at_the_release_deadline(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The provider answers every stop with 503 and "Retry-After: 50": without a deadline of its own
    # the release would wait 5 × 50 s per call; it gives up within its 120 s and says so.
    config = make_settings(tmp_path, PROVIDER="vast", CONTAINER_ID="9", CONTAINER_API_KEY="k" * 20, ON_EXIT="stop")
    clock = Clock()
    instance = ScriptedInstance(reads=[RUNNING], actions=[http(503, retry_after=50)])
    monkeypatch.setattr(providers, "instance_for", lambda access: instance)
    state = finished_state(config)

    code = release.end_of_job(config, state, failed=False, publish=lambda: True, policy=clock.policy())

    assert code == ReleaseError.exit_code
    assert sum(clock.slept) <= 120 and clock.slept == [50, 50]
    recorded = state.snapshot()
    assert recorded["release"]["status"] == "failed" and "release deadline" in recorded["release"]["error"]
    assert recorded["exit"]["code"] == ReleaseError.exit_code


def test_a_provider_that_never_answers_ends_at_the_release_deadline() -> None:
    # The connection is taken (the kernel's backlog) and nothing ever answers: each request would wait
    # its own 15 s timeout, past a deadline that only the waits between tries used to respect.
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        instance = providers.VastInstance(f"http://127.0.0.1:{silent.getsockname()[1]}", "9", "k" * 20)
        started = time.monotonic()
        with pytest.raises(ReleaseError, match="no answer before the release deadline"):
            providers.end_bill(instance, ExitAction.STOP, ReleaseRetry(deadline=started + 2.0))
        assert time.monotonic() - started < 15.0  # ended at the deadline, not after a request's own 15 s timeout
