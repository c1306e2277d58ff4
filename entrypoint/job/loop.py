"""The training stage of a job: the trainer started and watched until it ends (stops, stalls, the stop rule, the
dataset check's verdict, the progress line), and healed in place after an out-of-memory: the same run resumed
from its newest copy with half the batch; several machines never heal in place (``oom.end_of_set``).
"""

from __future__ import annotations

import signal
import time
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Protocol

from ..errors import AgentError, StallError
from ..libreyolo import STATUS_FILE
from ..log import logger
from ..report import dashboard, notify
from ..report.attempt import spend_entry
from ..run_args import RunArgs
from ..state import Phase
from ..sync import job as job_sync
from ..training import extend, monitor, profiling, resume, sizing
from ..training.launch import attempt_output, log_size
from ..training.oom import OomTry, end_of_set
from ..training.process import TrainingProcess, blame_full_disk, error_for_exit, job_command, started

if TYPE_CHECKING:
    from .. import dataset
    from ..gpu.nodes import NodesAgreement
    from ..hub import Hub
    from ..release.clock import ShutdownClock
    from ..report.attempt import Attempt
    from ..report.progress import Progress
    from ..settings import Settings
    from ..state import RunState
    from ..sync.bucket import RunFolder
    from ..sync.lease import RunLease
    from ..sync.uploader import Uploader
    from ..training.launch import Launch


class TrainingJob(Protocol):
    """What the training stage shares with the job (pipeline.py's ``Job``): its settings and records, the stop
    the job's one shutdown path requested, and the trainer that path stops."""

    settings: Settings
    state: RunState
    attempt: Attempt
    progress: Progress
    clock: ShutdownClock
    launch: Launch
    hub: Hub | None
    bucket: RunFolder | None
    lease: RunLease | None
    uploader: Uploader | None
    trainer: TrainingProcess | None
    trainer_live: bool
    stop_cause: AgentError | None
    dataset_check: dataset.DatasetCheck | None
    nodes: NodesAgreement | None
    nccl_env: dict[str, str]
    workers: int
    hub_copy: tuple[int, int] | None
    new_run: bool

    def request_stop(self, error: AgentError) -> None: ...

    def on_signal(self, signum: int, _frame: FrameType | None) -> None: ...

    def scratch(self) -> Path: ...


