"""The providers' instance APIs: stop or destroy this instance, then read its state back.

One small ``Instance`` protocol, one class per provider, the one retry helper for their calls,
and ``end_bill``: act, then poll the instance until the provider shows the bill has ended.
The API key only ever goes into the ``Authorization`` header; it is registered for redaction.

Endpoints (checked against the providers' API references):
- Vast.ai https://docs.vast.ai/api-reference/instances/ (destroy-instance, manage-instance,
  show-instance): ``DELETE /api/v0/instances/{id}/``; ``PUT`` the same URL with
  ``{"state": "stopped"}``; ``GET`` it for ``{"instances": {actual_status, intended_status,
  cur_state}}``, where ``cur_state`` becomes ``unloaded`` on destroy.
  The record's ``dph_total`` is the instance's price in $/h. A 200 without an instance record is
  no answer at all: it is retried and never read as "gone".
- RunPod REST v2, base ``https://api.runpod.io`` (OpenAPI ``/v2/openapi.json``, version 2.0.0;
  REST v1 at rest.runpod.io was retired on 2026-12-01): ``GET /v2/pods/{id}`` answers a ``Pod``
  with ``status`` (``PROVISIONING``, ``STARTING``, ``RUNNING``, ``EXITED``, ``ERROR``,
  ``TERMINATED``), ``cost`` ($/h, 0 when stopped), ``locked`` (prevents stopping) and ``cluster``
  (Instant Cluster members, ended only through ``/v2/clusters/{id}``); ``POST /v2/pods/{id}/action``
  with ``{"action": "stop"}`` answers 200 and the Pod, 409 when the action is not valid now;
  ``DELETE /v2/pods/{id}`` answers 204 with no body. Errors are RFC 9457 problem objects
  (``title``, ``status``, ``detail``); a 429 carries ``Retry-After`` and ``RateLimit``.
Both take ``Authorization: Bearer <key>``.
"""

from __future__ import annotations

import enum
import http.client
import json
import threading
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar, cast

from .. import __version__, retry
from ..errors import ReleaseError
from ..log import logger, redact
from ..settings import ExitAction, Provider, ProviderAccess

T = TypeVar("T")

REQUEST_TIMEOUT = 15.0
# A request started at the deadline still gets this long (a clock of a test may sit past it).
REQUEST_MIN_WAIT = 1.0
_REFUSED_STATUS = frozenset({401, 403})


class InstanceState(enum.StrEnum):
    RUNNING = "running"  # anything that still bills compute: provisioning, loading, running, rebooting, …
    STOPPED = "stopped"
    GONE = "gone"
    ERROR = "error"  # RunPod's ERROR: neither stopped nor gone, so never a confirmation


@dataclass(frozen=True)
class Observed:
    state: InstanceState
    detail: str  # the provider's own words, e.g. "actual_status=running intended_status=stopped"
    price_per_hour: float | None = None  # what the provider bills now ($/h), when it says
    price_source: str | None = None  # the field it came from, e.g. "runpod:cost"
    gpu: dict[str, Any] | None = None  # what it says it rented: gpu_name, gpu_count, source (the host check)
    # The instance's record says its container no longer runs (destroyed, exited, stopped): every process it ran
    # has ended, and a restart would run new ones. Never set on a 404 or on a stop only asked for.
    ended: bool = False


@dataclass(frozen=True)
class ReleaseRetry(retry.RetryPolicy):
    """The shared policy with the provider calls' limits, plus how long a release keeps confirming."""

    max_wait: float = 16.0
    # A provider's own wait (Retry-After, RateLimit) is honoured up to a minute, RunPod's shortest
    # rate window; a longer one is cut so the release still ends, or fails loudly, within minutes.
    max_retry_after: float = 60.0
    confirm_for: float = 90.0  # how long to keep reading the state before calling it a failure


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
        return self.status is None or self.status in retry.RETRY_STATUS


class UnclearAnswer(ProviderHttpError):
    """A 200 that says nothing about the instance (no record, an empty object, not JSON).

    It proves neither "gone" nor "stopped": it is retried like a 503 and never confirms a release."""

    def __init__(self, what: str, detail: str) -> None:
        super().__init__(what, 200, detail)

    @property
    def retryable(self) -> bool:
        return True


