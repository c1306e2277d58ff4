"""A stop (SIGTERM, Ctrl-C, MAX_RUNTIME, MAX_COST, a stall) is never swallowed by a broad handler.

The job's signal handler raises the stop in the main thread, inside whatever call is running: an
``except Exception`` around that call would log it and carry on, and the machine keeps billing.
So every broad handler in the package (``except Exception``/``BaseException``/bare, and
``contextlib.suppress`` of either) either handles the stop family first, re-raises whatever
it caught, or sits where no stop can be raised (a worker thread, a child process, the wrap-up):
listed below with the reason. A new broad handler fails this test until it is one of those.
"""

from __future__ import annotations

import ast
import os
import signal
import time
from pathlib import Path
from typing import Any, cast

import pytest

import entrypoint
from entrypoint import pipeline, retry, settings
from entrypoint.errors import DeadlineError, PreemptedError, StopRequested
from entrypoint.sync import checkpoint
from entrypoint.sync import uploader as sync

PACKAGE = Path(entrypoint.__file__).parent
BROAD = {"Exception", "BaseException"}
# A handler for one of these before the broad one deals with the stop family on purpose (re-raises or ends the job).
STOP_CATCHERS = {"StopRequested", "AgentError", "PreemptedError", "STOP_REQUESTS"}
_THREAD = "a worker thread: the signal handler raises stops in the main thread only"
_CHILD = "a child process of its own: the agent's signal handlers are not installed there"
_WRAP_UP = "runs once the job is finishing (or released): a stop is then only recorded, never raised"
_TRAINING = "main thread only while the trainer runs (a stop is then only recorded), else the uploader's thread"
# (file relative to the package, qualified function) → why no stop can reach its broad handlers
NO_STOP_HERE = {
    ("sync/snapshot.py", "Snapshotter._snapshot_loop"): _THREAD,
    ("sync/snapshot.py", "Snapshotter.snapshot"): "called by the snapshot thread only",
    ("sync/snapshot.py", "Snapshotter._pass"): "called by the snapshot thread only",
    ("sync/snapshot.py", "Snapshotter._stage_again"): "called by the snapshot thread only",
    ("sync/committer.py", "step"): "one turn of a committer thread (or of the protocol simulation's scheduler)",
    ("sync/lease.py", "RunLease.tick"): "one turn of the heartbeat thread (or of the protocol simulation's scheduler)",
    ("sync/committer.py", "Committers._commit_pending"): "the committer thread",
    ("sync/committer.py", "Committers._landed"): "the committer thread",
    ("training/process.py", "TrainingProcess._watch_liveness"): _THREAD,
    ("report/remote.py", "fetch_remote_state.look"): "a look's thread: what it raises is raised again by its caller",
    ("release/end.py", "_publish"): _WRAP_UP,
    ("report/epochs.py", "EpochLog.tick"): _TRAINING,
    ("report/progress.py", "Progress.publish"): _TRAINING,
    ("report/page.py", "CardPage.maybe_plot"): _TRAINING,
    ("report/page.py", "CardPage.load_base"): _TRAINING,
    ("report/progress.py", "Progress.finished"): _WRAP_UP,
    ("report/progress.py", "Progress._finished"): _WRAP_UP,
    ("dataset/writers.py", "Writers._work"): _THREAD,
    ("report/dashboard.py", "Dashboard._run"): _THREAD,
    ("report/dashboard.py", "Dashboard._prepare"): "the dashboard thread",
    ("report/dashboard.py", "Dashboard._send"): "the dashboard thread",
    ("dataset/hub_reads.py", "xet_stream_dataset_file.produce"): _THREAD,
    ("dataset/hub_reads.py", "stream_dataset_file"): "consumed by the dataset-download thread (_Download)",
    ("dataset/fetch.py", "_Download.run"): _THREAD,
    ("dataset/parquet.py", "Prefetch.run"): _THREAD,
    ("cli.py", "end_process"): "the process's last step: the job is finished, a stop is only recorded",
    ("job/wrapup.py", "WrapUp._deliver"): _WRAP_UP,
    ("release/providers.py", "_within.bounded.attempt"): _THREAD,
    ("gpu/probe.py", "*"): _CHILD,
    ("gpu/bench.py", "*"): "imported by the GPU check's child process only",
    ("gpu/nodes_probe.py", "*"): _CHILD,
    ("xet/child.py", "main"): _CHILD,
    ("xet/child.py", "_ahead_main"): _CHILD,
    ("report/notify.py", "Notifier._deliver"): _THREAD,
}