class TrainingLoop:
    """The training stage of ``job``; ``resume_point`` is where the run resumes from (the resume stage's too)."""

    def __init__(self, job: TrainingJob) -> None:
        self.job = job
        self.dashboard: monitor.Monitor | None = None
        self._log_start = 0  # where the current training's output begins in console.log

    def resume_point(self) -> resume.ResumePoint | None:
        point = resume.find(
            self.job.settings.run_dir,
            self.job.settings.run_args,
            hub=self.job.hub,
            repo_id=self.job.settings.output_repo,
            work_dir=self.job.scratch(),
            # several nodes: every node resumes from the stores alone (the repo at node 0's commit): the same epoch
            volume=not self.job.settings.topology.multi,
            revision=self.job.nodes.revision if self.job.nodes is not None else None,
            bucket=self.job.bucket,
            # a bucket that cannot be read is not an empty one: a run the repo knew ends (73) rather than start over
            run_known=not self.job.new_run,
            read_for=self.job.settings.lease_period / 2,
        )
        if point is not None:
            if point.source == "hub":  # the Hub's own copy is never at risk here (nodes other than 0 keep only it)
                self.job.hub_copy = job_sync.signature(point.checkpoint)
            pinned = (
                {"revision": self.job.nodes.revision} if self.job.nodes is not None and self.job.nodes.revision else {}
            )
            self.job.state.update(
                resume={"from": point.source, "epochs_done": point.completed_epochs, **pinned},
                progress={"epochs_done": point.completed_epochs, "epochs_total": point.total_epochs},
            )
            extend.note(self.job.state, point.checkpoint, point.completed_epochs, point.total_epochs)
        return point

    def train(
        self, data: dataset.PreparedDataset, gpu_indices: tuple[int, ...] | None, point: resume.ResumePoint | None
    ) -> None:
        args = (
            resume.resume_args(self.job.settings.run_args, point) if point is not None else self.job.settings.run_args
        )
        healed = OomTry.healing(self.job.state.history.attempts)
        if healed.batch is not None:  # an earlier attempt ran out of GPU memory: keep its smaller batch
            logger.warning("out of GPU memory before: training with batch=%d", healed.batch)
            args = args.set("batch", str(healed.batch))
        verdict = profiling.profile(self.job.settings, data.data_yaml, gpu_indices)
        if verdict is not None:
            self.job.state.update(profile=verdict)
        while True:
            error = self._train_once(data, gpu_indices, args)
            if error is None:
                return
            args = self._heal(error, args)

    def _heal(self, error: AgentError, args: RunArgs) -> RunArgs:
        """After a failed training: the arguments to resume with (out of GPU memory: half the batch), or raise."""
        assert self.job.trainer is not None
        tail = self.job.trainer.error_tail()
        if self.job.settings.topology.multi:
            raise self._end_of_set(error, args)
        attempt = OomTry.judge(error, tail, self.job.settings, self.job.state.history.attempts, args, self.job.workers)
        self._stop_check()
        point = self.resume_point()
        self._stop_check()  # the lookup may have taken long: a stop meanwhile wins over a new trainer
        if point is None:
            raise error
        logger.warning(
            "%s: resuming after epoch %d with batch=%d", attempt.describe(), point.completed_epochs, attempt.next_batch
        )
        notify.event("self-heal", f"{attempt.describe()}: resumed after epoch {point.completed_epochs}")
        spent = self.job.attempt.close_try()
        self.job.state.history.next_attempt(
            attempt.exit_code, attempt.reason, cost=spend_entry(spent), **attempt.record()
        )
        self.job.state.update(resume={"from": point.source, "epochs_done": point.completed_epochs})
        return resume.resume_args(self.job.settings.run_args, point).set("batch", str(attempt.next_batch))

    def _end_of_set(self, error: AgentError, args: RunArgs) -> AgentError:
        """Several machines never heal in place (oom.end_of_set); this node's and its peers' words decide."""
        output = attempt_output(self.job.settings.run_dir, self._log_start)  # its workers' words, not only rank 0's
        peer = self.job.launch.peer_out_of_memory()
        return end_of_set(
            error, output, peer, self.job.settings, self.job.state.history.attempts, args, self.job.workers
        )

    def _train_once(
        self, data: dataset.PreparedDataset, gpu_indices: tuple[int, ...] | None, args: RunArgs
    ) -> AgentError | None:
        if self.job.attempt.rule.stopped_before():
            return None  # a restart of a run the rule stopped: nothing more to train
        feed = sizing.for_job(self.job.settings, args, gpu_indices, data.data_yaml)  # threads, workers, cache
        command = job_command(self.job.settings, args, data.data_yaml, gpu_indices, extra=feed.args)
        command = self.job.launch.command(command, gpu_indices)
        env = dict(self.job.settings.env) | self.job.nccl_env | self.job.launch.env(gpu_indices) | feed.env
        env |= dashboard.tracker_env(env, self.job.state.identity.run_id)  # loggers=: one tracker run per run
        log_start = self._log_start = log_size(command.run_dir)
        self.job.launch.clear_peer_report()
        self.job.state.update(training=started(command, args), sizing=feed.record)
        try:
            self._stop_check()
            # What resume read is the run's only while this attempt holds it: a freeze since is read past here.
            job_sync.confirm_held(self.job.lease, self.job.uploader, read_for=self.job.settings.lease_period / 2)
            with self.job.clock.holding_signals(lambda signum: self.job.on_signal(signum, None)):
                self.job.trainer = TrainingProcess(command, env)
                self.job.trainer_live = True
            self.job.state.update(training={"pid": self.job.trainer.pid})
            code = self.job.trainer.wait(poll=self._watch_training)
            if (
                self.job.dataset_check is not None and self.job.stop_cause is None
            ):  # training ended first: the check decides
                self._dataset_checked()
        finally:
            if self.dashboard is not None:
                self.dashboard.stop(grace=0.0 if self.job.clock.preempted else 3.0)
                self.dashboard = None  # a resumed training (smaller batch) starts its own
        if self.job.stop_cause is not None:
            self._stop_trainer()
            raise self.job.stop_cause
        self.job.trainer_live = False
        self._stop_check()  # a stop that came just before the flag fell was only recorded
        if self.job.attempt.rule.stopped:
            return None  # stopped by the rule at a boundary (whatever the code the SIGINT left): finished
        error = self.job.launch.lost_peer(code, command.run_dir, log_start)
        error = error or error_for_exit(code, self.job.trainer.error_tail())
        return blame_full_disk(error, self.job.settings.run_dir, self.job.trainer.saw_no_space)

    def _watch_training(self) -> None:
        """Called every half second while training runs: act on stop requests and stalls."""
        assert self.job.trainer is not None
        if self.job.stop_cause is not None:
            self._stop_trainer()
            raise self.job.stop_cause
        if self.job.dataset_check is not None and self.job.dataset_check.done():
            self._dataset_checked()
        self.job.attempt.report_progress()
        if self.job.attempt.rule.at_boundary(lambda record: self.job.state.update(stop_rule=record)):
            self.job.trainer.child.send(signal.SIGINT)  # libreyolo leaves the next epoch, writing nothing
        self.job.progress.tick(publish=self.job.uploader is None)
        if self.job.settings.monitor and self.dashboard is None and (self.job.settings.run_dir / STATUS_FILE).exists():
            self.dashboard = monitor.start(self.job.settings)  # libreyolo monitor wants a run to show
        limit = self.job.settings.stall_timeout
        if limit and time.monotonic() - self.job.attempt.last_progress(self.job.trainer.last_activity) > limit:
            self.job.request_stop(
                StallError(
                    f"no sign of progress (output, epoch, CPU, GPU, files) for {limit:.0f} s",
                    "see console.log; raise STALL_TIMEOUT",
                )
            )

    def _dataset_checked(self) -> None:
        """The background dataset check's verdict: training goes on, or is stopped at once."""
        check, self.job.dataset_check = self.job.dataset_check, None
        assert check is not None
        try:
            check.result()
        except AgentError as error:
            self.job.request_stop(error)  # the training loop (or _train, once it ended) stops the child
            return
        self.job.state.set_phase(Phase.TRAINING)

    def _stop_check(self) -> None:
        """Raise the stop requested meanwhile, if any (a heal checks it between its steps)."""
        if self.job.stop_cause is not None:
            raise self.job.stop_cause

    def _stop_trainer(self) -> None:
        assert self.job.trainer is not None
        self.job.trainer.stop(signal.SIGINT, self.job.clock.child_grace())
