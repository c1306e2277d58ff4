"""The cost receipt: the billed time split along the phase timeline, with dollars and efficiency."""

from __future__ import annotations

import pytest

from entrypoint.report import receipt

T0 = 1_800_000_000.0


def finished_state(**marks: float) -> dict:
    return {
        "timeline": {
            "agent_started_at": T0,
            "marks": {"preflight": T0 + 4, "resume": T0 + 10, "dataset": T0 + 12, "training": T0 + 30}
            | {"finishing": T0 + 3630, "done": T0 + 3632}
            | marks,
        },
        "phases": {
            "preflight": {"seconds": 6.0},
            "resume": {"seconds": 2.0},
            "dataset": {"seconds": 18.0},
            "training": {"seconds": 3600.0},
            "finishing": {"seconds": 2.0},
        },
        "gpus": {"check_seconds": 5.0},
    }


def test_parts_add_up_to_the_billed_time() -> None:
    state = finished_state(release=T0 + 3640, released=T0 + 3645)
    found = receipt.compute(state, now=T0 + 99_999, price_per_hour=3.6)
    assert found is not None and found.final
    assert found.seconds == {
        "setup": 4 + (6 - 5) + 2,
        "gpu_check": 5,
        "dataset": 18,
        "training": 3600,
        "uploads": 2 + 8,  # the finishing phase, then the final upload until the release starts
        "release": 5,
    }
    assert found.billed_seconds == 3645  # `now` is ignored once the release ended
    assert sum(found.seconds.values()) == pytest.approx(found.billed_seconds)
    assert found.efficiency == pytest.approx(3600 / 3645)
    data = found.as_dict()
    assert data["parts"]["training"] == {"seconds": 3600.0, "dollars": 3.6}
    assert data["billed_dollars"] == pytest.approx(3.645)
    assert data["billing_efficiency"] == pytest.approx(0.9877, abs=1e-4)


def test_without_an_upload_all_after_the_end_is_the_release() -> None:
    found = receipt.compute(finished_state(released=T0 + 3640), now=T0 + 5000)
    assert found is not None
    assert found.seconds["uploads"] == 2 and found.seconds["release"] == 8
    assert found.dollars(100) is None and "$" not in found.one_line()


def test_a_live_run_counts_until_now() -> None:
    state = finished_state()
    del state["timeline"]["marks"]["finishing"], state["timeline"]["marks"]["done"]
    state["phases"]["training"]["seconds"] = None
    del state["phases"]["finishing"]
    found = receipt.compute(state, now=T0 + 130, price_per_hour=1.0)
    assert found is not None and not found.final
    assert found.seconds["training"] == 100 and found.billed_seconds == 130
    assert sum(found.seconds.values()) == pytest.approx(130)
    assert "still billing" in found.markdown()


def test_the_price_recorded_in_the_cost_block_is_used() -> None:
    state = finished_state(released=T0 + 3640) | {"cost": {"price_per_hour": 2.0}}
    found = receipt.compute(state, now=T0)
    assert found is not None and found.price_per_hour == 2.0


def test_no_timeline_no_receipt() -> None:
    assert receipt.compute({"phases": {}}, now=T0) is None


def test_one_line_and_markdown() -> None:
    found = receipt.compute(finished_state(release=T0 + 3640, released=T0 + 3645), now=T0, price_per_hour=2.0)
    assert found is not None
    line = found.one_line()
    assert line.startswith("receipt: setup 7 s $0.00 · GPU check 5 s $0.00 · dataset 18 s $0.01 · training 1h00 $2.00")
    assert line.endswith("billed 1h00 $2.02 · billing efficiency 99%")
    table = found.markdown()
    assert "| training | 3600.0 | 2.00 |" in table and "**billed at $2/h**" in table


@pytest.mark.parametrize(
    ("seconds", "text"), [(0, "0 s"), (41.4, "41 s"), (59.6, "60 s"), (65, "1m05"), (3720, "1h02"), (90000, "25h00")]
)
def test_format_seconds(seconds: float, text: str) -> None:
    assert receipt.format_seconds(seconds) == text


def test_after_a_restart_the_receipt_lists_every_attempt_and_the_runs_total() -> None:
    state = finished_state(release=T0 + 3634, released=T0 + 3636) | {  # billed 3636 s at $2/h: $2.02
        "attempt": 3,
        "attempts": [
            {"attempt": 1, "cost": {"hours": 1.0, "price_per_hour": 2.0, "dollars": 2.0}},
            {"attempt": 2, "reason": "lost", "cost": {"dollars": 1.5, "estimate": "upper estimate"}},
            {"attempt": 3, "cost": {"dollars": 1.9}},  # this one's own entry: its billed time counts instead
        ],
    }
    found = receipt.compute(state, now=T0, price_per_hour=2.0)
    assert found is not None
    assert [(entry.number, entry.estimated) for entry in found.attempts] == [(1, False), (2, True), (3, False)]
    assert found.run_dollars == pytest.approx(2.0 + 1.5 + 2.02)
    assert found.one_line().endswith("the run: #1 $2.00 + #2 $1.50 (killed: at most) + #3 $2.02 = $5.52")
    assert "The whole run, every attempt (MAX_COST counts them together): #1 $2.00" in found.markdown()
    assert found.as_dict()["run_dollars"] == pytest.approx(5.52)
    first = receipt.compute(finished_state(), now=T0 + 3700, price_per_hour=2.0)
    assert first is not None and first.attempts == () and "the run" not in first.one_line()


def test_a_try_healed_in_this_container_is_not_counted_twice_in_the_runs_total() -> None:
    # attempt 2 healed (out of memory) after 1800 s of this container, which then billed 3636 s in all: attempt 3
    # is the other 1836 s, not the whole container again
    state = finished_state(release=T0 + 3634, released=T0 + 3636) | {
        "attempt": 3,
        "cost": {"price_per_hour": 2.0, "healed_seconds": 1800.0},
        "attempts": [
            {"attempt": 2, "reason": "out_of_memory", "cost": {"hours": 0.5, "price_per_hour": 2.0, "dollars": 1.0}},
            {"attempt": 3},
        ],
    }
    found = receipt.compute(state, now=T0, price_per_hour=2.0)
    assert found is not None
    assert found.run_dollars == pytest.approx(1.0 + 1836 / 3600 * 2.0)
    assert found.one_line().endswith("the run: #2 $1.00 + #3 $1.02 = $2.02")
