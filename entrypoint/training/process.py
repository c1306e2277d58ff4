"""Build the ``libreyolo train`` command and run it as a supervised child process.

The child's output is streamed to the console and kept in the run folder (``console.log``),
both scrubbed of secrets. Its exit code is mapped to the agent's typed errors.
"""

from __future__ import annotations

import contextlib
import errno
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO

from .. import errors, libreyolo
from ..errors import AgentError, ConfigError
from ..log import logger, redact_bytes
from ..procs import Child
from ..run_args import RunArgs
from ..state import STATE_FILE
from .liveness import Liveness

if TYPE_CHECKING:
    from ..settings import Settings

CONSOLE_LOG = "console.log"
# Files the agent itself writes in the run folder: not a sign that training progresses.
_AGENT_FILES = frozenset({CONSOLE_LOG, STATE_FILE})
LIVENESS_INTERVAL = 1.0
PUMP_JOIN = 5.0
# Below this much free space a failed write of a checkpoint is the disk's fault, not the training's.
FULL_DISK_BYTES = 64 * 1024 * 1024
_NO_SPACE = (b"No space left on device", b"ENOSPC", b"Disk quota exceeded")


@dataclass(frozen=True)
class TrainCommand:
    argv: tuple[str, ...]
    cwd: Path
    run_dir: Path


def device_arg(gpu_indices: tuple[int, ...] | None) -> str:
    """LibreYOLO's ``device``: ``cpu``, or the GPU indices (several → its own DDP launch)."""
    return "cpu" if not gpu_indices else ",".join(map(str, gpu_indices))


def check_batch(args: RunArgs, workers: int, what: str = "GPUs") -> None:
    """A fixed global batch must split evenly across the workers (libreyolo refuses it later)."""
    batch = args.get("batch")
    if workers > 1 and batch is not None and int(batch) > 0 and int(batch) % workers:
        raise ConfigError(
            f"RUN_ARGS batch={batch} does not divide by the {workers} {what}",
            f"use a multiple of {workers}, or batch=-1 to size it automatically",
        )


def build_command(
    args: RunArgs,
    *,
    data_yaml: Path,
    workdir: Path,
    run_name: str,
    device: str,
    extra: RunArgs | None = None,
    libreyolo_command: str | None = None,
) -> TrainCommand:
    """The argv for ``libreyolo train``: the user's options, then the keys the agent owns."""
    merged = args
    for key, value in (extra or RunArgs()).pairs:
        merged = merged.set(key, value)
    owned = [
        f"data={data_yaml}",
        f"project={workdir / 'runs'}",
        f"name={run_name}",
        "exist_ok=true",
        f"device={device}",
    ]
    argv = (libreyolo.executable(libreyolo_command), "train", *merged.argv(), *owned)
    # cwd on the volume: libreyolo downloads bare weight names into ./weights/.
    return TrainCommand(argv=argv, cwd=workdir, run_dir=workdir / "runs" / run_name)


def job_command(
    settings: Settings, args: RunArgs, data_yaml: Path, gpu_indices: tuple[int, ...] | None, extra: RunArgs
) -> TrainCommand:
    """This job's ``libreyolo train`` on one machine: its run folder, its GPUs (``build_command``)."""
    return build_command(
        args,
        data_yaml=data_yaml,
        workdir=settings.workdir,
        run_name=settings.run_name,
        device=device_arg(gpu_indices),
        extra=extra,
        libreyolo_command=settings.libreyolo_command,
    )


def started(command: TrainCommand, args: RunArgs) -> dict[str, Any]:
    """trainbox.json's ``training`` as a training starts: the arguments libreyolo got, when, its batch."""
    batch = args.get("batch")
    return {"argv": list(command.argv[1:]), "started_at": time.time()} | (
        {"batch": int(batch)} if batch is not None and batch.isdigit() else {}
    )


def error_for_exit(code: int, tail: str) -> AgentError | None:
    """libreyolo's exit codes (its cli/errors.py) → the agent's errors; None for success."""
    detail = f": {tail}" if tail else ""
    match code:
        case libreyolo.EXIT_OK:
            return None
        case libreyolo.EXIT_BAD_OPTIONS:
            return errors.TrainingConfigError(f"libreyolo refused the training options{detail}", "fix RUN_ARGS")
        case libreyolo.EXIT_BAD_DATASET:
            return errors.DatasetInvalidError(
                f"libreyolo could not use the dataset{detail}",
                "check the data.yaml paths and labels (libreyolo doctor)",
            )
        case libreyolo.EXIT_BAD_MODEL:
            return errors.ModelError(f"libreyolo could not load the model{detail}", "check model= in RUN_ARGS")
        case libreyolo.EXIT_INTERRUPTED:
            return errors.UserInterruptError("training was interrupted")
        case _ if code < 0:
            return errors.TrainingError(f"training was killed by {signal.Signals(-code).name}{detail}")
        case _:
            return errors.TrainingError(f"training failed (libreyolo exit {code}){detail}", "see console.log")


def blame_full_disk(error: AgentError | None, run_dir: Path, saw_no_space: bool) -> AgentError | None:
    """A training that crashed on a full disk (it could not write last.pt) gets the disk error,
    whose fix is room, not the training's; any other outcome is kept as it is."""
    if type(error) is not errors.TrainingError:  # success, refused options, bad data: not the disk
        return error
    try:
        free = shutil.disk_usage(run_dir).free
    except OSError:
        free = None
    if not saw_no_space and (free is None or free >= FULL_DISK_BYTES):
        return error
    room = "" if free is None else f" ({free // (1024 * 1024)} MiB free)"
    return errors.DiskSpaceError(
        f"the disk of WORKDIR filled up during training: it could not write its checkpoints{room}",
        f"free space in {run_dir.parent.parent}, or rent a bigger disk; the next start resumes where it stopped",
    )


