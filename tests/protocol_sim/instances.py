"""The providers' side of a history, truthful: which simulated instances still run. A container runs on its own
instance (named like the container) and the run's lease names it; a relaunch on a new volume asks this whether
the holder's instance still runs (``RunLease``'s ``holder_ended``), as the product asks Vast.ai or RunPod.

The answer is the history's ground truth: "gone" only once the container on that instance was killed or ended,
never while it runs or is frozen (a frozen process comes back). The world marks ``gone`` when it kills one.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from entrypoint.sync import protocol

PROVIDER = "sim"


@dataclass
class Instances:
    running: set[str] = field(default_factory=set)  # instances whose container runs (or is frozen)
    asked: list[tuple[str, bool]] = field(default_factory=list)  # (instance, answered gone), in order

    def start(self, instance: str) -> tuple[str, str]:
        """A container starts on ``instance``: what its lease names."""
        self.running.add(instance)
        return PROVIDER, instance

    def gone(self, instance: str) -> None:
        """The container on ``instance`` was killed, or ended."""
        self.running.discard(instance)

    def ended(self, lease: protocol.Lease, within: float) -> str | None:
        """``holder_ended``: the provider's words when the lease's instance no longer runs, else None."""
        if lease.provider != PROVIDER or lease.instance is None or within <= 0:
            return None
        gone = lease.instance not in self.running
        self.asked.append((lease.instance, gone))
        return f"sim instance {lease.instance}, which no longer runs" if gone else None

    def run_on(self, instance: str, body: Callable[[], int]) -> int:
        """Run a container's ``body`` on ``instance``: gone once it returns or is killed (``Killed`` unwinds)."""
        try:
            return body()
        finally:
            self.gone(instance)
