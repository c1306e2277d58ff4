"""``trainbox run``: docs/how-a-run-works.md's steps in order, one shutdown path, and an honest final state.

Settings (read before the job starts), preflight, dataset, training with the sync beside it, the end. ``Job``
holds the stage order and the one shutdown path; the training stage is job/loop.py's ``TrainingLoop``, the
end job/wrapup.py's ``WrapUp``.
SIGTERM (preemption), SIGINT, MAX_RUNTIME and MAX_COST (SIGALRM) and the stall guard all end the job the
same way: stop the training child (SIGINT, then SIGKILL after a grace period), flush the
uploads, write the terminal trainbox.json, release the machine, exit with the matching code.
"""

from __future__ import annotations

import signal
import time
from pathlib import Path
from types import FrameType

from . import dataset, preflight
from .dataset import pin as dataset_pin
from .errors import (
    AgentError,
    CostLimitError,
    DeadlineError,
    PreemptedError,
    UserInterruptError,
)
from .evaluation import end as evaluation
from .evaluation import split as evaluation_split
from .export import run as export_run
from .foreign import Area, Where
from .foreign import agent_error as classify
from .gpu.nodes import NodesAgreement
from .gpu.report import GpuReport
from .host import check as host_check
from .hub import Hub
from .job.loop import TrainingLoop
from .job.wrapup import WrapUp
from .libreyolo import check_export_gpu
from .log import logger
from .release.clock import ShutdownClock
from .release.end import check_access
from .report import dashboard, notify, progress
from .report.attempt import Attempt
from .settings import Settings
from .state import STATE_FILE, Phase, RunState, read_state
from .sync import job as job_sync
from .sync import volume_lock
from .sync.bucket import RunFolder
from .sync.lease import RunLease
from .sync.uploader import Uploader
from .training import resume
from .training.launch import Launch
from .training.process import TrainingProcess


