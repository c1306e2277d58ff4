"""A history: containers on one run, the in-memory Hub, the faults, the chaos (kills, freezes, a person's edit of
the lease), the oracle after every step. ``run(seed, options)`` plays one, deterministically from its seed.
"""

from __future__ import annotations

import logging
import random
import shutil
import tempfile
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from unittest import mock

from entrypoint import hub as hub_module
from entrypoint.retry import RetryPolicy
from entrypoint.sync import bucket as bucket_module
from entrypoint.sync import clock, lease
from entrypoint.sync.protocol import CLOCK_SKEW

from . import container as c
from .clock import Actor, Scheduler, VirtualClock
from .faults import Faults, Outage
from .hub import Server, Session, SimApi
from .lease_file import PERSON_EDIT
from .oracle import LEASE, Oracle, Violation

# A generated freeze lasts at most this many periods: well past a lease period, so a holder is taken over while
# frozen anywhere (between its resume read and its training: job.confirm_held reads its lease again and it ends,
# 71; inside a bucket batch: the batch lands on thaw, ordering 5, histories.FENCED).
LONGEST_FREEZE = 2.5
# Volumes in memory where the machine has it: a history writes and deletes a few hundred small files.
_SCRATCH = "/dev/shm" if Path("/dev/shm").is_dir() else None


@dataclass
class Options:
    """One history's shape. The generator draws them from the seed; a named history sets them."""

    containers: int = 1  # started at first, each on its own volume
    stagger: float = 0.0  # seconds between their starts (at most)
    rate: float = 0.0  # chance a Hub call meets a fault
    kinds: dict[str, tuple[str, ...]] | None = None  # which faults (faults.EVERY)
    outages: list[Outage] = field(default_factory=list)
    skew: float = CLOCK_SKEW  # clocks within ±this of true time
    kill_rate: float = 0.0  # chance, at each step, that the running container is killed (then relaunched)
    freeze_rate: float = 0.0  # chance, at each step, that it freezes (0.1 to LONGEST_FREEZE periods)
    relaunch_after: float = 60.0  # a killed container's relaunch, on a new volume, this much later
    person: list[tuple[float, bytes | None]] = field(default_factory=list)  # (time, lease file) a person commits
    limit: float = 4 * 3600.0  # true seconds
    script: dict[str, list[str]] = field(default_factory=dict)
    disruptions: int = 1  # kills and freezes, at most
    kills: list[tuple[float, str]] = field(default_factory=list)  # (time, container): killed then
    freezes: list[tuple[str, str, int, float]] = field(default_factory=list)  # container frozen in its nth call
    pauses: list[tuple[float, str, float]] = field(default_factory=list)  # (time, container, seconds) frozen then
    skews: dict[str, float] = field(default_factory=dict)  # a container's clock, set
    starts: list[float] = field(default_factory=list)  # when the containers start (else drawn)


def draw(seed: int) -> Options:
    rng = random.Random(seed ^ 0x5EED)
    return Options(
        containers=rng.choice((1, 1, 2, 2, 3)),
        stagger=rng.choice((0.0, 5.0, 200.0)),
        rate=rng.choice((0.0, 0.03, 0.08, 0.15)),
        kill_rate=rng.choice((0.0, 0.002, 0.01)),
        freeze_rate=rng.choice((0.0, 0.0, 0.003)),
    )


@contextmanager
def _seam(scheduler: Scheduler, api: SimApi, rng: random.Random) -> Iterator[None]:
    """The one seam: the Hub calls (``SimHub.api``, the lease's raw read) and the clocks the store code reads."""
    virtual = VirtualClock(scheduler)

    def policy(**kw: Any) -> RetryPolicy:  # hub.with_retries' pauses and deadlines on the virtual clock too
        return RetryPolicy(**{**kw, "sleep": virtual.sleep, "clock": virtual.monotonic})

    ids = mock.Mock()
    ids.token_hex = lambda n: "".join(rng.choice("0123456789abcdef") for _ in range(2 * n))
    with ExitStack() as stack:
        stack.enter_context(clock.use(virtual))
        stack.enter_context(mock.patch.object(lease, "get_session", lambda: Session(api)))
        stack.enter_context(mock.patch.object(hub_module, "RetryPolicy", policy))
        stack.enter_context(mock.patch.object(bucket_module, "secrets", ids))
        quiet = logging.getLogger("trainbox")
        level = quiet.level
        quiet.setLevel(logging.CRITICAL)
        try:
            yield
        finally:
            quiet.setLevel(level)


@dataclass
class Result:
    seed: int
    exits: dict[str, int | None]
    steps: int
    seconds: float  # true (virtual) seconds the history lasted
    epochs: int  # the Hub's newest whole state at the end
    log: list[str]


