"""The Modal and Beam launchers, run against stand-ins of the platform's SDK and of the agent: the settings a person
gives on the command line reach the platform and the agent, interrupts reach the agent as SIGTERM, and the command
exits with the agent's code (or 1 with the platform's message)."""

from __future__ import annotations

import ast
import json
import os
import signal
import subprocess
import sys
import time
import warnings
from pathlib import Path
from typing import Any

import pytest

from tests.unit.test_templates import IMAGE, TEMPLATES, PythonTemplate, check_names, duration_s

SERVERLESS = ["modal_train.py", "beam_train.py"]

# What the launchers call of the SDK, each running the function in this process (as the platform's container does).
# Every call is printed ("SDK <call> <json>") so a test can read what reached the platform.
FAKE_MODAL = """
import json


def _plain(options):
    return {key: value for key, value in options.items() if isinstance(value, (str, int, float, bool))}


class Image:
    @staticmethod
    def from_registry(name):
        return Image()

    def entrypoint(self, argv):
        return self


class Volume:
    @staticmethod
    def from_name(name, create_if_missing=False):
        return Volume()

    def commit(self):
        print("volume committed", flush=True)


class Secret:
    @staticmethod
    def from_name(name):
        return Secret()


class _Call:
    object_id = "fc-stand-in"

    def __init__(self, fn, args):
        self.fn, self.args = fn, args

    def get(self):
        return self.fn(*self.args)


class _Function:
    def __init__(self, fn):
        self.fn = fn

    def remote(self, *args):
        print("SDK remote", flush=True)
        return self.fn(*args)

    def spawn(self, *args):
        print("SDK spawn", flush=True)
        return _Call(self.fn, args)

    def with_options(self, **options):
        print("SDK with_options " + json.dumps(_plain(options)), flush=True)
        return self


class App:
    def __init__(self, name):
        pass

    def function(self, **options):
        print("SDK function " + json.dumps(_plain(options)), flush=True)
        return _Function

    def local_entrypoint(self):
        return lambda fn: fn
"""

# Beam's `.remote()`: None when the function failed (older SDKs, FAKE_BEAM_FAILS=1), or RemoteExecutionError with
# Beam's message (newer ones, FAKE_BEAM_RAISES=1).
FAKE_BEAM = """
import json
import os


class RemoteExecutionError(Exception):
    pass


def Image(base_image):
    return base_image


def Volume(name, mount_path):
    return name


class _Function:
    def __init__(self, fn):
        self.fn = fn

    def remote(self, *args):
        print("beam uploads the folder", os.getcwd(), flush=True)  # the SDK syncs the working folder here
        if os.environ.get("FAKE_BEAM_RAISES"):
            raise RemoteExecutionError("task 3f2a failed: container exited (out of memory)")
        result = self.fn(*args)
        return None if os.environ.get("FAKE_BEAM_FAILS") else result


def function(**options):
    plain = {key: value for key, value in options.items() if isinstance(value, (str, int, float, bool))}
    print("SDK function " + json.dumps(plain), flush=True)
    return _Function
"""

# `trainbox` as the launchers see it on PATH: records what reaches it; on SIGTERM it takes a second to wrap up
# (longer than the 0.25 s subprocess.run would leave it) and exits 143 as the real agent does.
FAKE_AGENT = """
import json, os, signal, sys, time

def note(text):
    with open(os.environ["AGENT_RECORD"], "a") as record:
        record.write(text + "\\n")

def on_signal(signum, frame):
    note(signal.Signals(signum).name)
    if signum == signal.SIGTERM:
        time.sleep(1)
        note("wrapped up")
        sys.exit(143)

signal.signal(signal.SIGTERM, on_signal)
signal.signal(signal.SIGINT, on_signal)
given = ("DATASET_REPO", "OUTPUT_REPO", "RUN_ARGS", "MAX_RUNTIME", "PRICE_PER_HOUR", "ON_EXIT", "WORKDIR")
with open(os.environ["AGENT_RECORD"] + ".env", "w") as record:
    json.dump({name: os.environ.get(name) for name in given}, record)
note("started " + " ".join(sys.argv[1:]) + " ON_EXIT=" + os.environ["ON_EXIT"])
if os.environ.get("AGENT_EXIT"):
    sys.exit(int(os.environ["AGENT_EXIT"]))
time.sleep(120)
"""


