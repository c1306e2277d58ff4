"""The epoch line: one log line per finished epoch (pace, ETA, mAP, the bill so far, the Hub), from the
metrics.jsonl the training child writes, read only when it changed; and ``watch_view``, the same line and the
receipt so far for `trainbox status --watch`, from the files alone.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .. import libreyolo
from ..log import logger
from ..state import RunState, read_state, write_json_atomic
from . import plot, receipt

if TYPE_CHECKING:
    from ..settings import Settings

SIDECAR = "progress.json"  # beside the uploader's ledger, outside the run folder: never uploaded


def epoch_line(
    rows: list[dict[str, Any]],
    total: int | None,
    *,
    started_at: float | None,
    now: float,
    price_per_hour: float | None,
    hub: str | None,
    last_commit_at: float | None,
    prefix: str | None = None,
) -> str:
    """``epoch 12/100 · 41 s/epoch · ETA 1h02 · mAP50 0.61 (best 0.63 @ 9) · $0.42 so far, ~$3.20 in all · on the Hub
    3 s ago``: "in all" is the bill at the measured pace until the last epoch."""
    last = rows[-1]
    epoch = int(last["epoch"])
    parts = [prefix or f"epoch {epoch}/{total or '?'}"]
    pace = seconds_per_epoch(rows)
    if pace is not None:
        parts.append(f"{pace:.0f} s/epoch" if pace < 100 else f"{receipt.format_seconds(pace)}/epoch")
        if total and epoch < total and prefix is None:
            parts.append(f"ETA {receipt.format_seconds(pace * (total - epoch))}")
    parts.append(map_text(rows))
    if started_at is not None:
        spent = max(0.0, now - started_at)
        so_far = "" if prefix else " so far"
        if price_per_hour is not None:
            # the first epoch's measured pace replaces the estimate made at start: the bill for all the epochs
            ahead = pace * (total - epoch) if pace is not None and total and epoch < total and not prefix else None
            in_all = f", ~${(spent + ahead) / 3600 * price_per_hour:.2f} in all" if ahead is not None else ""
            parts.append(f"${spent / 3600 * price_per_hour:.2f}{so_far}{in_all}")
        else:
            parts.append(f"{receipt.format_seconds(spent)} billed{so_far}")
    parts.append(hub_text(hub, last_commit_at, now))
    return " · ".join(parts)


def seconds_per_epoch(rows: list[dict[str, Any]], window: int = 5) -> float | None:
    times = [float(row["time"]) for row in rows[-window:] if isinstance(row.get("time"), int | float)]
    return sum(times) / len(times) if times else None


def map_text(rows: list[dict[str, Any]]) -> str:
    validated = [row for row in rows if isinstance(row.get("metrics/mAP50"), int | float)]
    if not validated:
        return "mAP50 — (not validated yet)"
    best = max(validated, key=lambda row: row["metrics/mAP50"])
    return f"mAP50 {validated[-1]['metrics/mAP50']:.2f} (best {best['metrics/mAP50']:.2f} @ {best['epoch']})"


def hub_text(hub: str | None, last_commit_at: float | None, now: float) -> str:
    if hub is None:
        return "local only (no OUTPUT_REPO)"
    if last_commit_at is None:
        return "not on the Hub yet"
    return f"on the Hub {receipt.format_seconds(now - last_commit_at)} ago"


def total_epochs(run_dir: Path, state: dict[str, Any]) -> int | None:
    status = read_state(run_dir / libreyolo.STATUS_FILE) or {}
    total = status.get("total_epochs") or (state.get("progress") or {}).get("epochs_total")
    return int(total) if isinstance(total, int | float) else None


def sidecar_path(workdir: Path, run_name: str) -> Path:
    return workdir / ".trainbox" / run_name / SIDECAR


class EpochLog:
    """The epoch lines of this attempt: ``tick()`` (the training loop's poll) logs one per epoch finished since
    the last; ``committed()`` notes when the Hub last got something, for the line and for `status --watch`."""

    def __init__(self, settings: Settings, state: RunState, started_at: float, price: Callable[[], float | None]):
        self.settings = settings
        self.state = state
        self.run_dir = settings.run_dir
        self.started_at = started_at
        self._price = price
        self._tick_lock = threading.Lock()
        self._logged_epoch: int | None = None
        self._metrics_signature: tuple[int, int] | None = None
        self._rows: list[dict[str, Any]] = []
        self._last_commit_at: float | None = None
        self._total_cache: tuple[tuple[int, int] | None, int | None] = (None, None)

    def training_started(self) -> None:
        # Epochs restored from the Hub or an earlier attempt are history, not news.
        with self._tick_lock:
            rows = plot.read_rows(self.run_dir / libreyolo.METRICS_FILE)
            self._logged_epoch = rows[-1]["epoch"] if rows else 0

    def tick(self) -> bool:
        """Log a line for each epoch finished since the last call; True when there was one."""
        if not self._tick_lock.acquire(blocking=False):
            return False
        try:
            new = self._new_rows()
        except Exception as error:  # a log line must never stop the training loop
            logger.debug("progress: %s", error)
            new = []
        finally:
            self._tick_lock.release()
        for line in new:
            logger.info("%s", line)
        if new:
            self._write_sidecar()
        return bool(new)

    def _new_rows(self) -> list[str]:
        path = self.run_dir / libreyolo.METRICS_FILE
        try:
            stat = path.stat()
        except OSError:
            return []
        signature = (stat.st_size, stat.st_mtime_ns)
        if signature == self._metrics_signature:
            return []
        self._metrics_signature = signature
        self._rows = plot.read_rows(path)
        if self._logged_epoch is None:  # before training starts, epochs on disk are an earlier attempt's
            self._logged_epoch = self._rows[-1]["epoch"] if self._rows else 0
            return []
        lines = []
        snapshot = self.state.snapshot()
        total = self.total(snapshot)
        for index, row in enumerate(self._rows):
            if row["epoch"] > self._logged_epoch:
                lines.append(self.line(self._rows[: index + 1], total))
        if self._rows:
            self._logged_epoch = max(self._logged_epoch, self._rows[-1]["epoch"])
        return lines

    def line(self, rows: list[dict[str, Any]], total: int | None, prefix: str | None = None) -> str:
        return epoch_line(
            rows,
            total,
            started_at=self.started_at,
            now=time.time(),
            price_per_hour=self._price(),
            hub=self.settings.output_repo,
            last_commit_at=self._last_commit_at,
            prefix=prefix,
        )

    def committed(self) -> None:
        self._last_commit_at = time.time()
        self._write_sidecar()

    def _write_sidecar(self) -> None:
        """What `trainbox status --watch` needs and trainbox.json does not hold (kept out of the upload)."""
        with contextlib.suppress(OSError):
            write_json_atomic(
                sidecar_path(self.settings.workdir, self.settings.run_name),
                {"last_commit_at": self._last_commit_at, "hub": self.settings.output_repo},
            )

    def total(self, snapshot: dict[str, Any]) -> int | None:
        """The epoch count, reading status.json only after it changed: a read is an inotify event,
        and the uploader wakes on events of status.json."""
        try:
            stat = (self.run_dir / libreyolo.STATUS_FILE).stat()
            signature: tuple[int, int] | None = (stat.st_size, stat.st_mtime_ns)
        except OSError:
            signature = None
        if signature is None or signature != self._total_cache[0]:
            self._total_cache = (signature, total_epochs(self.run_dir, snapshot))
        return self._total_cache[1] or (snapshot.get("progress") or {}).get("epochs_total")


def watch_view(run_dir: Path, state: dict[str, Any], workdir: Path | None, now: float) -> list[str]:
    """The epoch line and the receipt so far, from the files of a run on this machine (`status --watch`)."""
    lines = []
    rows = plot.read_rows(run_dir / libreyolo.METRICS_FILE)
    timeline = state.get("timeline") or {}
    side: dict[str, Any] = {}
    if workdir is not None:
        side = read_state(sidecar_path(workdir, str(state.get("run_name")))) or {}
    if rows:
        hub = side.get("hub", (state.get("settings") or {}).get("output_repo"))
        lines.append(
            epoch_line(
                rows,
                total_epochs(run_dir, state),
                started_at=timeline.get("agent_started_at"),
                now=now,
                price_per_hour=timeline.get("price_per_hour"),
                hub=hub,
                last_commit_at=side.get("last_commit_at"),
            )
        )
    found = receipt.compute(state, now)
    if found is not None:
        lines.append(found.one_line())
    return lines