class TrainingProcess:
    """``libreyolo train`` running beside the agent.

    ``last_activity`` (monotonic) feeds the stall guard: the last output line or other sign of
    progress (CPU, GPU, files written; see ``liveness``). ``unreaped`` and ``pump_stuck`` record
    waits that ran out of their bound (a child stuck in the kernel, a pipe held open)."""

    def __init__(self, command: TrainCommand, env: Mapping[str, str], echo: BinaryIO | None = None) -> None:
        command.run_dir.mkdir(parents=True, exist_ok=True)
        env = {**env, "PYTHONUNBUFFERED": "1"}
        self.command = command
        self.last_activity = time.monotonic()
        self.pump_stuck = False
        self.saw_no_space = False  # the child said its disk was full (ENOSPC), or console.log could not be written
        self._log_failing = False
        self._activity_lock = threading.Lock()  # the output pump and the liveness watcher both report
        self._tail: list[str] = []
        self._echo = echo if echo is not None else sys.stdout.buffer
        self._log = open(command.run_dir / CONSOLE_LOG, "ab")  # noqa: SIM115 - closed by the pump
        try:
            self.child = Child(command.argv, cwd=command.cwd, env=env, label="training")
        except BaseException:
            self._log.close()
            raise
        try:
            self._ended = threading.Event()
            self._pump = threading.Thread(target=self._forward_output, name="training-output", daemon=True)
            self._pump.start()
            self._liveness = Liveness(self.child.pid, command.run_dir, _AGENT_FILES)
            self._watcher = threading.Thread(target=self._watch_liveness, name="training-liveness", daemon=True)
            self._watcher.start()
        except BaseException:
            # Started, then left without an owner: nobody would ever stop it (a machine kept busy).
            self.child.stop(signal.SIGKILL, grace=0.0)
            raise

    @property
    def pid(self) -> int:
        return self.child.pid

    @property
    def unreaped(self) -> bool:
        """SIGKILLed and still not gone: left behind (record it; the release ends the machine)."""
        return self.child.unreaped

    def _active(self, at: float) -> None:
        with self._activity_lock:
            self.last_activity = max(self.last_activity, at)

    def _watch_liveness(self) -> None:
        while not self._ended.wait(LIVENESS_INTERVAL) and self.child.poll() is None:
            try:
                sign = self._liveness.sample()
            except Exception as error:  # a failed look is no progress, and never ends training
                logger.debug("liveness: %s", error)
                continue
            if sign is not None:
                self._active(sign)

    def _forward_output(self) -> None:
        stream = self.child.process.stdout
        assert stream is not None
        try:
            for line in iter(stream.readline, b""):
                self._active(time.monotonic())
                if any(marker in line for marker in _NO_SPACE):
                    self.saw_no_space = True
                clean = redact_bytes(line)
                self._write_log(clean)
                try:
                    self._echo.write(clean)
                    self._echo.flush()
                except (OSError, ValueError):
                    pass  # a closed console must not stop the log
                text = clean.decode(errors="replace").strip()
                if text:
                    self._tail = [*self._tail[-19:], text]
        finally:
            with contextlib.suppress(OSError):  # its last flush may meet the same full disk
                self._log.close()
            stream.close()  # here, by its only reader: a pipe left to the garbage collector warns

    def _write_log(self, data: bytes) -> None:
        """Into console.log; a failed write (a full disk) costs only the log, never the reader: a pipe
        nobody drains would block the trainer at its next 64 KB of output. Tried again line by line."""
        try:
            self._log.write(data)
            self._log.flush()
        except (OSError, ValueError) as error:
            if isinstance(error, OSError) and error.errno in (errno.ENOSPC, errno.EDQUOT):
                self.saw_no_space = True  # the disk's fault if training fails now
            if not self._log_failing:
                self._log_failing = True
                logger.warning("cannot write %s (%s): the training output goes on unlogged", CONSOLE_LOG, error)
            return
        if self._log_failing:
            self._log_failing = False
            logger.info("writing %s again", CONSOLE_LOG)

    def _join_pump(self) -> None:
        """The output pump ends when every holder of the pipe is gone; an orphan may keep it open."""
        self._ended.set()
        self._pump.join(timeout=PUMP_JOIN)
        if self._pump.is_alive() and not self.pump_stuck:
            self.pump_stuck = True
            logger.warning("training output: the pipe is still held open %.0f s after the exit; not waiting", PUMP_JOIN)

    def error_tail(self) -> str:
        """The most telling recent line of output, for one-line error messages."""
        for line in reversed(self._tail):
            lowered = line.lower()
            if "error" in lowered or "exception" in lowered or "failed" in lowered:
                return line[-300:]
        return self._tail[-1][-300:] if self._tail else ""

    def wait(self, poll: Callable[[], None] | None = None, interval: float = 0.5) -> int:
        """Wait for the child, calling ``poll`` (deadline and stall checks) between waits."""
        while True:
            try:
                code = self.child.wait(timeout=interval)
                break
            except subprocess.TimeoutExpired:
                if poll is not None:
                    poll()
        self._join_pump()
        return code

    def stop(self, first: int = signal.SIGINT, grace: float = 10.0) -> int:
        """Stop the child (bounded: see ``Child.stop``); ``-SIGKILL`` when it could not be reaped."""
        code = self.child.stop(first, grace)
        self._join_pump()
        return code
