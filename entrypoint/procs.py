"""The one child-process helper: start in a new session with the scrubbed environment, echo the
command, stop the whole tree, and never wait on a process without a bound.

libreyolo's multi-GPU launch starts its coordinator in a session of its own, so signalling the
child's process group is not enough: ``kill_tree`` also signals every descendant found in /proc.
A child stuck in the kernel (a GPU that fell off the bus) survives even SIGKILL: after
``KILL_WAIT`` it is recorded as unreaped and left behind, so the job still reaches its release.

Every child dies with the agent, however the agent ends (``kill -9``, the OOM killer, a supervisor): a
small warden process (``_Warden``) holds the read end of a pipe whose write end only the agent holds, and is
told each child's pid. When the pipe closes (the kernel closes it when the agent dies) it SIGKILLs every
child still registered and its whole tree. Not ``PR_SET_PDEATHSIG``: it fires when the *thread* that started
the child ends, and the agent starts children from threads that end before them; setting it needs code run
between fork and exec (``preexec_fn``, unsafe beside the agent's threads) or a wrapper around every command.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import shlex
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, TypeVar

from .log import logger, redact

# Provider API keys, NOTIFY (a Slack or Discord webhook URL carries its channel's key) and the trackio
# server's write token: the agent's own, never handed to a child process.
SECRET_PROVIDER_VARS = ("CONTAINER_API_KEY", "RUNPOD_API_KEY", "VAST_API_KEY", "NOTIFY", "TRACKIO_WRITE_TOKEN")


# How long a SIGKILLed process may take to be reaped before it is given up on.
KILL_WAIT = 5.0
_POLL = 0.05
_CLOCK_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


@dataclass(frozen=True)
class ProcEntry:
    pid: int
    ppid: int
    pgid: int
    cpu: float  # seconds: its own user+system time and that of the children it reaped
    state: str = ""  # R, S, D, Z (zombie: exited, not reaped yet), ...


def _stat_fields(stat: Path) -> list[str]:
    """The fields of a /proc/<pid>/stat after the command name (state first); OSError when it is gone."""
    # The command name may hold spaces and parentheses: fields start after the last ')'.
    return stat.read_text().rsplit(")", 1)[-1].split()


def proc_table() -> list[ProcEntry]:
    """Every process in /proc; empty where /proc is absent."""
    table = []
    for entry in Path("/proc").glob("[0-9]*"):
        try:
            fields = _stat_fields(entry / "stat")
        except OSError:
            continue
        try:
            ticks = sum(int(value) for value in fields[11:15])  # utime stime cutime cstime
            table.append(ProcEntry(int(entry.name), int(fields[1]), int(fields[2]), ticks / _CLOCK_TICKS, fields[0]))
        except (IndexError, ValueError):
            continue
    return table


def process_start_time() -> float | None:
    """Wall-clock time this process started (Linux), so setup includes the interpreter's start."""
    try:
        fields = _stat_fields(Path("/proc/self/stat"))
        uptime = float(Path("/proc/uptime").read_text().split()[0])
        return time.time() - (uptime - int(fields[19]) / _CLOCK_TICKS)
    except (OSError, ValueError, IndexError):
        return None


def descendants(pid: int, table: list[ProcEntry] | None = None) -> list[int]:
    """PIDs below ``pid`` (children first), read from /proc; empty where /proc is absent."""
    children: dict[int, list[int]] = {}
    for entry in proc_table() if table is None else table:
        children.setdefault(entry.ppid, []).append(entry.pid)
    found: list[int] = []
    queue = [pid]
    while queue:
        for child in children.get(queue.pop(0), []):
            found.append(child)
            queue.append(child)
    return found


def tree_cpu(pid: int) -> dict[int, float]:
    """CPU seconds by process of ``pid``, its descendants and its process group (DDP workers, loaders)."""
    table = proc_table()
    tree = {pid, *descendants(pid, table)}
    return {entry.pid: entry.cpu for entry in table if entry.pid in tree or entry.pgid == pid}


T = TypeVar("T")


