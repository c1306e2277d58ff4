"""The store protocol (entrypoint/sync/protocol.py) checked over generated histories (tests/protocol_world.py):
agents killed at every step, every call failing or timing out, slow calls, lease expiry, clocks ±30 s apart,
the invariants checked after every step. Each ordering of issue 45 is a named history that fails under the
rule it replaced and holds under the new one. bench/protocol_sim.py runs the long lane (100 000 histories)."""

from __future__ import annotations

import pytest

from tests.protocol_world import NAMED, OLD, Rules, Violation, run_history

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
