"""This attempt's bookkeeping in trainbox.json, apart from the order of the stages (pipeline.py): what the
settings chose, the price and what it arms (MAX_PRICE_PER_HOUR, MAX_COST over the whole run, STOP_FLAT_SPEND), its
spend at every boundary, the true epoch count as libreyolo writes it, the last sign of progress, and the outcome
the job ends with."""

from __future__ import annotations

import json
import threading
import time
from typing import Any

from ..errors import AgentError, CostLimitError, DeadlineError, NodesOutOfMemoryError, PreemptedError, StallError
from ..foreign import Area, Where
from ..foreign import agent_error as classify
from ..libreyolo import STATUS_FILE, epochs_done
from ..log import logger
from ..release import cost, providers
from ..release.clock import ShutdownClock
from ..settings import Settings
from ..state import Phase, RunState
from ..sync import run_identity
from ..training import resume, stoprule
from .status import progress_fields

_TERMINAL_FOR: dict[type[AgentError], Phase] = {
    PreemptedError: Phase.PREEMPTED,
    StallError: Phase.STALLED,
    DeadlineError: Phase.TIMED_OUT,
    CostLimitError: Phase.TIMED_OUT,
}


class Attempt:
    """What one attempt records of itself; the job asks it and tells it, in the stages' order."""

    def __init__(self, settings: Settings, state: RunState, clock: ShutdownClock) -> None:
        self.settings, self.state, self.clock = settings, state, clock
        self.price = cost.configured_price(settings.price_per_hour)
        self.rule = stoprule.OFF  # STOP_FLAT_SPEND's rule, once the price is known
        self._status_mtime = 0
        self._boundary = (0.0, 0.0)  # status.json's last mtime seen, and when it was written (monotonic)
        self._lock = threading.Lock()
        self._counted = 0.0  # this process's seconds already in an earlier entry of ``attempts`` (a heal)
        self._recorded = (0.0, 0.0)  # the last spend record (monotonic) and the longest gap between two
        self.earlier: cost.RunSpend | None = None  # what the run's earlier attempts spent (MAX_COST)
        self._said_spend: str | None = None

    def begin(self) -> None:
        """Step 1: the settings were read before the job began; trainbox.json records what they chose, in a
        run folder made now (a full or read-only volume then still ends with an exit code and a release). A run this
        volume holds under this name, started with other settings, is another run: refused before anything changes."""
        mismatch = run_identity.refusal(self.state.previous, self.settings.record())
        if mismatch is not None:
            raise run_identity.refuse(mismatch, self.settings.run_name, "this volume")
        self.state.update(settings=self.settings.record())
        run_dir = self.settings.run_dir
        try:
            run_dir.mkdir(parents=True, exist_ok=True)
        except OSError as error:
            mapped = classify(error, Where(Area.DISK, doing=f"creating {run_dir}", disk_hint="free space in WORKDIR"))
            raise mapped or AgentError(
                f"cannot create the run folder {run_dir}: {error.strerror or error}", "give WORKDIR a writable volume"
            ) from None
        self.state.save()  # the saves before it had nowhere to go
        resume.check_crash_loop(self.state.history.attempts)

    def arm_budget(self, seen: providers.Observed | None) -> None:
        """Settle the price (PRICE_PER_HOUR, else the provider's), hold it against MAX_PRICE_PER_HOUR, and turn
        MAX_COST into a deadline on the MAX_RUNTIME timer, whichever comes first, so it ends the job the same way
        (this attempt's own budget; ``arm_run_budget`` narrows it once the run's history is known)."""
        self.price = cost.choose_price(self.settings.price_per_hour, seen)
        self.state.update(
            cost={
                "price_per_hour": self.price.per_hour,
                "price_source": self.price.source,
                "max_cost": self.settings.max_cost,
                "max_price_per_hour": self.settings.max_price_per_hour,
                "healed_seconds": 0.0,  # none yet in this container (a record adopted from another is not ours)
            }
        )
        cost.check_ceiling(self.price, self.settings.max_price_per_hour)
        # refused here without a price; each epoch priced at the price it ran at (the attempts' records)
        self.rule = stoprule.for_job(self.settings, self.price.per_hour, self.state.snapshot)
        budget = cost.budget_seconds(self.settings.max_cost, self.price)
        if budget is not None:
            self.clock.arm_budget(budget)
        self.record_spend()
        self.state.on_phase(self.record_spend)  # a record at every phase change too (the uploader publishes those)

    def arm_run_budget(self) -> None:
        """Once the run's history is known (the volume's, the newest store's): what the earlier attempts spent,
        said in one line; MAX_COST is the run's, so this attempt may spend only what they left (exit 82 at once
        when nothing is left, before the dataset)."""
        self.earlier = earlier = cost.earlier_spend(self.state.history.attempts)
        max_cost = self.settings.max_cost
        self.state.update(cost={"run": earlier.as_dict(max_cost)})
        if earlier.attempts and earlier.line(max_cost) != self._said_spend:  # armed before the lease, then again
            self._said_spend = earlier.line(max_cost)
            logger.info("cost: %s", self._said_spend)
        if max_cost is None:
            return
        if earlier.dollars >= max_cost:
            raise cost.run_limit_reached(max_cost, earlier)
        budget = cost.budget_seconds(earlier.left(max_cost), self.price)
        if budget is not None:
            self.clock.arm_budget(budget)

    def limit_message(self) -> str:
        """What the MAX_COST stop says: this attempt's spend, and the run's with the earlier attempts."""
        spent = self.spent()
        text = f"MAX_COST (${self.settings.max_cost:.2f}) reached: {cost.describe_spend(spent)}"
        if self.earlier is not None and self.earlier.attempts:
            # this container's whole time (a try healed in it included), and the earlier attempts'
            here = cost.spend(self.clock.elapsed(), self.price.per_hour)["dollars"] or 0.0
            text += f" this attempt, ${self.earlier.dollars + here:.2f} with {self.earlier.line(None)}"
        return text

    def spent(self) -> dict[str, Any]:
        """Billed time of this attempt (≈ the container, less what a heal in it already counted), in dollars where
        the price is known."""
        return cost.spend(self.clock.elapsed() - self._counted, self.price.per_hour, self.price.source)

    def record_spend(self) -> None:
        """This attempt's spend so far in trainbox.json, with the longest gap between two records: a later attempt
        counts an attempt killed without an end up to its last record plus that gap (state.lost_spend)."""
        with self._lock:  # the training loop, the uploader's thread and phase changes all record
            now = time.monotonic()
            last, gap = self._recorded
            gap = max(gap, now - last) if last else now - self.clock.started
            self._recorded = (now, gap)
        self.state.update(cost={**self.spent(), "interval_seconds": round(gap, 1)})

    def close_try(self) -> dict[str, Any]:
        """A healed failure ends an entry of ``attempts`` inside this process: its spend, which later entries
        no longer count."""
        spent = self.spent()
        self._counted = self.clock.elapsed()
        # the receipt bills this container's whole time: it leaves out what the healed try's entry already counts
        self.state.update(cost={"healed_seconds": round(self._counted, 1)})
        return spent

    def report_progress(self, *, again: bool = False) -> None:
        """At each epoch boundary, put the true epoch count in trainbox.json (libreyolo's status.json
        counts only this invocation's epochs after a resume). ``again``: even if status.json is unchanged."""
        status_path = self.settings.run_dir / STATUS_FILE
        with self._lock:  # called by the training loop and by the uploader's thread
            try:
                mtime = status_path.stat().st_mtime_ns
                if mtime == self._status_mtime and not again:
                    return
                self._status_mtime = mtime
                status = json.loads(status_path.read_text())
            except (OSError, ValueError):
                return
        done = epochs_done(self.settings.run_dir)
        if done is not None:  # with the pace and the mAP: trainbox.json alone is `status --repo`'s view
            self.state.update(**progress_fields(self.settings.run_dir, done, status.get("total_epochs")))
        self.record_spend()  # every boundary: what a later attempt counts if this one is killed

    def last_progress(self, activity: float) -> float:
        """The monotonic time of the last sign of progress: the trainer's ``activity``, or a new status.json."""
        status = self.settings.run_dir / STATUS_FILE
        try:
            mtime = status.stat().st_mtime
        except OSError:
            mtime = self._boundary[0]
        if mtime != self._boundary[0]:  # only a new status.json is progress: a volume clock ahead never delays a stall
            now = time.monotonic()
            self._boundary = (mtime, min(now, now - (time.time() - mtime)))  # when written, on the monotonic clock
        return max(activity, self._boundary[1])

    def end(self, outcome: AgentError | None, *, already_complete: bool) -> tuple[Phase, int]:
        """The terminal phase and exit code of ``outcome`` (None: trained, or nothing left to train), written
        with the cost into trainbox.json (provisional until the final upload returns)."""
        if outcome is None and already_complete:
            phase, code, reason, message = Phase.DONE, 0, "already_complete", "all epochs were already trained"
        elif outcome is None:
            phase, code, reason, message = Phase.DONE, 0, *self.rule.outcome()
        else:
            phase = _TERMINAL_FOR.get(type(outcome), Phase.FAILED)
            code, reason, message = outcome.exit_code, outcome.reason, str(outcome)
        spent = self.spent()
        self.state.update(cost=spent)
        record = outcome.record if isinstance(outcome, NodesOutOfMemoryError) else {}
        self.state.finish(phase, code, reason, message, cost=spend_entry(spent), **record)
        return phase, code


def spend_entry(spent: dict[str, Any]) -> dict[str, Any]:
    """An attempt's spend as its entry in ``attempts`` keeps it."""
    return {key: spent[key] for key in ("hours", "price_per_hour", "dollars")}