def _names(node: ast.expr | None) -> set[str]:
    if node is None:
        return {"<bare>"}
    if isinstance(node, ast.Tuple):
        return set().union(*(_names(item) for item in node.elts))
    if isinstance(node, ast.Attribute):
        return {node.attr}
    if isinstance(node, ast.Name):
        return {node.id}
    return set()


def _reraises(handler: ast.ExceptHandler) -> bool:
    """The handler ends by raising what it caught, whatever happens before."""
    last = handler.body[-1]
    return isinstance(last, ast.Raise) and (
        last.exc is None or (isinstance(last.exc, ast.Name) and last.exc.id == handler.name)
    )


class _Scan(ast.NodeVisitor):
    def __init__(self, relative: str) -> None:
        self.relative = relative
        self.scope: list[str] = []
        self.found: list[tuple[str, int, str]] = []  # (qualified function, line, what)
        self.used: set[tuple[str, str]] = set()

    def _function(self, node: ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef) -> None:
        self.scope.append(node.name)
        self.generic_visit(node)
        self.scope.pop()

    visit_FunctionDef = visit_AsyncFunctionDef = visit_ClassDef = _function

    def _allowed(self) -> bool:
        for key in ((self.relative, ".".join(self.scope)), (self.relative, "*")):
            if key in NO_STOP_HERE:
                self.used.add(key)
                return True
        return False

    def visit_Try(self, node: ast.Try) -> None:
        lets_stops_through = False
        for handler in node.handlers:
            caught = _names(handler.type)
            if caught & STOP_CATCHERS:  # the stop family is handled on purpose before the broad handler
                lets_stops_through = True
            broad = caught & (BROAD | {"<bare>"})
            if broad and not lets_stops_through and not _reraises(handler) and not self._allowed():
                self.found.append((".".join(self.scope), handler.lineno, f"except {'/'.join(sorted(broad))}"))
        self.generic_visit(node)

    visit_TryStar = visit_Try

    def visit_Call(self, node: ast.Call) -> None:
        func = node.func
        suppressed: set[str] = set().union(*map(_names, node.args))
        if isinstance(func, ast.Attribute) and func.attr == "suppress" and suppressed & BROAD and not self._allowed():
            self.found.append((".".join(self.scope), node.lineno, "contextlib.suppress(Exception)"))
        self.generic_visit(node)


def _scan_package() -> tuple[list[str], set[tuple[str, str]]]:
    problems: list[str] = []
    used: set[tuple[str, str]] = set()
    for path in sorted(PACKAGE.rglob("*.py")):
        relative = path.relative_to(PACKAGE).as_posix()
        scan = _Scan(relative)
        scan.visit(ast.parse(path.read_text(), str(path)))
        problems += [f"{relative}:{line} in {function or '<module>'}: {what}" for function, line, what in scan.found]
        used |= scan.used
    return problems, used


def test_no_broad_handler_can_swallow_a_stop() -> None:
    problems, _ = _scan_package()
    assert not problems, (
        "a broad handler where a stop can be raised swallows it: add `except StopRequested: raise` before it, "
        "or list the function in NO_STOP_HERE with the reason no stop reaches it:\n" + "\n".join(problems)
    )


def test_every_exception_to_the_rule_still_exists() -> None:
    _, used = _scan_package()
    assert set(NO_STOP_HERE) <= used, f"stale entries: {sorted(set(NO_STOP_HERE) - used)}"


def test_the_scan_finds_a_new_member_of_the_family() -> None:
    source = (
        "def fetch():\n    try:\n        work()\n    except Exception:\n        pass\n"
        "def guarded():\n    try:\n        work()\n    except StopRequested:\n        raise\n"
        "    except Exception:\n        pass\n"
        "def quiet():\n    with contextlib.suppress(BaseException):\n        work()\n"
    )
    scan = _Scan("new.py")
    scan.visit(ast.parse(source))
    assert [(function, what) for function, _, what in scan.found] == [
        ("fetch", "except Exception"),
        ("quiet", "contextlib.suppress(Exception)"),
    ]


# -- one test per site: the stop raised inside the call comes out of it -------------------------
class _StoppingHub:
    """The Hub call during which the signal handler raises (the Hub was answering 503, say)."""

    def head(self, repo_id: str) -> str | None:
        raise PreemptedError("received SIGTERM")


