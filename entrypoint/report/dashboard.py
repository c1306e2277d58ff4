"""TRACKIO: the run on a trackio dashboard (a Hugging Face Space or a self-hosted trackio server), live, as one
trackio run across every attempt and machine.

The trackio run is named ``<RUN_NAME>-<run id>`` (the id makes it unique in the project: another run may reuse a
RUN_NAME) and every attempt logs into it. An epoch is logged once the run *kept* it: once a store holds its
checkpoint (the uploader's ``kept_epochs``; with no OUTPUT_REPO, the volume alone), so an epoch lost to a kill
and trained again is logged once, with the metrics of the epoch the run kept. What the dashboard already has is
asked of the dashboard itself at the start (its run's last step: the record in trainbox.json could lag it, it is
uploaded after the log), and every entry carries a ``log_id`` of its own (``<run>/epoch-<n>``) that trackio's
store keeps unique (``INSERT OR IGNORE``): a resend after a kill between the log and that question is a no-op.

Nothing here ever waits on the boundary path: one daemon worker polls metrics.jsonl (read only when it changed)
and the kept epoch, and sends through trackio's HTTP API with bounded timeouts, retrying with a capped backoff.
``finish`` gives it one second at the end, then says what was not sent and drops it. One WARNING when the
dashboard cannot be reached, one when it answers again. The write token travels in a header, never in a URL.
"""

from __future__ import annotations

import math
import shutil
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .. import libreyolo, procs
from ..evaluation.record import EVAL_FILE
from ..log import logger
from ..runtimes import fetch
from ..state import RunState
from . import dashboard_eval, plot
from .card import PLOT_FILE

if TYPE_CHECKING:
    from ..settings import Settings

WRITE_TOKEN_HEADER = "x-trackio-write-token"
# A dashboard that hangs costs the worker this, never the run. The client is huggingface_hub's own (httpx2, in the
# image with it), imported where a dashboard is written to: a tenth of a CPU-second of an agent's start otherwise.
TIMEOUT = {"timeout": 10.0, "connect": 3.0}
POLL_SECONDS = 1.0
MAX_BACKOFF = 30.0
FINISH_SECONDS = 1.0  # what the end gives the dashboard, at most
MAX_PENDING = 10_000  # epochs; a run longer than this keeps the newest
# metrics.jsonl's columns logged as they are (the wandb-style names libreyolo writes)
LOGGED = ("train/", "metrics/", "lr/")


@dataclass(frozen=True)
class Target:
    """Where the dashboard is, and which trackio project and run the job logs into."""

    where: str  # a Space id (org/name) or a server's base URL
    project: str
    run: str

    @property
    def space(self) -> bool:
        return not self.where.startswith(("http://", "https://"))

    @property
    def api(self) -> str:
        if not self.space:
            return self.where.rstrip("/") + "/"
        owner, name = self.where.split("/", 1)
        return f"https://{owner}-{name}".lower().replace("_", "-").replace(".", "-") + ".hf.space/"

    def address(self, hub_url: str = "https://huggingface.co") -> str:
        """The page a person opens (no token in it)."""
        if self.space:
            return f"{hub_url.rstrip('/')}/spaces/{self.where}?project={self.project}"
        return f"{self.where.rstrip('/')}/?project={self.project}"


def target(
    where: str | None, project: str | None, output_repo: str | None, run_name: str, run_id: str | None
) -> Target | None:
    """TRACKIO's target for this run (None: no dashboard)."""
    if where is None:
        return None
    chosen = project or (output_repo.split("/", 1)[1] if output_repo else run_name)
    return Target(where, chosen, f"{run_name}-{run_id[:8]}" if run_id else run_name)


def epoch_metrics(row: dict[str, Any], price_per_hour: float | None) -> dict[str, float]:
    """One metrics.jsonl row as the dashboard's numbers: losses, mAPs, precision, recall, lr, the epoch's time and
    dollars (at the price it ran at)."""
    found: dict[str, float] = {}
    for key, value in row.items():
        number = isinstance(value, int | float) and not isinstance(value, bool)
        if key.startswith(LOGGED) and number and math.isfinite(value):
            found[key] = float(value)
    seconds = row.get("time")
    if isinstance(seconds, int | float) and math.isfinite(seconds):
        found["epoch/seconds"] = float(seconds)
        if price_per_hour is not None:
            found["epoch/dollars"] = float(seconds) / 3600 * price_per_hour
    return found


