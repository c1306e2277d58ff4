"""The Hub's real faults, each one a generator option (``Faults.kinds``) or a scripted window (``Outage``).

Before a call is applied: 5xx, 429 with the Hub's ``RateLimit`` headers, a timeout, 401/403. After it was
applied: the answer lost (a timeout), a batch of which only a subset applied, a download failing part-way.
A listing: the 404 (EntryNotFound) of a prefix that exists, or cut short (the connection drops between
pages). The calls: ``repo_read`` (repo_info, the lease's read), ``commit``, ``list``, ``list_all`` (a
recursive listing of the run's folder: what a writer learns and tidies by), ``batch``, ``read`` (paths-info),
``download``.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field, replace

BEFORE = ("503", "429", "timeout")  # raised before the server applied anything
AFTER = ("lost",)  # applied, then the answer was lost
EVERY = {
    "repo_read": ("503", "429", "timeout"),
    "commit": ("503", "429", "timeout", "lost"),
    "list": ("503", "timeout", "missing", "cut"),
    "list_all": ("503", "timeout", "missing", "cut"),
    "batch": ("503", "timeout", "lost", "some"),
    "read": ("503", "timeout"),
    "download": ("503", "timeout", "partway"),
}
# Faults left out of the generated lane because no fence of the product closes their ordering: none (the 429 on
# the lease commit and the 404 on a listing are fenced: docs/stores.md "Fences").
FENCED: dict[str, tuple[str, ...]] = {}
RATE_LIMIT = {"RateLimit": '"api";r=0;t=55', "RateLimit-Policy": '"fixed window";"api";q=500;w=300'}


def generated() -> dict[str, tuple[str, ...]]:
    """The faults the generated lane draws from: every one but the fenced."""
    return {call: tuple(k for k in kinds if k not in FENCED.get(call, ())) for call, kinds in EVERY.items()}


@dataclass(frozen=True)
class Outage:
    """Every ``call`` (``*``: any) between ``start`` and ``end`` (seconds of true time since the history's
    start) meets ``fault``."""

    call: str
    start: float
    end: float
    fault: str
    who: str = "*"  # the container it hits (its token, its network)
    times: int = 1_000_000  # at most this many calls


@dataclass
class Faults:
    rng: random.Random
    rate: float = 0.0
    kinds: dict[str, tuple[str, ...]] = field(default_factory=lambda: generated())
    outages: list[Outage] = field(default_factory=list)
    script: dict[str, list[str]] = field(default_factory=dict)  # outcomes taken in order, per call
    slow: float = 2.0  # a call's latency is up to this (true seconds, each way)
    since: float = 0.0  # the history's start (true time)
    now: float = 0.0  # true time, kept by the world

    def latency(self) -> float:
        return self.rng.uniform(0.0, self.slow)

    def outcome(self, call: str, who: str = "?") -> str:
        elapsed = self.now - self.since
        for n, outage in enumerate(self.outages):
            hits = outage.call in (call, "*") and outage.who in (who, "*") and outage.times > 0
            if hits and outage.start <= elapsed < outage.end:
                self.outages[n] = replace(outage, times=outage.times - 1)
                return outage.fault
        queued = self.script.get(call)
        if queued:
            return queued.pop(0)
        if self.rate and self.rng.random() < self.rate and self.kinds.get(call):
            return self.rng.choice(self.kinds[call])
        return "ok"

    def before(self, call: str, who: str = "?") -> str:
        """The fault the call meets: raised now when it comes before the server applies anything."""
        from .hub import http_error

        outcome = self.outcome(call, who)
        if outcome in ("503", "500", "502"):
            raise http_error(int(outcome), call)
        if outcome == "429":
            raise http_error(429, call, RATE_LIMIT)
        if outcome in ("401", "403"):
            raise http_error(int(outcome), call)
        if outcome == "timeout":
            raise TimeoutError(f"{call} timed out")
        return outcome

    def after(self, outcome: str, call: str) -> None:
        from .hub import http_error

        if outcome == "lost":
            raise TimeoutError(f"{call}: the answer was lost")
        if outcome in ("some", "partway"):
            raise http_error(503, f"{call} cut short")

    def cut(self, count: int) -> int:
        return self.rng.randrange(count + 1)
