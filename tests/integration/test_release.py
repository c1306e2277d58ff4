"""Ending the bill, end to end: real ``trainbox`` processes, a stand-in ``libreyolo`` child
(tests/fakes/libreyolo.py), local provider APIs (tests/fakes/providers.py) and the local Hub."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from entrypoint import pipeline, settings
from entrypoint.errors import AccessError, AgentError, ConfigError, CostLimitError, ReleaseError
from entrypoint.release import end as release
from entrypoint.release import providers
from entrypoint.release.providers import InstanceState, ReleaseRetry
from entrypoint.settings import ExitAction
from entrypoint.state import Phase, RunState
from tests.fakes import libreyolo as fake_libreyolo
from tests.fakes.providers import RUNPOD_V2_REFERENCE, Call, FakeProvider, FakeRunPod, FakeVast
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
    assert destroy.method == "DELETE"


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


# -- end_of_job against the local APIs (in process, waits recorded instead of slept) --------------
def job_settings(tmp_path: Path, provider: FakeProvider, **env: str) -> settings.Settings:
    base = {"WORKDIR": str(tmp_path), "GPUS": "cpu", "OUTPUT_REPO": "acme/run", "PROVIDER": provider.kind}
    return settings.from_env({**base, **provider.env(), **env}, options={})


@pytest.mark.parametrize("server", [FakeVast, FakeRunPod])
@pytest.mark.parametrize("action", [ExitAction.STOP, ExitAction.DESTROY])
def test_end_of_job_matrix(tmp_path: Path, server: type[FakeProvider], action: ExitAction) -> None:
    with server() as provider:
        config = job_settings(tmp_path, provider, ON_EXIT=action.value)
        state = RunState(config.run_dir, config.run_name)
        state.finish(Phase.DONE, 0, "success")
        published: list[dict[str, Any]] = []

        code = release.end_of_job(
            config, state, failed=False, publish=lambda: published.append(state.snapshot()) or True
        )

        assert code is None
        (call,) = provider.actions()
        expected = {
            ("vast", ExitAction.STOP): "PUT",
            ("vast", ExitAction.DESTROY): "DELETE",
            ("runpod", ExitAction.STOP): "POST",
            ("runpod", ExitAction.DESTROY): "DELETE",
        }[provider.kind, action]
        assert call.method == expected
        # Published before the provider was called, then again with the outcome.
        assert published[0]["release"]["status"] == "requested"
        assert published[-1]["release"]["status"] == "confirmed"
        assert provider.state == ("destroyed" if action is ExitAction.DESTROY else "stopped")


def test_500_then_200_is_retried(tmp_path: Path) -> None:
    with FakeRunPod() as provider:
        provider.fail(500, method="DELETE", times=2)
        config = job_settings(tmp_path, provider, ON_EXIT="destroy")
        state = RunState(config.run_dir, config.run_name)
        waits: list[float] = []

        code = release.end_of_job(
            config, state, failed=False, publish=lambda: True, policy=ReleaseRetry(sleep=waits.append)
        )

        assert code is None
        assert [call.status for call in provider.actions()] == [500, 500, 204]
        assert waits[:2] == [1.0, 2.0]  # capped exponential backoff
        assert state.snapshot()["release"]["status"] == "confirmed"


def test_a_destroy_the_provider_never_shows_fails_after_the_confirmation_window(tmp_path: Path) -> None:
    with FakeVast(lag_reads=10_000) as provider:
        config = job_settings(tmp_path, provider, ON_EXIT="destroy")
        state = RunState(config.run_dir, config.run_name)
        now = [0.0]

        def sleep(seconds: float) -> None:
            now[0] += seconds

        policy = ReleaseRetry(sleep=sleep, clock=lambda: now[0], confirm_for=60)
        code = release.end_of_job(config, state, failed=False, publish=lambda: True, policy=policy)

        assert code == ReleaseError.exit_code
        assert state.snapshot()["release"]["status"] == "failed"
        assert "NOT" in state.snapshot()["release"]["error"]
        assert now[0] <= 60


def test_destroy_becomes_stop_when_the_hub_lacks_part_of_the_run(tmp_path: Path) -> None:
    with FakeVast() as provider:
        config = job_settings(tmp_path, provider, ON_EXIT="destroy")
        state = RunState(config.run_dir, config.run_name)

        code = release.end_of_job(config, state, failed=False, publish=lambda: False)

        assert code is None
        assert [call.method for call in provider.actions()] == ["PUT"]  # the disk, and the run, survive
        assert state.snapshot()["release"]["downgraded_from"] == "destroy"


def test_vast_refusal_inside_a_200_is_a_failure(tmp_path: Path) -> None:
    with FakeVast() as provider:
        provider.fail(200, method="DELETE", body={"success": False, "msg": "instance is locked"})
        config = job_settings(tmp_path, provider, ON_EXIT="destroy")
        state = RunState(config.run_dir, config.run_name)

        code = release.end_of_job(config, state, failed=False, publish=lambda: True)

        assert code == ReleaseError.exit_code
        assert "instance is locked" in state.snapshot()["release"]["error"]
        assert provider.state == "running"


def test_check_access_at_start(tmp_path: Path) -> None:
    with FakeVast() as provider:
        config = job_settings(tmp_path, provider, ON_EXIT="destroy")
        assert release.check_access(config) is not None
        wrong = settings.from_env(
            {"WORKDIR": str(tmp_path), "PROVIDER": "vast", **provider.env(), "CONTAINER_ID": "999", "ON_EXIT": "stop"},
            options={},
        )
        with pytest.raises(ConfigError, match="does not know"):
            release.check_access(wrong)
        refused = settings.from_env(
            {
                "WORKDIR": str(tmp_path),
                "PROVIDER": "vast",
                **provider.env(),
                "CONTAINER_API_KEY": "x" * 20,
                "ON_EXIT": "stop",
            },
            options={},
        )
        with pytest.raises(AccessError, match="refused CONTAINER_API_KEY"):
            release.check_access(refused)


# -- Vast.ai: only a real "gone" or "stopped" confirms -------------------------------------------
@pytest.mark.parametrize(
    "answer",
    [(200, {"instances": None}), (200, {}), (200, b"<html>down for maintenance</html>")],
    ids=["null-record", "empty-object", "not-json"],
)
def test_a_vast_read_that_proves_nothing_never_confirms(tmp_path: Path, answer: tuple[int, Any]) -> None:
    with FakeVast() as provider:
        provider.gone_answer = answer  # after the destroy, reads answer 200 with no instance record
        config = job_settings(tmp_path, provider, ON_EXIT="destroy")
        state = RunState(config.run_dir, config.run_name)
        waits: list[float] = []

        code = release.end_of_job(
            config, state, failed=False, publish=lambda: True, policy=ReleaseRetry(sleep=waits.append)
        )

        assert code == ReleaseError.exit_code
        assert state.snapshot()["release"]["status"] == "failed"
        assert "may still be billing" in state.snapshot()["release"]["error"]
        reads_after = [call for call in provider.calls if call.method == "GET"][1:]
        assert len(reads_after) == ReleaseRetry().attempts  # retried, then an honest failure
        assert provider.state == "destroyed"  # it may well be gone: we just cannot say so


# -- RunPod: rate limits and races ----------------------------------------------------------------
def test_runpod_429_waits_as_the_provider_says(tmp_path: Path) -> None:
    with FakeRunPod() as provider:
        provider.fail(429, method="DELETE", times=1, retry_after=7)
        provider.fail(429, method="DELETE", times=1)  # no Retry-After: the RateLimit header's reset
        config = job_settings(tmp_path, provider, ON_EXIT="destroy")
        state = RunState(config.run_dir, config.run_name)
        waits: list[float] = []

        code = release.end_of_job(
            config, state, failed=False, publish=lambda: True, policy=ReleaseRetry(sleep=waits.append)
        )

        assert code is None
        assert [call.status for call in provider.actions()] == [429, 429, 204]
        assert waits[:2] == [7.0, 12.0]  # Retry-After, then the exhausted minute window's t=12


def test_a_stop_that_landed_before_its_retry_is_confirmed(tmp_path: Path) -> None:
    with FakeRunPod() as provider:
        config = job_settings(tmp_path, provider, ON_EXIT="stop")
        instance = providers.instance_for(config.provider)
        instance.stop()  # a first attempt that landed, its answer lost on the way back

        instance.stop()  # the retry: 409, the pod is EXITED already

        assert [call.status for call in provider.actions()] == [200, 409]
        assert instance.observe().state is InstanceState.STOPPED


# -- the client against RunPod's v2 reference -------------------------------------------------------
REFERENCE = json.loads(RUNPOD_V2_REFERENCE.read_text())


def reference_operation(call: Call) -> dict[str, Any]:
    """The operation of the reference that ``call`` is; fails when RunPod documents no such request."""
    for operation in REFERENCE["operations"]:
        pattern = re.sub(r"\\\{[^/]+\\\}", "[^/]+", re.escape(operation["path"]))
        if operation["method"] == call.method and re.fullmatch(pattern, call.path):
            return operation
    raise AssertionError(f"{call.method} {call.path} is not in RunPod's v2 reference")


def check_request(call: Call, operation: dict[str, Any]) -> None:
    schema = operation["request_body"]
    if schema is None:
        assert call.body is None, f"{operation['operationId']} takes no body"
        return
    assert call.content_type == schema["content_type"]
    assert isinstance(call.body, dict)
    assert set(schema["required"]) <= set(call.body)
    if schema["additionalProperties"] is False:
        assert set(call.body) <= set(schema["properties"])
    for name, value in call.body.items():
        allowed = schema["properties"][name].get("enum")
        assert allowed is None or value in allowed, f"{name}={value!r} is not one of {allowed}"


def check_answer(call: Call, operation: dict[str, Any]) -> None:
    """The fake answers only what the reference documents for that operation."""
    documented = operation["responses"].get(str(call.status)) or operation["responses"]["default"]
    content_type = (call.answer_headers or {}).get("Content-Type", "application/json")
    if documented["content_type"] is None:
        assert call.answer is None
        return
    assert content_type == documented["content_type"]
    if documented["schema"] == "Pod":
        pod = REFERENCE["schemas"]["Pod"]
        assert set(pod["required"]) <= set(call.answer)
        assert call.answer["status"] in pod["status_enum"]
        assert set(call.answer["actions"]) <= set(pod["actions_enum"])
        assert call.answer["actions"] == [
            action
            for action in REFERENCE["status_actions"].get(call.answer["status"], [])
            if not (call.answer["locked"] and action in {"stop", "restart"})
        ]
    elif documented["schema"] == "ErrorResponse":
        assert set(REFERENCE["schemas"]["ErrorResponse"]["required"]) <= set(call.answer)
        assert call.answer["status"] == call.status


def exercise_the_client(provider: FakeRunPod, tmp_path: Path) -> None:
    """Every request the RunPod client can make: the reads, stop, terminate, and their refusals."""
    config = job_settings(tmp_path, provider, ON_EXIT="destroy")
    instance = providers.instance_for(config.provider)
    release.check_access(config)
    providers.end_bill(instance, ExitAction.STOP, ReleaseRetry(sleep=lambda _: None))
    instance.stop()  # 409, then the read that shows it EXITED
    provider.state = "running"
    provider.locked = True
    with pytest.raises(ReleaseError, match="locked"):
        instance.stop()
    provider.locked = False
    provider.cluster = "cl-1"
    with pytest.raises(ReleaseError, match="Instant Cluster"):
        instance.destroy()
    provider.cluster = None
    providers.end_bill(instance, ExitAction.DESTROY, ReleaseRetry(sleep=lambda _: None))


def test_every_runpod_request_is_in_the_v2_reference(tmp_path: Path) -> None:
    with FakeRunPod() as provider:
        exercise_the_client(provider, tmp_path)

    used = {reference_operation(call)["operationId"] for call in provider.calls}
    assert used == {"getPod", "podAction", "deletePod"}
    assert {call.status for call in provider.calls} >= {200, 204, 404, 409}
    for call in provider.calls:
        operation = reference_operation(call)
        check_request(call, operation)
        check_answer(call, operation)
        assert call.authorization == f"Bearer {provider.key}"


def test_the_reference_table_is_what_the_client_is_built_on() -> None:
    assert REFERENCE["server"] == settings.RUNPOD_API_URL == "https://api.runpod.io"
    (action,) = [op for op in REFERENCE["operations"] if op["operationId"] == "podAction"]
    assert action["request_body"]["properties"]["action"]["enum"] == ["start", "stop", "restart", "terminate"]
    (delete,) = [op for op in REFERENCE["operations"] if op["operationId"] == "deletePod"]
    assert delete["responses"]["204"]["content_type"] is None and "409" in delete["responses"]


def request(url: str, method: str, key: str, body: Any = None) -> tuple[int, Any, str | None]:
    data = None if body is None else json.dumps(body).encode()
    headers = {"Authorization": f"Bearer {key}", **({"Content-Type": "application/json"} if data else {})}
    try:
        with urllib.request.urlopen(urllib.request.Request(url, data=data, method=method, headers=headers)) as answer:
            raw = answer.read()
            return answer.status, json.loads(raw) if raw else None, answer.headers.get("Content-Type")
    except urllib.error.HTTPError as error:
        with error:
            return error.code, json.loads(error.read() or b"null"), error.headers.get("Content-Type")


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("GET", "/v1/pods/{id}"),
        ("DELETE", "/v1/pods/{id}"),
        ("POST", "/v1/pods/{id}/stop"),
        ("POST", "/v1/pods/{id}/start"),
        ("POST", "/v1/pods/{id}/reset"),
        ("GET", "/v1/pods"),
        ("GET", "/pods/{id}"),
        ("POST", "/pods/{id}/stop"),
    ],
)
def test_the_fake_answers_every_v1_path_with_404(method: str, path: str) -> None:
    with FakeRunPod() as provider:
        url = provider.url + path.format(id=provider.instance_id)
        status, problem, content_type = request(url, method, provider.key)

        assert status == 404
        assert content_type == "application/problem+json" and problem["status"] == 404 and problem["title"]
        assert provider.state == "running"


@pytest.mark.parametrize(
    ("body", "status"),
    [({"action": "stop", "force": True}, 422), ({"action": "reset"}, 422), ({}, 422), (None, 400)],
)
def test_the_fake_refuses_what_the_reference_refuses(body: Any, status: int) -> None:
    with FakeRunPod() as provider:
        got, problem, _ = request(f"{provider.url}/v2/pods/{provider.instance_id}/action", "POST", provider.key, body)

        assert got == status and problem["status"] == status
        assert provider.state == "running"


def test_runpod_check_access_at_start_reads_the_v2_pod(tmp_path: Path) -> None:
    with FakeRunPod() as provider:
        seen = release.check_access(job_settings(tmp_path, provider, ON_EXIT="destroy"))
        assert seen is not None and (seen.price_per_hour, seen.price_source) == (0.74, "runpod:cost")
        assert [(call.method, call.path) for call in provider.calls] == [("GET", "/v2/pods/4242")]

        provider.forbidden = True
        with pytest.raises(AccessError, match=r"refused RUNPOD_API_KEY.*Forbidden: access denied"):
            release.check_access(job_settings(tmp_path, provider, ON_EXIT="stop"))
        # Nothing to release at the end: a refused read is only a warning, and there is no price.
        assert release.check_access(job_settings(tmp_path, provider, ON_EXIT="exit")) is None

        provider.forbidden = False
        wrong = job_settings(tmp_path, provider, ON_EXIT="stop", RUNPOD_POD_ID="nope")
        with pytest.raises(ConfigError, match="does not know RunPod pod nope"):
            release.check_access(wrong)
