"""The protocol's simulation with its providers' side (tests/protocol_sim/instances.py): each container runs on
its own instance, named in its lease, and a relaunch asks the holder's provider, which answers truthfully
("gone" only once that container was killed or ended). The agent's own lease code decides."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.protocol_sim import container
from tests.protocol_sim.container import PERIOD
from tests.protocol_sim.histories import ORDERINGS
from tests.protocol_sim.hub import SimApi
from tests.protocol_sim.instances import Instances
from tests.protocol_sim.world import run

pytestmark = pytest.mark.protocol

EVERY_INVARIANT = {"start-from-less", "trained-twice", "durable", "snapshots", "silence", "one-writer", "two-end-0"}


@pytest.fixture
def instances(monkeypatch: pytest.MonkeyPatch) -> Iterator[Instances]:
    """Every container of the histories on an instance named like it (its volume's name)."""
    found = Instances()
    plain = container.container

    def on_instance(api: SimApi, volume: Path, report: container.Report, run_id: str) -> int:
        return found.run_on(
            volume.name, lambda: plain(api, volume, report, run_id, instance=volume.name, instances=found)
        )

    monkeypatch.setattr(container, "container", on_instance)
    yield found


def test_a_relaunch_takes_a_killed_holders_run_at_once_when_its_provider_says_so(instances: Instances) -> None:
    # Ordering 3: c1 killed at 300 s, c2 relaunched at 310 s on a new volume and a new instance. The provider says
    # c1's instance no longer runs: c2 takes the run at once, waits only the holder's licence (a quarter period)
    # before its first write, and resumes where c1 was told its epochs landed. Every invariant holds.
    # The oracle's "silence" invariant (a take only after a period without the holder's writes) is the rule for a
    # holder not known gone; here the ground truth replaces it: c1 was killed before c2 was launched. Every other
    # invariant is judged, "one writer" among them.
    result = run(1, ORDERINGS["3-relaunch-waits-one-period"], only=EVERY_INVARIANT - {"silence"})
    assert result.log.index(next(line for line in result.log if " c1 killed" in line)) < result.log.index(
        next(line for line in result.log if " c2 launched" in line)
    )
    told = [line.split() for line in result.log if " c1 told: " in line]
    started = [line.split() for line in result.log if " c2 (" in line and " starts run " in line]
    assert told and started and started[0][-1] == told[-1][4], "\n".join(result.log)
    waited = float(started[0][1]) - 310.0
    # Its state is read once the holder's licence (a quarter period) is over: some Hub calls after that, never
    # the period (and the quarter) a relaunch that cannot know the holder gone watches first.
    assert waited < PERIOD / 4 + 60.0, f"the relaunch started {waited:.0f} s after its launch: it watched a period"
    assert ("c1", True) in instances.asked
    assert result.epochs == 8


def test_a_live_holders_instance_still_runs_and_is_watched(instances: Instances) -> None:
    # Ordering 7: c2 starts beside a live c1 (its clock 10 minutes fast): c1's provider says it runs, c2 watches
    # c1's heartbeat move and ends (72); every invariant holds, "silence" included.
    result = run(1, ORDERINGS["7-a-clock-fast-beyond-the-skew"])
    assert instances.asked and not any(gone for _, gone in instances.asked), instances.asked
    assert result.exits["c2"] == 72 and result.epochs == 8, "\n".join(result.log[-20:])
