"""A clock that moves only when told, for the store code's ``entrypoint.sync.clock`` (``clock.use``) and the
ledger's ``time``: sleeps and waits move it at once, so a test of lease periods and backoffs runs in no time."""

from __future__ import annotations


class ManualClock:
    def __init__(self, now: float = 1000.0, *, wall_offset: float = 0.0) -> None:
        self.now = now
        self.wall_offset = wall_offset  # the wall clock (``time``) apart from the monotonic one
        self.waits: list[float | None] = []  # every wait's timeout, in order

    def time(self) -> float:
        return self.now + self.wall_offset

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds

    def advance(self, seconds: float) -> None:
        self.now += seconds

    def wait(self, event: object, timeout: float | None) -> bool:
        """An event's wait: the whole timeout passes; True when the event was set (else False)."""
        self.waits.append(timeout)
        self.now += timeout or 0.0
        is_set = getattr(event, "is_set", None)
        return bool(is_set()) if callable(is_set) else False
