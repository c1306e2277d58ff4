"""The providers' instance APIs: stop or destroy this instance, then read its state back.

One small ``Instance`` protocol, one class per provider, the one retry helper for their calls,
and ``end_bill``: act, then poll the instance until the provider shows the bill has ended.
The API key only ever goes into the ``Authorization`` header; it is registered for redaction.

Endpoints (checked against the providers' API references):
- Vast.ai https://docs.vast.ai/api-reference/instances/ (destroy-instance, manage-instance,
  show-instance): ``DELETE /api/v0/instances/{id}/``; ``PUT`` the same URL with
  ``{"state": "stopped"}``; ``GET`` it for ``{"instances": {actual_status, intended_status,
  cur_state}}``, where ``cur_state`` becomes ``unloaded`` on destroy.
- RunPod https://docs.runpod.io/api-reference/pods/ (REST v1): ``DELETE /v1/pods/{podId}``,
  ``POST /v1/pods/{podId}/stop``, ``GET /v1/pods/{podId}`` with ``desiredStatus`` one of
  ``RUNNING``, ``EXITED``, ``TERMINATED``.
Both take ``Authorization: Bearer <key>``.
"""

from __future__ import annotations

import enum
import http.client
import json
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

from . import __version__
from .errors import ReleaseError
from .log import logger, redact
from .settings import ExitAction, Provider, ProviderAccess

T = TypeVar("T")

RETRY_STATUS = frozenset({408, 429, 500, 502, 503, 504})
REQUEST_TIMEOUT = 15.0
_REFUSED_STATUS = frozenset({401, 403})


class InstanceState(enum.StrEnum):
    RUNNING = "running"  # anything that still bills compute: loading, running, rebooting, …
    STOPPED = "stopped"
    GONE = "gone"


@dataclass(frozen=True)
class Observed:
    state: InstanceState
    detail: str  # the provider's own words, e.g. "actual_status=running intended_status=stopped"


@dataclass(frozen=True)
class RetryPolicy:
    """Capped exponential backoff; ``sleep`` and ``clock`` are parameters so tests run instantly."""

    attempts: int = 6  # per call
    first_wait: float = 1.0
    max_wait: float = 16.0
    confirm_for: float = 90.0  # how long to keep reading the state before calling it a failure
    sleep: Callable[[float], None] = field(default=time.sleep, compare=False)
    clock: Callable[[], float] = field(default=time.monotonic, compare=False)

    def waits(self) -> list[float]:
        """The pauses between attempts, without ``Retry-After``."""
        return [min(self.max_wait, self.first_wait * 2**n) for n in range(self.attempts - 1)]


class ProviderHttpError(Exception):
    """A non-2xx answer, or no answer at all (``status`` None)."""

    def __init__(self, what: str, status: int | None, detail: str, retry_after: float | None = None) -> None:
        self.answer = f"{f'HTTP {status}' if status else 'no answer'} ({detail})"
        super().__init__(f"{what}: {self.answer}")
        self.status = status
        self.detail = detail
        self.retry_after = retry_after

    @property
    def retryable(self) -> bool:
        return self.status is None or self.status in RETRY_STATUS


def with_retries(call: Callable[[], T], what: str, policy: RetryPolicy) -> T:
    """Run ``call``; on a network error or a retryable status wait (``Retry-After`` wins) and run it again."""
    waits = policy.waits()
    for attempt in range(policy.attempts):
        try:
            return call()
        except ProviderHttpError as error:
            if not error.retryable or attempt == len(waits):
                raise
            pause = min(policy.max_wait, error.retry_after) if error.retry_after is not None else waits[attempt]
            logger.warning("%s; retrying in %.1f s (%d/%d)", redact(str(error)), pause, attempt + 1, len(waits))
            policy.sleep(pause)
    raise AssertionError("unreachable")


class Instance(Protocol):
    """This machine, as its provider's API sees it."""

    label: str  # for messages, e.g. "Vast.ai instance 123"
    key_name: str  # the variable holding the key, for hints

    def stop(self) -> None: ...

    def destroy(self) -> None: ...

    def observe(self) -> Observed: ...