class GpuSampler:
    """The GPUs' utilisation and memory for the dashboard, from ``nvidia-smi`` (a child process: the agent never
    opens CUDA), as the stall guard reads it; at most one query per ``every`` seconds, none once it hung."""

    QUERY = ("--query-gpu=utilization.gpu,memory.used", "--format=csv,noheader,nounits")

    def __init__(self, smi: str | None, every: float = 10.0) -> None:
        self.smi, self.every, self._at = smi, every, -math.inf
        self._last: dict[str, float] = {}

    def sample(self) -> dict[str, float]:
        if self.smi is None or time.monotonic() - self._at < self.every:
            return dict(self._last)
        self._at = time.monotonic()
        try:
            result = procs.run([self.smi, *self.QUERY], timeout=5.0, echo=False)
        except OSError:
            self.smi = None
            return {}
        if result.timed_out or result.returncode != 0:
            self.smi = None if result.timed_out else self.smi
            return {}
        rows = [line.split(",") for line in result.stdout.splitlines() if line.count(",") == 1]
        try:
            busy, used = [float(row[0]) for row in rows], [float(row[1]) for row in rows]
        except ValueError:
            return {}
        if rows:
            self._last = {"gpu/utilization_percent": sum(busy) / len(busy), "gpu/memory_used_gb": sum(used) / 1024}
        return dict(self._last)


class Unreachable(Exception):
    """The dashboard did not answer (or answered 5xx): worth another try later."""


class Refused(Exception):
    """The dashboard answered no (a wrong token, a bad request): no later try will change it."""


class Client:
    """trackio's HTTP API (``POST /api/<name>``, its ``{"kwargs": …}`` body), with bounded timeouts."""

    def __init__(self, target: Target, *, write_token: str | None, hf_token: str | None) -> None:
        self.target = target
        self.headers: dict[str, str] = {}
        if write_token:
            self.headers[WRITE_TOKEN_HEADER] = write_token
        if hf_token and target.space:  # a private Space: the Hub token opens it, and may write
            self.headers["authorization"] = f"Bearer {hf_token}"

    def call(self, name: str, **kwargs: Any) -> Any:
        import httpx2 as httpx  # here, not at the top: see TIMEOUT

        api, timeout = self.target.api, httpx.Timeout(**TIMEOUT)
        try:
            response = httpx.post(api + f"api/{name}", json={"kwargs": kwargs}, headers=self.headers, timeout=timeout)
        except (httpx.HTTPError, OSError) as error:
            raise Unreachable(type(error).__name__) from None
        if response.status_code >= 500 or response.status_code in (404, 408, 429):
            raise Unreachable(f"HTTP {response.status_code}")
        try:
            body = response.json()
        except ValueError:
            raise Unreachable(f"HTTP {response.status_code}, not trackio's answer") from None
        if response.status_code >= 400 or body.get("error"):
            raise Refused(f"HTTP {response.status_code}: {str(body.get('error') or '')[:200]}")
        return body.get("data")

    def last_step(self) -> int | None:
        """The last epoch this run's dashboard holds (None: none yet)."""
        summary = self.call("get_run_summary", project=self.target.project, run=self.target.run)
        step = summary.get("last_step") if isinstance(summary, dict) else None
        return step if isinstance(step, int) else None

    def log(self, entries: list[dict[str, Any]]) -> None:
        self.call("bulk_log", logs=entries, hf_token=None)

    def log_image(self, image: Path, step: int, caption: str) -> None:
        """``image`` into the run's media at ``step``, and logged there as trackio's image (``/api/upload``, then
        ``bulk_upload_media``: the server keeps it under the name sent, where the logged ``file_path`` points)."""
        target, name = self.target, f"{image.stem}-{step}{image.suffix}"
        import httpx2 as httpx  # here, not at the top: see TIMEOUT

        try:
            response = httpx.post(
                target.api + "api/upload",
                files={"files": (name, image.read_bytes())},
                headers=self.headers,
                timeout=httpx.Timeout(**TIMEOUT),
            )
            response.raise_for_status()
            uploaded = response.json()["paths"][0]
        except (httpx.HTTPError, OSError, ValueError, KeyError, IndexError) as error:
            raise Unreachable(f"upload: {type(error).__name__}") from None
        where = {"project": target.project, "run": target.run, "run_id": None, "step": step, "relative_path": None}
        file_data = {"path": uploaded, "orig_name": name, "meta": {"_type": "gradio.FileData"}}
        self.call("bulk_upload_media", uploads=[where | {"uploaded_file": file_data}], hf_token=None)
        folder = "".join(c for c in target.project if c.isalnum() or c in "-_") or "default"  # trackio's own
        shown = {"_type": "trackio.image", "file_path": f"{folder}/{target.run}/{step}/{name}", "caption": caption}
        entry = {"project": target.project, "run": target.run, "step": step, "metrics": {"training/plot": shown}}
        self.log([entry | {"log_id": f"{target.run}/plot-{step}"}])