class DeadlineReached(ProviderHttpError):
    """Waiting for the next try (a long ``Retry-After``) would pass the release's deadline."""

    def __init__(self, what: str, error: ProviderHttpError, left: float) -> None:
        detail = f"{error.detail}; the release deadline leaves {max(0.0, left):.0f} s, too little to try again"
        super().__init__(what, error.status, detail, error.retry_after)

    @property
    def retryable(self) -> bool:
        return False


def with_provider_retries(call: Callable[[], T], what: str, policy: ReleaseRetry) -> T:
    """Run ``call``; on a network error or a retryable status wait (the provider's wait wins) and run it again."""
    return retry.call_with_retries(
        _within(call, what, policy),
        policy,
        retryable=lambda error: isinstance(error, ProviderHttpError) and error.retryable,
        describe=lambda error: redact(str(error)),
        asked_wait=lambda error: error.retry_after if isinstance(error, ProviderHttpError) else None,
        past_deadline=lambda error, left: (
            DeadlineReached(what, error, left) if isinstance(error, ProviderHttpError) else error
        ),
    )


def _within(call: Callable[[], T], what: str, policy: ReleaseRetry) -> Callable[[], T]:
    """Each try ends by ``policy.deadline``, a request in flight too (a slow DNS lookup, a provider
    that takes the connection and never answers): it runs in a thread that is left behind then."""
    deadline = policy.deadline
    if deadline is None:
        return call

    def bounded() -> T:
        outcome: list[tuple[bool, Any]] = []

        def attempt() -> None:
            try:
                outcome.append((True, call()))
            except BaseException as error:  # handed to the caller's thread
                outcome.append((False, error))

        worker = threading.Thread(target=attempt, name="provider-request", daemon=True)
        worker.start()
        worker.join(max(REQUEST_MIN_WAIT, deadline - policy.clock()))
        if not outcome:
            raise ProviderHttpError(what, None, "no answer before the release deadline")
        ok, value = outcome[0]
        if not ok:
            raise value
        return cast(T, value)

    return bounded


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
                "Accept": "application/json, application/problem+json",
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
            wait = retry.parse_retry_after(error.headers.get("Retry-After") if error.headers is not None else None)
            if wait is None and error.code == 429:
                wait = _rate_limit_wait(error.headers.get("RateLimit") if error.headers is not None else None)
            raise ProviderHttpError(what, error.code, str(detail)[:200], wait) from None
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
        what = f"reading {self.label}"
        try:
            _, body = self._api.call("GET", self._path, what)
        except ProviderHttpError as error:
            if error.status == 404:
                return Observed(InstanceState.GONE, "not found (HTTP 404)")
            raise
        return vast_state(body, what)


class RunPodInstance:
    key_name = "RUNPOD_API_KEY"

    def __init__(self, api_url: str, pod_id: str, key: str) -> None:
        self.label = f"RunPod pod {pod_id}"
        self._api = _Api(api_url, key)
        self._path = f"/v2/pods/{urllib.parse.quote(pod_id, safe='')}"
        self._pod: dict[str, Any] = {}  # the last Pod read, to explain a refusal

    def stop(self) -> None:
        try:
            self._api.call("POST", self._path + "/action", f"stopping {self.label}", {"action": "stop"})
        except ProviderHttpError as error:
            if error.status != 409:
                raise
            # 409 on a retried stop whose first attempt landed: the pod is EXITED already.
            if self.observe().state in {InstanceState.STOPPED, InstanceState.GONE}:
                return
            raise self._refusal(error, "stop") from None

    def destroy(self) -> None:
        try:
            self._api.call("DELETE", self._path, f"terminating {self.label}")
        except ProviderHttpError as error:
            if error.status != 409:
                raise
            if self.observe().state is InstanceState.GONE:
                return
            raise self._refusal(error, "terminate") from None

    def observe(self) -> Observed:
        what = f"reading {self.label}"
        try:
            _, body = self._api.call("GET", self._path, what)
        except ProviderHttpError as error:
            if error.status == 404:
                return Observed(InstanceState.GONE, "not found (HTTP 404)")
            raise
        if isinstance(body, dict):
            self._pod = body
        return runpod_state(body, what)

    def _refusal(self, error: ProviderHttpError, action: str) -> ReleaseError:
        """A 409, explained by the pod as just read: an Instant Cluster member, locked, or in a
        status that does not allow ``action``."""
        refused = f"RunPod refused to {action} {self.label} ({error.answer})"
        cluster = self._pod.get("cluster")
        if isinstance(cluster, dict) and cluster.get("id"):
            return ReleaseError(
                f"{refused}: it belongs to Instant Cluster {cluster['id']}, which RunPod ends only as a whole",
                f"terminate cluster {cluster['id']} from the RunPod console; this pod may still be billing",
            )
        if action == "stop" and self._pod.get("locked") is True:
            return ReleaseError(
                f"{refused}: the pod is locked (locked: true prevents stopping)",
                "unlock it in the RunPod console and stop it there, or use ON_EXIT=destroy; it may still be billing",
            )
        allowed = ", ".join(map(str, self._pod.get("actions") or [])) or "none"
        return ReleaseError(
            f"{refused}: not valid in status {self._pod.get('status', 'unknown')} (valid now: {allowed})",
            f"{action} the pod from the RunPod console; it may still be billing",
        )


