"""Build the ``libreyolo train`` command and run it as a supervised child process.

The child's output is streamed to the console and kept in the run folder (``console.log``),
both scrubbed of secrets. Its exit code is mapped to the agent's typed errors.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from . import errors
from .errors import AgentError, ConfigError
from .log import redact_bytes
from .procs import Child
from .run_args import RunArgs

CONSOLE_LOG = "console.log"


@dataclass(frozen=True)
class TrainCommand:
    argv: tuple[str, ...]
    cwd: Path
    run_dir: Path


def libreyolo_executable() -> str:
    """``TRAINBOX_LIBREYOLO``, else the ``libreyolo`` script of this interpreter's environment, else PATH's."""
    override = os.environ.get("TRAINBOX_LIBREYOLO")  # a stand-in command (tests, wrappers)
    if override:
        return override
    beside = Path(sys.executable).parent / "libreyolo"
    if beside.is_file():
        return str(beside)
    found = shutil.which("libreyolo")
    if found is None:
        raise ConfigError("the libreyolo command is not installed", "install it: pip install libreyolo")
    return found


def device_arg(gpu_indices: tuple[int, ...] | None) -> str:
    """LibreYOLO's ``device``: ``cpu``, or the GPU indices (several → its own DDP launch)."""
    return "cpu" if not gpu_indices else ",".join(map(str, gpu_indices))


def check_batch(args: RunArgs, gpu_count: int) -> None:
    """A fixed global batch must split evenly across the GPUs (libreyolo refuses it later)."""
    batch = args.get("batch")
    if gpu_count > 1 and batch is not None and int(batch) > 0 and int(batch) % gpu_count:
        raise ConfigError(
            f"RUN_ARGS batch={batch} does not divide by the {gpu_count} GPUs",
            f"use a multiple of {gpu_count}, or batch=-1 to size it automatically",
        )


def build_command(
    args: RunArgs, *, data_yaml: Path, workdir: Path, run_name: str, device: str, extra: RunArgs | None = None
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
    argv = (libreyolo_executable(), "train", *merged.argv(), *owned)
    # cwd on the volume: libreyolo downloads bare weight names into ./weights/.
    return TrainCommand(argv=argv, cwd=workdir, run_dir=workdir / "runs" / run_name)


def error_for_exit(code: int, tail: str) -> AgentError | None:
    """libreyolo's exit codes (its cli/errors.py) → the agent's errors; None for success."""
    detail = f": {tail}" if tail else ""
    match code:
        case 0:
            return None
        case 2:
            return errors.TrainingConfigError(f"libreyolo refused the training options{detail}", "fix RUN_ARGS")
        case 3:
            return errors.DatasetInvalidError(
                f"libreyolo could not use the dataset{detail}",
                "check the data.yaml paths and labels (libreyolo doctor)",
            )
        case 4:
            return errors.ModelError(f"libreyolo could not load the model{detail}", "check model= in RUN_ARGS")
        case 130:
            return errors.UserInterruptError("training was interrupted")
        case _ if code < 0:
            return errors.TrainingError(f"training was killed by {signal.Signals(-code).name}{detail}")
        case _:
            return errors.TrainingError(f"training failed (libreyolo exit {code}){detail}", "see console.log")


class TrainingProcess:
    """``libreyolo train`` running beside the agent. ``last_activity`` feeds the stall guard."""

    def __init__(self, command: TrainCommand, env: dict[str, str], echo: BinaryIO | None = None) -> None:
        command.run_dir.mkdir(parents=True, exist_ok=True)
        env = {**env, "PYTHONUNBUFFERED": "1"}
        self.command = command
        self.last_activity = time.monotonic()
        self._tail: list[str] = []
        self._echo = echo if echo is not None else sys.stdout.buffer
        self._log = open(command.run_dir / CONSOLE_LOG, "ab")  # noqa: SIM115 - closed by the pump
        self.child = Child(command.argv, cwd=command.cwd, env=env)
        self._pump = threading.Thread(target=self._forward_output, name="training-output", daemon=True)
        self._pump.start()

    @property
    def pid(self) -> int:
        return self.child.pid

    def _forward_output(self) -> None:
        stream = self.child.process.stdout
        assert stream is not None
        try:
            for line in iter(stream.readline, b""):
                self.last_activity = time.monotonic()
                clean = redact_bytes(line)
                self._log.write(clean)
                self._log.flush()
                try:
                    self._echo.write(clean)
                    self._echo.flush()
                except (OSError, ValueError):
                    pass  # a closed console must not stop the log
                text = clean.decode(errors="replace").strip()
                if text:
                    self._tail = [*self._tail[-19:], text]
        finally:
            self._log.close()

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
        self._pump.join(timeout=5)
        return code

    def stop(self, first: int = signal.SIGINT, grace: float = 10.0) -> int:
        code = self.child.stop(first, grace)
        self._pump.join(timeout=5)
        return code