def signal_tree(leader: int, signum: int, members: Iterable[int] = ()) -> None:
    """``signum`` to the process group ``leader`` leads, then to each of ``members`` (descendants that
    left the group: libreyolo's multi-GPU coordinator starts a session of its own). Gone or not ours: skipped."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(leader, signum)
    for pid in members:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signum)


def kill_tree(
    leader: int,
    *,
    members: Callable[[], Iterable[int]],
    wait: Callable[[float], T],
    kill_wait: float = KILL_WAIT,
    first: int | None = None,
    grace: float = 0.0,
    alive: Callable[[], bool] = lambda: True,
    grace_ends: Callable[[], float] = lambda: float("inf"),
    label: str = "",
) -> T:
    """Stop the process tree of ``leader``: its process group and ``members()`` (read before each signal).

    With ``first``: send it while ``alive()``, and wait until it is not, for at most ``grace`` seconds
    (cut short by ``grace_ends()``, a ``time.monotonic()`` value). Then SIGKILL to all, and ``wait(kill_wait)``:
    a bounded wait, since a process stuck in the kernel (a GPU that fell off the bus) survives even SIGKILL."""
    if first is not None:
        if alive():
            signal_tree(leader, first, members())
            deadline = time.monotonic() + grace
            while alive() and time.monotonic() < min(deadline, grace_ends()):
                time.sleep(_POLL)
        if alive() and first != signal.SIGKILL:
            logger.warning("%s did not stop within %.0f s of %s: killing it", label, grace, signal.Signals(first).name)
    signal_tree(leader, signal.SIGKILL, members())
    return wait(kill_wait)


# The warden's whole program (run with ``python -S``: no site, so it starts in milliseconds). It reads
# ``+ pid``/``- pid`` lines and notes each child's start time at once; at end of file (the agent is gone) it kills
# the group and tree of every child still registered and still the process it was (a pid reaped and reused by
# another process since is left alone).
_WARDEN = r"""
import os, signal, sys
signal.signal(signal.SIGINT, signal.SIG_IGN)
signal.signal(signal.SIGHUP, signal.SIG_IGN)
def started(pid):  # the kernel's start time of a pid: the same pid started again later is another process
    try:
        with open("/proc/%d/stat" % pid, "rb") as stat:
            return stat.read().rsplit(b")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None
pids = {}
for line in sys.stdin.buffer:
    words = line.split()
    if len(words) == 2 and words[0] == b"+" and words[1].isdigit():
        pids[int(words[1])] = started(int(words[1]))
    elif len(words) == 2 and words[0] == b"-" and words[1].isdigit():
        pids.pop(int(words[1]), None)
ours = [pid for pid, start in pids.items() if start is not None and started(pid) == start]
def tree():
    children = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open("/proc/%s/stat" % entry, "rb") as stat:
                    ppid = int(stat.read().rsplit(b")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
            children.setdefault(ppid, []).append(int(entry))
    found, stack = set(), list(ours)
    while stack:
        pid = stack.pop()
        if pid not in found:
            found.add(pid)
            stack.extend(children.get(pid, ()))
    return found
for _ in range(3):  # a child may start another while it is being killed
    doomed = tree()
    for pid in ours:
        try:
            os.killpg(pid, signal.SIGKILL)
        except OSError:
            pass
    for pid in doomed:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
"""


class _Warden:
    """The one warden of this process, started with its first child (see the module's docstring)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._process: subprocess.Popen[bytes] | None = None
        self._owner = 0  # the pid that started it: a forked copy of the agent has no warden of its own

    def watch(self, pid: int) -> None:
        self._say(f"+ {pid}\n")

    def forget(self, pid: int) -> None:
        self._say(f"- {pid}\n")

    def _say(self, line: str) -> None:
        with self._lock:
            try:
                if self._process is None or self._owner != os.getpid() or self._process.poll() is not None:
                    self._process = subprocess.Popen(
                        [sys.executable, "-S", "-c", _WARDEN],
                        stdin=subprocess.PIPE,
                        stdout=subprocess.DEVNULL,
                        stderr=subprocess.DEVNULL,
                        start_new_session=True,  # a Ctrl-C or a group signal meant for the agent's children
                    )
                    self._owner = os.getpid()
                assert self._process.stdin is not None
                self._process.stdin.write(line.encode())
                self._process.stdin.flush()
            except OSError as error:  # no warden: the children still end with the job, as before
                logger.debug("warden: %s", error)

    def close(self) -> None:
        """At a normal exit: end of file tells the warden to sweep what is left, and it is waited for briefly
        (its pipe and process are not left to the interpreter's teardown)."""
        with self._lock:
            process, self._process = self._process, None
        if process is None or self._owner != os.getpid():
            return
        with contextlib.suppress(OSError):
            assert process.stdin is not None
            process.stdin.close()
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(timeout=2)


_warden = _Warden()
atexit.register(_warden.close)


def scrubbed_env(env: Mapping[str, str] | None = None) -> dict[str, str]:
    """What every child gets: ``env`` (default: ours) without the provider keys."""
    return child_env(os.environ if env is None else env)


class Child:
    """A child process in its own session, with its output piped to us and provider keys kept from it."""

    def __init__(
        self,
        argv: Sequence[str],
        *,
        cwd: Path,
        env: Mapping[str, str] | None = None,
        output: IO[bytes] | int = subprocess.PIPE,
        errors: IO[bytes] | int = subprocess.STDOUT,
        echo: bool = True,
        label: str | None = None,
        stdin: int = subprocess.DEVNULL,
    ) -> None:
        self.label = label or " ".join([Path(argv[0]).name, *argv[1:2]])  # for log lines
        if echo:
            logger.info("+ %s", redact(shlex.join(argv)))
        self.process = subprocess.Popen(
            list(argv),
            cwd=cwd,
            env=scrubbed_env(env),
            stdin=stdin,  # subprocess.PIPE: the child takes commands (xet/ahead.py)
            stdout=output,
            stderr=errors,
            start_new_session=True,
        )
        self.pid = self.process.pid
        _warden.watch(self.pid)
        self.unreaped = False  # SIGKILLed and still not gone after KILL_WAIT: left behind
        self._stop_lock = threading.Lock()
        self._tree: set[int] = set()
        self._hurry_by = float("inf")  # a stop's grace ends by then (``hurry``)
        self._forgotten = False

    def poll(self) -> int | None:
        return self._reaped(self.process.poll())

    def wait(self, timeout: float) -> int:
        code = self.process.wait(timeout)
        self._reaped(code)
        return code

    def _reaped(self, code: int | None) -> int | None:
        """Once the child is reaped its pid may be another process's: the warden forgets it."""
        if code is not None and not self._forgotten:
            self._forgotten = True
            _warden.forget(self.pid)
        return code

    def members(self) -> set[int]:
        """Every descendant seen so far, kept after its parent died (then /proc no longer links it to us)."""
        self._tree.update(descendants(self.pid))
        return self._tree

    def send(self, signum: int) -> None:
        """Send ``signum`` to the child's group and every descendant it started elsewhere."""
        signal_tree(self.pid, signum, self.members())

    def hurry(self, deadline: float) -> None:
        """A stop's grace, running or to come, ends by ``deadline`` (``time.monotonic()``): a SIGTERM
        during a MAX_RUNTIME/stall wrap-up. Safe in a signal handler: it takes no lock."""
        self._hurry_by = min(self._hurry_by, deadline)

    def stop(self, first: int = signal.SIGINT, grace: float = 10.0, kill_wait: float = KILL_WAIT) -> int:
        """Ask politely with ``first``; SIGKILL the whole tree when ``grace`` runs out. Idempotent.

        Returns the exit code, or ``-SIGKILL`` when the child was not reaped ``kill_wait`` seconds
        after SIGKILL (``unreaped`` is then set and a warning logged)."""
        with self._stop_lock:
            try:
                # SIGKILL even after a polite exit: stragglers (DDP workers) must not outlive us holding GPU memory.
                code = kill_tree(
                    self.pid,
                    members=self.members,
                    wait=self.process.wait,
                    kill_wait=kill_wait,
                    first=first,
                    grace=grace,
                    alive=lambda: self.poll() is None,
                    grace_ends=lambda: self._hurry_by,
                    label=self.label,
                )
                self._reaped(self.process.returncode)
                return code
            except subprocess.TimeoutExpired:
                if not self.unreaped:
                    logger.warning(
                        "%s (pid %d) did not exit within %.0f s of SIGKILL (stuck in the kernel?): left behind",
                        self.label,
                        self.pid,
                        kill_wait,
                    )
                self.unreaped = True
                return -signal.SIGKILL


@dataclass(frozen=True)
class Completed:
    returncode: int | None  # None: it did not finish in time (then ``timed_out``)
    stdout: str
    stderr: str
    timed_out: bool = False
    unreaped: bool = False


def run(
    argv: Sequence[str],
    *,
    timeout: float,
    cwd: Path | None = None,
    env: Mapping[str, str] | None = None,
    kill_wait: float = KILL_WAIT,
    echo: bool = True,
) -> Completed:
    """``subprocess.run`` with a real bound: on timeout the whole tree is killed, and a process that
    will not die (or grandchildren holding the pipes) is left behind after ``kill_wait``."""
    child = Child(argv, cwd=cwd or Path.cwd(), env=env, errors=subprocess.PIPE, echo=echo)
    try:
        out, err = child.process.communicate(timeout=timeout)
        child.poll()
        return Completed(child.process.returncode, out.decode(errors="replace"), err.decode(errors="replace"))
    except subprocess.TimeoutExpired:
        logger.warning("%s did not finish within %.0f s: killing it", child.label, timeout)
    except BaseException:  # a stop raised by the signal handler meanwhile (PROFILE=1): no child left running
        child.stop(signal.SIGKILL, grace=0.0, kill_wait=kill_wait)
        for pipe in (child.process.stdout, child.process.stderr):
            if pipe is not None:
                pipe.close()
        raise
    child.stop(signal.SIGKILL, grace=0.0, kill_wait=kill_wait)
    out = err = b""
    with contextlib.suppress(subprocess.TimeoutExpired):
        out, err = child.process.communicate(timeout=kill_wait)
    for pipe in (child.process.stdout, child.process.stderr):
        if pipe is not None:
            pipe.close()  # a grandchild that holds the other end is not waited for
    return Completed(None, out.decode(errors="replace"), err.decode(errors="replace"), True, child.unreaped)


def child_env(env: Mapping[str, str]) -> dict[str, str]:
    """The environment for child processes: provider keys never leave the agent."""
    return {key: value for key, value in env.items() if key not in SECRET_PROVIDER_VARS}


@dataclass(frozen=True)
class Logged:
    """What ``run_logged`` saw: the exit code (None when stopped), the output, and why it was stopped ("": not)."""

    code: int | None
    output: str
    why: str

    def tail(self) -> str:
        return last_line(self.output)


def last_json(output: str) -> dict[str, Any] | None:
    """The last line of a child's output that is a JSON object (its result), or None."""
    for line in reversed(output.splitlines()):
        if line.startswith("{"):
            try:
                found = json.loads(line)
            except ValueError:
                continue
            return found if isinstance(found, dict) else None
    return None


def last_line(output: str) -> str:
    """A child's output's last non-empty line, for a one-line error."""
    lines = [line.strip() for line in output.splitlines() if line.strip()]
    return lines[-1][:300] if lines else "no output"


def run_logged(
    argv: Sequence[str],
    cwd: Path,
    env: Mapping[str, str],
    timeout: float,
    stopping: Callable[[], bool],
    label: str,
    poll: float = 0.2,
) -> Logged:
    """``argv`` to its end within ``timeout``, killed at once when ``stopping()``; its output written to
    ``cwd/output.log`` and read from there (no pipe a grandchild could hold open)."""
    log = cwd / "output.log"
    with log.open("wb") as sink:
        child = Child(argv, cwd=cwd, env=env, output=sink, label=label)
        deadline = time.monotonic() + timeout
        why = ""
        while child.poll() is None:
            if stopping():
                why = "stopped: the machine is being taken back (SIGTERM)"
            elif time.monotonic() > deadline:
                why = f"did not finish within {timeout:.0f} s"
            if why:
                child.stop(signal.SIGKILL, grace=0.0)
                break
            time.sleep(poll)
        code = child.poll()
    return Logged(None if why else code, log.read_text(errors="replace"), why)