def vast_state(body: Any, what: str = "reading the instance") -> Observed:
    """Vast.ai's show-instance answer → our state. The record sits under ``instances`` (one object).

    Only a 404 or a record that says so means gone or stopped; an answer without a record is
    ``UnclearAnswer``, never "gone": taking silence for a destroy would end the job with the bill running."""
    record = body.get("instances") if isinstance(body, dict) else None
    if isinstance(record, list):
        record = record[0] if len(record) == 1 else None
    if not isinstance(record, dict) or not record:
        raise UnclearAnswer(what, "an answer without an instance record" if body is not None else "not JSON")
    actual, intended, contract = record.get("actual_status"), record.get("intended_status"), record.get("cur_state")
    detail = f"actual_status={actual} intended_status={intended} cur_state={contract}"
    price = _price(record.get("dph_total"))
    source = "vast:dph_total" if price is not None else None
    gpu = _rented("vast:gpu_name", record.get("gpu_name"), record.get("num_gpus"))
    ended = contract == "unloaded" or actual in ("exited", "stopped")  # not "frozen": its memory is kept
    if contract == "unloaded":  # the machine contract is released on destroy
        return Observed(InstanceState.GONE, detail, price, source, gpu, ended)
    # The agent runs inside the instance, so the container can only read "stopped" once the agent
    # is gone: the provider having taken "stopped" as its target is the confirmation we can see.
    if "stopped" in (actual, intended):
        return Observed(InstanceState.STOPPED, detail, price, source, gpu, ended)
    if actual is None and intended is None and contract is None:
        raise UnclearAnswer(what, "an instance record without a status")
    return Observed(InstanceState.RUNNING, detail, price, source, gpu, ended)


def runpod_state(body: Any, what: str = "reading the pod") -> Observed:
    """RunPod v2's ``Pod`` → our state. ``ERROR`` is reported as it is; an unknown status still bills."""
    status = body.get("status") if isinstance(body, dict) else None
    if not isinstance(status, str) or not status:
        raise UnclearAnswer(what, "an answer without a pod status" if body is not None else "not JSON")
    detail = f"status={status}" + (" locked" if body.get("locked") is True else "")
    price = _price(body.get("cost"))  # 0.0 once EXITED or TERMINATED: no price
    source = "runpod:cost" if price is not None else None
    state = {"TERMINATED": InstanceState.GONE, "EXITED": InstanceState.STOPPED, "ERROR": InstanceState.ERROR}.get(
        status, InstanceState.RUNNING
    )
    # v2's Pod names its GPU type in ``gpu.id`` with ``gpu.count``; v1's pod did in ``machine``.
    gpu_block = body.get("gpu") if isinstance(body.get("gpu"), dict) else {}
    machine = body.get("machine") if isinstance(body.get("machine"), dict) else {}
    if gpu_block.get("id"):
        gpu = _rented("runpod:gpu.id", gpu_block.get("id"), gpu_block.get("count"))
    else:
        name = machine.get("gpuDisplayName") or machine.get("gpuTypeId")
        gpu = _rented("runpod:machine.gpuTypeId", name, body.get("gpuCount"))
    return Observed(state, detail, price, source, gpu, ended=status in ("TERMINATED", "EXITED"))


