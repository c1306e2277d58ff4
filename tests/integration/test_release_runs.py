"""Ending the bill, end to end: real ``trainbox`` processes, a stand-in ``libreyolo`` child
(tests/fakes/libreyolo.py), local provider APIs (tests/fakes/providers.py) and the local Hub.
The release's client against those APIs, in process, is in test_release_providers.py."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from entrypoint import pipeline, settings
from entrypoint.errors import AgentError, ConfigError, CostLimitError, ReleaseError
from entrypoint.release.providers import ReleaseRetry
from entrypoint.state import Phase
from tests.fakes import libreyolo as fake_libreyolo
from tests.fakes.providers import FakeProvider, FakeRunPod, FakeVast
from tests.hubfixtures import HubContext

VAST_KEY = "vast-canary-key-5f1c0a9e77d2"
RUNPOD_KEY = "runpod-canary-key-c3b8e41d90aa"
AGENT_TIMEOUT = 120


@pytest.fixture
def vast() -> Iterator[FakeVast]:
    with FakeVast("31337", VAST_KEY) as server:
        yield server


@pytest.fixture
def runpod() -> Iterator[FakeRunPod]:
    with FakeRunPod("pod-7xq2", RUNPOD_KEY) as server:
        yield server


@dataclass
class Agent:
    """``trainbox`` in a clean environment: demo dataset, CPU, the stand-in libreyolo, this test's
    WORKDIR, and its run mirrored to a fresh repo on the local Hub."""

    tmp_path: Path
    hub_ctx: HubContext
    repo: str

    def env(self, provider: FakeProvider | None, **extra: str) -> dict[str, str]:
        drop = {"CONTAINER_ID", "CONTAINER_API_KEY", "RUNPOD_POD_ID", "RUNPOD_API_KEY"}
        env = {key: value for key, value in self.hub_ctx.env().items() if key not in drop}
        env.update(
            WORKDIR=str(self.tmp_path / "work"),
            GPUS="cpu",
            OUTPUT_REPO=self.repo,
            TRAINBOX_LIBREYOLO=str(self.tmp_path / "bin" / "libreyolo"),
            FAKE_TRAIN_MODE="ok",
            FAKE_EPOCH_SECONDS="0.2",
            PROVIDER=provider.kind if provider else "none",
        )
        return {**env, **(provider.env() if provider else {}), **extra}

    def run(self, *args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "entrypoint", *args], env=env, capture_output=True, text=True, timeout=AGENT_TIMEOUT
        )

    @property
    def run_dir(self) -> Path:
        (path,) = (self.tmp_path / "work" / "runs").glob("*/trainbox.json")
        return path.parent

    def state(self) -> dict[str, Any]:
        return json.loads((self.run_dir / "trainbox.json").read_text())

    def hub_text(self) -> str:
        hub = self.hub_ctx.hub
        return "".join(hub.file_bytes(self.repo, name).decode(errors="replace") for name in hub.files(self.repo))


@pytest.fixture
def agent(tmp_path: Path, hub_ctx: HubContext) -> Agent:
    fake_libreyolo.install(tmp_path / "bin")
    return Agent(tmp_path, hub_ctx, hub_ctx.repo_id("run"))


def assert_no_key(text: str, *keys: str) -> None:
    for key in keys:
        assert key not in text


# -- the whole job ---------------------------------------------------------------------------
@pytest.mark.slow  # `trainbox run` with the stand-in libreyolo
def test_success_destroys_once_with_the_key_after_the_last_upload(agent: Agent, vast: FakeVast) -> None:
    result = agent.run("run", env=agent.env(vast, ON_EXIT="destroy"))

    assert result.returncode == 0, result.stderr
    (destroy,) = vast.actions()
    assert (destroy.method, destroy.path) == ("DELETE", "/api/v0/instances/31337/")
    assert destroy.authorization == f"Bearer {VAST_KEY}"
    # Everything the run folder held, and the terminal trainbox.json, were on the Hub first.
    hub = agent.hub_ctx.hub
    before = [commit for commit in hub.commits(agent.repo) if commit.timestamp < destroy.at]
    assert before, "nothing was committed before the destroy call"
    published = json.loads(hub.file_bytes(agent.repo, "trainbox.json", revision=before[0].oid))
    assert published["phase"] == Phase.DONE and published["exit"]["code"] == 0
    assert published["release"]["status"] == "requested" and published["release"]["action"] == "destroy"
    for name in ("status.json", "metrics.jsonl", "console.log"):
        local = (agent.run_dir / name).read_bytes()
        assert hub.file_bytes(agent.repo, name, revision=before[0].oid) == local
    # The confirmed destroy is noted locally (and on the Hub, when the machine lives long enough).
    assert agent.state()["release"]["status"] == "confirmed"
    assert_no_key(result.stdout + result.stderr + agent.hub_text(), VAST_KEY)


@pytest.mark.slow  # `trainbox run` with the stand-in libreyolo
def test_a_failed_run_takes_on_failure_not_on_exit(agent: Agent, runpod: FakeRunPod) -> None:
    env = agent.env(runpod, ON_EXIT="destroy", ON_FAILURE="stop", FAKE_TRAIN_MODE="fail")

    result = agent.run("run", env=env)

    assert result.returncode == 60, result.stderr  # the training failure, not hidden by the release
    (stop,) = runpod.actions()
    assert (stop.method, stop.path, stop.body) == ("POST", "/v2/pods/pod-7xq2/action", {"action": "stop"})
    assert stop.authorization == f"Bearer {RUNPOD_KEY}"
    state = agent.state()
    assert state["phase"] == Phase.FAILED
    assert state["release"]["status"] == "confirmed" and state["release"]["action"] == "stop"
    assert_no_key(result.stdout + result.stderr + json.dumps(state) + agent.hub_text(), RUNPOD_KEY)


@pytest.mark.slow  # `trainbox run` with the stand-in libreyolo
def test_on_failure_exit_keeps_the_machine(agent: Agent, vast: FakeVast) -> None:
    result = agent.run("run", env=agent.env(vast, ON_EXIT="destroy", ON_FAILURE="exit", FAKE_TRAIN_MODE="fail"))

    assert result.returncode == 60
    assert vast.actions() == []
    assert agent.state()["release"]["status"] == "not_requested"
    assert "keeps billing" in result.stderr


@pytest.mark.slow  # `trainbox run` with the stand-in libreyolo
def test_max_runtime_wraps_up_and_releases(agent: Agent, runpod: FakeRunPod) -> None:
    # MAX_RUNTIME's timer ends the run with SIGALRM; delivered here once training is seen running,
    # so the test does not depend on how fast a loaded machine reaches training.
    env = agent.env(runpod, ON_EXIT="destroy", MAX_RUNTIME="1h", FAKE_TRAIN_MODE="forever")
    process = subprocess.Popen(
        [sys.executable, "-m", "entrypoint", "run"], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    metrics = agent.tmp_path / "work" / "runs"
    deadline = time.monotonic() + AGENT_TIMEOUT  # only a guard against a hung test
    while process.poll() is None and time.monotonic() < deadline and not any(metrics.glob("*/metrics.jsonl")):
        time.sleep(0.05)
    process.send_signal(signal.SIGALRM)  # what the MAX_RUNTIME timer sends
    stdout, stderr = process.communicate(timeout=AGENT_TIMEOUT)

    assert process.returncode == 80, stderr
    assert "MAX_RUNTIME (3600 s) expired" in stderr
    assert "interrupted: saving last.pt" in stdout  # stopped politely, not killed
    assert agent.state()["phase"] == Phase.TIMED_OUT
    assert agent.state()["release"]["status"] == "confirmed"
    (destroy,) = runpod.actions()
    assert destroy.method == "DELETE"
    epochs = (agent.run_dir / "metrics.jsonl").read_text().splitlines()
    assert 1 <= len(epochs) < 100  # a few seconds of a run planned for hours
    assert json.loads(agent.hub_ctx.hub.file_bytes(agent.repo, "trainbox.json"))["phase"] == Phase.TIMED_OUT


def test_max_runtime_arms_the_timer_that_ends_the_run(agent: Agent) -> None:
    job = pipeline.Job(settings.from_env(agent.env(None, MAX_RUNTIME="1h")))
    saved = {signum: signal.getsignal(signum) for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGALRM)}
    try:
        job._install_signal_handlers()
        left, _ = signal.getitimer(signal.ITIMER_REAL)
        assert 0 < left <= 3600  # armed for MAX_RUNTIME
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        for signum, handler in saved.items():
            signal.signal(signum, handler)


@pytest.mark.slow  # `trainbox run` with the stand-in libreyolo
def test_a_hung_child_is_stalled_killed_logged_and_released(agent: Agent, vast: FakeVast) -> None:
    result = agent.run("run", env=agent.env(vast, ON_EXIT="stop", STALL_TIMEOUT="2s", FAKE_TRAIN_MODE="hang"))

    assert result.returncode == 81, result.stderr
    assert "killing it" in result.stderr  # SIGINT was ignored: escalated to SIGKILL
    child = int((agent.run_dir / "fake-pid").read_text())
    with pytest.raises(ProcessLookupError):
        os.kill(child, 0)
    assert agent.state()["phase"] == Phase.STALLED
    (stop,) = vast.actions()
    assert (stop.method, stop.body) == ("PUT", {"state": "stopped"})
    hub = agent.hub_ctx.hub
    assert b"loading the model" in hub.file_bytes(agent.repo, "console.log")  # the logs are on the Hub
    assert json.loads(hub.file_bytes(agent.repo, "trainbox.json"))["phase"] == Phase.STALLED


@pytest.mark.slow  # `trainbox run` with the stand-in libreyolo
def test_sigterm_during_the_release_does_not_cut_it_short(agent: Agent, vast: FakeVast) -> None:
    vast.lag_reads = 2  # the provider takes a few reads to show the destroy
    agent_process = subprocess.Popen(
        [sys.executable, "-m", "entrypoint", "run"],
        env=agent.env(vast, ON_EXIT="destroy"),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + AGENT_TIMEOUT
    while not vast.actions() and agent_process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    agent_process.send_signal(signal.SIGTERM)
    _, stderr = agent_process.communicate(timeout=AGENT_TIMEOUT)

    assert agent_process.returncode == 0, stderr  # the job had finished and the destroy was confirmed
    assert agent.state()["release"]["status"] == "confirmed"


# -- RunPod REST v2, end to end ---------------------------------------------------------------
def hub_state(agent: Agent) -> dict[str, Any]:
    return json.loads(agent.hub_ctx.hub.file_bytes(agent.repo, "trainbox.json"))


@pytest.mark.slow  # `trainbox run` with the stand-in libreyolo
def test_runpod_destroy_terminates_the_pod_and_reads_it_until_gone(agent: Agent, runpod: FakeRunPod) -> None:
    runpod.lag_reads = 2  # RunPod takes a few reads to show the termination
    runpod.terminated_reads = 1  # then shows TERMINATED once before answering 404

    result = agent.run("run", env=agent.env(runpod, ON_EXIT="destroy"))

    assert result.returncode == 0, result.stderr
    (delete,) = runpod.actions()
    assert (delete.method, delete.path, delete.body) == ("DELETE", "/v2/pods/pod-7xq2", None)
    assert delete.authorization == f"Bearer {RUNPOD_KEY}" and delete.status == 204
    reads_after = [call for call in runpod.calls if call.at >= delete.at and call.method == "GET"]
    assert [call.status for call in reads_after][-1] in {200, 404} and len(reads_after) >= 3
    assert all(call.path.startswith("/v2/pods/") for call in runpod.calls), "a v1 path was requested"
    state = agent.state()
    assert state["release"]["status"] == "confirmed" and state["release"]["observed"] == "gone"
    # No PRICE_PER_HOUR: the pod's own cost prices the run, in trainbox.json and in the final log line.
    assert state["cost"]["price_per_hour"] == runpod.price and state["cost"]["price_source"] == "runpod:cost"
    assert state["cost"]["dollars"] is not None
    assert re.search(r"cost: [\d.]+ h, \$[\d.]+ at \$0\.74/h \(runpod:cost\)", result.stderr)
    assert hub_state(agent)["cost"]["price_source"] == "runpod:cost"
    assert_no_key(result.stdout + result.stderr + json.dumps(state) + agent.hub_text(), RUNPOD_KEY)


@pytest.mark.slow  # `trainbox run` with the stand-in libreyolo
def test_runpod_stop_is_one_action_and_confirmed_by_exited(agent: Agent, runpod: FakeRunPod) -> None:
    result = agent.run("run", env=agent.env(runpod, ON_EXIT="stop", PRICE_PER_HOUR="2.5"))

    assert result.returncode == 0, result.stderr
    (stop,) = runpod.actions()
    assert (stop.method, stop.path, stop.body) == ("POST", "/v2/pods/pod-7xq2/action", {"action": "stop"})
    assert stop.content_type == "application/json"
    assert all(call.path.startswith("/v2/pods/") for call in runpod.calls), "a v1 path was requested"
    state = agent.state()
    assert state["release"]["status"] == "confirmed" and state["release"]["detail"] == "status=EXITED"
    assert runpod.state == "stopped"
    # PRICE_PER_HOUR wins over the pod's cost.
    assert (state["cost"]["price_per_hour"], state["cost"]["price_source"]) == (2.5, "PRICE_PER_HOUR")


def _in_cluster(server: FakeProvider) -> None:
    assert isinstance(server, FakeRunPod)
    server.cluster = "cl-9a7b"


def _locked(server: FakeProvider) -> None:
    assert isinstance(server, FakeRunPod)
    server.locked = True


def _forbidden_terminate(server: FakeProvider) -> None:
    server.fail(403, method="DELETE", body={"title": "Forbidden", "status": 403, "detail": "access denied"})


def _vast_forbidden_echoing_the_key(server: FakeProvider) -> None:
    # A provider that echoes the key back in its error must not get it into any output.
    server.fail(403, method="DELETE", body={"success": False, "msg": f"key {VAST_KEY} may not destroy"})


def _always_500(server: FakeProvider) -> None:
    server.fail(500, method="DELETE", retry_after=0)  # Retry-After: 0 keeps the test instant


@pytest.mark.parametrize(
    ("provider", "on_exit", "setup", "says", "attempts"),
    [
        ("runpod", "destroy", _in_cluster, "Instant Cluster cl-9a7b", 1),
        ("runpod", "stop", _locked, "locked: true prevents stopping", 1),
        ("runpod", "destroy", _forbidden_terminate, "refused RUNPOD_API_KEY", 1),
        ("runpod", "destroy", _always_500, "may still be billing", ReleaseRetry().attempts),
        ("vast", "destroy", _vast_forbidden_echoing_the_key, "refused CONTAINER_API_KEY", 1),
        ("vast", "destroy", _always_500, "may still be billing", ReleaseRetry().attempts),
    ],
    ids=[
        "runpod-409-cluster",
        "runpod-locked",
        "runpod-403-key",
        "runpod-500-forever",
        "vast-403-key",
        "vast-500-forever",
    ],
)
@pytest.mark.slow  # `trainbox run` with the stand-in libreyolo
def test_a_provider_refusal_is_an_honest_failure(
    request: pytest.FixtureRequest, agent: Agent, provider: str, on_exit: str, setup: Any, says: str, attempts: int
) -> None:
    server: FakeProvider = request.getfixturevalue(provider)
    key = {"runpod": RUNPOD_KEY, "vast": VAST_KEY}[provider]
    setup(server)

    result = agent.run("run", env=agent.env(server, ON_EXIT=on_exit))

    assert result.returncode == ReleaseError.exit_code, result.stderr
    assert says in result.stderr
    assert "confirmed" not in result.stderr
    assert len(server.actions()) == attempts  # a refusal is not retried; a 500 is, up to the policy
    assert server.state == "running"
    for state in (agent.state(), hub_state(agent)):
        assert state["release"]["status"] == "failed" and says in state["release"]["error"]
        assert state["exit"]["code"] == ReleaseError.exit_code and state["exit"]["job"]["code"] == 0
    if provider == "runpod":
        assert all(call.path.startswith("/v2/pods/") for call in server.calls)
    texts = [path.read_text(errors="replace") for path in agent.run_dir.rglob("*") if path.is_file()]
    assert_no_key(result.stdout + result.stderr + "".join(texts) + agent.hub_text(), key)


# -- MAX_COST --------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("limit", "error", "message", "max_cost"),
    [
        ({"MAX_COST": "8"}, CostLimitError, "MAX_COST ($8.00) reached", 8.0),
    ],
    ids=["max-cost"],
)
@pytest.mark.slow  # `trainbox run` with the stand-in libreyolo
def test_a_limit_wraps_up_politely_and_releases(
    agent: Agent,
    runpod: FakeRunPod,
    limit: dict[str, str],
    error: type[AgentError],
    message: str,
    max_cost: float | None,
) -> None:
    runpod.price = 3600.0  # $1 a second: $8 is spent a few seconds into training
    env = agent.env(runpod, ON_EXIT="destroy", FAKE_TRAIN_MODE="forever", **limit)

    result = agent.run("run", env=env)

    assert result.returncode == error.exit_code, result.stderr
    assert "interrupted: saving last.pt" in result.stdout  # stopped politely, not killed
    state = agent.state()
    assert state["phase"] == Phase.TIMED_OUT and state["exit"]["reason"] == error.reason
    assert message in state["exit"]["message"]
    assert state["cost"]["max_cost"] == max_cost and state["cost"]["price_source"] == "runpod:cost"
    assert state["cost"]["dollars"] >= (max_cost or 0.0)
    epochs = (agent.run_dir / "metrics.jsonl").read_text().splitlines()
    assert 1 <= len(epochs) < 100  # a few seconds of a run planned for hours
    published = hub_state(agent)
    assert published["phase"] == Phase.TIMED_OUT and published["exit"]["code"] == error.exit_code
    assert agent.hub_ctx.hub.file_bytes(agent.repo, "metrics.jsonl").decode().splitlines() == epochs
    assert state["release"]["status"] == "confirmed"
    (destroy,) = runpod.actions()
    assert destroy.method == "DELETE", result.stderr[-3000:]


def test_max_cost_without_any_price_is_refused_at_start(agent: Agent, vast: FakeVast) -> None:
    vast.price = None  # the provider reports no dph_total, and PRICE_PER_HOUR is not set

    result = agent.run("run", env=agent.env(vast, ON_EXIT="stop", MAX_COST="25"))

    assert result.returncode == ConfigError.exit_code, result.stderr
    errors = [line for line in result.stderr.splitlines() if "ERROR: MAX_COST=$25 needs" in line]
    assert errors and "PRICE_PER_HOUR" in errors[0]
    assert not (agent.run_dir / "metrics.jsonl").exists()  # nothing was trained


# -- trainbox release ------------------------------------------------------------------------
def test_release_command_alone(agent: Agent, runpod: FakeRunPod) -> None:
    result = agent.run("release", "--json", env=agent.env(runpod, ON_EXIT="stop"))

    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["status"] == "confirmed"
    (stop,) = runpod.actions()
    assert (stop.path, stop.body) == ("/v2/pods/pod-7xq2/action", {"action": "stop"})
    assert_no_key(result.stdout + result.stderr, RUNPOD_KEY)


def test_release_command_uses_on_failure_and_notes_the_run(agent: Agent, vast: FakeVast) -> None:
    run_dir = agent.tmp_path / "my-run"
    run_dir.mkdir()
    (run_dir / "trainbox.json").write_text(json.dumps({"phase": "failed"}))

    result = agent.run("release", str(run_dir), "--failed", env=agent.env(vast, ON_EXIT="stop", ON_FAILURE="destroy"))

    assert result.returncode == 0, result.stderr
    assert [call.method for call in vast.actions()] == ["DELETE"]
    noted = json.loads((run_dir / "trainbox.json").read_text())
    assert noted["phase"] == "failed" and noted["release"]["status"] == "confirmed"


def test_release_command_without_a_provider_is_a_config_error(agent: Agent) -> None:
    result = agent.run("release", "--action", "destroy", env=agent.env(None))

    assert result.returncode == 10
    assert "no provider was detected" in result.stderr