class _Api:
    """Bearer-authenticated JSON requests to one provider."""

    def __init__(self, base_url: str, key: str) -> None:
        self.base_url = base_url.rstrip("/")
        self._key = key

    def call(self, method: str, path: str, what: str, body: dict[str, Any] | None = None) -> tuple[int, Any]:
        request = urllib.request.Request(
            self.base_url + path,
            method=method,
            data=None if body is None else json.dumps(body).encode(),
            headers={
                "Authorization": f"Bearer {self._key}",
                "Accept": "application/json",
                "User-Agent": f"trainbox/{__version__}",
                **({} if body is None else {"Content-Type": "application/json"}),
            },
        )
        try:
            with urllib.request.urlopen(request, timeout=REQUEST_TIMEOUT) as response:
                return response.status, _json(response.read())
        except urllib.error.HTTPError as error:
            payload = _json(error.read())
            detail = _message(payload) or error.reason or "no message"
            raise ProviderHttpError(what, error.code, str(detail)[:200], _retry_after(error.headers)) from None
        except (OSError, http.client.HTTPException) as error:  # refused, reset, timed out, DNS
            reason = getattr(error, "reason", None) or error
            raise ProviderHttpError(what, None, f"{type(error).__name__}: {reason}"[:200]) from None


class VastInstance:
    key_name = "CONTAINER_API_KEY"

    def __init__(self, api_url: str, instance_id: str, key: str) -> None:
        self.label = f"Vast.ai instance {instance_id}"
        self._api = _Api(api_url, key)
        self._path = f"/api/v0/instances/{urllib.parse.quote(instance_id, safe='')}/"

    def stop(self) -> None:
        _, body = self._api.call("PUT", self._path, f"stopping {self.label}", {"state": "stopped"})
        _check_success(body, f"stopping {self.label}")

    def destroy(self) -> None:
        _, body = self._api.call("DELETE", self._path, f"destroying {self.label}")
        _check_success(body, f"destroying {self.label}")

    def observe(self) -> Observed:
        try:
            _, body = self._api.call("GET", self._path, f"reading {self.label}")
        except ProviderHttpError as error:
            if error.status == 404:
                return Observed(InstanceState.GONE, "not found (HTTP 404)")
            raise
        return vast_state(body)


class RunPodInstance:
    key_name = "RUNPOD_API_KEY"

    def __init__(self, api_url: str, pod_id: str, key: str) -> None:
        self.label = f"RunPod pod {pod_id}"
        self._api = _Api(api_url, key)
        self._path = f"/v1/pods/{urllib.parse.quote(pod_id, safe='')}"

    def stop(self) -> None:
        self._api.call("POST", self._path + "/stop", f"stopping {self.label}")

    def destroy(self) -> None:
        self._api.call("DELETE", self._path, f"destroying {self.label}")

    def observe(self) -> Observed:
        try:
            _, body = self._api.call("GET", self._path, f"reading {self.label}")
        except ProviderHttpError as error:
            if error.status == 404:
                return Observed(InstanceState.GONE, "not found (HTTP 404)")
            raise
        return runpod_state(body)


def vast_state(body: Any) -> Observed:
    """Vast.ai's show-instance answer → our state. The record sits under ``instances`` (one object)."""
    record = body.get("instances") if isinstance(body, dict) else None
    if isinstance(record, list):
        record = record[0] if record else None
    if not isinstance(record, dict) or not record:
        return Observed(InstanceState.GONE, "no instance record")
    actual, intended, contract = record.get("actual_status"), record.get("intended_status"), record.get("cur_state")
    detail = f"actual_status={actual} intended_status={intended} cur_state={contract}"
    if contract == "unloaded":  # the machine contract is released on destroy
        return Observed(InstanceState.GONE, detail)
    # The agent runs inside the instance, so the container can only read "stopped" once the agent
    # is gone: the provider having taken "stopped" as its target is the confirmation we can see.
    if "stopped" in (actual, intended):
        return Observed(InstanceState.STOPPED, detail)
    return Observed(InstanceState.RUNNING, detail)


def runpod_state(body: Any) -> Observed:
    status = body.get("desiredStatus") if isinstance(body, dict) else None
    detail = f"desiredStatus={status}"
    if status == "TERMINATED":
        return Observed(InstanceState.GONE, detail)
    if status == "EXITED":
        return Observed(InstanceState.STOPPED, detail)
    return Observed(InstanceState.RUNNING, detail)


