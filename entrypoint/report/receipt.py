"""The cost receipt: where an attempt's billed seconds (and dollars) went, from trainbox.json.

Billed time runs from the agent's process start to the end of the release (or now, for a live
run). It is split along the phase timeline: ``phases.*.seconds`` as the run state measured them,
and the ``timeline`` marks the agent records (its start, each phase change, the release). The
parts are contiguous, so they add up to the billed time; a gap would show as a mismatch.

MAX_COST is the run's: after a restart the receipt also lists every attempt's dollars (``attempts`` in
trainbox.json; this one at its billed time) and the run's total.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..training import sizing, stoprule

# In the order they happen; labels as a person reads them.
PARTS = (
    ("setup", "setup"),
    ("gpu_check", "GPU check"),
    ("dataset", "dataset"),
    ("training", "training"),
    ("uploads", "uploads after training"),
    ("release", "release"),
)
TERMINAL = ("done", "failed", "preempted", "stalled", "timed_out")


@dataclass(frozen=True)
class AttemptSpend:
    number: int
    dollars: float | None
    estimated: bool  # killed without an end: counted up to its last record plus one interval

    def text(self) -> str:
        money = "no spend on record" if self.dollars is None else f"${self.dollars:.2f}"
        return f"#{self.number} {money}{' (killed: at most)' if self.estimated else ''}"


@dataclass(frozen=True)
class Receipt:
    seconds: dict[str, float]  # by part key, in PARTS order
    billed_seconds: float
    price_per_hour: float | None
    final: bool  # the release has ended: nothing more is billed by this attempt
    host: str | None = None  # the host report in a phrase: what the money bought
    feeding: str | None = None  # the training's CPUs, threads, workers and cache in a phrase
    stopped: str | None = None  # why training ended before its last epoch (the STOP_FLAT_SPEND rule)
    attempts: tuple[AttemptSpend, ...] = ()  # the run's attempts, this one last; empty for a run's first

    @property
    def run_dollars(self) -> float | None:
        """Every attempt's dollars together (unrecorded ones count nothing), None without a price."""
        known = [entry.dollars for entry in self.attempts if entry.dollars is not None]
        return sum(known) if known else None

    def dollars(self, seconds: float) -> float | None:
        return None if self.price_per_hour is None else seconds / 3600 * self.price_per_hour

    @property
    def efficiency(self) -> float | None:
        """Training seconds per billed second."""
        return self.seconds["training"] / self.billed_seconds if self.billed_seconds > 0 else None

    def as_dict(self) -> dict[str, Any]:
        def money(seconds: float) -> float | None:
            value = self.dollars(seconds)
            return None if value is None else round(value, 4)

        return {
            "parts": {
                key: {"seconds": round(self.seconds[key], 2), "dollars": money(self.seconds[key])} for key, _ in PARTS
            },
            "billed_seconds": round(self.billed_seconds, 2),
            "billed_dollars": money(self.billed_seconds),
            "price_per_hour": self.price_per_hour,
            "billing_efficiency": None if self.efficiency is None else round(self.efficiency, 4),
            "final": self.final,
            **({"host": self.host} if self.host else {}),
            **({"feeding": self.feeding} if self.feeding else {}),
            **({"stopped": self.stopped} if self.stopped else {}),
            **(
                {
                    "attempts": [vars(entry) for entry in self.attempts],
                    "run_dollars": None if self.run_dollars is None else round(self.run_dollars, 4),
                }
                if self.attempts
                else {}
            ),
        }

    def _money(self, seconds: float) -> str:
        value = self.dollars(seconds)
        return "" if value is None else f" ${value:.2f}"

    def one_line(self) -> str:
        """``receipt: setup 12 s $0.01 · … · billed 3605 s $2.50 · billing efficiency 91 %``."""
        parts = [f"{label} {format_seconds(self.seconds[key])}{self._money(self.seconds[key])}" for key, label in PARTS]
        parts.append(f"billed {format_seconds(self.billed_seconds)}{self._money(self.billed_seconds)}")
        if self.efficiency is not None:
            parts.append(f"billing efficiency {self.efficiency:.0%}")
        if self.host:
            parts.append(f"host: {self.host}")
        if self.feeding:
            parts.append(f"fed: {self.feeding}")
        if self.stopped:
            parts.append(f"stopped early: {self.stopped}")
        if self.attempts:
            parts.append(f"the run: {self._run_text()}")
        return "receipt: " + " · ".join(parts)

    def _run_text(self) -> str:
        """``#1 $4.10 (killed: at most) + #2 $3.90 = $8.00``."""
        total = "—" if self.run_dollars is None else f"${self.run_dollars:.2f}"
        return " + ".join(entry.text() for entry in self.attempts) + f" = {total}"

    def markdown(self) -> str:
        price = "" if self.price_per_hour is None else f" at ${self.price_per_hour:g}/h"
        rows = ["| | seconds | dollars |", "|---|---:|---:|"]
        for key, label in PARTS:
            dollars = self.dollars(self.seconds[key])
            rows.append(f"| {label} | {self.seconds[key]:.1f} | {'—' if dollars is None else f'{dollars:.2f}'} |")
        billed = self.dollars(self.billed_seconds)
        rows.append(
            f"| **billed{price}** | **{self.billed_seconds:.1f}** | **{'—' if billed is None else f'{billed:.2f}'}** |"
        )
        tail = (
            "" if self.efficiency is None else f"\n\nBilling efficiency (training ÷ billed): **{self.efficiency:.0%}**"
        )
        if self.price_per_hour is None:
            tail += "\n\nSet `PRICE_PER_HOUR` to see dollars."
        if self.host:
            tail += f"\n\nHost: {self.host}."
        if self.feeding:
            tail += f"\n\nTraining fed with {self.feeding}."
        if self.stopped:
            tail += f"\n\nStopped early by the dollar rule: {self.stopped}."
        if self.attempts:
            tail += f"\n\nThe whole run, every attempt (MAX_COST counts them together): {self._run_text()}."
        if not self.final:
            tail += "\n\nThe run is still billing; this is the receipt so far."
        return "\n".join(rows) + tail