class Job:
    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.clock = ShutdownClock()  # the deadlines between a stop and the exit
        # one machine or several: chosen once
        self.launch = Launch(settings.topology, settings.run_name, settings.agent_dir / "peer-report.json")
        # Only reads here: the run folder is made inside ``run``'s try, so a full or read-only volume
        # still ends with trainbox.json (where it can be written), ON_EXIT/ON_FAILURE and an exit code.
        self.state = RunState(settings.run_dir, settings.run_name, read_state(settings.run_dir / STATE_FILE))
        self.progress = progress.Progress(settings, self.state)  # epoch lines, plot, model card, receipt
        self.attempt = Attempt(settings, self.state, self.clock)  # settings, price, epochs, outcome in trainbox.json
        self.notifier = notify.install(notify.Notifier(settings, self.state))  # NOTIFY: start, self-heals, end
        self.trainer: TrainingProcess | None = None
        # The trainer runs and the training loop will notice a stop. Not while a heal decides what to
        # start next: a stop then ends the job at once, before any lookup, download or new trainer.
        self.trainer_live = False
        self.uploader: Uploader | None = None
        self.bucket: RunFolder | None = None  # the run's folder in its Storage Bucket (sync/bucket.py)
        self.lease: RunLease | None = None  # this container's hold on the run: one writer at a time (sync/lease.py)
        self.hub: Hub | None = None
        self.dashboard: dashboard.Dashboard | None = None  # TRACKIO: the run's trackio dashboard, beside training
        self.already_complete = False
        self.stop_cause: AgentError | None = None
        self._finishing = False
        self.dataset_check: dataset.DatasetCheck | None = None  # libreyolo doctor beside the training's start
        self.nodes: NodesAgreement | None = None  # several machines: what they agreed on
        self.workers = 1  # training processes of all nodes: a batch must divide by it
        self.nccl_env: dict[str, str] = {}  # the GPU check's working NCCL fallback, when the defaults failed
        self.hub_copy: tuple[int, int] | None = None  # size, mtime of the checkpoint resume copied from the Hub
        self.new_run = False  # this start gave the run its id: it goes to the repo before training
        self._gpu_indices: tuple[int, ...] | None = None  # the GPUs trained on (None: the CPU): exports use the first
        self._data_settings = settings  # the dataset to fetch: a resume's pinned to the run's first commit
        self.training = TrainingLoop(self)  # the training stage: the trainer watched, healed after an out-of-memory

    # -- the one shutdown path -------------------------------------------------------------
    def request_stop(self, error: AgentError) -> None:
        """Stop the job because of ``error``. Before training this raises at once; during it,
        the training loop notices and stops the child; while finishing it is only recorded."""
        if self.stop_cause is not None:
            if isinstance(error, PreemptedError) and not isinstance(self.stop_cause, PreemptedError):
                self.stop_cause = error  # the machine is going away: that bound now rules the wrap-up
            if not self.trainer_live and not self._finishing:
                raise self.stop_cause  # the first one was swallowed somewhere: a later signal still stops the job
            return
        self.stop_cause = error
        logger.warning("stopping: %s", error)
        if self.trainer_live:
            assert self.trainer is not None
            self.trainer.child.send(signal.SIGINT)
        elif not self._finishing:
            raise error  # no trainer to wait for (before training, or healing after one): stop now

    def on_signal(self, signum: int, _frame: FrameType | None) -> None:
        if self.clock.hold(signum):  # the trainer is starting: handled once the job holds it
            return
        if signum == signal.SIGTERM:
            if self.clock.preempt():
                if self.uploader is not None:  # a final upload already under way ends in time too
                    self.uploader.cut_short(self.clock.upload_cutoff)
                if self.trainer is not None:  # so does a wrap-up's grace (MAX_RUNTIME, a stall) under way
                    self.trainer.child.hurry(time.monotonic() + self.clock.preempt_grace())
            self.request_stop(PreemptedError("received SIGTERM: the machine is being taken back"))
        elif signum == signal.SIGINT:
            self.request_stop(UserInterruptError("interrupted (Ctrl-C)"))
        elif signum == signal.SIGALRM and self.clock.alarm_is_budget:
            self.request_stop(CostLimitError(self.attempt.limit_message(), "raise MAX_COST"))
        elif signum == signal.SIGALRM:
            self.request_stop(
                DeadlineError(f"MAX_RUNTIME ({self.settings.max_runtime:.0f} s) expired", "raise MAX_RUNTIME")
            )

    def _install_signal_handlers(self) -> None:
        for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGALRM):
            signal.signal(signum, self.on_signal)
        self.clock.arm_runtime(self.settings.max_runtime)

    # -- the stages ------------------------------------------------------------------------
    def run(self) -> int:
        self._install_signal_handlers()
        try:
            outcome = self._attempt()
        except AgentError as late:  # a stop the signal handler raised while a failure was being handled
            self._finishing = True  # first: any later signal is only recorded now
            outcome = late
        return self._wrap_up().finish(outcome)

    def _attempt(self) -> AgentError | None:
        """Every stage, in order; the failure that ended them, or None. Ends with the job finishing."""
        outcome: AgentError | None = None
        try:
            self.attempt.begin()
            gpus = self._preflight()
            self.notifier.started(self.attempt.price.per_hour, self.attempt.price.source)
            point = self._resume()
            if point is not None and point.complete:
                logger.info(
                    "run %s already trained %d/%d epochs: nothing to train",
                    self.settings.run_name,
                    point.completed_epochs,
                    point.total_epochs,
                )
                self.already_complete = True
                self.state.update(
                    **export_run.carried(self.state.previous, self.settings), **evaluation.carried(self.state.previous)
                )
            else:
                self.attempt.arm_run_budget()  # MAX_COST is the run's: the earlier attempts' spend counts
                data = self._dataset()
                self.training.train(data, gpus.indices, point)
        except AgentError as error:
            outcome = error
        except Exception as error:  # still end with an honest trainbox.json and a release
            outcome = classify(error, Where(Area.HUB)) or AgentError(f"unexpected {type(error).__name__}: {error}")
            logger.exception("unexpected failure")
        finally:
            self._finishing = True
            self.clock.disarm()
            if self.dataset_check is not None:  # stopped before its verdict: not wanted any more
                self.dataset_check.cancel()
        return outcome

    def _preflight(self) -> GpuReport:
        """Step 2: the GPUs run kernels, the batch fits the workers, the provider and the Hub answer."""
        self.state.set_phase(Phase.PREFLIGHT)
        # First: a trainer the previous attempt left running holds the GPUs and the disk the checks measure.
        resume.stop_orphan(self.state.previous)
        gpus = preflight.check_gpus(self.settings, record=lambda details: self.state.update(gpus=details))
        self._gpu_indices = gpus.indices
        check_export_gpu(self.settings.export, has_gpu=gpus.indices is not None)  # the demo on the CPU
        self.nccl_env = preflight.nccl_env(gpus.details)
        self.workers = self.launch.check_batch(self.settings.run_args, gpus.indices)
        preflight.check_shared_memory(self.settings.run_args, preflight.shared_memory_bytes())
        # A wrong instance id or key fails now, not at the end; the read also gives the price.
        seen = check_access(self.settings)
        self.attempt.arm_budget(seen)
        # Before the dataset: under HOST_CHECK=strict a machine that falls short costs a minute, not a night.
        observed_gpu = seen.gpu if seen else None
        host_check.check(self.settings, gpus.details, observed_gpu, lambda report: self.state.update(host=report))
        self._connect_hub()
        if self.settings.topology.leader:  # the node that exports: its runtime (the Hub answered) before the dataset
            export_run.fetch_runtimes(self.settings)
        if self.settings.topology.multi:  # several machines: meet, prove NCCL, share node 0's OUTPUT_REPO commit
            assert self.hub is not None
            self.nodes = preflight.meet_nodes(
                self.settings, self.hub, gpus, record=lambda details: self.state.update(nodes_check=details)
            )
        return gpus

    def _resume(self) -> resume.ResumePoint | None:
        """Where this run stands (the volume, the bucket, the Hub); the sync starts from there (step 5)."""
        self.state.set_phase(Phase.RESUME)
        point = self._find_resume_point()
        self._start_uploader(point)
        # an epoch goes to the dashboard once a store holds its checkpoint (no store: the volume is the run's)
        kept = (lambda: self.uploader.kept_epochs) if self.uploader is not None else (lambda: None)
        self.dashboard = dashboard.open_for(
            self.settings, self.state, kept=kept, price=lambda: self.attempt.price.per_hour
        )
        return point

    def _dataset(self) -> dataset.PreparedDataset:
        """Step 3: the dataset ready for training; libreyolo's own check runs beside the training's start."""
        self.state.set_phase(Phase.DATASET)
        data, self.dataset_check = dataset.prepare_checked_in_background(self._data_settings)
        if data.revision is not None:
            self.state.identity.pin_dataset(data.revision)  # the first start's commit: the run's from now on
        self.state.update(
            dataset={"source": data.description, "revision": data.revision, "data_yaml": str(data.data_yaml)}
        )
        # A test split that cannot be scored is refused now, not found out after the training (exit 25, 26).
        if self.settings.evaluate:
            held_out = evaluation_split.choose(data.data_yaml)
            logger.info("dataset: the model will be scored on its %s", held_out.words)
        else:
            logger.info("dataset: the model will not be scored (EVAL=0)")
        self.progress.estimate(data.data_yaml)  # what the epochs should cost, until the first one is measured
        if data.download_mbps is not None and self.state.snapshot().get("host"):
            self.state.update(host={"dataset_mbps": data.download_mbps})
            logger.info("host: dataset download %.1f MB/s", data.download_mbps)
        if self.dataset_check is None:  # else the phase moves on once the check passed
            self.state.set_phase(Phase.TRAINING)
        return data

    def _connect_hub(self) -> None:
        """Check write access to OUTPUT_REPO and that it holds this run (or nothing), take over its history."""
        repo = self.settings.output_repo
        if repo is None:
            logger.warning("OUTPUT_REPO is not set: the weights stay in %s only", self.settings.run_dir)
            return
        self.hub = Hub.for_settings(self.settings)
        if self.settings.topology.leader:  # the other nodes only read OUTPUT_REPO (resume)
            # the bucket too, before any dataset byte; several machines keep none (sync/places.py)
            bucket = None if self.settings.topology.multi else self.settings.checkpoint_bucket
            self.hub.ensure_writable_repo(repo, bucket=bucket)
        names = resume.remote_names(self.hub, repo)
        remote = resume.remote_state(self.hub, repo, self.scratch(), names)
        run_id = self.state.identity.run_id if self.settings.topology.leader else None  # the others take node 0's
        resume.check_same_run(remote, self.settings.run_name, repo, names, self.settings.record(), run_id)
        # Node 0 writes the run's history (a halved batch included); every other node takes it as it is.
        self.state.history.adopt(remote, authoritative=not self.settings.topology.leader)
        # Judged only now: on a new disk the attempts are known from the Hub alone.
        resume.check_crash_loop(self.state.history.attempts)

    def _start_uploader(self, point: resume.ResumePoint | None) -> None:
        """Mirror the run folder to OUTPUT_REPO (and its bucket), once resume has chosen between the
        volume and the stores: what the Hub holds newer than this volume is never overwritten by the
        older copy. A new run's id is on the repo before training, so a new volume learns it."""
        if self.hub is None or self.settings.output_repo is None or not self.settings.topology.leader:
            return
        newer = (point.hub_files if point is not None else frozenset()) - {STATE_FILE}
        self.uploader = job_sync.start(
            self.settings,
            self.hub,
            self.bucket,
            self.state,
            newer=newer,
            before_snapshot=self._before_snapshot,
            on_commit=self.progress.committed,
            stop=self.request_stop,
            lease=self.lease,
            on_fallback=lambda line: notify.event("storage fallback", line),
        )
        self.state.on_phase(self.uploader.notify)
        if self.new_run:
            job_sync.publish_run_id(self.uploader, self.state, self.settings)

    def scratch(self) -> Path:
        scratch = self.settings.agent_dir / "scratch"
        scratch.mkdir(parents=True, exist_ok=True)
        return scratch

    def _find_resume_point(self) -> resume.ResumePoint | None:
        # An explicit other DATASET_REVISION is refused before the run's lease is taken (a refused start writes
        # nothing), on what the volume and the repo recorded; and again once the bucket's record is adopted too.
        if self.settings.dataset_revision_given:
            dataset_pin.pinned(self.settings, self.state.identity.dataset_revision)
        # MAX_COST counts the earlier attempts' spend from before any wait for the lease (a relaunch after a kill -9
        # may watch the old holder a whole period, billing): the history the volume and the stores hold, then.
        self.bucket, self.new_run, self.lease = job_sync.open_run(
            self.settings, self.state, self.hub, self.scratch(), before_lease=self.attempt.arm_run_budget
        )
        self._data_settings = dataset_pin.pinned(self.settings, self.state.identity.dataset_revision)
        # the bucket's trainbox.json is the newest: its attempts count
        resume.check_crash_loop(self.state.history.attempts)
        if self.settings.run_args.get("resume") is not None:
            return None  # the user drives resume themselves
        return self.training.resume_point()

    def _before_snapshot(self) -> None:
        """The uploader's hook: trainbox.json, the plot and README.md are current in every snapshot."""
        self.attempt.report_progress()
        self.progress.publish(self.hub, self.settings.output_repo)

    def _wrap_up(self) -> WrapUp:
        """The job's end, with what the stages left (job/wrapup.py)."""
        return WrapUp(
            settings=self.settings,
            state=self.state,
            clock=self.clock,
            attempt=self.attempt,
            progress=self.progress,
            notifier=self.notifier,
            trainer=self.trainer,
            uploader=self.uploader,
            hub=self.hub,
            lease=self.lease,
            already_complete=self.already_complete,
            gpu_indices=self._gpu_indices,
            hub_copy=self.hub_copy,
            dashboard=self.dashboard,
        )


def run(settings: Settings) -> int:
    # Before the job reads or writes the run folder: a second agent on this volume is refused having written nothing.
    with volume_lock.held(volume_lock.lock_path(settings.workdir, settings.run_name), settings.run_name):
        return Job(settings).run()