def test_a_stop_while_the_uploader_reads_its_ledger_is_not_swallowed(tmp_path: Path) -> None:
    uploader = sync.Uploader(cast(Any, _StoppingHub()), "org/run", tmp_path / "run", tmp_path / "work")
    with pytest.raises(PreemptedError):
        uploader.start()
    assert not uploader._threads, "the uploader went on starting after the stop"


def test_a_stop_while_a_checkpoint_is_inspected_is_not_a_bad_checkpoint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import zipfile

    path = tmp_path / "last.pt"
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("last/data.pkl", b"\x80\x02}q\x00.")

    def stopped(self: Any) -> Any:
        raise DeadlineError("MAX_RUNTIME (60 s) expired")

    monkeypatch.setattr(checkpoint._SafeUnpickler, "load", stopped)
    with pytest.raises(DeadlineError):
        checkpoint.inspect(path)


def test_a_stop_during_a_retried_call_is_never_retried() -> None:
    calls: list[int] = []

    def call() -> None:
        calls.append(1)
        raise PreemptedError("received SIGTERM")

    with pytest.raises(PreemptedError):
        retry.call_with_retries(
            call, retry.RetryPolicy(attempts=5, sleep=lambda _: None), retryable=lambda _: True, describe=str
        )
    assert len(calls) == 1


def test_a_later_signal_still_stops_a_job_whose_first_stop_was_swallowed(tmp_path: Path) -> None:
    env = {"WORKDIR": str(tmp_path), "GPUS": "cpu", "RUN_NAME": "stops", "PROVIDER": "none", "MAX_RUNTIME": "60"}
    job = pipeline.Job(settings.from_env(env))
    with pytest.raises(DeadlineError):  # swallowed by some library that catches everything
        job.on_signal(signal.SIGALRM, None)
    with pytest.raises(PreemptedError):  # the SIGTERM after it: raised again, and it rules now
        job.on_signal(signal.SIGTERM, None)
    with pytest.raises(PreemptedError):
        job.on_signal(signal.SIGTERM, None)
    assert isinstance(job.stop_cause, StopRequested) and job.clock.deadline is not None
    assert os.getpid()  # the job's handlers were never installed here: nothing to restore


def test_a_status_json_dated_in_the_future_never_delays_the_stall_guard(tmp_path: Path) -> None:
    env = {"WORKDIR": str(tmp_path), "GPUS": "cpu", "RUN_NAME": "stall", "PROVIDER": "none"}
    job = pipeline.Job(settings.from_env(env))
    quiet = time.monotonic() - 1000  # the trainer's last output
    status = job.settings.run_dir / "status.json"
    status.parent.mkdir(parents=True, exist_ok=True)
    status.write_text("{}")
    os.utime(status, (time.time() + 3600, time.time() + 3600))  # the volume's clock is an hour ahead
    first = job.attempt.last_progress(quiet)
    assert first <= time.monotonic(), "a boundary dated in the future counts as progress to come"
    time.sleep(0.2)
    assert job.attempt.last_progress(quiet) == first, "an unchanged status.json is no new progress"


def test_a_stop_raised_while_a_failure_is_handled_still_ends_through_the_release(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The signal handler raises in whatever runs: even the job's own ``except`` block that records a failure."""
    env = {"WORKDIR": str(tmp_path), "GPUS": "cpu", "RUN_NAME": "late", "PROVIDER": "none"}
    job = pipeline.Job(settings.from_env(env))

    def broken(*_: Any, **__: Any) -> None:
        raise RuntimeError("a bug in a stage")

    def signal_while_logging(*_: Any, **__: Any) -> None:
        job.on_signal(signal.SIGTERM, None)  # SIGTERM lands while the failure is being logged

    finished: list[Any] = []
    monkeypatch.setattr(pipeline.resume, "check_crash_loop", broken)
    monkeypatch.setattr(pipeline.logger, "exception", signal_while_logging)

    class Ending:  # the job's end (job/wrapup.py), recorded instead of run
        def finish(self, outcome: Any) -> int:
            finished.append(outcome)
            return 143

    monkeypatch.setattr(job, "_wrap_up", Ending)
    assert job.run() == 143
    assert len(finished) == 1 and isinstance(finished[0], PreemptedError), "the end (and its release) still ran"
    assert job._finishing
