"""The stop rule in dollars: when the best mAP50-95 has not risen by ``STOP_MIN_GAIN`` over the last
``STOP_FLAT_SPEND`` dollars of training, the training stops at that epoch boundary and the run ends as
finished.

The dollars are the epochs' own: each metrics.jsonl row's ``time`` (the epoch's seconds, validation
included) at the price of the instance that trained it (``epoch_prices``: the attempts in trainbox.json, each
with its price and its last epoch; this instance's for the epochs after them), so a restart on a dearer host
does not reprice the past. An extension (more ``epochs`` for a finished run) starts a fresh window: the window
never reaches back before the extension, so a run whose tail was flat trains ``STOP_FLAT_SPEND`` dollars of the
new epochs before the rule may stop it. The window is judged against the best of the last boundary at least
``STOP_FLAT_SPEND`` dollars back; it needs a validated epoch inside it (an epoch without validation is no evidence: with
libreyolo's ``eval_interval=10`` nine in ten are). Off by default.

Stopping: libreyolo writes every checkpoint of an epoch, then its metrics.jsonl row, then renames
status.json; the agent judges once the row is there, and sends SIGINT. libreyolo then leaves the next
epoch without writing a checkpoint (KeyboardInterrupt, exit 130; under its multi-GPU launch or torchrun the
launcher's own code), so the last checkpoint is the boundary's; whatever the code, the job reads that exit
as the rule's, not as an interruption or a failure.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import ConfigError
from ..libreyolo import METRICS_FILE
from ..log import logger

if TYPE_CHECKING:
    from ..settings import Settings

DEFAULT_MIN_GAIN = 0.005
REASON = "stop_rule"
METRIC = "metrics/mAP50-95"


@dataclass(frozen=True)
class Verdict:
    epoch: int  # the boundary it was judged at (1-based, as metrics.jsonl counts)
    stop: bool
    spent: float  # dollars of training up to this boundary
    since: int  # the window's first boundary (0: the start of training)
    gain: float | None  # the best's rise over the window; None: nothing to compare yet
    best: float | None

    def message(self, flat_spend: float, min_gain: float) -> str:
        rise = "no validated epoch before" if self.gain is None else f"rose {self.gain:+.4f}"
        return (
            f"STOP_FLAT_SPEND: the best mAP50-95 ({_fmt(self.best)}) {rise} over the last ${flat_spend:g} of"
            f" training (epochs {self.since + 1}-{self.epoch}), less than STOP_MIN_GAIN {min_gain:g}:"
            f" stopped after epoch {self.epoch}"
        )

    def record(self, flat_spend: float, min_gain: float) -> dict[str, Any]:
        return {
            "flat_spend": flat_spend,
            "min_gain": min_gain,
            "epoch": self.epoch,
            "spent": round(self.spent, 4),
            "window_from_epoch": self.since + 1,
            "gain": None if self.gain is None else round(self.gain, 4),
            "best": self.best,
            "stopped": self.stop,
            **({"message": self.message(flat_spend, min_gain)} if self.stop else {}),
        }


def _fmt(value: float | None) -> str:
    return "none yet" if value is None else f"{value:.4f}"


PriceOf = Callable[[int], float]  # an epoch's number → the $/h of the instance that trained it


def judge(
    rows: list[dict[str, Any]],
    price_per_hour: float | PriceOf,
    flat_spend: float,
    min_gain: float,
    fresh_from: int = 0,
) -> Verdict | None:
    """The rule at the last row's boundary; None without a row. Boundary k comes after k rows (0: the start).
    ``price_per_hour``: one price, or each epoch's; ``fresh_from``: the window starts no earlier than the boundary
    after that epoch (an extension's)."""
    if not rows:
        return None
    price_of = price_per_hour if callable(price_per_hour) else (lambda _epoch, flat=price_per_hour: flat)
    spent: list[float] = [0.0]
    best: list[float | None] = [None]
    validated = [False]
    for index, row in enumerate(rows):
        seconds, value = _number(row.get("time")), _number(row.get(METRIC))
        spent.append(spent[-1] + (seconds or 0.0) * price_of(_epoch(rows, index + 1)) / 3600)
        top = best[-1]
        best.append(value if value is not None and (top is None or value > top) else top)
        validated.append(value is not None)
    now = len(rows)
    epoch = _epoch(rows, now)
    since = max(
        (k for k in range(now) if spent[k] <= spent[now] - flat_spend and _epoch(rows, k) >= fresh_from),
        default=None,
    )
    if since is None:  # not that many dollars of training yet
        return Verdict(epoch, False, spent[now], 0, None, best[now])
    before, after = best[since], best[now]
    if before is None or after is None or not any(validated[since + 1 :]):  # no evidence in the window
        return Verdict(epoch, False, spent[now], _epoch(rows, since), None, after)
    gain = after - before
    return Verdict(epoch, gain < min_gain, spent[now], _epoch(rows, since), gain, after)


def _epoch(rows: list[dict[str, Any]], boundary: int) -> int:
    """The epoch count at boundary ``boundary`` (after that many rows)."""
    if boundary == 0:
        return 0
    epoch = rows[boundary - 1].get("epoch")
    return epoch if isinstance(epoch, int) else boundary


def _number(value: object) -> float | None:
    """A finite number, else None (JSON has no NaN, but a row may carry a string or null)."""
    if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):
        return float(value)
    return None


