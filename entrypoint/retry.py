"""The one retry policy: which failures deserve another try, how long to wait, and when to stop.

Used by the Hub calls (``hub.with_retries``), the dataset download loop (``dataset.hub_reads``) and
the provider calls (``providers.with_provider_retries``, whose ``ReleaseRetry`` adds the release's
limits). huggingface_hub's own ``http_backoff`` retries one raw request with ``time.sleep``; ours
wrap whole ``HfApi`` calls and urllib requests, need a deadline, an injectable sleep and clock
(tests run instantly), and ``Retry-After`` in both of its forms, so the policy is written here once
instead.
"""

from __future__ import annotations

import email.utils
import math
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC
from typing import TypeVar

from .errors import StopRequested
from .log import logger

T = TypeVar("T")

# Worth another try: a timeout, a rate limit, or a server-side failure that may pass.
RETRY_STATUS = frozenset({408, 429, 500, 502, 503, 504})
MAX_RETRY_AFTER = 3600.0  # a Retry-After beyond an hour is not a rate limit but an outage


def _network_errors() -> tuple[type[BaseException], ...]:
    errors: list[type[BaseException]] = [ConnectionError, TimeoutError]
    try:  # huggingface_hub ≥ 1.0 speaks httpx (2.x: its fork httpx2); older versions requests
        import httpx2

        errors.append(httpx2.TransportError)
    except ImportError:
        try:
            import httpx

            errors.append(httpx.TransportError)
        except ImportError:
            pass
    return tuple(errors)


NETWORK_ERRORS = _network_errors()


def status_of(error: BaseException) -> int | None:
    """The HTTP status of an error that carries a response (huggingface_hub's, httpx's)."""
    response = getattr(error, "response", None)
    status = getattr(response, "status_code", None)
    return status if isinstance(status, int) else None


def describe(error: BaseException) -> str:
    """A failure in a few words for a log line: its HTTP status, else its type (never a URL or token)."""
    status = status_of(error)
    return f"HTTP {status}" if status else type(error).__name__


def is_retryable(error: BaseException, statuses: frozenset[int] = RETRY_STATUS) -> bool:
    """A Hub answer with one of ``statuses``, or no answer at all (a network error)."""
    from huggingface_hub.errors import HfHubHTTPError

    if isinstance(error, HfHubHTTPError):
        return status_of(error) in statuses
    return isinstance(error, NETWORK_ERRORS)


def parse_retry_after(value: str | None, *, now: Callable[[], float] = time.time) -> float | None:
    """Seconds to wait from a ``Retry-After`` value: delay-seconds or an HTTP-date (RFC 9110 10.2.3).

    None when absent or unreadable (the caller's own backoff applies); a past date or a negative
    number is 0; anything beyond ``MAX_RETRY_AFTER`` is cut to it."""
    text = (value or "").strip()
    if not text:
        return None
    try:
        seconds = float(text)
    except ValueError:
        try:
            when = email.utils.parsedate_to_datetime(text)
        except (TypeError, ValueError, IndexError):
            return None
        if when.tzinfo is None:  # "-0000": UTC by the RFC
            when = when.replace(tzinfo=UTC)
        seconds = when.timestamp() - now()
    if math.isnan(seconds):
        return None
    return min(MAX_RETRY_AFTER, max(0.0, seconds))


def retry_after_of(error: BaseException, *, now: Callable[[], float] = time.time) -> float | None:
    """How long the response an error carries asks to wait, if it says: a 429 whose ``RateLimit`` header (the
    IETF draft the Hub and RunPod send, ``"api";r=0;t=55``: none left, 55 s to the reset) says the quota is spent,
    else its ``Retry-After``. As huggingface_hub's own backoff reads them, with its public parser."""
    response = getattr(error, "response", None)
    headers = getattr(response, "headers", None)
    if not isinstance(headers, Mapping):
        return None
    if status_of(error) == 429:
        reset = _quota_reset(headers)
        if reset is not None:
            return reset
    return parse_retry_after(headers.get("Retry-After"), now=now)


def _quota_reset(headers: Mapping[str, str]) -> float | None:
    """Seconds until a spent ``RateLimit`` quota resets; None when the header is absent, unreadable or not spent."""
    try:
        from huggingface_hub.utils import parse_ratelimit_headers
    except ImportError:
        return None
    info = parse_ratelimit_headers(headers)
    return float(info.reset_in_seconds) if info is not None and info.remaining == 0 else None


@dataclass(frozen=True)
class RetryPolicy:
    """Capped exponential backoff; ``sleep`` and ``clock`` are parameters so tests run instantly."""

    attempts: int = 6  # per call, the first included
    first_wait: float = 1.0
    max_wait: float = 30.0  # our own backoff; a server's Retry-After may ask for longer
    max_retry_after: float = MAX_RETRY_AFTER  # the longest server-asked wait honoured
    # When everything must be over (``clock`` time), retries and waits included; None: no bound.
    deadline: float | None = None
    sleep: Callable[[float], None] = field(default=time.sleep, compare=False)
    clock: Callable[[], float] = field(default=time.monotonic, compare=False)

    def backoff(self, retry: int) -> float:
        """Our own pause before retry number ``retry`` (0 for the first)."""
        return min(self.max_wait, self.first_wait * 2.0 ** min(retry, 64))

    def waits(self) -> list[float]:
        """The pauses between attempts, without ``Retry-After``."""
        return [self.backoff(n) for n in range(self.attempts - 1)]

    def pause(self, retry: int, asked: float | None) -> float:
        """The server's wait wins (up to ``max_retry_after``); else our backoff."""
        return self.backoff(retry) if asked is None else min(self.max_retry_after, max(0.0, asked))

    def left(self) -> float:
        """Seconds to the deadline (infinite without one)."""
        return math.inf if self.deadline is None else self.deadline - self.clock()

    def fits(self, pause: float) -> bool:
        """Another try after ``pause`` still starts before the deadline."""
        return self.deadline is None or self.clock() + pause <= self.deadline


def call_with_retries(
    call: Callable[[], T],
    policy: RetryPolicy,
    *,
    retryable: Callable[[Exception], bool],
    describe: Callable[[Exception], str],
    asked_wait: Callable[[Exception], float | None] = retry_after_of,
    before_retry: Callable[[], T | None] | None = None,
    past_deadline: Callable[[Exception, float], Exception] | None = None,
) -> T:
    """Run ``call``; on a ``retryable`` failure wait and run it again, at most ``policy.attempts`` times.

    ``before_retry`` may return a result that makes the retry unnecessary (the commit check). A
    wait that would end past the deadline is not started: the failure is raised at once, as
    ``past_deadline(error, seconds_left)`` when given."""
    for attempt in range(policy.attempts):
        try:
            return call()
        except StopRequested:  # a stop raised by the signal handler during the call is never retried
            raise
        except Exception as error:
            if not retryable(error) or attempt == policy.attempts - 1:
                raise
            pause = policy.pause(attempt, asked_wait(error))
            if not policy.fits(pause):
                if past_deadline is None:
                    raise
                raise past_deadline(error, policy.left()) from None
            logger.warning("%s; retrying in %.1f s (%d/%d)", describe(error), pause, attempt + 1, policy.attempts - 1)
            policy.sleep(pause)
            if before_retry is not None:
                done = before_retry()
                if done is not None:
                    return done
    raise AssertionError("unreachable: attempts must be at least 1")
