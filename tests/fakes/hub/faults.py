"""Fault injection (status, reset, slow bodies, ...) and the request log of the local Hub."""

from __future__ import annotations

import random
import re
import secrets
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any

from tests.fakes.hub.model import RequestRecord

if TYPE_CHECKING:
    from tests.fakes.hub.server import HubServer


# "hold": the request waits, unanswered and unapplied, until the fault is removed (a writer's commit in flight
# while it freezes: it lands, or is refused, only then).
FAULT_KINDS = ("status", "reset", "reset-body", "slow", "apply-then-reset", "cas-unwritable", "hold")
HOLD_AT_MOST = 300.0


@dataclass
class Fault:
    kind: str
    status: int = 500
    method: str | None = None
    path: str | None = None
    share: float = 1.0
    times: int | None = None
    skip: int = 0
    seed: int | None = None
    retry_after: int = 0
    # A status fault's X-Error-Code (e.g. "EntryNotFound": a 404 the client raises as EntryNotFoundError), and
    # its RateLimit reset in seconds (a 429 answered with the Hub's RateLimit headers instead of Retry-After).
    code: str | None = None
    reset: int | None = None
    after_bytes: int | None = None
    rate: int | None = None
    fired: int = 0
    id: str = field(default_factory=lambda: secrets.token_hex(4))
    # Set when the fault is removed or cleared: a "slow" body still trickling under it then drops its
    # connection, so a transfer slowed for one test never outlives it (holding the client's download slots).
    lifted: bool = field(default=False, repr=False)
    _seen: int = field(default=0, repr=False)
    _rng: random.Random = field(default_factory=random.Random, repr=False)
    _hub: HubServer | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        if self.kind.isdigit():
            self.kind, self.status = "status", int(self.kind)
        if self.kind not in FAULT_KINDS:
            raise ValueError(f"unknown fault kind {self.kind!r}; one of {FAULT_KINDS} or a status code")
        if self.kind == "slow" and not self.rate:
            raise ValueError("a 'slow' fault needs rate= (bytes per second)")
        self._rng = random.Random(self.seed)

    def _select(self, method: str, path: str) -> bool:
        """Called under the hub lock: does this fault hit this request?"""
        if self.method and not re.fullmatch(self.method, method, re.IGNORECASE):
            return False
        if self.path and not re.search(self.path, path):
            return False
        self._seen += 1
        if self._seen <= self.skip or (self.times is not None and self.fired >= self.times):
            return False
        if self.share < 1.0 and self._rng.random() >= self.share:
            return False
        self.fired += 1
        return True

    @property
    def label(self) -> str:
        return str(self.status) if self.kind == "status" else self.kind

    def to_json(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self) if not f.name.startswith("_")}

    def remove(self) -> None:
        if self._hub is not None:
            self._hub._remove_fault(self)

    def __enter__(self) -> Fault:
        return self

    def __exit__(self, *exc: object) -> None:
        self.remove()


class FaultsMixin:
    """Faults and the request log of ``HubServer``."""

    def inject(self, kind: str, **kwargs: Any) -> Fault:
        fault = Fault(kind, **kwargs)
        fault._hub = self
        with self._lock:
            self._faults.append(fault)
        return fault

    def clear_faults(self) -> None:
        with self._lock:
            for fault in self._faults:
                fault.lifted = True
            self._faults.clear()

    @property
    def faults(self) -> list[Fault]:
        with self._lock:
            return list(self._faults)

    def _remove_fault(self, fault: Fault) -> None:
        with self._lock:
            fault.lifted = True
            if fault in self._faults:
                self._faults.remove(fault)

    def _pick_fault(self, method: str, path: str) -> Fault | None:
        with self._lock:
            return next((f for f in self._faults if f._select(method, path)), None)

    # -- request log --------------------------------------------------------------------------------
    def _log_request(self, record: RequestRecord) -> None:
        with self._lock:
            self._log.append(record)

    @property
    def requests(self) -> list[RequestRecord]:
        with self._lock:
            return list(self._log)

    def find_requests(self, method: str | None = None, path: str | None = None) -> list[RequestRecord]:
        return [
            r
            for r in self.requests
            if (method is None or r.method == method.upper()) and (path is None or re.search(path, r.path))
        ]

    def bytes_served(self, path: str | None = None) -> int:
        return sum(r.bytes_out for r in self.find_requests(path=path))

    def reset_log(self) -> None:
        with self._lock:
            self._log.clear()