def _rented(source: str, name: Any, count: Any) -> dict[str, Any] | None:
    """The provider's own words for the GPUs it rented, for the host check; None when it says nothing."""
    if not isinstance(name, str) or not name.strip():
        return None
    return {"gpu_name": name.strip(), "gpu_count": count if isinstance(count, int) else None, "source": source}


def instance_for(access: ProviderAccess) -> Instance:
    if access.instance_id is None or access.api_key is None:
        raise ReleaseError("no provider instance to release", "run on Vast.ai or RunPod, or set ON_EXIT=exit")
    key = access.api_key.reveal()
    if access.provider is Provider.VAST:
        return VastInstance(access.api_url, access.instance_id, key)
    if access.provider is Provider.RUNPOD:
        return RunPodInstance(access.api_url, access.instance_id, key)
    raise ReleaseError(f"provider {access.provider} cannot release instances", "set ON_EXIT=exit")


def end_bill(instance: Instance, action: ExitAction, policy: ReleaseRetry | None = None) -> Observed:
    """Stop or destroy ``instance`` and confirm it from the provider's side; ``ReleaseError`` otherwise."""
    policy = policy or ReleaseRetry()
    if action is ExitAction.EXIT:
        raise ValueError("exit needs no provider call")
    verb = "destroy" if action is ExitAction.DESTROY else "stop"
    wanted = {InstanceState.GONE} if action is ExitAction.DESTROY else {InstanceState.GONE, InstanceState.STOPPED}
    try:
        before = with_provider_retries(instance.observe, f"reading {instance.label}", policy)
        if before.state is InstanceState.GONE:
            # Seconds ago this machine was running the job: "not found" means a wrong id or key
            # scope, and the machine we are on may well still be billing.
            raise ReleaseError(
                f"the provider does not know {instance.label} ({before.detail}); the bill was NOT ended",
                f"check the instance id and {instance.key_name}, then {verb} this machine from the provider console",
            )
        logger.info("%s: %s; requesting %s", instance.label, before.detail, verb)
        try:
            with_provider_retries(
                instance.destroy if verb == "destroy" else instance.stop, f"{verb} {instance.label}", policy
            )
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


def _confirm(instance: Instance, wanted: set[InstanceState], verb: str, policy: ReleaseRetry) -> Observed:
    """Read the state until it shows ``wanted``, backing off, for at most ``policy.confirm_for`` seconds."""
    deadline = policy.clock() + policy.confirm_for
    if policy.deadline is not None:
        deadline = min(deadline, policy.deadline)
    pause = policy.first_wait / 2
    while True:
        seen = with_provider_retries(instance.observe, f"reading {instance.label}", policy)
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
    """The error text of an answer: an RFC 9457 problem's ``title: detail`` (RunPod v2), else Vast.ai's ``msg``."""
    if not isinstance(payload, dict):
        return None
    if payload.get("title") or payload.get("detail"):
        text = ": ".join(str(payload[key]) for key in ("title", "detail") if payload.get(key))
        errors = payload.get("errors")
        if isinstance(errors, list) and errors:
            text += " (" + "; ".join(map(str, errors[:3])) + ")"
        return text
    for key in ("msg", "message", "error"):
        if payload.get(key):
            return str(payload[key])
    return None


def _price(value: Any) -> float | None:
    """A provider's $/h; 0 (a stopped instance) and anything that is not a number mean no price."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if value > 0 else None


def _rate_limit_wait(value: str | None) -> float | None:
    """Seconds until an exhausted window of a ``RateLimit`` header resets.

    The header (IETF ratelimit-headers, as RunPod sends it) lists one member per window, e.g.
    ``"minute";r=0;t=12, "hour";r=2800;t=1812``: ``r`` requests remain, ``t`` seconds to the reset."""
    if not value:
        return None
    waits: list[float] = []
    for member in value.split(","):
        params = dict(part.strip().split("=", 1) for part in member.split(";")[1:] if "=" in part)
        try:
            if int(params.get("r", "1")) <= 0:
                waits.append(max(0.0, float(params["t"])))
        except (KeyError, ValueError):
            continue
    return max(waits) if waits else None
