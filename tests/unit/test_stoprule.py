"""The stop rule in dollars (training/stoprule.py): judged from metrics.jsonl's rows at the instance's price;
refused without a price; its stop on the card and the receipt."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from entrypoint.errors import ConfigError
from entrypoint.report import card, receipt
from entrypoint.settings import from_env
from entrypoint.training import stoprule

PRICE = 3600.0  # $1 a second: an epoch's seconds are its dollars


def rows(curve: list[float | None], seconds: float = 1.0) -> list[dict[str, Any]]:
    """metrics.jsonl rows; None: an epoch without validation (libreyolo's eval_interval)."""
    made = []
    for epoch, value in enumerate(curve, start=1):
        row: dict[str, Any] = {"epoch": epoch, "time": seconds, "validated": value is not None}
        if value is not None:
            row["metrics/mAP50-95"] = value
        made.append(row)
    return made


def verdicts(curve: list[float | None], flat: float, gain: float = 0.005) -> list[bool]:
    return [
        bool(v and v.stop)
        for v in (stoprule.judge(rows(curve[:n]), PRICE, flat, gain) for n in range(1, 1 + len(curve)))
    ]


def test_a_flat_best_over_the_window_stops_at_that_boundary() -> None:
    curve = [0.10, 0.20, 0.30, 0.302, 0.303, 0.304, 0.40]
    # the window is $3: at epoch 6 the best rose 0.004 since epoch 3 (0.30 → 0.304)
    assert verdicts(curve, 3.0) == [False, False, False, False, False, True, False]
    verdict = stoprule.judge(rows(curve[:6]), PRICE, 3.0, 0.005)
    assert verdict is not None and (verdict.epoch, verdict.since, verdict.spent) == (6, 3, 6.0)
    assert verdict.gain == pytest.approx(0.004) and verdict.best == 0.304
    assert verdict.message(3.0, 0.005) == (
        "STOP_FLAT_SPEND: the best mAP50-95 (0.3040) rose +0.0040 over the last $3 of training (epochs 4-6),"
        " less than STOP_MIN_GAIN 0.005: stopped after epoch 6"
    )


def test_a_rising_best_never_stops_and_a_worse_epoch_does_not_lower_it() -> None:
    assert not any(verdicts([0.1, 0.2, 0.3, 0.4, 0.5, 0.6], 2.0))
    # a dip is not a loss: the best stays; but no new best for $2 stops it
    assert verdicts([0.1, 0.5, 0.2, 0.3, 0.4], 2.0) == [False, False, False, True, True]


def test_not_before_that_many_dollars_nor_without_evidence_in_the_window() -> None:
    assert verdicts([0.3, 0.3, 0.3], 5.0) == [False, False, False]  # only $3 of training
    # validation every 3rd epoch: a window with no validated epoch is no evidence
    curve = [None, None, 0.3, None, None, 0.3, None]
    assert verdicts(curve, 2.0) == [False, False, False, False, False, True, True]
    assert verdicts([None, None, 0.3, None, None, None], 2.0) == [False] * 6
    assert verdicts([None, None, None, None], 1.0) == [False] * 4


def test_the_dollars_follow_the_price_and_the_epoch_seconds() -> None:
    slow = rows([0.3, 0.3, 0.3, 0.3], seconds=1800)  # half an hour each
    assert not stoprule.judge(slow[:2], 2.0, 2.0, 0.005).stop  # $2/h: $1 so far
    assert stoprule.judge(slow[:3], 2.0, 2.0, 0.005).stop  # $3: epochs 2-3 cost $2, no gain
    missing = [dict(row, time=None) for row in rows([0.3] * 4)]
    assert not stoprule.judge(missing, PRICE, 1.0, 0.005).stop  # unknown seconds count nothing: never early


def test_rows_of_a_resumed_epoch_count_once(tmp_path: Path) -> None:
    lines = [json.dumps(row) for row in rows([0.1, 0.2, 0.3])]
    lines.insert(2, json.dumps({"epoch": 2, "time": 1.0, "metrics/mAP50-95": 0.25}))  # written again by a resume
    lines.append('{"epoch": 4, "ti')  # cut short by a kill
    (tmp_path / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    read = stoprule.read_rows(tmp_path)
    assert [row["epoch"] for row in read] == [1, 2, 3] and read[1]["metrics/mAP50-95"] == 0.25


def test_judged_once_per_boundary_and_recorded(tmp_path: Path) -> None:
    rule = stoprule.StopRule(tmp_path, PRICE, 2.0, 0.005)
    seen: list[dict[str, Any]] = []
    assert rule.at_boundary(seen.append) is False and seen == []  # no metrics.jsonl: no boundary yet
    for n in (1, 2, 3):
        (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows([0.3, 0.3, 0.3][:n])))
        stops = rule.at_boundary(seen.append)
        assert rule.at_boundary(seen.append) is False  # the same boundary is not judged twice
        assert stops is (n == 3)
    assert [record["stopped"] for record in seen] == [False, False, True]
    assert seen[-1]["message"].startswith("STOP_FLAT_SPEND: the best mAP50-95 (0.3000) rose +0.0000")
    assert rule.stopped
    assert rule.outcome() == (stoprule.REASON, rule.message())
    # the next start of this run: already stopped, nothing more to train
    again = stoprule.StopRule(tmp_path, PRICE, 2.0, 0.005)
    assert again.stopped_before()


def test_off_by_default() -> None:
    assert stoprule.OFF.check() is None and not stoprule.OFF.stopped_before() and not stoprule.OFF.stopped
    assert stoprule.OFF.outcome() == ("success", "training finished")


def test_it_needs_a_price(tmp_path: Path) -> None:
    env = {"WORKDIR": str(tmp_path), "PROVIDER": "none", "STOP_FLAT_SPEND": "5"}
    with pytest.raises(ConfigError, match="STOP_FLAT_SPEND=5 needs the instance's price") as refused:
        from_env(env)
    assert "PRICE_PER_HOUR" in (refused.value.hint or "")
    settings = from_env(env | {"PRICE_PER_HOUR": "2.49", "STOP_MIN_GAIN": "0.01"})
    assert (settings.stop_flat_spend, settings.stop_min_gain) == (5.0, 0.01)
    assert from_env({"WORKDIR": str(tmp_path), "PROVIDER": "none"}).stop_flat_spend is None
    # a provider that reports no price at start: refused then, before the dataset is paid for
    with pytest.raises(ConfigError, match="reported no price"):
        stoprule.for_job(settings, None)
    assert stoprule.for_job(settings, 2.49).flat_spend == 5.0


@pytest.mark.parametrize(
    ("name", "value"), [("STOP_FLAT_SPEND", "0"), ("STOP_FLAT_SPEND", "lots"), ("STOP_MIN_GAIN", "2")]
)
def test_bad_values_are_refused(tmp_path: Path, name: str, value: str) -> None:
    env = {"WORKDIR": str(tmp_path), "PROVIDER": "none", "PRICE_PER_HOUR": "1", "STOP_FLAT_SPEND": "5"}
    with pytest.raises(ConfigError, match=name):
        from_env(env | {name: value})


def ended_state(reason: str, message: str) -> dict[str, Any]:
    return {
        "timeline": {"agent_started_at": 1000.0, "marks": {"training": 1010.0, "done": 1100.0, "released": 1101.0}},
        "phases": {"training": {"seconds": 90.0}},
        "exit": {"code": 0, "reason": reason, "message": message},
        "sizing": {
            "cpus": {"cpus": 1, "affinity": 2, "quota": 1.0},
            "threads": {"per_process": 1, "source": "cgroup quota"},
            "workers": {"value": 0, "source": "sized"},
            "cache": {"value": "ram", "source": "sized"},
        },
    }


def test_the_receipt_and_the_card_say_why_it_stopped() -> None:
    found = receipt.compute(ended_state(stoprule.REASON, "STOP_FLAT_SPEND: flat"), 2000.0, 2.0)
    assert found is not None and found.stopped == "STOP_FLAT_SPEND: flat"
    assert found.feeding == "1 CPU, quota 1: 1 thread per process, workers 0, cache ram"
    assert "stopped early: STOP_FLAT_SPEND: flat" in found.one_line()
    assert "fed: 1 CPU, quota 1" in found.one_line()
    assert "Stopped early by the dollar rule: STOP_FLAT_SPEND: flat." in found.markdown()
    assert found.as_dict()["stopped"] == "STOP_FLAT_SPEND: flat"
    plain = receipt.compute(ended_state("success", "training finished"), 2000.0, 2.0)
    assert plain is not None and plain.stopped is None and "stopped early" not in plain.one_line()

    def state_line(reason: str) -> str:
        info = card.CardInfo(
            repo_id=None, run_name="r", phase="done", exit={"reason": reason, "message": "STOP_FLAT_SPEND: flat"},
            epochs_done=6, epochs_total=20, best=None, last=None, dataset={}, dataset_repo=None, argv=[],
            run_args="", versions={}, gpus=[], receipt=None, plot=False, updated_at=None,
        )  # fmt: skip
        return card.page(info).splitlines()[0]

    assert state_line(stoprule.REASON) == (
        "**State: done, stopped early by the dollar rule** after 6/20 epochs: STOP_FLAT_SPEND: flat."
    )
    assert state_line("success") == "**State: done** after 6/20 epochs."


def test_each_epoch_is_priced_at_the_price_it_ran_at() -> None:
    attempts = [
        {"attempt": 1, "epochs_done": 2, "cost": {"price_per_hour": 3600.0}},  # $1/s
        {"attempt": 2, "reason": "lost", "epochs_done": 4},  # no price on record: its epochs go to the next
        {"attempt": 3, "epochs_done": 5, "cost": {"price_per_hour": 7200.0}},  # $2/s
    ]
    price_of = stoprule.epoch_prices(attempts, current=36000.0)
    assert [price_of(epoch) for epoch in range(1, 8)] == [3600.0, 3600.0, 7200.0, 7200.0, 7200.0, 36000.0, 36000.0]
    # Five flat epochs at $1 each, then a restart on a host ten times dearer: the past stays $5, not $50.
    flat = rows([0.3] * 6)
    cheap_then_dear = stoprule.epoch_prices([{"epochs_done": 5, "cost": {"price_per_hour": PRICE}}], PRICE * 10)
    assert stoprule.judge(flat, PRICE * 10, 20.0, 0.005).stop  # every epoch at today's price: stopped at once
    verdict = stoprule.judge(flat, cheap_then_dear, 20.0, 0.005)
    assert verdict is not None and not verdict.stop and verdict.spent == 15.0  # $5 + one $10 epoch


def test_an_extension_starts_a_fresh_window() -> None:
    flat_tail = rows([0.3, 0.3, 0.3, 0.3, 0.3])  # a finished run of 5 epochs whose tail was flat
    extended = flat_tail + [dict(row, epoch=row["epoch"] + 5) for row in rows([0.3, 0.3, 0.3])]
    # Without the fresh window the extension stops at its first new epoch; with it, after $2 of new epochs.
    assert stoprule.judge(extended[:6], PRICE, 2.0, 0.005).stop
    assert [stoprule.judge(extended[:n], PRICE, 2.0, 0.005, fresh_from=5).stop for n in (6, 7, 8)] == [
        False,
        True,
        True,
    ]
    assert stoprule.fresh_window([{"after_epoch": 5}, {"after_epoch": 12}, "junk"]) == 12
    assert stoprule.fresh_window(None) == 0


def test_the_rule_reads_the_attempts_and_the_extensions_from_trainbox_json(tmp_path: Path) -> None:
    lines = [json.dumps(row) for row in rows([0.3] * 6)]
    (tmp_path / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    history = {"attempts": [{"epochs_done": 5, "cost": {"price_per_hour": PRICE}}], "extensions": [{"after_epoch": 5}]}
    rule = stoprule.StopRule(tmp_path, PRICE * 10, 20.0, 0.005, history=lambda: history)
    verdict = rule.judge_now()
    assert verdict is not None and not verdict.stop and verdict.spent == 15.0
    alone = stoprule.StopRule(tmp_path, PRICE * 10, 20.0, 0.005).judge_now()  # every epoch at today's price
    assert alone is not None and alone.stop and alone.spent == 60.0
