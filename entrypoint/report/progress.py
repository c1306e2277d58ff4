"""What a person follows during a run: one log line per epoch, the plot, the model card, the receipt.

``Progress`` lives in the agent beside the training child and works from files the child
already writes (metrics.jsonl, status.json) and from trainbox.json; it never slows training. It keeps
the arithmetic (the timeline, the price, the estimate, the receipt) and leaves the rendering to
``epochs.EpochLog`` (the epoch line) and ``page.CardPage`` (the plot and the model card):

* ``tick()`` (the training loop's poll) logs one line per finished epoch;
* ``publish()`` (the uploader's hook before each snapshot) redraws the plot when an epoch ended
  and rewrites README.md in the run folder, so the same commit carries them with the epoch;
* ``committed()`` (the uploader's commit callback) notes when the Hub last got something;
* ``finished()`` (after the release) writes the receipt and logs the summary and the receipt last.

It also records ``timeline`` in trainbox.json (the agent's start and the wall-clock time of each
phase change and of the release), which the receipt is computed from.
"""

from __future__ import annotations

import contextlib
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .. import libreyolo, procs
from ..errors import StopRequested
from ..log import logger
from ..state import RunState
from . import estimate, plot, receipt
from .card_facts import best_row
from .epochs import EpochLog, total_epochs
from .page import CardPage

if TYPE_CHECKING:
    from ..hub import Hub
    from ..settings import Settings


class Progress:
    def __init__(self, settings: Settings, state: RunState) -> None:
        self.settings = settings
        self.state = state
        self.run_dir = settings.run_dir
        self.started_at = procs.process_start_time() or time.time()
        self._marks: dict[str, float] = {}
        self._publish_lock = threading.Lock()
        self.epochs = EpochLog(settings, state, self.started_at, self._price)
        self.page = CardPage(settings)
        self._save_timeline()
        state.on_phase(self._phase_changed)

    # -- timeline -------------------------------------------------------------------------
    def _save_timeline(self) -> None:
        self.state.update(
            timeline={
                "agent_started_at": round(self.started_at, 3),
                "price_per_hour": self._price(),
                "marks": dict(self._marks),
            }
        )

    def _price(self) -> float | None:
        """PRICE_PER_HOUR, else the provider's price once the preflight read it (trainbox.json's ``cost``)."""
        if self.settings.price_per_hour is not None:
            return self.settings.price_per_hour
        found = (self.state.snapshot().get("cost") or {}).get("price_per_hour")
        return float(found) if isinstance(found, int | float) else None

    def estimate(self, data_yaml: Path) -> None:
        """Once the dataset is ready: what training the epochs left should cost, logged and kept in trainbox.json
        (the card shows it until the first epoch's measured pace replaces it)."""
        try:
            found = estimate.at_start(self.settings, self.state, data_yaml, self._price)
        except StopRequested:  # a signal during the count (SIGTERM): the job's stop, not the estimate's failure
            raise
        except Exception as error:  # an estimate is a courtesy: never let it stop the run
            logger.debug("estimate: %s: %s", type(error).__name__, error)
            return
        if found is not None:
            self.state.update(estimate=found)

    def _mark(self, name: str) -> bool:
        if name in self._marks:
            return False
        self._marks[name] = round(time.time(), 3)
        return True

    def _phase_changed(self) -> None:
        phase = self.state.phase.value
        if self._mark(phase):
            self._save_timeline()
        if phase == "training":
            self.epochs.training_started()

    def receipt(self, now: float | None = None) -> receipt.Receipt | None:
        return receipt.compute(self.state.snapshot(), time.time() if now is None else now)

    # -- the epoch line (training loop) ---------------------------------------------------
    def tick(self, *, publish: bool = False) -> None:
        """Log a line for each epoch finished since the last call; ``publish`` also writes plot and card."""
        if self.epochs.tick() and publish:
            self.publish()

    def committed(self, _sha: str, _names: list[str]) -> None:
        """The uploader's commit callback."""
        self.epochs.committed()

    # -- plot and card (before each snapshot) ---------------------------------------------
    def publish(self, hub: Hub | None = None, repo_id: str | None = None) -> None:
        """Bring the plot and README.md in the run folder up to date; cheap when nothing changed."""
        self.tick()
        with self._publish_lock:
            try:
                snapshot = self.state.snapshot()
                self._note_release(snapshot)
                rows = plot.read_rows(self.run_dir / libreyolo.METRICS_FILE)
                self.page.maybe_plot(rows, final=snapshot.get("phase") in receipt.TERMINAL)
                if not self.page.load_base(hub, repo_id):
                    return  # the Hub's card could not be read: never overwrite a card we have not seen
                snapshot = self.state.snapshot()
                as_of, total = self._as_of(), self.epochs.total(snapshot)
                self.page.write(snapshot, rows, previous=self.state.previous, as_of=as_of, total=total)
            except Exception as error:  # the card is a courtesy: never let it stop training or the upload
                logger.warning("card: not updated: %s: %s", type(error).__name__, error)

    def _note_release(self, snapshot: dict[str, Any]) -> None:
        released = snapshot.get("release")
        if not released:
            return
        changed = self._mark("release")
        if released.get("status") != "requested":
            changed = self._mark("released") or changed
        if changed:
            self._save_timeline()
            if "released" in self._marks:
                self._save_receipt()

    def _as_of(self) -> float:
        """The card's "so far" moment: the last phase change or epoch, so the card only changes with them
        (a card that changed at every snapshot would be uploaded at every snapshot)."""
        moments = list(self._marks.values())
        with contextlib.suppress(OSError):
            moments.append((self.run_dir / libreyolo.METRICS_FILE).stat().st_mtime)
        return max(moments, default=self.started_at)

    # -- the end --------------------------------------------------------------------------
    def _save_receipt(self) -> None:
        found = receipt.compute(self.state.snapshot(), time.time())
        if found is not None:
            self.state.update(receipt=found.as_dict())

    def finished(self) -> None:
        """After the release: the receipt into trainbox.json; the summary, then the receipt, logged last."""
        try:
            self._finished()
        except Exception as error:  # the job is over and released: report, never fail now
            logger.warning("receipt: not written: %s: %s", type(error).__name__, error)

    def _finished(self) -> None:
        self.tick()  # the last epoch may have ended after the training loop's last look
        # Without an upload before it, "release" stays unmarked: all after the end is the release.
        self._marks["released"] = round(time.time(), 3)
        self._save_timeline()
        self._save_receipt()
        if self.settings.output_repo is None:
            with contextlib.suppress(Exception):
                self.publish()  # the local card and plot, for a run that is not uploaded
        rows = plot.read_rows(self.run_dir / libreyolo.METRICS_FILE)
        snapshot = self.state.snapshot()
        if rows:
            total = total_epochs(self.run_dir, snapshot)
            done = (snapshot.get("progress") or {}).get("epochs_done") or rows[-1]["epoch"]
            prefix = f"summary: {snapshot.get('phase')} · {done}/{total or '?'} epochs"
            best = best_row(rows)
            line = self.epochs.line(rows, total, prefix=prefix)
            if best is not None:
                line += f" · best mAP50-95 {best['metrics/mAP50-95']:.3f} @ {best['epoch']}"
            logger.info("%s", line)
        found = receipt.compute(snapshot, time.time())
        if found is not None:
            logger.info("%s", found.one_line())
