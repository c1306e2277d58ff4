"""The one retry policy: statuses, Retry-After in both forms, capped backoff, the deadline; no real sleeping."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from email.utils import format_datetime

import httpx2
import pytest
from huggingface_hub.errors import HfHubHTTPError

from entrypoint.retry import (
    MAX_RETRY_AFTER,
    RETRY_STATUS,
    RetryPolicy,
    call_with_retries,
    is_retryable,
    parse_retry_after,
    retry_after_of,
)

NOW = 1_800_000_000.0  # a fixed wall clock for HTTP dates


def http_error(status: int, headers: dict[str, str] | None = None) -> HfHubHTTPError:
    request = httpx2.Request("GET", "https://hub.test/api")
    return HfHubHTTPError("scripted", response=httpx2.Response(status, headers=headers or {}, request=request))


class Clock:
    """A clock that only moves when slept on."""

    def __init__(self) -> None:
        self.now = 100.0
        self.slept: list[float] = []

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds

    def policy(self, **overrides: float | None) -> RetryPolicy:
        return RetryPolicy(sleep=self.sleep, clock=lambda: self.now, **overrides)  # type: ignore[arg-type]


def scripted(*answers: object) -> Callable[[], object]:
    remaining = list(answers)

    def call() -> object:
        answer = remaining.pop(0)
        if isinstance(answer, BaseException):
            raise answer
        return answer

    return call


def run(call: Callable[[], object], policy: RetryPolicy, **kwargs: object) -> object:
    return call_with_retries(call, policy, retryable=is_retryable, describe=str, **kwargs)  # type: ignore[arg-type]


@pytest.mark.parametrize("status", sorted(RETRY_STATUS))
def test_the_retryable_statuses_are_retried(status: int) -> None:
    clock = Clock()
    assert run(scripted(http_error(status), "ok"), clock.policy()) == "ok"
    assert clock.slept == [1.0]


@pytest.mark.parametrize("status", [400, 401, 403, 404, 409, 412, 501])
def test_other_statuses_fail_at_once(status: int) -> None:
    clock = Clock()
    with pytest.raises(HfHubHTTPError):
        run(scripted(http_error(status), "ok"), clock.policy())
    assert clock.slept == []


def test_network_errors_are_retried_and_programming_errors_are_not() -> None:
    clock = Clock()
    assert run(scripted(ConnectionResetError("reset"), httpx2.ReadTimeout("slow"), "ok"), clock.policy()) == "ok"
    assert clock.slept == [1.0, 2.0]
    with pytest.raises(KeyError):
        run(scripted(KeyError("bug"), "ok"), clock.policy())


def test_backoff_doubles_up_to_its_cap_and_the_last_failure_is_raised() -> None:
    clock = Clock()
    with pytest.raises(HfHubHTTPError):
        run(scripted(*[http_error(503)] * 8), clock.policy(attempts=8, first_wait=1.0, max_wait=5.0))
    assert clock.slept == [1.0, 2.0, 4.0, 5.0, 5.0, 5.0, 5.0]
    assert RetryPolicy(attempts=200, max_wait=30.0).waits()[-1] == 30.0  # no overflow far out


@pytest.mark.parametrize(
    ("value", "seconds"),
    [
        ("120", 120.0),
        (" 7 ", 7.0),
        ("1.5", 1.5),
        ("0", 0.0),
        ("-5", 0.0),  # negative: at once
        ("99999999", MAX_RETRY_AFTER),  # huge: cut to the cap
        ("1e400", MAX_RETRY_AFTER),  # infinite
        (format_datetime(datetime.fromtimestamp(NOW + 90, UTC), usegmt=True), 90.0),
        (format_datetime(datetime.fromtimestamp(NOW - 90, UTC), usegmt=True), 0.0),  # a past date
        ("Wed, 21 Oct 2015 07:28:00 -0000", 0.0),
        (format_datetime(datetime.fromtimestamp(NOW + 10 * 86400, UTC), usegmt=True), MAX_RETRY_AFTER),
        (None, None),
        ("", None),
        ("soon", None),
        ("nan", None),
        ("Wed, 32 Foo 2015 99:99:99 GMT", None),
    ],
)
def test_retry_after_in_seconds_and_http_date_forms(value: str | None, seconds: float | None) -> None:
    assert parse_retry_after(value, now=lambda: NOW) == seconds


def test_the_server_wait_wins_over_the_backoff_up_to_the_policy_cap() -> None:
    clock = Clock()
    answers = [http_error(429, {"Retry-After": "120"}), http_error(503, {"Retry-After": "bogus"}), "ok"]
    assert run(scripted(*answers), clock.policy()) == "ok"
    assert clock.slept == [120.0, 2.0]  # the bogus header falls back to the backoff of its attempt
    clock = Clock()
    assert run(scripted(http_error(429, {"Retry-After": "120"}), "ok"), clock.policy(max_retry_after=60.0)) == "ok"
    assert clock.slept == [60.0]


def test_a_spent_ratelimit_quota_says_how_long_to_wait() -> None:
    """The Hub's (and RunPod's) ``RateLimit`` header, read with huggingface_hub's public parser: a 429 whose quota
    is spent waits for its reset, even where Retry-After says less; a quota not spent leaves Retry-After to say."""
    spent = {"RateLimit": '"api";r=0;t=55', "RateLimit-Policy": '"fixed window";"api";q=500;w=300', "Retry-After": "3"}
    assert retry_after_of(http_error(429, spent)) == 55.0
    assert retry_after_of(http_error(429, spent | {"RateLimit": '"api";r=4;t=55'})) == 3.0
    runpod = {"RateLimit": '"minute";r=0;t=12, "hour";r=2999;t=3600'}
    assert retry_after_of(http_error(429, runpod)) == 12.0
    assert retry_after_of(http_error(503, spent)) == 3.0  # not a rate limit: the header is not the answer
    assert retry_after_of(http_error(429, {"RateLimit": "garbage"})) is None
    clock = Clock()
    assert run(scripted(http_error(429, spent), "ok"), clock.policy()) == "ok"
    assert clock.slept == [55.0]


def test_retry_after_of_reads_the_response_an_error_carries() -> None:
    date = format_datetime(datetime.fromtimestamp(NOW + 30, UTC), usegmt=True)
    assert retry_after_of(http_error(503, {"Retry-After": date}), now=lambda: NOW) == 30.0
    assert retry_after_of(http_error(503)) is None
    assert retry_after_of(ConnectionError("no response")) is None


def test_no_wait_is_started_that_would_end_past_the_deadline() -> None:
    clock = Clock()
    policy = clock.policy(deadline=clock.now + 10.0)
    with pytest.raises(HfHubHTTPError):
        run(scripted(http_error(503, {"Retry-After": "30"}), "ok"), policy)
    assert clock.slept == []
    clock = Clock()
    policy = clock.policy(deadline=clock.now + 3.5)
    with pytest.raises(HfHubHTTPError):  # 1 s, 2 s fit; the next 4 s would not
        run(scripted(*[http_error(503)] * 6), policy)
    assert clock.slept == [1.0, 2.0]


def test_past_the_deadline_the_caller_names_the_error() -> None:
    clock = Clock()
    policy = clock.policy(deadline=clock.now + 10.0)
    with pytest.raises(TimeoutError, match="left 10"):
        run(
            scripted(http_error(503, {"Retry-After": "30"})),
            policy,
            past_deadline=lambda error, left: TimeoutError(f"left {left:.0f}"),
        )


def test_before_retry_can_make_the_retry_unnecessary() -> None:
    clock = Clock()
    calls: list[str] = []

    def call() -> str:
        calls.append("call")
        raise http_error(500)

    assert run(call, clock.policy(), before_retry=lambda: "landed") == "landed"
    assert calls == ["call"] and clock.slept == [1.0]