def instance_for(access: ProviderAccess) -> Instance:
    if access.instance_id is None or access.api_key is None:
        raise ReleaseError("no provider instance to release", "run on Vast.ai or RunPod, or set ON_EXIT=exit")
    key = access.api_key.reveal()
    if access.provider is Provider.VAST:
        return VastInstance(access.api_url, access.instance_id, key)
    if access.provider is Provider.RUNPOD:
        return RunPodInstance(access.api_url, access.instance_id, key)
    raise ReleaseError(f"provider {access.provider} cannot release instances", "set ON_EXIT=exit")


def end_bill(instance: Instance, action: ExitAction, policy: RetryPolicy | None = None) -> Observed:
    """Stop or destroy ``instance`` and confirm it from the provider's side; ``ReleaseError`` otherwise."""
    policy = policy or RetryPolicy()
    if action is ExitAction.EXIT:
        raise ValueError("exit needs no provider call")
    verb = "destroy" if action is ExitAction.DESTROY else "stop"
    wanted = {InstanceState.GONE} if action is ExitAction.DESTROY else {InstanceState.GONE, InstanceState.STOPPED}
    try:
        before = with_retries(instance.observe, f"reading {instance.label}", policy)
        if before.state is InstanceState.GONE:
            # Seconds ago this machine was running the job: "not found" means a wrong id or key
            # scope, and the machine we are on may well still be billing.
            raise ReleaseError(
                f"the provider does not know {instance.label} ({before.detail}); the bill was NOT ended",
                f"check the instance id and {instance.key_name}, then {verb} this machine from the provider console",
            )
        logger.info("%s: %s; requesting %s", instance.label, before.detail, verb)
        try:
            with_retries(instance.destroy if verb == "destroy" else instance.stop, f"{verb} {instance.label}", policy)
        except ProviderHttpError as error:
            if error.status != 404:  # 404 after a retry: an earlier attempt already did it
                raise
        return _confirm(instance, wanted, verb, policy)
    except ProviderHttpError as error:
        hint = (
            f"the provider refused {instance.key_name}: {verb} this machine from the provider console now"
            if error.status in _REFUSED_STATUS
            else f"{verb} this machine from the provider console now; it may still be billing"
        )
        raise ReleaseError(f"could not {verb} {instance.label}: {redact(error.answer)}", hint) from None


def _confirm(instance: Instance, wanted: set[InstanceState], verb: str, policy: RetryPolicy) -> Observed:
    """Read the state until it shows ``wanted``, backing off, for at most ``policy.confirm_for`` seconds."""
    deadline = policy.clock() + policy.confirm_for
    pause = policy.first_wait / 2
    while True:
        seen = with_retries(instance.observe, f"reading {instance.label}", policy)
        if seen.state in wanted:
            return seen
        if policy.clock() + pause > deadline:
            raise ReleaseError(
                f"{instance.label} still shows {seen.detail} {policy.confirm_for:.0f} s after the {verb} request; "
                "the bill may NOT have ended",
                f"{verb} this machine from the provider console",
            )
        logger.info("%s: %s; waiting %.1f s for the %s to show", instance.label, seen.detail, pause, verb)
        policy.sleep(pause)
        pause = min(policy.max_wait, pause * 2)


def _check_success(body: Any, what: str) -> None:
    """Vast.ai answers some refusals with HTTP 200 and ``{"success": false}``."""
    if isinstance(body, dict) and body.get("success") is False:
        raise ProviderHttpError(what, 200, str(_message(body) or "success=false")[:200])


def _json(raw: bytes) -> Any:
    try:
        return json.loads(raw) if raw.strip() else None
    except ValueError:
        return None


def _message(payload: Any) -> str | None:
    if isinstance(payload, dict):
        for key in ("msg", "message", "error", "detail"):
            if payload.get(key):
                return str(payload[key])
    return None


def _retry_after(headers: Any) -> float | None:
    value = headers.get("Retry-After") if headers is not None else None
    try:
        return max(0.0, float(value)) if value is not None else None
    except ValueError:
        return None  # an HTTP date: fall back to our own backoff