@dataclass(frozen=True)
class Sources:
    """What the worker reads, handed in by the job."""

    metrics: Path  # metrics.jsonl
    kept: Callable[[], int | None]  # the last epoch whose checkpoint a store holds (None: every epoch on disk)
    price: Callable[[], float | None]  # $/h
    config: Callable[[], dict[str, Any]]  # the run's config, sent with its first entry
    record: Callable[[dict[str, Any]], None]  # into trainbox.json's "dashboard"
    prepare: Callable[[], None] | None = None  # a Space's creation, before the first call
    plot: Path | None = None  # the training plot, logged once at the end
    evaluation: Path | None = None  # eval.json, its scores logged once at the end
    gpus: GpuSampler = field(default_factory=lambda: GpuSampler(None))  # sampled as each epoch is taken


class Dashboard:
    """``start()``, let it run beside training, ``finish()`` at the end: one worker, never on the run's path."""

    def __init__(self, client: Client, sources: Sources, address: str, *, poll: float = POLL_SECONDS) -> None:
        self.client = client
        self.sources = sources
        self.address = address
        self.poll = poll
        self._lock = threading.Lock()
        self._pending: dict[int, dict[str, Any]] = {}  # epoch → entry, not yet on the dashboard
        self._queued = 0  # the last epoch taken into _pending
        self._known: int | None = None  # the dashboard's last step, once asked
        self._config_sent = False
        self._down: str | None = None  # why it could not be reached, while it cannot
        self._refused = False
        self._retry_at = 0.0
        self._backoff = 1.0
        self._signature: tuple[int, int] | None = None
        self._rows: list[dict[str, Any]] = []
        self._closed = False  # finish returned: a late answer records nothing
        self._prepared = sources.prepare is None  # a Space being created takes the worker a while
        self._final = threading.Event()
        self._wake = threading.Event()
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, name="dashboard", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def finish(self, timeout: float = FINISH_SECONDS) -> int:
        """Send what the run kept, within ``timeout``; what is left is said and dropped. The epochs dropped."""
        self._final.set()
        self._wake.set()
        self._done.wait(timeout)
        self._closed = True
        with self._lock:
            left = sorted(self._pending)
            self._pending.clear()
        if not self._prepared:
            logger.warning("dashboard: %s was still being prepared at the end: no epoch was sent", self.address)
        elif left:
            logger.warning(
                "dashboard: %d epoch(s) (%s) not on %s at the end: dropped (metrics.jsonl has them)",
                len(left),
                _span(left),
                self.address,
            )
        return len(left)

    # -- the worker ------------------------------------------------------------------------
    def _run(self) -> None:
        try:
            if self.sources.prepare is not None:
                self._prepare()
            while True:
                final = self._final.is_set()
                self._collect()
                if self._refused:
                    break
                if self._pending and time.monotonic() >= self._retry_at:
                    self._send()
                if final and not self._pending and self._down is None:
                    self._send_plot()
                if final and (not self._pending or self._retry_at > time.monotonic()):
                    break
                self._wake.wait(self.poll)
                self._wake.clear()
        except Exception as error:  # the dashboard is a courtesy: never the run's failure
            logger.warning("dashboard: stopped: %s: %s", type(error).__name__, error)
        finally:
            self._done.set()

    def _prepare(self) -> None:
        assert self.sources.prepare is not None
        try:
            self.sources.prepare()
        except Exception as error:
            logger.warning("dashboard: cannot prepare %s (%s): epochs are sent once it answers", self.address, error)
        self._prepared = True

    def _collect(self) -> None:
        """New kept epochs into ``_pending`` (metrics.jsonl read only when it changed)."""
        try:
            stat = self.sources.metrics.stat()
        except OSError:
            return
        signature = (stat.st_size, stat.st_mtime_ns)
        if signature != self._signature:
            self._signature = signature
            self._rows = plot.read_rows(self.sources.metrics)
        kept = self.sources.kept()
        price = self.sources.price()
        new = any(self._queued < row["epoch"] <= (kept if kept is not None else row["epoch"]) for row in self._rows)
        gpus = self.sources.gpus.sample() if new else {}  # nvidia-smi: outside the lock that finish takes
        with self._lock:
            for row in self._rows:
                epoch = int(row["epoch"])
                if epoch <= self._queued or (kept is not None and epoch > kept):
                    continue
                self._pending[epoch] = {
                    "project": self.client.target.project,
                    "run": self.client.target.run,
                    "step": epoch,
                    "metrics": epoch_metrics(row, price) | gpus,
                    "log_id": f"{self.client.target.run}/epoch-{epoch}",
                }
                self._queued = epoch
            while len(self._pending) > MAX_PENDING:
                del self._pending[min(self._pending)]

    def _send(self) -> None:
        try:
            if self._known is None:
                self._known = self.client.last_step() or 0
            with self._lock:
                for epoch in [epoch for epoch in self._pending if epoch <= (self._known or 0)]:
                    del self._pending[epoch]  # the dashboard has it (an earlier attempt sent it)
                epochs = sorted(self._pending)
                entries = [dict(self._pending[epoch]) for epoch in epochs]
            if not entries:
                return
            if not self._config_sent:
                entries[0]["config"] = self.sources.config()
            self.client.log(entries)
        except Unreachable as error:
            self._unreachable(str(error))
            return
        except Refused as error:
            self._refused = True
            logger.warning("dashboard: %s refused the epochs (%s): nothing more is sent", self.address, error)
            return
        with self._lock:
            for epoch in epochs:
                self._pending.pop(epoch, None)
        self._config_sent = True
        self._known = max(self._known or 0, epochs[-1])
        self._backoff = 1.0
        self._retry_at = 0.0
        if self._down is not None:
            logger.warning("dashboard: %s answers again: epochs up to %d are on it", self.address, epochs[-1])
            self._down = None
        if self._closed:
            return
        try:
            self.sources.record({"logged_epoch": self._known})
        except Exception as error:
            logger.debug("dashboard: record: %s", error)

    def _send_plot(self) -> None:
        """The end's extras at the last epoch: the training plot, and the evaluation's scores."""
        plot_file, last = self.sources.plot, self._known
        if not last:
            return
        scored = dashboard_eval.entry(self.sources.evaluation, self.client.target.project, self.client.target.run, last)
        try:
            if plot_file is not None and plot_file.is_file():
                self.client.log_image(plot_file, last, "loss and mAP per epoch")
            if scored is not None:
                self.client.log([scored])
        except (Unreachable, Refused) as error:
            logger.warning("dashboard: the plot or the evaluation did not reach %s (%s)", self.address, error)

    def _unreachable(self, why: str) -> None:
        if self._down is None:
            logger.warning(
                "dashboard: %s cannot be reached (%s): the run goes on, its epochs are sent when it answers",
                self.address,
                why,
            )
        self._down = why
        self._retry_at = time.monotonic() + self._backoff
        self._backoff = min(MAX_BACKOFF, self._backoff * 2)


