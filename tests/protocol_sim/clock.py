"""Virtual time and a deterministic scheduler for the protocol's simulation.

Each simulated container (an ``Actor``) runs the product's code in its own greenlet, one at a time: an actor
runs until it reaches a *yield point* (a call to the in-memory Hub, a sleep or a timed wait of
sync/clock.py), switches back, and the scheduler (seeded) picks who runs next. Time is
virtual: nothing waits for real. Each actor has its own clock (``skew`` on the wall clock, its own
monotonic origin); a frozen actor is not scheduled, and its clocks have jumped when it thaws.
``VirtualClock`` is what ``entrypoint.sync.clock.use`` installs: it routes every read to the running
actor (the scheduler itself reads true time).
"""

from __future__ import annotations

import random
import threading
from collections.abc import Callable
from dataclasses import dataclass

import greenlet

START = 1_800_000_000.0  # true time at a history's start (the Hub's clock)


class Killed(BaseException):
    """Raised in an actor's thread at its next yield point: kill -9 (no product ``except Exception`` sees it)."""


@dataclass
class Actor:
    name: str
    body: Callable[[], int]
    skew: float = 0.0  # its wall clock minus true time
    mono_origin: float = 0.0
    wake_at: float = 0.0
    kill: bool = False
    done: bool = False
    exit: int | None = None  # its exit code; None: killed or still running
    error: BaseException | None = None
    runner: greenlet.greenlet | None = None


class Scheduler:
    """One greenlet per actor, switched to and from at yield points: one real thread, no real wait."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        self.now = START
        self.actors: list[Actor] = []
        self.steps = 0
        self.on_step: Callable[[], None] | None = None  # the oracle, after every step
        self.hub = greenlet.getcurrent()
        self._running: Actor | None = None

    # -- actors ---------------------------------------------------------------------------------
    def spawn(self, name: str, body: Callable[[], int], *, skew: float = 0.0, at: float | None = None) -> Actor:
        actor = Actor(name, body, skew=skew, mono_origin=self.rng.uniform(100.0, 10_000.0))
        actor.wake_at = self.now if at is None else at
        actor.runner = greenlet.greenlet(lambda: self._main(actor), parent=self.hub)
        self.actors.append(actor)
        return actor

    def _main(self, actor: Actor) -> None:
        try:
            if not actor.kill:
                actor.exit = actor.body()
        except Killed:
            pass
        except BaseException as error:  # a product bug: the history reports it
            actor.error = error
        finally:
            actor.done = True

    def current(self) -> Actor | None:
        return self._running

    def _switch(self, actor: Actor) -> None:
        assert actor.runner is not None
        self._running = actor
        try:
            actor.runner.switch()
        finally:
            self._running = None

    def pause(self, seconds: float = 0.0) -> None:
        """A yield point of the calling actor: it wakes ``seconds`` later (true time)."""
        actor = self._running
        if actor is None:
            self.now += max(0.0, seconds)
            return
        if actor.kill:
            raise Killed()
        actor.wake_at = self.now + max(0.0, seconds)
        self.hub.switch()
        if actor.kill:
            raise Killed()

    def freeze(self, actor: Actor, seconds: float) -> None:
        actor.wake_at = max(actor.wake_at, self.now) + seconds

    def kill(self, actor: Actor) -> None:
        """kill -9: it unwinds at its yield point (no Hub call is made on the way out)."""
        if actor.done:
            return
        actor.kill = True
        if actor.runner is not None and actor.runner:
            self._switch(actor)
        actor.done = True

    def alive(self) -> list[Actor]:
        return [a for a in self.actors if not a.done]

    def run(
        self,
        until: float,
        *,
        max_steps: int = 20_000,
        chaos: Callable[[Actor], None] | None = None,
    ) -> None:
        """Run the actors until all are done or true time passes ``until``; ``chaos`` may kill or freeze the
        actor about to run (every step is a place where it may)."""
        while self.steps < max_steps:
            alive = self.alive()
            if not alive:
                return
            soonest = min(a.wake_at for a in alive)
            if soonest > until:
                return
            self.now = max(self.now, soonest)
            ready = [a for a in alive if a.wake_at <= self.now]
            actor = ready[0] if len(ready) == 1 else self.rng.choice(ready)
            self.steps += 1
            if chaos is not None:
                chaos(actor)
                if actor.done or actor.wake_at > self.now:
                    continue
            self._switch(actor)
            if self.on_step is not None:
                self.on_step()

    def close(self) -> None:
        for actor in self.actors:
            self.kill(actor)


class VirtualClock:
    """sync/clock.py's ``Clock`` over the scheduler: each actor's reads on its own clock, every sleep a yield."""

    def __init__(self, scheduler: Scheduler) -> None:
        self.s = scheduler

    def time(self) -> float:
        actor = self.s.current()
        return self.s.now + (actor.skew if actor is not None else 0.0)

    def monotonic(self) -> float:
        actor = self.s.current()
        return self.s.now - START + (actor.mono_origin if actor is not None else 0.0)

    def sleep(self, seconds: float) -> None:
        self.s.pause(seconds)

    def wait(self, event: threading.Event, timeout: float | None) -> bool:
        if event.is_set():
            return True
        self.s.pause(timeout if timeout is not None else 3600.0)
        return event.is_set()
