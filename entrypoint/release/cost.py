"""What a run costs: the price, the spend, MAX_COST, and the stop-versus-destroy arithmetic of
LibreYOLO's rented-GPU guide.

The price is ``PRICE_PER_HOUR`` when set, else what the provider reports for this instance at
start (RunPod's pod ``cost``, Vast.ai's ``dph_total``); ``price_source`` in trainbox.json says which.

MAX_COST is the run's, not one container's: each attempt records its spend (price × time, at the price it
ran at) in trainbox.json at every boundary and at its end, and a new attempt adds up the earlier ones from the
newest store before it spends anything (``RunSpend``). An attempt killed without an end (SIGKILL, a lost
machine) counts up to its last record plus one interval between its records: an upper estimate, marked so
(``state.lost_spend``).
``MAX_PRICE_PER_HOUR`` refuses an instance that bills more per hour (``check_ceiling``).

A stopped instance still bills its allocated disk: allocated_GB × price_per_GB_month / 730
(730 = 8760 h / 12, the hours of an average month). Stopping beats destroying and rebuilding
when you come back within rebuild_cost / stopped_price hours.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..errors import ConfigError, CostLimitError, PriceCeilingError

if TYPE_CHECKING:
    from .providers import Observed

HOURS_PER_MONTH = 730.0


@dataclass(frozen=True)
class Price:
    per_hour: float | None
    source: str | None  # "PRICE_PER_HOUR", or the provider's field, e.g. "runpod:cost"


def configured_price(price_per_hour: float | None) -> Price:
    return Price(price_per_hour, None if price_per_hour is None else "PRICE_PER_HOUR")


def choose_price(price_per_hour: float | None, seen: Observed | None) -> Price:
    """``PRICE_PER_HOUR`` wins; else the provider's price read at start, when it gave one."""
    if price_per_hour is not None or seen is None or seen.price_per_hour is None:
        return configured_price(price_per_hour)
    return Price(seen.price_per_hour, seen.price_source)


def budget_seconds(max_cost: float | None, price: Price) -> float | None:
    """How long the instance may bill before MAX_COST is spent; None without MAX_COST (or at $0/h).

    Without a price MAX_COST cannot be kept, so it is refused rather than silently ignored."""
    if max_cost is None:
        return None
    if price.per_hour is None:
        raise ConfigError(
            f"MAX_COST=${max_cost:g} needs the instance's price, and the provider reported none",
            "set PRICE_PER_HOUR to the instance's $/h, e.g. PRICE_PER_HOUR=2.49",
        )
    return None if price.per_hour == 0 else max_cost / price.per_hour * 3600


def spend(seconds: float, price_per_hour: float | None, source: str | None = None) -> dict[str, Any]:
    """The ``cost`` block of trainbox.json: hours, and dollars when the price is known."""
    hours = max(0.0, seconds) / 3600
    dollars = None if price_per_hour is None else round(hours * price_per_hour, 4)
    return {"hours": round(hours, 4), "price_per_hour": price_per_hour, "price_source": source, "dollars": dollars}


def describe_spend(cost: dict[str, Any]) -> str:
    """One line for the final summary, e.g. ``0.51 h, $1.27 at $2.49/h (runpod:cost)``."""
    text = f"{cost['hours']:.2f} h"
    if cost.get("dollars") is not None:
        text += f", ${cost['dollars']:.2f} at ${cost['price_per_hour']:.2f}/h"
        if cost.get("price_source"):
            text += f" ({cost['price_source']})"
    return text


def check_ceiling(price: Price, ceiling: float | None) -> None:
    """MAX_PRICE_PER_HOUR: refuse an instance billing more, before anything is spent on it beyond the start."""
    if ceiling is None or (price.per_hour is not None and price.per_hour <= ceiling):
        return
    if price.per_hour is None:
        raise ConfigError(
            f"MAX_PRICE_PER_HOUR=${ceiling:g} needs the instance's price, and the provider reported none",
            "set PRICE_PER_HOUR to the instance's $/h, e.g. PRICE_PER_HOUR=2.49",
        )
    source = f" ({price.source})" if price.source else ""
    raise PriceCeilingError(
        f"this instance bills ${price.per_hour:g}/h{source}, above MAX_PRICE_PER_HOUR=${ceiling:g}/h",
        "rent a cheaper instance, or raise MAX_PRICE_PER_HOUR",
    )