def _span(epochs: list[int]) -> str:
    return str(epochs[0]) if len(epochs) == 1 else f"{epochs[0]}-{epochs[-1]}"


def where(settings: Settings) -> str | None:
    """Where the run's dashboard will be, before it has a run id (``--dry-run``, ``trainbox plan``)."""
    found = target(settings.trackio, settings.trackio_project, settings.output_repo, settings.run_name, None)
    if found is None:
        return None
    kind = "a private Space, created if missing" if found.space else "a self-hosted trackio server"
    return f"{found.address(settings.hub_url)} ({kind}; trackio run {found.run}-<run id>)"


def recorded_url(state: dict[str, Any]) -> str | None:
    """The dashboard's address as a trainbox.json records it (``status --repo``, the card), if it does."""
    board = state.get("dashboard")
    url = board.get("url") if isinstance(board, dict) else None
    return url[:300] if isinstance(url, str) and url.startswith(("http://", "https://")) else None


def run_config(settings: Settings, snapshot: dict[str, Any], price: float | None) -> dict[str, Any]:
    """The run's config on the dashboard: model, imgsz, batch, epochs, dataset and revision, GPU, price."""
    args = settings.run_args
    dataset = snapshot.get("dataset") or {}
    gpus = (snapshot.get("gpus") or {}).get("gpus") or []
    names = [str(gpu.get("name")) for gpu in gpus if isinstance(gpu, dict) and gpu.get("name")]
    return {
        "model": args.get("model"),
        "imgsz": args.get("imgsz"),
        "batch": args.get("batch"),
        "epochs": args.get("epochs"),
        "dataset": settings.dataset_repo or dataset.get("source") or settings.dataset_kind.value,
        "dataset_revision": dataset.get("revision"),
        "gpu": ", ".join(names) or "cpu",
        "price_per_hour": price,
        "run_id": snapshot.get("run_id"),
        "output_repo": settings.output_repo,
    }


