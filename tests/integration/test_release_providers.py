"""Ending the bill against the provider APIs: the release's client in process (waits recorded instead of
slept) against local provider APIs (tests/fakes/providers.py), and those fakes held to RunPod's v2 reference."""

from __future__ import annotations

import json
import re
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from entrypoint import settings, variables
from entrypoint.errors import AccessError, ConfigError, ReleaseError
from entrypoint.release import end as release
from entrypoint.release import providers
from entrypoint.release.providers import InstanceState, ReleaseRetry
from entrypoint.settings import ExitAction
from entrypoint.state import Phase, RunState
from tests.fakes.providers import RUNPOD_V2_REFERENCE, Call, FakeProvider, FakeRunPod, FakeVast


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
                "CONTAINER_API_KEY": "vast-key-refused-0123456789",
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
    assert REFERENCE["server"] == variables.RUNPOD_API_URL == "https://api.runpod.io"
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
