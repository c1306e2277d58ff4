"""Cost: the price, hours and dollars of a run, MAX_COST, and ``trainbox plan``'s stop-versus-destroy arithmetic."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from pathlib import Path

import pytest

from entrypoint import settings, state
from entrypoint.cli import main
from entrypoint.errors import ConfigError, PriceCeilingError
from entrypoint.release import cost
from entrypoint.release.providers import InstanceState, Observed


@pytest.fixture(autouse=True)
def _restore_logging() -> Iterator[None]:
    """``main`` points the agent's log at this test's captured stderr: put it back afterwards."""
    logger = logging.getLogger("trainbox")
    handlers, propagate, level = logger.handlers[:], logger.propagate, logger.level
    yield
    logger.handlers[:] = handlers
    logger.propagate = propagate
    logger.setLevel(level)


def test_spend_with_and_without_a_price() -> None:
    assert cost.spend(5400, 2.49, "PRICE_PER_HOUR") == {
        "hours": 1.5,
        "price_per_hour": 2.49,
        "price_source": "PRICE_PER_HOUR",
        "dollars": 3.735,
    }
    assert cost.spend(5400, None) == {"hours": 1.5, "price_per_hour": None, "price_source": None, "dollars": None}
    assert cost.spend(-1, 1.0)["hours"] == 0.0


def test_describe_spend() -> None:
    assert cost.describe_spend(cost.spend(1836, 2.49)) == "0.51 h, $1.27 at $2.49/h"
    assert cost.describe_spend(cost.spend(1836, 0.74, "runpod:cost")) == "0.51 h, $0.38 at $0.74/h (runpod:cost)"
    assert cost.describe_spend(cost.spend(1836, None)) == "0.51 h"


# -- where the price comes from ---------------------------------------------------------------
RUNPOD_POD = Observed(InstanceState.RUNNING, "status=RUNNING", 0.74, "runpod:cost")


def test_price_per_hour_wins_over_the_providers_price() -> None:
    assert cost.choose_price(2.49, RUNPOD_POD) == cost.Price(2.49, "PRICE_PER_HOUR")


def test_the_providers_price_fills_in() -> None:
    assert cost.choose_price(None, RUNPOD_POD) == cost.Price(0.74, "runpod:cost")


def test_no_price_at_all() -> None:
    assert cost.choose_price(None, None) == cost.Price(None, None)
    unpriced = Observed(InstanceState.RUNNING, "status=RUNNING")
    assert cost.choose_price(None, unpriced) == cost.Price(None, None)


# -- MAX_COST ----------------------------------------------------------------------------------
def test_max_cost_is_a_time_budget_at_the_price() -> None:
    assert cost.budget_seconds(25.0, cost.Price(2.5, "PRICE_PER_HOUR")) == 36000
    assert cost.budget_seconds(None, cost.Price(None, None)) is None
    assert cost.budget_seconds(25.0, cost.Price(0.0, "PRICE_PER_HOUR")) is None  # free: never reached


def test_max_cost_without_a_price_is_refused_naming_price_per_hour() -> None:
    with pytest.raises(ConfigError) as raised:
        cost.budget_seconds(25.0, cost.Price(None, None))
    assert "PRICE_PER_HOUR" in str(raised.value) and "\n" not in str(raised.value)
    assert raised.value.exit_code == 10


def read_settings(**env: str) -> settings.Settings:
    return settings.from_env({"WORKDIR": "/w", "GPUS": "cpu", "PROVIDER": "none", **env}, options={})


@pytest.mark.parametrize(("value", "dollars"), [("25", 25.0), ("$12.50", 12.5), (" 0.5 ", 0.5)])
def test_max_cost_setting(value: str, dollars: float) -> None:
    assert read_settings(MAX_COST=value, PRICE_PER_HOUR="1").max_cost == dollars


@pytest.mark.parametrize("value", ["0", "-5", "ten", "inf", "nan"])
def test_a_bad_max_cost_is_refused(value: str) -> None:
    with pytest.raises(ConfigError, match="MAX_COST"):
        read_settings(MAX_COST=value, PRICE_PER_HOUR="1")


def test_max_cost_with_no_provider_and_no_price_is_refused_at_once() -> None:
    with pytest.raises(ConfigError, match="PRICE_PER_HOUR"):
        read_settings(MAX_COST="25")
    # With a provider, its price is read at start instead.
    with_provider = read_settings(MAX_COST="25", PROVIDER="runpod", RUNPOD_POD_ID="p1", RUNPOD_API_KEY="k" * 20)
    assert with_provider.max_cost == 25.0


def test_the_guides_example() -> None:
    """250 GB at $0.20/GB-month, $1.00 to rebuild (LibreYOLO's rented-GPU guide).

    The guide prints $0.0694/h next to its own formula, 250 × 0.20 / 730 = $0.0685/h ($0.0694 is
    what a 720-hour month gives); either way stopping wins for about 14 hours.
    """
    plan = cost.StopOrDestroy(disk_gb=250, storage_price=0.20, rebuild_cost=1.00)
    assert plan.stopped_per_hour == pytest.approx(0.0685, abs=5e-5)
    assert plan.break_even_hours == pytest.approx(14.6, abs=0.05)
    assert plan.as_dict()["stop_beats_destroy_within_hours"] == 14.6


def test_without_a_rebuild_cost_there_is_no_break_even() -> None:
    plan = cost.StopOrDestroy(disk_gb=100, storage_price=0.10, rebuild_cost=None)
    assert plan.break_even_hours is None
    assert len(plan.lines()) == 1


def test_plan_command(capsys: pytest.CaptureFixture[str]) -> None:
    main(["plan", "--disk-gb", "250", "--storage-price", "0.20", "--rebuild-cost", "1.00"])
    out = capsys.readouterr().out
    assert "250 GB × $0.2/GB-month ÷ 730 h = $0.0685/h" in out
    assert "within 14.6 h" in out


def test_plan_command_json(capsys: pytest.CaptureFixture[str]) -> None:
    main(["plan", "--disk-gb", "250", "--storage-price", "0.20", "--rebuild-cost", "1", "--json"])
    report = json.loads(capsys.readouterr().out)["stop_or_destroy"]
    assert report["stopped_per_hour"] == 0.0685 and report["stop_beats_destroy_within_hours"] == 14.6


def test_plan_without_a_price_says_what_to_add(capsys: pytest.CaptureFixture[str]) -> None:
    main(["plan", "--disk-gb", "250"])
    out = capsys.readouterr().out
    assert "--storage-price" in out
    assert "stopped:" not in out  # no arithmetic without a price


def test_plan_refuses_a_negative_disk(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as done:
        main(["plan", "--disk-gb", "-5", "--storage-price", "0.2"])
    assert done.value.code == 2
    assert "--disk-gb" in capsys.readouterr().err


# -- MAX_COST over the whole run -----------------------------------------------------------------
def killed_attempt_state(hours: float, interval_seconds: float, price: float = 2.0) -> dict:
    """trainbox.json as an attempt killed in training left it on the Hub: no end, its last spend record."""
    return {
        "attempt": 1,
        "phase": "training",
        "progress": {"epochs_done": 3},
        "cost": {
            "hours": hours,
            "price_per_hour": price,
            "price_source": "PRICE_PER_HOUR",
            "dollars": hours * price,
            "interval_seconds": interval_seconds,
        },
    }


def test_a_killed_attempt_counts_its_last_record_plus_one_interval_said_as_an_upper_estimate() -> None:
    found = state.lost_spend(killed_attempt_state(hours=1.0, interval_seconds=1800))
    assert found is not None
    assert (found["hours"], found["dollars"]) == (1.5, 3.0)  # 1 h recorded + half an hour between records, at $2/h
    assert "upper estimate" in found["estimate"]
    assert state.lost_spend({"phase": "training"}) is None  # an older agent recorded no spend


def test_the_run_state_records_a_killed_attempts_estimated_spend() -> None:
    run = state.RunState(Path("/nonexistent"), "run", killed_attempt_state(hours=1.0, interval_seconds=1800))
    (lost,) = run.history.attempts
    assert lost["reason"] == "lost" and lost["cost"]["dollars"] == 3.0 and lost["epochs_done"] == 3


def test_earlier_attempts_add_up_and_say_what_is_left() -> None:
    attempts = [
        {"attempt": 1, "cost": {"hours": 1.0, "price_per_hour": 2.0, "dollars": 2.0}},
        {"attempt": 2, "cost": {"dollars": 4.5, "estimate": state.LOST_SPEND_NOTE}},  # killed: an upper estimate
        {"attempt": 3, "reason": "lost"},  # nothing on record
    ]
    spent = cost.earlier_spend(attempts)
    assert (spent.dollars, spent.attempts, spent.estimated, spent.unrecorded) == (6.5, 3, 1, 1)
    assert spent.left(25.0) == 18.5 and spent.left(5.0) == 0.0
    assert spent.line(25.0) == (
        "$6.50 spent by 3 earlier attempts (1 killed: an upper estimate; 1 with no spend on record, not counted),"
        " $18.50 left of MAX_COST $25"
    )
    assert cost.earlier_spend([]).line(None) == "$0.00 spent by 0 earlier attempts"
    error = cost.run_limit_reached(5.0, spent)
    assert error.exit_code == 82 and "MAX_COST ($5.00) reached by the run: $6.50 spent by 3" in str(error)


# -- MAX_PRICE_PER_HOUR --------------------------------------------------------------------------
def test_a_price_above_the_ceiling_is_refused_naming_both_prices() -> None:
    with pytest.raises(PriceCeilingError) as raised:
        cost.check_ceiling(cost.Price(3.2, "vast:dph_total"), 2.5)
    assert raised.value.exit_code == 83
    assert str(raised.value).startswith("this instance bills $3.2/h (vast:dph_total), above MAX_PRICE_PER_HOUR=$2.5/h")
    assert "\n" not in str(raised.value)
    cost.check_ceiling(cost.Price(2.5, "PRICE_PER_HOUR"), 2.5)  # at the ceiling: taken
    cost.check_ceiling(cost.Price(None, None), None)  # no ceiling: nothing to check
    with pytest.raises(ConfigError, match="PRICE_PER_HOUR"):
        cost.check_ceiling(cost.Price(None, None), 2.5)  # a ceiling, and no price to hold against it


def test_max_price_per_hour_setting() -> None:
    assert read_settings(MAX_PRICE_PER_HOUR="$2.50", PRICE_PER_HOUR="1").max_price_per_hour == 2.5
    with pytest.raises(ConfigError, match="MAX_PRICE_PER_HOUR"):
        read_settings(MAX_PRICE_PER_HOUR="cheap", PRICE_PER_HOUR="1")
    with pytest.raises(ConfigError, match="PRICE_PER_HOUR"):
        read_settings(MAX_PRICE_PER_HOUR="2.5")  # no provider, no price: it could never be checked
