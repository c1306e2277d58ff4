"""The store protocol's one clock: every wall-clock read, monotonic read, sleep and timed wait of the sync's
store code (the lease, the bucket, the read side, the committers) goes through here.

In the container it is the system's clock. The protocol's simulation (tests/protocol_sim) swaps in a virtual
one with ``use``, so the code the container runs plays a history of minutes in milliseconds, replayably, and
freezes or skews one process's clock without touching the others'.
"""

from __future__ import annotations

import threading
import time as _time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Protocol


class Clock(Protocol):
    def time(self) -> float:
        """Seconds since the epoch, as this machine's wall clock says (it may be skewed)."""

    def monotonic(self) -> float:
        """Seconds on a clock that never goes back (it may jump forward: a frozen process thawed)."""

    def sleep(self, seconds: float) -> None:
        """Block this thread for ``seconds``."""

    def wait(self, event: threading.Event, timeout: float | None) -> bool:
        """``event.wait(timeout)``: True when it was set."""


class SystemClock:
    def time(self) -> float:
        return _time.time()

    def monotonic(self) -> float:
        return _time.monotonic()

    def sleep(self, seconds: float) -> None:
        _time.sleep(seconds)

    def wait(self, event: threading.Event, timeout: float | None) -> bool:
        return event.wait(timeout)


SYSTEM = SystemClock()
_current: Clock = SYSTEM


def time() -> float:
    return _current.time()


def monotonic() -> float:
    return _current.monotonic()


def sleep(seconds: float) -> None:
    _current.sleep(seconds)


def wait(event: threading.Event, timeout: float | None) -> bool:
    return _current.wait(event, timeout)


@contextmanager
def use(clock: Clock) -> Iterator[Clock]:
    """Run the block on ``clock`` (the simulation's); the system's clock again after it."""
    global _current
    previous, _current = _current, clock
    try:
        yield clock
    finally:
        _current = previous