def launcher(
    name: str, tmp_path: Path, *, options: dict[str, str] | None = None, **env: str
) -> tuple[subprocess.Popen[str], Path]:
    """Start a launcher as the platform would: Modal calls the local entrypoint (``options`` as its keyword
    arguments, what `modal run ... --gpu H100` gives it), Beam runs the script (``options`` as ``--name value``)."""
    sdk = tmp_path / "sdk"
    sdk.mkdir(parents=True)
    (sdk / "modal.py").write_text(FAKE_MODAL)
    (sdk / "beam.py").write_text(FAKE_BEAM)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    agent = bin_dir / "trainbox"
    agent.write_text(f"#!{sys.executable}\n{FAKE_AGENT}")
    agent.chmod(0o755)
    record = tmp_path / "agent.log"
    environment = {
        **os.environ,
        "PYTHONPATH": str(sdk),
        "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
        "AGENT_RECORD": str(record),
        **env,
    }
    template = str(TEMPLATES / name)
    options = options or {}
    if name == "modal_train.py":
        call = "import json, runpy, sys; runpy.run_path(sys.argv[1])['main'](*sys.argv[2:4], **json.loads(sys.argv[4]))"
        kwargs = {key.replace("-", "_"): float(v) if key == "timeout-hours" else v for key, v in options.items()}
        argv = [sys.executable, "-c", call, template, "org/data", "org/model", json.dumps(kwargs)]
    else:
        flags = [word for key, value in options.items() for word in (f"--{key}", value)]
        argv = [sys.executable, template, "org/data", "org/model", *flags]
    process = subprocess.Popen(argv, env=environment, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    return process, record


def wait_for_agent(process: subprocess.Popen[str], record: Path) -> None:
    deadline = time.monotonic() + 60
    while not (record.exists() and "started" in record.read_text()):
        assert process.poll() is None, process.communicate()[0]
        assert time.monotonic() < deadline, "the stand-in agent never started"
        time.sleep(0.05)


def sdk_calls(output: str, call: str) -> list[dict[str, Any]]:
    return [json.loads(line.split(" ", 2)[2]) for line in output.splitlines() if line.startswith(f"SDK {call} ")]


def agent_env(record: Path) -> dict[str, str]:
    return json.loads(Path(f"{record}.env").read_text())


# -- the files, read without the SDK -------------------------------------------------------------------------------
@pytest.mark.parametrize("name", SERVERLESS)
def test_serverless_functions(name: str) -> None:
    template = PythonTemplate(TEMPLATES / name)
    assert template.constants["IMAGE"].startswith(f"{IMAGE}:")
    kwargs = template.decorator_kwargs("train")
    assert {"image", "gpu", "timeout", "volumes", "secrets", "cpu", "memory", "retries"} <= set(kwargs)
    check_names(template.env_keys())
    assert "HF_TOKEN" in ast.unparse(kwargs["secrets"]) + template.text
    assert '"trainbox", "run"' in template.text
    # DataLoader workers need cores (both platforms default to a fraction of one); a failed run is not retried
    assert template.constants["CPU"] >= 4
    assert template.value(kwargs["retries"]) == 0
    assert "subprocess.run(" not in template.text, "subprocess.run kills the agent 0.25 s after an interrupt"


def test_beam_runs_headless_and_says_what_its_defaults_are() -> None:
    template = PythonTemplate(TEMPLATES / "beam_train.py")
    assert template.value(template.decorator_kwargs("train")["headless"]) is True
    # Beam's Function defaults (beta9 sdk, abstractions/function.py): cpu 0.125, memory 128 MiB, retries 3
    cpu_line = next(line for line in template.text.splitlines() if line.startswith("CPU ="))
    assert "0.125" in cpu_line


def test_modal_launcher_documents_detach() -> None:
    text = (TEMPLATES / "modal_train.py").read_text()
    assert "modal run --detach templates/modal_train.py" in text
    # since Modal 1.4 `modal app logs` prints the last lines and exits; -f follows
    assert "modal app logs -f trainbox" in text and "modal app logs trainbox" not in text


# -- what reaches the platform and the agent -----------------------------------------------------------------------
@pytest.mark.parametrize("name", SERVERLESS)
def test_the_defaults_bound_the_run_and_price_it(name: str, tmp_path: Path) -> None:
    process, record = launcher(name, tmp_path, AGENT_EXIT="0")
    output, _ = process.communicate(timeout=60)
    assert process.returncode == 0, output
    (declared,) = sdk_calls(output, "function")
    timeout = (sdk_calls(output, "with_options") or [declared])[-1]["timeout"]
    assert 0 < timeout <= 24 * 3600
    env = agent_env(record)
    # the agent's own deadline comes first, so the final upload happens before the platform stops it
    assert 0 < duration_s(env["MAX_RUNTIME"]) <= timeout - 10 * 60
    assert float(env["PRICE_PER_HOUR"]) > 0, "the card, the status and MAX_COST need the price"
    assert env["ON_EXIT"] == "exit" and env["WORKDIR"] == "/workspace"
    assert env["DATASET_REPO"] == "org/data" and env["OUTPUT_REPO"] == "org/model"


@pytest.mark.parametrize("name", SERVERLESS)
def test_gpu_timeout_and_price_are_arguments(name: str, tmp_path: Path) -> None:
    gpu = "H100" if name == "modal_train.py" else "RTX4090"
    options = {"gpu": gpu, "timeout-hours": "12", "run-args": "model=LibreYOLO9m.pt epochs=3", "price-per-hour": "4.2"}
    process, record = launcher(name, tmp_path, options=options, AGENT_EXIT="0")
    output, _ = process.communicate(timeout=60)
    assert process.returncode == 0, output
    chosen = (sdk_calls(output, "with_options") or sdk_calls(output, "function"))[-1]
    assert chosen["gpu"] == gpu and chosen["timeout"] == 12 * 3600
    env = agent_env(record)
    assert env["MAX_RUNTIME"] == "705m" and env["PRICE_PER_HOUR"] == "4.2"
    assert env["RUN_ARGS"] == "model=LibreYOLO9m.pt epochs=3"


@pytest.mark.parametrize("name", SERVERLESS)
def test_the_price_follows_the_gpu(name: str, tmp_path: Path) -> None:
    cheap, dear = ("L4", "H100") if name == "modal_train.py" else ("RTX4090", "A10G")
    prices = []
    for gpu in (cheap, dear):
        process, record = launcher(name, tmp_path / gpu, options={"gpu": gpu}, AGENT_EXIT="0")
        output, _ = process.communicate(timeout=60)
        assert process.returncode == 0, output
        prices.append(float(agent_env(record)["PRICE_PER_HOUR"]))
    assert 0 < prices[0] < prices[1]


@pytest.mark.parametrize("name", SERVERLESS)
def test_a_gpu_without_a_known_price_is_refused_before_any_bill(name: str, tmp_path: Path) -> None:
    process, record = launcher(name, tmp_path, options={"gpu": "B200"}, AGENT_EXIT="0")
    output, _ = process.communicate(timeout=60)
    assert process.returncode != 0 and "price-per-hour" in output, output
    assert not record.exists() and "SDK spawn" not in output and "beam uploads" not in output


def test_modal_refuses_a_timeout_over_its_maximum(tmp_path: Path) -> None:
    process, record = launcher("modal_train.py", tmp_path, options={"timeout-hours": "30"}, AGENT_EXIT="0")
    output, _ = process.communicate(timeout=60)
    assert process.returncode != 0 and "24" in output, output
    assert not record.exists()


def test_modal_spawns_the_run_so_a_sleeping_client_cannot_cancel_it(tmp_path: Path) -> None:
    process, _ = launcher("modal_train.py", tmp_path, AGENT_EXIT="0")
    output, _ = process.communicate(timeout=60)
    assert process.returncode == 0, output
    assert "SDK spawn" in output and "SDK remote" not in output


@pytest.mark.parametrize("name", SERVERLESS)
def test_a_run_cut_short_says_that_running_it_again_resumes(name: str, tmp_path: Path) -> None:
    process, _ = launcher(name, tmp_path, AGENT_EXIT="80")  # MAX_RUNTIME reached
    output, _ = process.communicate(timeout=60)
    assert process.returncode == 80, output
    assert "run the same command again to resume" in output


# -- interrupts and exit codes -------------------------------------------------------------------------------------
# Modal interrupts the function with SIGINT on preemption; Beam (like any container platform) stops with SIGTERM.
@pytest.mark.parametrize(("name", "interrupt"), [("modal_train.py", signal.SIGINT), ("beam_train.py", signal.SIGTERM)])
def test_serverless_launcher_forwards_the_interrupt_as_sigterm_and_waits(
    name: str, interrupt: signal.Signals, tmp_path: Path
) -> None:
    process, record = launcher(name, tmp_path)
    try:
        wait_for_agent(process, record)
        process.send_signal(interrupt)
        output, _ = process.communicate(timeout=60)
    finally:
        process.kill()
    lines = record.read_text().splitlines()
    assert lines[0] == "started run ON_EXIT=exit"
    # SIGTERM (what the agent treats as preemption), once, and the agent finished its wrap-up
    assert lines[1:] == ["SIGTERM", "wrapped up"], lines
    # the agent's exit code comes out of the launcher: the run did not finish
    assert process.returncode == 143, output
    if name == "modal_train.py":
        assert "volume committed" in output


@pytest.mark.parametrize("name", SERVERLESS)
def test_serverless_launcher_exits_with_the_agent_failure(name: str, tmp_path: Path) -> None:
    process, record = launcher(name, tmp_path, AGENT_EXIT="20")
    output, _ = process.communicate(timeout=60)
    assert process.returncode == 20, output
    assert record.read_text().startswith("started run")


def test_beam_launcher_fails_when_beam_returns_no_result(tmp_path: Path) -> None:
    # older SDKs return None when the function failed or this client stopped following it: never exit 0 then
    process, _ = launcher("beam_train.py", tmp_path, AGENT_EXIT="0", FAKE_BEAM_FAILS="1")
    output, _ = process.communicate(timeout=60)
    assert process.returncode == 1, output
    assert "no result" in output and "beam task list" in output


def test_beam_launcher_exits_1_with_beams_message_when_the_run_failed(tmp_path: Path) -> None:
    # newer SDKs raise RemoteExecutionError: one line with Beam's own message, no traceback
    process, _ = launcher("beam_train.py", tmp_path, AGENT_EXIT="0", FAKE_BEAM_RAISES="1")
    output, _ = process.communicate(timeout=60)
    assert process.returncode == 1, output
    assert "RemoteExecutionError: task 3f2a failed: container exited (out of memory)" in output
    assert "Traceback" not in output


def test_beam_uploads_the_launcher_alone(tmp_path: Path) -> None:
    """Beam syncs the working folder, filtered by the .beamignore found there (gitignore syntax)."""
    process, _ = launcher("beam_train.py", tmp_path, AGENT_EXIT="0")
    output, _ = process.communicate(timeout=60)
    assert process.returncode == 0, output
    assert f"beam uploads the folder {TEMPLATES}" in output, "run from anywhere, it syncs the templates folder"
    pathspec = pytest.importorskip("pathspec")
    with warnings.catch_warnings():  # Beam vendors a pathspec from before "gitwildmatch" was deprecated
        warnings.simplefilter("ignore", DeprecationWarning)
        rules = pathspec.PathSpec.from_lines("gitwildmatch", (TEMPLATES / ".beamignore").read_text().splitlines())
    kept = {path.name for path in TEMPLATES.iterdir() if not rules.match_file(path.name)}
    assert kept == {"beam_train.py"}
    assert rules.match_file(".env") and rules.match_file("data/images/a.jpg")
