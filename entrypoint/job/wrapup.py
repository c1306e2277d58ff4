"""The end of a job, whatever ended it: trainbox.json's outcome, a finished run's deliverables (the EXPORT formats
and config.json), the final upload, the notice, then the release (exit, stop or destroy) and the receipt last.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .. import libreyolo
from ..errors import AgentError
from ..evaluation import end as evaluation
from ..export import hubconfig
from ..export import run as exports
from ..libreyolo import BEST_CHECKPOINT
from ..log import logger
from ..release.clock import PUBLISH_TIMEOUT, ShutdownClock
from ..release.end import end_of_job
from ..report.nextsteps import summary
from ..state import Phase
from ..sync import job as job_sync

if TYPE_CHECKING:
    from ..hub import Hub
    from ..report.attempt import Attempt
    from ..report.dashboard import Dashboard
    from ..report.notify import Notifier
    from ..report.progress import Progress
    from ..settings import Settings
    from ..state import RunState
    from ..sync.lease import RunLease
    from ..sync.uploader import Uploader
    from ..training.process import TrainingProcess

DASHBOARD_SECONDS = 1.0  # TRACKIO's at the end: what it has not sent by then is said and dropped


@dataclass(kw_only=True)
class WrapUp:
    """What the job's end works with, as the stages left it."""

    settings: Settings
    state: RunState
    clock: ShutdownClock
    attempt: Attempt
    progress: Progress
    notifier: Notifier
    trainer: TrainingProcess | None
    uploader: Uploader | None
    hub: Hub | None
    lease: RunLease | None
    already_complete: bool
    gpu_indices: tuple[int, ...] | None  # the GPUs trained on (None: the CPU): exports use the first
    hub_copy: tuple[int, int] | None  # size, mtime of the checkpoint resume copied from the Hub
    dashboard: Dashboard | None = None  # TRACKIO: given a second after the final upload, never more

    def finish(self, outcome: AgentError | None) -> int:
        """The job's end: its record, a finished run's deliverables, the final upload, the release; the exit code."""
        self.state.set_phase(Phase.FINISHING)
        if self.trainer is not None:
            self.attempt.report_progress(again=True)
            if self.trainer.unreaped or self.trainer.pump_stuck:  # a child stuck in the kernel was left behind
                self.state.update(training={"unreaped": self.trainer.unreaped, "pump_stuck": self.trainer.pump_stuck})
        if self.uploader is not None:
            self.state.update(sync=job_sync.report(self.uploader))
        phase, code = self.attempt.end(outcome, already_complete=self.already_complete)
        if phase is Phase.DONE and code == 0:
            self._deliver()
        synced: dict[str, Any] | None = None
        if self.uploader is not None:
            code = job_sync.final(
                self.uploader, self.state, self.settings, self.hub, phase, code, self.clock.remaining()
            )
            # What the Hub holds as the final upload returned, for the end message: the exit confirmed next
            # changes trainbox.json again, which the release publishes, and is not a file the Hub lacks.
            synced = job_sync.report(self.uploader)
        if self.dashboard is not None:  # after the final upload: the epochs it kept are the last to log
            self.dashboard.finish(self.clock.remaining(DASHBOARD_SECONDS))  # a second, less under a SIGTERM's bound
        self.state.history.confirm_exit()
        summary(self.settings, phase, outcome, self.clock.elapsed(), self.state.snapshot()["cost"])
        self.notifier.ended(self.clock, synced)
        try:
            release_code = end_of_job(self.settings, self.state, failed=code != 0, publish=self.publish_state)
            if self.lease is not None:  # after the last write: the next container takes the run at once
                self.lease.release(time.monotonic() + min(10.0, self.clock.remaining()))
        finally:
            if self.uploader is not None:
                self.uploader.stop(timeout=min(5.0, self.clock.remaining()))
            self.notifier.settle(self.clock)
        self.progress.finished()  # the receipt into trainbox.json; the summary and the receipt are the last lines
        return code if release_code is None else release_code

    def _deliver(self) -> None:
        """A finished run's deliverables beside best.pt, before the final publish: the EXPORT formats, each checked,
        and config.json. Never fails the run: the weights are the product."""
        if not self.settings.topology.leader:
            return
        # A start that finds the run already trained delivers only what the earlier attempts did not settle (one
        # killed during its exports): it carried their dataset and settled records over (export.run.carried),
        # so the card keeps listing them.
        snapshot = self.state.snapshot()
        done = exports.settled(snapshot, self.settings) if self.already_complete else {}
        todo = tuple(name for name in self.settings.export if name not in done)
        found = (snapshot.get("dataset") or {}).get("data_yaml")
        data_yaml = Path(found) if isinstance(found, str) else None
        # Another volume's start has neither best.pt nor the dataset: what the repo holds stays as it is.
        best = self.settings.run_dir / BEST_CHECKPOINT
        on_volume = best.is_file() and data_yaml is not None and data_yaml.is_file()
        # A run trained by this start is scored; one found trained, unless an earlier start settled it.
        unscored = self.settings.evaluate and not (
            self.already_complete and evaluation.settled(snapshot, self.settings.run_dir)
        )
        if self.already_complete and not ((todo or unscored) and on_volume):
            return
        try:
            made: dict[str, dict[str, Any]] = dict(done)
            scorer = self._scorer(data_yaml) if data_yaml is not None and (todo or unscored) else None
            if todo:
                made |= exports.export_all(
                    self.settings,
                    self.state,
                    device=self._device(),
                    stopping=lambda: self.clock.preempted,
                    data_yaml=data_yaml,
                    names=todo,
                    judge=None if scorer is None else scorer.judge,
                )
            if scorer is not None:
                scorer.finish(made)
            if self.settings.output_repo is not None:
                hubconfig.write(self.settings.run_dir, self.settings.run_args, data_yaml, made)
        except Exception as error:  # an export is a courtesy: never the run's failure
            logger.warning("export: stopped: %s: %s", type(error).__name__, error)
            self.state.update(exports={"error": f"{type(error).__name__}: {error}"})

    def _device(self) -> str:
        return "cpu" if self.gpu_indices is None else str(self.gpu_indices[0])

    def _scorer(self, data_yaml: Path) -> evaluation.Scorer:
        """best.pt and each export scored on the held-out split (evaluation/end.py), in a child process."""
        from ..runtimes import fetch as runtimes

        job = evaluation.Job(
            executable=libreyolo.executable(self.settings.libreyolo_command),
            run_dir=self.settings.run_dir,
            scratch=self.settings.agent_dir / "evaluation",
            data_yaml=data_yaml,
            imgsz=self.settings.run_args.get("imgsz"),
            device=self._device(),
            env=runtimes.child_env(self.settings.env),
            revision=(self.state.snapshot().get("dataset") or {}).get("revision"),
            stopping=lambda: self.clock.preempted,
            best=BEST_CHECKPOINT,
            **({"raw_check": (self.settings.raw_check,)} if self.settings.raw_check else {}),
        )
        return evaluation.Scorer(job, lambda found: self.state.update(evaluation=found))

    def publish_state(self) -> bool:
        """The release's question: does the Hub hold every completed epoch of this volume?"""
        timeout = self.clock.remaining(PUBLISH_TIMEOUT)
        return job_sync.hub_holds_everything(self.uploader, self.settings, self.hub_copy, timeout)