def attempt_dollars(entry: dict[str, Any]) -> float | None:
    """The dollars an ``attempts`` entry of trainbox.json spent; None where it recorded none (or no price)."""
    block = entry.get("cost")
    return _number(block.get("dollars")) if isinstance(block, dict) else None


@dataclass(frozen=True)
class RunSpend:
    """What the earlier attempts of a run spent, as this attempt starts."""

    dollars: float
    attempts: int  # earlier attempts
    estimated: int  # of them, killed ones counted as an upper estimate
    unrecorded: int  # of them, ones with no spend on record (an older agent, no price): not counted

    def left(self, max_cost: float) -> float:
        return max(0.0, max_cost - self.dollars)

    def line(self, max_cost: float | None) -> str:
        """``MAX_COST: $3.20 spent by 2 earlier attempts (1 killed: an upper estimate), $21.80 left of $25``."""
        notes = []
        if self.estimated:
            notes.append(f"{self.estimated} killed: an upper estimate")
        if self.unrecorded:
            notes.append(f"{self.unrecorded} with no spend on record, not counted")
        note = f" ({'; '.join(notes)})" if notes else ""
        plural = "" if self.attempts == 1 else "s"
        text = f"${self.dollars:.2f} spent by {self.attempts} earlier attempt{plural}{note}"
        return text if max_cost is None else f"{text}, ${self.left(max_cost):.2f} left of MAX_COST ${max_cost:g}"

    def as_dict(self, max_cost: float | None) -> dict[str, Any]:
        return {
            "earlier_dollars": round(self.dollars, 4),
            "earlier_attempts": self.attempts,
            "estimated": self.estimated,
            "unrecorded": self.unrecorded,
            "left": None if max_cost is None else round(self.left(max_cost), 4),
        }


def earlier_spend(attempts: list[dict[str, Any]]) -> RunSpend:
    """Add up the ``attempts`` entries of trainbox.json (the run's history, from the newest store)."""
    dollars = [attempt_dollars(entry) for entry in attempts]
    estimated = sum(1 for entry in attempts if isinstance(entry.get("cost"), dict) and entry["cost"].get("estimate"))
    return RunSpend(
        sum(value for value in dollars if value is not None),
        len(attempts),
        estimated,
        sum(1 for value in dollars if value is None),
    )


def run_limit_reached(max_cost: float, earlier: RunSpend) -> CostLimitError:
    return CostLimitError(
        f"MAX_COST (${max_cost:.2f}) reached by the run: {earlier.line(None)}",
        "raise MAX_COST to train on",
    )


def _number(value: object) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def stopped_price_per_hour(disk_gb: float, storage_price_per_gb_month: float) -> float:
    return disk_gb * storage_price_per_gb_month / HOURS_PER_MONTH


@dataclass(frozen=True)
class StopOrDestroy:
    disk_gb: float
    storage_price: float  # $ per GB-month
    rebuild_cost: float | None  # $ to rent, pull the image and stage the data again

    @property
    def stopped_per_hour(self) -> float:
        return stopped_price_per_hour(self.disk_gb, self.storage_price)

    @property
    def break_even_hours(self) -> float | None:
        """Within this many hours stopping is cheaper; after it, destroy and rebuild."""
        if self.rebuild_cost is None:
            return None
        return self.rebuild_cost / self.stopped_per_hour

    def as_dict(self) -> dict[str, Any]:
        return {
            "disk_gb": self.disk_gb,
            "storage_price_per_gb_month": self.storage_price,
            "stopped_per_hour": round(self.stopped_per_hour, 4),
            "rebuild_cost": self.rebuild_cost,
            "stop_beats_destroy_within_hours": None
            if self.break_even_hours is None
            else round(self.break_even_hours, 1),
        }

    def lines(self) -> list[str]:
        stopped = self.stopped_per_hour
        result = [
            f"stopped: {self.disk_gb:g} GB × ${self.storage_price:g}/GB-month ÷ {HOURS_PER_MONTH:g} h"
            f" = ${stopped:.4f}/h (the disk bills while stopped; destroyed bills nothing)"
        ]
        if self.break_even_hours is not None:
            result.append(
                f"stop beats destroy + rebuild (${self.rebuild_cost:.2f}) if you are back within"
                f" {self.break_even_hours:.1f} h; for a longer pause, destroy (ON_EXIT=destroy) and rebuild"
            )
        return result