def format_seconds(seconds: float) -> str:
    """``42 s``, ``7m05``, ``1h02``: short and unambiguous."""
    seconds = max(0.0, seconds)
    if seconds < 60:
        return f"{seconds:.0f} s"
    minutes = int(seconds // 60)
    if minutes < 60:
        return f"{minutes}m{int(seconds % 60):02d}"
    return f"{minutes // 60}h{minutes % 60:02d}"


def compute(state: dict[str, Any], now: float, price_per_hour: float | None = None) -> Receipt | None:
    """The receipt of trainbox.json's attempt at wall-clock ``now``; None without a timeline."""
    timeline = state.get("timeline") or {}
    started = timeline.get("agent_started_at")
    if not isinstance(started, int | float):
        return None
    marks: dict[str, float] = timeline.get("marks") or {}
    phases: dict[str, dict[str, Any]] = state.get("phases") or {}
    released = marks.get("released")
    end = released if released is not None else now
    if price_per_hour is None:  # the cost block's (it may come from the provider), else the one at start
        price_per_hour = (state.get("cost") or {}).get("price_per_hour")
    if price_per_hour is None:
        price_per_hour = timeline.get("price_per_hour")

    def duration(name: str) -> float:
        phase = phases.get(name) or {}
        if phase.get("seconds") is not None:
            return float(phase["seconds"])
        return max(0.0, end - marks[name]) if name in marks else 0.0

    first_phase = min((at for name, at in marks.items() if name not in {"release", "released"}), default=end)
    preflight = duration("preflight")
    gpu = min(float((state.get("gpus") or {}).get("check_seconds") or 0.0), preflight)
    ended_at = next((marks[name] for name in TERMINAL if name in marks), None)
    # Without an upload before it (no OUTPUT_REPO) everything after the end of the job is the release.
    release_start = marks.get("release", ended_at)
    after_end = 0.0 if ended_at is None or release_start is None else max(0.0, release_start - ended_at)
    seconds = {
        "setup": max(0.0, first_phase - started) + preflight - gpu + duration("resume"),
        "gpu_check": gpu,
        "dataset": duration("dataset"),
        "training": duration("training"),
        "uploads": duration("finishing") + after_end,
        "release": 0.0 if release_start is None else max(0.0, end - release_start),
    }
    host = state.get("host")
    if isinstance(host, dict):
        from ..host import judge

        summary: str | None = judge.brief(host)
    else:
        summary = None
    return Receipt(
        seconds,
        max(0.0, end - started),
        price_per_hour,
        final=released is not None,
        host=summary,
        feeding=sizing.describe(state["sizing"]) if isinstance(state.get("sizing"), dict) else None,
        stopped=_stopped(state),
        attempts=_attempts(
            state, None if price_per_hour is None else _own_seconds(state, end - started) / 3600 * price_per_hour
        ),
    )


def _own_seconds(state: dict[str, Any], billed: float) -> float:
    """This attempt's share of the container's billed time: less what a try healed in it already counted in its own
    entry of ``attempts`` (``cost.healed_seconds``), so the run's total counts no second twice."""
    block = state.get("cost")
    healed = block.get("healed_seconds") if isinstance(block, dict) else None
    healed = float(healed) if isinstance(healed, int | float) and not isinstance(healed, bool) else 0.0
    return max(0.0, billed - healed)


def _attempts(state: dict[str, Any], billed_dollars: float | None) -> tuple[AttemptSpend, ...]:
    """The run's attempts and their dollars, this one at its billed time; empty when this is the only one."""
    from ..release import cost

    number = state.get("attempt")
    found: list[AttemptSpend] = []
    for entry in state.get("attempts") or []:
        if not isinstance(entry, dict) or not isinstance(entry.get("attempt"), int) or entry["attempt"] == number:
            continue
        block = entry.get("cost")
        estimated = isinstance(block, dict) and bool(block.get("estimate"))
        found.append(AttemptSpend(entry["attempt"], cost.attempt_dollars(entry), estimated))
    if not found or not isinstance(number, int):
        return ()
    return (*found, AttemptSpend(number, billed_dollars, False))


def _stopped(state: dict[str, Any]) -> str | None:
    ended = state.get("exit") or {}
    return str(ended.get("message")) if ended.get("reason") == stoprule.REASON else None
