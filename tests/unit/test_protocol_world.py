"""The store protocol's rules over the rule-level model of tests/protocol_world.py: kept for what the simulation
of the agent's own code (tests/protocol_sim, tests/unit/test_protocol_sim.py) does not play yet, the repo's side
of the bucket's fallback (it falls back only after failing long enough; the repo never takes a snapshot)."""

from __future__ import annotations

import pytest

from tests.protocol_world import NAMED, OLD, Rules, Violation, run_history

pytestmark = pytest.mark.protocol

FAST_LANE = 1500


@pytest.mark.parametrize("name", list(NAMED))
def test_each_ordering_holds_under_the_new_rules(name: str) -> None:
    history, _ = NAMED[name]
    history(Rules())


@pytest.mark.parametrize("name", list(NAMED))
def test_each_ordering_breaks_an_invariant_under_the_old_rule(name: str) -> None:
    history, old = NAMED[name]
    with pytest.raises(Violation):
        history(old)


def test_generated_histories_keep_every_invariant() -> None:
    for seed in range(FAST_LANE):
        run_history(seed)  # a Violation names the seed and prints the replay


def test_a_violation_names_its_seed_and_replays_the_last_steps() -> None:
    with pytest.raises(Violation) as raised:
        for seed in range(200):
            run_history(seed, OLD)
    text = str(raised.value)
    assert text.startswith("seed ") and "replay (last steps):" in text and " starts on " in text