def run(
    seed: int, options: Options | None = None, *, rules: Callable[[], Any] | None = None, only: set[str] | None = None
) -> Result:
    """Play one history; ``Violation`` (seed, why, the last events) when an invariant breaks."""
    options = options or draw(seed)
    rng = random.Random(seed)
    scheduler = Scheduler(rng)
    faults = Faults(
        rng, options.rate, outages=list(options.outages), script={k: list(v) for k, v in options.script.items()}
    )
    if options.kinds is not None:
        faults.kinds = dict(options.kinds)
    faults.since = scheduler.now
    server = Server(scheduler, faults)
    server.freezes = list(options.freezes)
    kills = sorted(options.kills)
    pauses = sorted(options.pauses)
    api = SimApi(server)
    oracle = Oracle(server, c.PERIOD, seed=seed, only=only)
    root = Path(tempfile.mkdtemp(prefix="protocol-sim-", dir=_SCRATCH))
    count = 0
    disruptions = 0
    relaunches: list[float] = []
    person = sorted(options.person, key=lambda p: p[0])

    def say(line: str) -> None:
        oracle.log.append(f"t={scheduler.now - faults.since:7.1f} {line}")

    report = c.Report(
        durable=lambda run_id, epochs, snaps: (
            say(f"{_who(scheduler)} told: {epochs} epochs on the Hub"),
            oracle.durable(run_id, epochs, snaps),
        )[-1],
        trained=lambda run_id, epoch: oracle.train(_who(scheduler), run_id, epoch),
        started=lambda attempt, run_id, epochs: (
            say(f"{_who(scheduler)} ({attempt}) starts run {run_id} at {epochs}"),
            oracle.start(_who(scheduler), run_id, epochs, attempt),
        )[-1],
    )

    def launch(at: float | None = None) -> Actor:
        nonlocal count
        count += 1
        name = f"c{count}"
        volume = root / name
        volume.mkdir()
        run_id = "".join(rng.choice("0123456789abcdef") for _ in range(12))
        skew = options.skews.get(name, rng.uniform(-options.skew, options.skew))
        say(f"{name} launched (clock {skew:+.0f} s)")
        return scheduler.spawn(name, lambda: c.container(api, volume, report, run_id), skew=skew, at=at)

    def chaos(actor: Actor) -> None:
        nonlocal disruptions
        faults.now = scheduler.now
        while person and person[0][0] <= scheduler.now - faults.since:
            _, content = person.pop(0)
            server.commit({LEASE: content}, PERSON_EDIT)
            say(f"a person {'rewrites' if content else 'deletes'} the lease")
        while kills and kills[0][0] <= scheduler.now - faults.since:
            _, name = kills.pop(0)
            for victim in scheduler.actors:
                if victim.name == name and not victim.done:
                    say(f"{name} killed")
                    scheduler.kill(victim)
                    relaunches.append(scheduler.now + options.relaunch_after)
        while pauses and pauses[0][0] <= scheduler.now - faults.since:
            _, name, seconds = pauses.pop(0)
            for victim in scheduler.actors:
                if victim.name == name and not victim.done:
                    say(f"{name} frozen {seconds:.0f} s")
                    scheduler.freeze(victim, seconds)
        if disruptions >= options.disruptions:
            return
        roll = rng.random()
        if roll < options.kill_rate:
            disruptions += 1
            say(f"{actor.name} killed")
            scheduler.kill(actor)
            relaunches.append(scheduler.now + options.relaunch_after)
        elif roll < options.kill_rate + options.freeze_rate:
            disruptions += 1
            seconds = rng.uniform(0.1, LONGEST_FREEZE) * c.PERIOD
            say(f"{actor.name} frozen {seconds:.0f} s")
            scheduler.freeze(actor, seconds)

    def after_step() -> None:
        faults.now = scheduler.now
        oracle.check()

    scheduler.on_step = after_step
    try:
        with _seam(scheduler, api, rng), rules() if rules is not None else ExitStack():
            for n in range(options.containers):
                drawn = rng.uniform(0, options.stagger) if n else 0.0
                launch(scheduler.now + (options.starts[n] if n < len(options.starts) else drawn))
            end = scheduler.now + options.limit
            while True:
                scheduler.run(end, chaos=chaos)
                exits = [a.exit for a in scheduler.actors]
                errors = [a.error for a in scheduler.actors if a.error is not None]
                if errors:
                    raise errors[0]
                if relaunches and 0 not in exits and scheduler.now < end:
                    scheduler.now = max(scheduler.now, relaunches.pop(0))
                    launch(scheduler.now)
                    continue
                break
            oracle.check()
            oracle.end({a.name: a.exit for a in scheduler.actors})
        states = [e for runs in _whole(server).values() for e in runs]
        return Result(
            seed,
            {a.name: a.exit for a in scheduler.actors},
            scheduler.steps,
            scheduler.now - faults.since,
            max(states, default=0),
            oracle.log,
        )
    finally:
        scheduler.close()
        shutil.rmtree(root, ignore_errors=True)


def _whole(server: Server) -> dict[str, list[int]]:
    from .oracle import whole_states

    return {run: [e for e, _ in states] for run, states in whole_states(server.bucket).items()}


def _who(scheduler: Scheduler) -> str:
    actor = scheduler.current()
    return actor.name if actor is not None else "?"


__all__ = ["Options", "Result", "Violation", "draw", "run"]
