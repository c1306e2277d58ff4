"""Ledger and budget: what the Hub already holds, and how many commits it still allows this hour."""

from __future__ import annotations

import json
import math
import time
from collections.abc import Iterable
from pathlib import Path

from ..state import write_json_atomic
from ..variables import COMMITS_PER_HOUR
from .staging import StagedFile

__all__ = ["COMMITS_PER_HOUR", "CommitBudget", "Ledger"]  # variables.py holds the hourly figure (PUBLISH_EVERY's floor)

COMMIT_BURST = 20


class Ledger:
    """What the Hub already holds: ``path → ids`` (sha256, git blob id), persisted in the workspace."""

    def __init__(self, path: Path) -> None:
        self.path = path
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError):
            data = {}
        self.files: dict[str, list[str]] = {key: list(value) for key, value in data.get("files", {}).items()}
        self.head: str | None = data.get("head")
        self.commit_times: list[float] = [t for t in data.get("commit_times", []) if time.time() - t < 3600]

    def has(self, relative: str, ids: list[str]) -> bool:
        return bool(set(self.files.get(relative, ())) & set(ids))

    def record(self, files: list[StagedFile], head: str) -> None:
        for staged in files:
            self.files[staged.relative] = staged.ids
        self.head = head
        self.commit_times = [t for t in self.commit_times if time.time() - t < 3600] + [time.time()]
        self._save()

    def rebuild(self, remote: dict[str, str], head: str | None) -> None:
        """Start over from what the Hub lists (``path → sha256 or git blob id``)."""
        self.files = {relative: [oid] for relative, oid in remote.items()}
        self.head = head
        self._save()

    def _save(self) -> None:
        write_json_atomic(self.path, {"head": self.head, "files": self.files, "commit_times": self.commit_times})


class CommitBudget:
    """A token bucket: bursts of ``burst`` commits, refilled at ``per_hour`` (0: never of its own accord; only a
    flush, which spends over budget, commits)."""

    def __init__(
        self, per_hour: int = COMMITS_PER_HOUR, burst: int = COMMIT_BURST, recent: Iterable[float] = ()
    ) -> None:
        self.rate = per_hour / 3600.0
        self.burst = burst
        self.tokens = float(burst)
        self.updated = time.monotonic()
        self.held_until = 0.0
        for _ in recent:  # commits of an earlier attempt in the last hour still count
            self.tokens = max(0.0, self.tokens - 1)

    def _refill(self) -> None:
        now = time.monotonic()
        self.tokens = min(self.burst, self.tokens + (now - self.updated) * self.rate)
        self.updated = now

    def wait_time(self) -> float:
        self._refill()
        own = 0.0 if self.tokens >= 1 else (1 - self.tokens) / self.rate if self.rate > 0 else math.inf
        return max(own, self.hold())

    def hold(self) -> float:
        """Seconds the server asked us to wait (429 Retry-After); even a final commit waits."""
        return max(0.0, self.held_until - time.monotonic())

    def drain(self, retry_after: float) -> None:
        """The Hub said 429: nothing left to spend, and nothing at all before ``retry_after``."""
        self._refill()
        self.tokens = min(self.tokens, 0.0)
        self.held_until = max(self.held_until, time.monotonic() + retry_after)

    def spend(self) -> None:
        self._refill()
        self.tokens -= 1
