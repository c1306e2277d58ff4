"""The shutdown clock: from a stop to the exit, each step's share of the time the machine leaves.

Spot platforms allow 5-30 s between SIGTERM and SIGKILL: from SIGTERM to exit is a bound, and every
step after it (the training child's grace, the final upload, publishing trainbox.json) takes its share
of it. Completed epochs are already safe on disk (and on the Hub). MAX_RUNTIME and MAX_COST share one
timer (SIGALRM), whichever comes first.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

PREEMPT_BUDGET = 5.0
PREEMPT_GRACE = 2.0
# What the child grace leaves for the final upload and writing the end of trainbox.json.
PREEMPT_SYNC_RESERVE = 2.5
PREEMPT_EXIT_RESERVE = 0.3
WRAP_UP_GRACE = 15.0
# How long the final upload may take when nothing presses.
FINAL_SYNC_TIMEOUT = 600.0
PUBLISH_TIMEOUT = 60.0


class ShutdownClock:
    """The job's deadlines: when it began, when it must exit (once SIGTERM came), what SIGALRM means.

    Only the main thread uses it (the signal handler and the stages): no lock.
    """

    def __init__(self) -> None:
        self.started = time.monotonic()
        self.deadline: float | None = None  # set by SIGTERM: the process exits by then
        self.alarm_is_budget = False  # SIGALRM means MAX_COST, not MAX_RUNTIME
        self._held: list[int] | None = None  # signals held while the trainer starts, then handled

    def elapsed(self) -> float:
        return time.monotonic() - self.started

    # -- SIGTERM ------------------------------------------------------------------------------
    def preempt(self) -> bool:
        """SIGTERM: the process exits within PREEMPT_BUDGET from now. False when an earlier SIGTERM set it."""
        if self.deadline is not None:
            return False
        self.deadline = time.monotonic() + PREEMPT_BUDGET
        return True

    @property
    def preempted(self) -> bool:
        return self.deadline is not None

    @property
    def upload_cutoff(self) -> float:
        """When a final upload already under way must give up (the exit's own reserve kept)."""
        assert self.deadline is not None
        return self.deadline - PREEMPT_EXIT_RESERVE

    def remaining(self, default: float = FINAL_SYNC_TIMEOUT) -> float:
        """Seconds left before the process must exit (``default`` when no SIGTERM set a bound)."""
        if self.deadline is None:
            return default
        return max(0.0, min(default, self.deadline - time.monotonic() - PREEMPT_EXIT_RESERVE))

    def preempt_grace(self) -> float:
        """The training child's grace under SIGTERM: what the final upload needs comes first."""
        return max(0.0, min(PREEMPT_GRACE, self.remaining() - PREEMPT_SYNC_RESERVE))

    def child_grace(self) -> float:
        """How long a stopped training child may take to exit on its own."""
        return self.preempt_grace() if self.deadline is not None else WRAP_UP_GRACE

    # -- SIGALRM: MAX_RUNTIME and MAX_COST ----------------------------------------------------
    def arm_runtime(self, max_runtime: float | None) -> None:
        if max_runtime:
            signal.setitimer(signal.ITIMER_REAL, max_runtime)

    def arm_budget(self, budget: float) -> None:
        """MAX_COST as a deadline on the MAX_RUNTIME timer, whichever comes first."""
        left = budget - self.elapsed()
        runtime_left = signal.getitimer(signal.ITIMER_REAL)[0]  # 0.0 without MAX_RUNTIME
        if runtime_left and runtime_left <= left:
            return
        self.alarm_is_budget = True
        signal.setitimer(signal.ITIMER_REAL, max(left, 0.001))  # 0 would disarm it

    def disarm(self) -> None:
        signal.setitimer(signal.ITIMER_REAL, 0)

    # -- signals held while the training child starts ------------------------------------------
    def hold(self, signum: int) -> bool:
        """Keep ``signum`` for later when signals are held; False when it must be handled now."""
        if self._held is None:
            return False
        self._held.append(signum)
        return True

    @contextmanager
    def holding_signals(self, handle: Callable[[int], None]) -> Iterator[None]:
        """The child may exist before the job holds it: a stop raised inside its start would leave it
        untracked, so signals wait until the block ends, then ``handle`` takes each in order."""
        self._held = []
        try:
            yield
        finally:
            held, self._held = self._held, None
            for signum in held:
                handle(signum)