def read_rows(run_dir: Path) -> list[dict[str, Any]]:
    """metrics.jsonl's complete rows, one per epoch (the last written wins: a resumed epoch is written again)."""
    try:
        lines = (run_dir / METRICS_FILE).read_text().splitlines()
    except OSError:
        return []
    by_epoch: dict[int, dict[str, Any]] = {}
    for line in lines:
        try:
            row = json.loads(line)
        except ValueError:
            continue  # a row cut short by a kill
        if isinstance(row, dict) and isinstance(row.get("epoch"), int):
            by_epoch[row["epoch"]] = row
    return [by_epoch[epoch] for epoch in sorted(by_epoch)]


def epoch_prices(attempts: Sequence[dict[str, Any]], current: float) -> PriceOf:
    """Each epoch's price from the run's attempts (trainbox.json's ``attempts``): an epoch was trained by the first
    attempt whose ``epochs_done`` reaches it, at that attempt's ``cost.price_per_hour``; later ones by this
    instance, at ``current``. An attempt with no price on record leaves its epochs to the next one that has."""
    segments: list[tuple[int, float]] = []
    for entry in attempts:
        block, done = entry.get("cost"), entry.get("epochs_done")
        price = _number(block.get("price_per_hour")) if isinstance(block, dict) else None
        if isinstance(done, int) and price is not None:
            segments.append((done, price))

    def price_of(epoch: int) -> float:
        return next((price for done, price in segments if epoch <= done), current)

    return price_of


def fresh_window(extensions: object) -> int:
    """The epoch the last extension resumed after (trainbox.json's ``extensions``): the window starts there."""
    if not isinstance(extensions, list):
        return 0
    found = [entry.get("after_epoch") for entry in extensions if isinstance(entry, dict)]
    return max((epoch for epoch in found if isinstance(epoch, int)), default=0)


class StopRule:
    """The rule as the training loop asks it: at each new epoch boundary (status.json), once."""

    def __init__(
        self,
        run_dir: Path,
        price_per_hour: float,
        flat_spend: float | None,
        min_gain: float,
        history: Callable[[], dict[str, Any]] | None = None,
    ) -> None:
        self.run_dir = run_dir
        self.price_per_hour = price_per_hour
        self.flat_spend = flat_spend
        self.min_gain = min_gain
        self.history = history  # trainbox.json as it stands: the attempts' prices, the extensions
        self.verdict: Verdict | None = None  # the last one
        self._seen: tuple[int, int] | None = None  # metrics.jsonl at the last look

    def check(self) -> Verdict | None:
        """A verdict when a new epoch's row is in metrics.jsonl (written after every checkpoint of the
        epoch), else None."""
        if self.flat_spend is None:
            return None
        try:
            stat = (self.run_dir / METRICS_FILE).stat()
        except OSError:
            return None
        signature = (stat.st_size, stat.st_mtime_ns)  # appended to: never the same size again
        if signature == self._seen:
            return None
        self._seen = signature
        judged = self.verdict.epoch if self.verdict is not None else None
        verdict = self.judge_now()
        return verdict if verdict is not None and verdict.epoch != judged else None

    def at_boundary(self, record: Callable[[dict[str, Any]], None]) -> bool:
        """The training loop's look: at a new boundary, ``record`` the rule's state; True when it stops there."""
        if self.stopped:
            return False  # decided already: the stop is under way
        verdict = self.check()
        if verdict is None:
            return False
        record(self.record())
        if verdict.stop:
            logger.info("%s", self.message())
        return verdict.stop

    def stopped_before(self) -> bool:
        """Before a training starts: the run folder's history already meets the rule (a restart of a run it
        stopped), so nothing more is trained."""
        return self.flat_spend is not None and self.judge_now() is not None and self.stopped

    def outcome(self) -> tuple[str, str]:
        """A finished training's exit reason and message."""
        return (REASON, self.message()) if self.stopped else ("success", "training finished")

    def message(self) -> str:
        assert self.verdict is not None and self.flat_spend is not None
        return self.verdict.message(self.flat_spend, self.min_gain)

    def judge_now(self) -> Verdict | None:
        """The rule over what the run folder holds now (also before training starts: a resumed run the rule
        already stopped is not trained again)."""
        if self.flat_spend is None:
            return None
        state = self.history() if self.history is not None else {}
        prices = epoch_prices(state.get("attempts") or [], self.price_per_hour)
        fresh = fresh_window(state.get("extensions"))
        verdict = judge(read_rows(self.run_dir), prices, self.flat_spend, self.min_gain, fresh)
        if verdict is not None:
            self.verdict = verdict
        return verdict

    @property
    def stopped(self) -> bool:
        return self.verdict is not None and self.verdict.stop

    def record(self) -> dict[str, Any]:
        if self.verdict is None or self.flat_spend is None:
            return {"flat_spend": self.flat_spend, "min_gain": self.min_gain, "stopped": False}
        return self.verdict.record(self.flat_spend, self.min_gain)


OFF = StopRule(Path(), 0.0, None, DEFAULT_MIN_GAIN)  # STOP_FLAT_SPEND unset


def for_job(
    settings: Settings, price_per_hour: float | None, history: Callable[[], dict[str, Any]] | None = None
) -> StopRule:
    """The rule STOP_FLAT_SPEND asks for (``OFF``: unset); without a price it cannot count dollars: refused."""
    if settings.stop_flat_spend is None:
        return OFF
    if price_per_hour is None:
        raise ConfigError(
            f"STOP_FLAT_SPEND=${settings.stop_flat_spend:g} counts dollars, and the provider reported no price",
            "set PRICE_PER_HOUR to the instance's $/h, e.g. PRICE_PER_HOUR=2.49",
        )
    return StopRule(settings.run_dir, price_per_hour, settings.stop_flat_spend, settings.stop_min_gain, history)
