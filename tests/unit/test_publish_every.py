"""PUBLISH_EVERY: ``off`` publishes milestones only at the end; a value more often than the Hub's commit
budget allows is raised to its floor, said in one line."""

from __future__ import annotations

import logging
import math

import pytest

from entrypoint.settings import Settings, from_env
from entrypoint.sync.places import publish_budget
from entrypoint.variables import COMMITS_PER_HOUR, MIN_PUBLISH_EVERY


def make(**env: str) -> Settings:
    return from_env({"WORKDIR": "/srv/work", "PROVIDER": "none", "OUTPUT_REPO": "acme/yolo"} | env)


def said(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [record.getMessage() for record in caplog.records if "PUBLISH_EVERY" in record.getMessage()]


@pytest.mark.parametrize("value", ["off", "0", "none"])
def test_off_means_only_at_the_end(value: str, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="trainbox"):
        assert make(PUBLISH_EVERY=value).publish_every is None
    assert said(caplog) == []


def test_a_value_over_the_hubs_commit_budget_is_raised_to_the_floor_in_one_line(
    caplog: pytest.LogCaptureFixture,
) -> None:
    assert MIN_PUBLISH_EVERY * COMMITS_PER_HOUR == 3600  # no more milestones an hour than the budget
    with caplog.at_level(logging.INFO, logger="trainbox"):
        assert make(PUBLISH_EVERY="10s").publish_every == MIN_PUBLISH_EVERY
    (line,) = said(caplog)
    assert "PUBLISH_EVERY=10s" in line and f"{MIN_PUBLISH_EVERY:.0f} s" in line
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="trainbox"):
        assert make(PUBLISH_EVERY="1m").publish_every == 60  # within the budget: kept, nothing said
        assert make().publish_every == 600
    assert said(caplog) == []


def test_off_never_commits_of_its_own_accord_yet_a_flush_does() -> None:
    budget = publish_budget(None, [])
    assert budget.wait_time() == math.inf  # beside training: never
    assert budget.hold() == 0.0  # a flush (the run id before training, the end) spends over budget
    every = publish_budget(MIN_PUBLISH_EVERY, [])
    assert every.wait_time() == 0.0
    every.spend()
    assert every.wait_time() == pytest.approx(MIN_PUBLISH_EVERY, rel=0.01)
