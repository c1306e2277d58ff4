"""What a person follows during a run: one log line per epoch, the plot, the model card, the receipt.

``Progress`` lives in the agent beside the training child and works from files the child
already writes (metrics.jsonl, status.json) and from trainbox.json; it never slows training:

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
import os
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .. import libreyolo, procs
from ..errors import StopRequested
from ..log import logger
from ..state import RunState, read_state, write_json_atomic
from . import card, estimate, plot, provenance, receipt
from .card_facts import best_row, card_info

if TYPE_CHECKING:
    from ..hub import Hub
    from ..settings import Settings

CARD_FILE = "README.md"
SIDECAR = "progress.json"  # beside the uploader's ledger, outside the run folder: never uploaded
# A plot that costs more than this share of an epoch is drawn less often (the card keeps the last one).
PLOT_SHARE = 0.2


# -- the epoch line ---------------------------------------------------------------------------
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


class Progress:
    def __init__(self, settings: Settings, state: RunState) -> None:
        self.settings = settings
        self.state = state
        self.run_dir = settings.run_dir
        self.started_at = procs.process_start_time() or time.time()
        self._marks: dict[str, float] = {}
        self._tick_lock = threading.Lock()
        self._publish_lock = threading.Lock()
        self._logged_epoch: int | None = None
        self._metrics_signature: tuple[int, int] | None = None
        self._rows: list[dict[str, Any]] = []
        self._last_commit_at: float | None = None
        self._plotted_epoch = 0
        self._plot_seconds = 0.0
        self._card_base: str | None = None
        self._card_base_known = False
        self._base_model = provenance.base_model(settings.user_run_args)
        self._license = settings.card_license  # else the base model's, read with the Hub's card
        self._total_cache: tuple[tuple[int, int] | None, int | None] = (None, None)
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
            found = self._estimate(data_yaml)
        except StopRequested:  # a signal during the count (SIGTERM): the job's stop, not the estimate's failure
            raise
        except Exception as error:  # an estimate is a courtesy: never let it stop the run
            logger.debug("estimate: %s: %s", type(error).__name__, error)
            return
        if found is not None:
            self.state.update(estimate=found)

    def _estimate(self, data_yaml: Path) -> dict[str, Any] | None:
        images = estimate.train_images(data_yaml)
        if images is None:
            return None
        snapshot = self.state.snapshot()
        done = (snapshot.get("progress") or {}).get("epochs_done") or 0
        args = self.settings.run_args
        total = (snapshot.get("progress") or {}).get("epochs_total") or int(args.get("epochs") or 300)
        names = [str(gpu.get("name")) for gpu in (snapshot.get("gpus") or {}).get("gpus") or []]
        gpu = estimate.find_gpu(names[0]) if names and not self.settings.gpus.cpu else None
        if gpu is None or total <= done:
            return {"images": images}
        per_image, source = estimate.seconds_per_image(gpu, args.get("model"), int(args.get("imgsz") or 640))
        workers = len(names) * self.settings.topology.nnodes
        if workers > 1:  # data parallel: each GPU takes its share of every epoch
            per_image, source = per_image / workers, f"{source}, ÷ {workers} GPUs"
        cost = snapshot.get("cost") or {}
        found = estimate.Estimate(
            total - done, images, per_image, source, self._price(), cost.get("price_source") or "PRICE_PER_HOUR"
        )
        logger.info("%s", found.line())
        return found.as_dict()

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
            # Epochs restored from the Hub or an earlier attempt are history, not news.
            with self._tick_lock:
                rows = plot.read_rows(self.run_dir / libreyolo.METRICS_FILE)
                self._logged_epoch = rows[-1]["epoch"] if rows else 0

    def receipt(self, now: float | None = None) -> receipt.Receipt | None:
        return receipt.compute(self.state.snapshot(), time.time() if now is None else now)

    # -- the epoch line (training loop) ---------------------------------------------------
    def tick(self, *, publish: bool = False) -> None:
        """Log a line for each epoch finished since the last call; ``publish`` also writes plot and card."""
        if not self._tick_lock.acquire(blocking=False):
            return
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
            if publish:
                self.publish()

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
        total = self._total(snapshot)
        for index, row in enumerate(self._rows):
            if row["epoch"] > self._logged_epoch:
                lines.append(self._line(self._rows[: index + 1], total))
        if self._rows:
            self._logged_epoch = max(self._logged_epoch, self._rows[-1]["epoch"])
        return lines

    def _line(self, rows: list[dict[str, Any]], total: int | None, prefix: str | None = None) -> str:
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

    def committed(self, _sha: str, _names: list[str]) -> None:
        """The uploader's commit callback."""
        self._last_commit_at = time.time()
        self._write_sidecar()

    def _write_sidecar(self) -> None:
        """What `trainbox status --watch` needs and trainbox.json does not hold (kept out of the upload)."""
        with contextlib.suppress(OSError):
            write_json_atomic(
                sidecar_path(self.settings.workdir, self.settings.run_name),
                {"last_commit_at": self._last_commit_at, "hub": self.settings.output_repo},
            )

    # -- plot and card (before each snapshot) ---------------------------------------------
    def publish(self, hub: Hub | None = None, repo_id: str | None = None) -> None:
        """Bring the plot and README.md in the run folder up to date; cheap when nothing changed."""
        self.tick()
        with self._publish_lock:
            try:
                snapshot = self.state.snapshot()
                self._note_release(snapshot)
                rows = plot.read_rows(self.run_dir / libreyolo.METRICS_FILE)
                self._maybe_plot(rows, final=snapshot.get("phase") in receipt.TERMINAL)
                if not self._load_card_base(hub, repo_id):
                    return  # the Hub's card could not be read: never overwrite a card we have not seen
                self._write_card(self.state.snapshot(), rows)
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

    def _maybe_plot(self, rows: list[dict[str, Any]], *, final: bool) -> None:
        if not rows or rows[-1]["epoch"] == self._plotted_epoch:
            return
        pace = seconds_per_epoch(rows) or 0.0
        behind = rows[-1]["epoch"] - self._plotted_epoch
        # Cannot keep up (drawing costs a fair share of an epoch): skip boundaries, never the last one.
        if not final and self._plot_seconds > PLOT_SHARE * pace * behind:
            return
        started = time.monotonic()
        try:
            plot.draw(rows, self.run_dir / card.PLOT_FILE, f"{self.settings.run_name}: loss and mAP per epoch")
        except Exception as error:  # a broken plot must not cost the card or the upload
            logger.warning("plot: not drawn: %s", error)
        self._plot_seconds = time.monotonic() - started
        self._plotted_epoch = rows[-1]["epoch"]  # drawn, or tried: the next epoch tries again

    def _load_card_base(self, hub: Hub | None, repo_id: str | None) -> bool:
        """The card to build on, once per attempt: the Hub's (the user may have edited it), else the local one."""
        if self._card_base_known:
            return True
        local = self.run_dir / CARD_FILE
        if hub is not None and repo_id is not None:
            from huggingface_hub.errors import EntryNotFoundError, RepositoryNotFoundError, RevisionNotFoundError

            scratch = self.settings.agent_dir / "card"
            try:
                self._card_base = hub.download(repo_id, CARD_FILE, scratch).read_text(encoding="utf-8")
            except (EntryNotFoundError, RepositoryNotFoundError, RevisionNotFoundError):
                self._card_base = None
            except Exception as error:
                logger.warning(
                    "card: cannot read %s's README.md yet (%s); trying again at the next upload", repo_id, error
                )
                return False
        if self._card_base is None and local.is_file():
            self._card_base = local.read_text(encoding="utf-8")
        self._card_base_known = True
        self._find_license(hub)
        return True

    def _find_license(self, hub: Hub | None) -> None:
        """LICENSE, else the base model's own; without either the card has none, and says so once."""
        if self._license is None and hub is not None and self._base_model is not None:
            scratch = self.settings.agent_dir / "base-card"
            self._license = provenance.base_license(hub, self._base_model, scratch)
            if self._license is not None:
                logger.info("card: license %s, from %s's card (LICENSE overrides it)", self._license, self._base_model)
        if self._license is None:
            logger.info("card: no license in the model card; set LICENSE to a Hub license id, e.g. LICENSE=apache-2.0")

    def _write_card(self, snapshot: dict[str, Any], rows: list[dict[str, Any]]) -> None:
        previous = self.state.previous or {}
        for key in ("training", "dataset"):  # until this attempt gets there (or never: already complete)
            if not snapshot.get(key) and previous.get(key):
                snapshot[key] = previous[key]
        info = card_info(
            snapshot,
            rows,
            repo_id=self.settings.output_repo,
            receipt=receipt.compute(snapshot, self._as_of()),
            plot=(self.run_dir / card.PLOT_FILE).is_file(),
            total=self._total(snapshot),
            license=self._license,
            base_model=self._base_model,
        )
        text = card.render(info, self._card_base)
        self._card_base = text
        path = self.run_dir / CARD_FILE
        with contextlib.suppress(OSError):
            if path.read_text(encoding="utf-8") == text:
                return
        tmp = path.with_name(f".{CARD_FILE}.tmp")
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, path)

    def _total(self, snapshot: dict[str, Any]) -> int | None:
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
            line = self._line(rows, total, prefix=prefix)
            if best is not None:
                line += f" · best mAP50-95 {best['metrics/mAP50-95']:.3f} @ {best['epoch']}"
            logger.info("%s", line)
        found = receipt.compute(snapshot, time.time())
        if found is not None:
            logger.info("%s", found.one_line())


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