def open_for(
    settings: Settings, state: RunState, *, kept: Callable[[], int | None], price: Callable[[], float | None]
) -> Dashboard | None:
    """The job's dashboard, started (None without TRACKIO, or on a node other than node 0). ``kept``: the last
    epoch a store holds (None: the volume is the only store)."""
    found = target(
        settings.trackio,
        settings.trackio_project,
        settings.output_repo,
        settings.run_name,
        state.identity.run_id,
    )
    if found is None or not settings.topology.leader:
        return None
    hf_token = settings.hf_token.reveal() if settings.hf_token is not None else None
    write_token = settings.trackio_write_token.reveal() if settings.trackio_write_token is not None else None
    client = Client(found, write_token=write_token, hf_token=hf_token)
    address = found.address(settings.hub_url)
    state.update(dashboard={"url": address, "project": found.project, "run": found.run})
    logger.info("dashboard: trackio at %s (run %s)", address, found.run)
    sources = Sources(
        metrics=settings.run_dir / libreyolo.METRICS_FILE,
        kept=kept,
        price=price,
        config=lambda: run_config(settings, state.snapshot(), price()),
        record=lambda fields: state.update(dashboard=fields),
        prepare=(lambda: create_space(found.where, hf_token, settings.workdir, settings.env)) if found.space else None,
        plot=settings.run_dir / PLOT_FILE,
        evaluation=settings.run_dir / EVAL_FILE,
        gpus=GpuSampler(None if settings.gpus.cpu else shutil.which("nvidia-smi")),
    )
    dashboard = Dashboard(client, sources, address)
    dashboard.start()
    return dashboard


def create_space(space_id: str, hf_token: str | None, workdir: Path, env: Mapping[str, str]) -> None:
    """A missing Space is created private, running trackio's dashboard: trackio's own deploy, with the run's token
    (the image leaves trackio out: fetched on first use, runtimes/fetch.py). A Space that is there needs nothing."""
    from huggingface_hub import HfApi
    from huggingface_hub.errors import RepositoryNotFoundError

    try:
        HfApi(token=hf_token).repo_info(space_id, repo_type="space")
        return
    except RepositoryNotFoundError:
        pass
    fetch.ensure(fetch.TRACKIO, workdir, env)
    from trackio import deploy

    deploy.create_space_if_not_exists(space_id, private=True)


def tracker_env(env: Mapping[str, str], run_id: str | None) -> dict[str, str]:
    """The training child's variables that make libreyolo's own trackers (RUN_ARGS ``loggers=``) continue one
    tracker run across attempts and machines where the tracker takes its id from the environment: wandb
    (``WANDB_RUN_ID`` + ``WANDB_RESUME=allow``; values already set win). mlflow cannot (``MLFLOW_RUN_ID`` must
    name a run its server made), nor clearml (libreyolo passes ``reuse_last_task_id=False``), comet or neptune
    (their ids are arguments libreyolo leaves unset); tensorboard and dvclive write into the run folder, which
    travels with the run."""
    if run_id is None:
        return {}
    wanted = {"WANDB_RUN_ID": f"trainbox-{run_id}", "WANDB_RESUME": "allow"}
    return {key: value for key, value in wanted.items() if key not in env}
