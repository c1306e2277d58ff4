"""Local stand-ins for the providers' instance APIs, for tests and benchmarks.

Each server implements the documented endpoints for one instance, checks the Bearer key,
records every call and can be told to fail:

- ``FakeVast``: ``GET``/``PUT {"state": "stopped"}``/``DELETE`` on ``/api/v0/instances/{id}/``;
  the state reads as ``{"instances": {actual_status, intended_status, cur_state, dph_total}}``,
  404 once destroyed (or ``gone_answer``, to play a provider that answers something unclear).
- ``FakeRunPod``: RunPod REST v2 as its OpenAPI document describes it (the operations used here
  are tabled in ``runpod_v2_reference.json`` beside this file): ``GET /v2/pods/{id}`` → a ``Pod``,
  ``POST /v2/pods/{id}/action`` ``{"action": …}`` (409 when not valid now), ``DELETE /v2/pods/{id}``
  → 204; RFC 9457 problem errors, ``RateLimit`` headers; every other path, v1's included, is 404.

Point the agent at them with ``VAST_API_URL`` / ``RUNPOD_API_URL`` (``server.env()``).

The launch side, as templates/runpod.sh and templates/vast.sh meet it from a laptop with an account key:

- ``FakeRunPodLaunch``: ``GET /v2/catalog/gpus/{id}`` → a ``GpuType`` (its list prices), ``POST /v2/pods`` → 201
  and a ``Pod``, the body checked against ``CreatePodRequest`` of ``runpod_v2_reference.json`` (422 otherwise).
- ``FakeVastLaunch``: ``POST /api/v0/bundles/`` (the offer search: its ``eq``/``gte``/``lte`` filters and
  ``dph_total`` order) → ``{"offers": [...]}``, ``PUT /api/v0/asks/{offer}/`` → ``{"success": true,
  "new_contract": id}``, as vast-cli's ``search offers`` and ``create instance`` call them.
"""

from __future__ import annotations

import json
import re
import threading
import time
from dataclasses import dataclass
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

RUNPOD_V2_REFERENCE = Path(__file__).with_name("runpod_v2_reference.json")


@dataclass(frozen=True)
class Call:
    method: str
    path: str
    authorization: str | None
    body: Any
    status: int
    at: float  # time.time() when the request arrived
    content_type: str | None = None  # of the request
    answer: Any = None  # the body answered
    answer_headers: dict[str, str] | None = None


@dataclass
class Fault:
    status: int
    method: str | None = None  # None: every method
    times: int | None = None  # None: for ever
    retry_after: float | None = None
    body: Any = None  # bytes go out as they are (a body that is not JSON)


class FakeProvider:
    """One instance behind a provider API. ``state``: running, stopped or destroyed."""

    kind = ""

    def __init__(self, instance_id: str = "4242", key: str = "provider-key-0123456789", *, lag_reads: int = 0) -> None:
        self.instance_id = instance_id
        self.key = key
        self.state = "running"
        # State reads that still show "running" after an accepted stop/destroy (a slow provider).
        self.lag_reads = lag_reads
        self.calls: list[Call] = []
        self._faults: list[Fault] = []
        self._lock = threading.Lock()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self._server.daemon_threads = True
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, name=f"fake-{self.kind}", daemon=True
        )

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def start(self) -> FakeProvider:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def __enter__(self) -> FakeProvider:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def fail(
        self,
        status: int,
        *,
        method: str | None = None,
        times: int | None = None,
        retry_after: float | None = None,
        body: Any = None,
    ) -> Fault:
        fault = Fault(status, method, times, retry_after, body)
        with self._lock:
            self._faults.append(fault)
        return fault

    def actions(self) -> list[Call]:
        """The calls that change the instance (not the state reads)."""
        return [call for call in self.calls if call.method != "GET"]

    def env(self) -> dict[str, str]:  # pragma: no cover - per provider
        raise NotImplementedError

    # -- request handling ------------------------------------------------------------------
    def handle(
        self, method: str, path: str, authorization: str | None, body: Any, content_type: str | None = None
    ) -> tuple[int, Any, dict[str, str]]:
        with self._lock:
            status, answer, headers = self._answer(method, path, authorization, body)
            self.calls.append(
                Call(method, path, authorization, body, status, time.time(), content_type, answer, headers)
            )
            return status, answer, headers

    def _answer(self, method: str, path: str, authorization: str | None, body: Any) -> tuple[int, Any, dict[str, str]]:
        if authorization != f"Bearer {self.key}":
            return self._error(401, "invalid api key")
        for fault in self._faults:
            if fault.times != 0 and (fault.method is None or fault.method == method):
                if fault.times is not None:
                    fault.times -= 1
                status, payload, headers = self._error(fault.status, "injected")
                if fault.retry_after is not None:
                    headers["Retry-After"] = f"{fault.retry_after:g}"
                return status, fault.body if fault.body is not None else payload, headers
        return self._route(method, path, body)

    def _error(self, status: int, message: str) -> tuple[int, Any, dict[str, str]]:
        return status, {"error": message}, {}

    def _route(self, method: str, path: str, body: Any) -> tuple[int, Any, dict[str, str]]:  # pragma: no cover
        raise NotImplementedError

    def _visible_state(self) -> str:
        """What a state read shows now: the lag keeps a changed state hidden for a few reads."""
        if self.state != "running" and self.lag_reads > 0:
            self.lag_reads -= 1
            return "running"
        return self.state


class FakeVast(FakeProvider):
    kind = "vast"
    price: float | None = 0.35  # dph_total, $/h
    gpu_name: str | None = None  # what the record says was rented (``gpu_name``, ``num_gpus``: 1)
    # What a state read answers once destroyed; a test may make it something that proves nothing.
    gone_answer: tuple[int, Any] | None = None

    def env(self) -> dict[str, str]:
        return {"CONTAINER_ID": self.instance_id, "CONTAINER_API_KEY": self.key, "VAST_API_URL": self.url}

    def _route(self, method: str, path: str, body: Any) -> tuple[int, Any, dict[str, str]]:
        match = re.fullmatch(r"/api/v0/instances/([^/]+)/", path)
        not_found = 404, {"success": False, "error": "no_such_instance", "msg": "Instance not found"}, {}
        if match is None or match.group(1) != self.instance_id:
            return not_found
        if method == "GET":
            shown = self._visible_state()
            if shown == "destroyed":
                return not_found if self.gone_answer is None else (*self.gone_answer, {})
            record: dict[str, Any] = {
                "id": int(self.instance_id) if self.instance_id.isdigit() else self.instance_id,
                "actual_status": "running",  # the container runs until the host acts on the request
                "intended_status": "stopped" if shown == "stopped" else "running",
                "cur_state": "running",
            }
            if self.price is not None:
                record["dph_total"] = self.price
            if self.gpu_name is not None:
                record.update(gpu_name=self.gpu_name, num_gpus=1)
            return 200, {"instances": record}, {}
        if self.state == "destroyed":
            return not_found
        if method == "PUT":
            if not isinstance(body, dict) or body.get("state") not in {"stopped", "running"}:
                return 400, {"success": False, "error": "invalid_args", "msg": "state must be stopped or running"}, {}
            self.state = body["state"]
            return 200, {"success": True}, {}
        if method == "DELETE":
            self.state = "destroyed"
            return 200, {"success": True, "msg": "Instance destroyed successfully"}, {}
        return 405, {"error": "method not allowed"}, {}

    def _error(self, status: int, message: str) -> tuple[int, Any, dict[str, str]]:
        return status, {"success": False, "error": message, "msg": message}, {}


class FakeRunPod(FakeProvider):
    """One pod behind RunPod REST v2. Tests set ``price``, ``locked``, ``cluster``, ``status``
    (``ERROR``), ``forbidden`` (a key without access) or ``terminated_reads`` (reads that show
    ``TERMINATED`` before the deleted pod answers 404)."""

    kind = "runpod"
    price = 0.74  # the pod's cost, $/h, while it runs
    locked = False
    cluster: str | None = None
    status: str | None = None  # overrides RUNNING while the pod runs, e.g. "ERROR"
    forbidden = False
    terminated_reads = 0
    _POD = re.compile(r"/v2/pods/([^/]+)(/action)?")

    def env(self) -> dict[str, str]:
        return {"RUNPOD_POD_ID": self.instance_id, "RUNPOD_API_KEY": self.key, "RUNPOD_API_URL": self.url}

    def _error(self, status: int, message: str, errors: list[str] | None = None) -> tuple[int, Any, dict[str, str]]:
        problem: dict[str, Any] = {"title": HTTPStatus(status).phrase, "status": status, "detail": message}
        if errors:
            problem["errors"] = errors
        headers = {"Content-Type": "application/problem+json"}
        if status != 401:  # RateLimit travels with every authenticated answer
            headers |= self._rate_limit(exhausted=status == 429)
        return status, problem, headers

    @staticmethod
    def _rate_limit(*, exhausted: bool = False) -> dict[str, str]:
        minute = "r=0;t=12" if exhausted else "r=59;t=60"
        return {
            "RateLimit": f'"minute";{minute}, "hour";r=2999;t=3600, "day";r=49999;t=86400',
            "RateLimit-Policy": '"minute";q=60;w=60, "hour";q=3000;w=3600, "day";q=50000;w=86400',
        }

    def _ok(self, status: int, payload: Any) -> tuple[int, Any, dict[str, str]]:
        return status, payload, self._rate_limit()

    def _route(self, method: str, path: str, body: Any) -> tuple[int, Any, dict[str, str]]:
        match = self._POD.fullmatch(path)  # anything else, /v1/... included, is not found
        if match is None:
            return self._error(404, "resource not found")
        action_path = match.group(2) is not None
        allowed = ["POST"] if action_path else ["GET", "DELETE"]
        if method not in allowed:
            status, problem, headers = self._error(405, "The requested method is not allowed for this path.")
            return status, problem, headers | {"Allow": ", ".join(allowed)}
        if self.forbidden:
            return self._error(403, "access denied")
        if match.group(1) != self.instance_id:
            return self._error(404, "pod not found")
        if method == "GET":
            shown = self._visible_state()
            if shown == "destroyed":
                if self.terminated_reads > 0:
                    self.terminated_reads -= 1
                    return self._ok(200, self._pod("TERMINATED"))
                return self._error(404, "pod not found")
            return self._ok(200, self._pod(self._status(shown)))
        if self.state == "destroyed":
            return self._error(404, "pod not found")
        if method == "DELETE":
            return self._terminate()
        return self._action(body)

    def _action(self, body: Any) -> tuple[int, Any, dict[str, str]]:
        if not isinstance(body, dict):
            return self._error(400, "request body must be a JSON object")
        problems = [f"$: additional properties '{key}' not allowed" for key in body if key != "action"]
        if "action" not in body:
            problems.append("$: missing property 'action'")
        elif body["action"] not in {"start", "stop", "restart", "terminate"}:
            problems.append("$.action: value must be one of 'start', 'stop', 'restart', 'terminate'")
        if problems:
            return self._error(422, "Request validation failed.", problems)
        action = body["action"]
        status = self._status(self.state)
        if self.cluster is not None:
            return self._error(409, f"pod belongs to cluster {self.cluster}; manage it through /v2/clusters/{{id}}")
        if action not in self._actions(status):
            return self._error(409, f"action {action} is not valid for a pod in status {status}")
        if action == "terminate":
            return self._terminate()
        self.state = {"stop": "stopped", "start": "running", "restart": "running"}[action]
        return self._ok(200, self._pod(self._status(self.state)))

    def _terminate(self) -> tuple[int, Any, dict[str, str]]:
        if self.cluster is not None:
            return self._error(409, "Pod belongs to a cluster and cannot be terminated via the pod endpoints.")
        self.state = "destroyed"
        return self._ok(204, None)

    def _status(self, state: str) -> str:
        if state == "running":
            return self.status or "RUNNING"
        return {"stopped": "EXITED", "destroyed": "TERMINATED"}[state]

    def _actions(self, status: str) -> list[str]:
        actions = {
            "RUNNING": ["stop", "restart", "terminate"],
            "EXITED": ["start", "terminate"],
            "ERROR": ["start", "terminate"],
            "PROVISIONING": ["stop", "terminate"],
            "STARTING": ["stop", "terminate"],
        }.get(status, [])
        if self.locked:  # locked prevents stopping or resetting
            actions = [action for action in actions if action not in {"stop", "restart"}]
        return actions

    def _pod(self, status: str) -> dict[str, Any]:
        """A ``Pod`` with every field the schema requires."""
        running = status in {"RUNNING", "PROVISIONING", "STARTING"}
        pod: dict[str, Any] = {
            "id": self.instance_id,
            "name": "trainbox",
            "status": status,
            "actions": self._actions(status),
            "image": "ghcr.io/libreyolo/trainbox:latest",
            "args": "",
            "disk": 30,
            "mounts": {"persistent": {"size": 100, "path": "/workspace"}},
            "ports": [],
            "env": {},
            "registry": None,
            "gpu": {"id": "NVIDIA GeForce RTX 4090", "count": 1},
            "cloud": "SECURE",
            "dataCenterId": "US-KS-2",
            "cudaVersion": "12.8",
            "ssh": {},
            "template": None,
            "cost": self.price if running else 0.0,
            "locked": self.locked,
            "globalNetworking": {"enabled": False},
            "runtime": {"uptime": 60, "ports": []} if status == "RUNNING" else None,
            "createdAt": "2026-12-01T12:00:00Z",
            "startedAt": "2026-12-01T12:02:00Z",
        }
        if self.cluster is not None:
            pod["cluster"] = {"id": self.cluster, "rank": 0}
        return pod


def _handler(provider: FakeProvider) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def _serve(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length) if length else b""
            try:
                body = json.loads(raw) if raw else None
            except ValueError:
                body = raw.decode(errors="replace")
            status, payload, headers = provider.handle(
                self.command,
                self.path.split("?")[0],
                self.headers.get("Authorization"),
                body,
                self.headers.get("Content-Type"),
            )
            headers = dict(headers)
            if isinstance(payload, bytes):
                data = payload
                headers.setdefault("Content-Type", "text/html")
            else:
                data = b"" if payload is None or status == 204 else json.dumps(payload).encode()
            content_type = headers.pop("Content-Type", "application/json")
            self.send_response(status)
            for name, value in headers.items():
                self.send_header(name, value)
            if data:
                self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        do_GET = do_PUT = do_POST = do_DELETE = do_PATCH = _serve

        def log_message(self, format: str, *args: Any) -> None:
            pass

    return Handler


class FakeRunPodLaunch(FakeProvider):
    """RunPod REST v2 for creating a pod. ``prices``: GPU type id → (secure, community) list $/h per GPU."""

    kind = "runpod-launch"
    pod_id = "7h9k2m4n6p"
    prices: dict[str, tuple[float, float]] = {  # noqa: RUF012 - a test may replace it whole
        "NVIDIA GeForce RTX 4090": (0.69, 0.34),
        "NVIDIA H100 80GB HBM3": (2.99, 2.39),
    }

    def created(self) -> list[Any]:
        return [call.body for call in self.calls if call.method == "POST" and call.status == 201]

    def _error(self, status: int, message: str, errors: list[str] | None = None) -> tuple[int, Any, dict[str, str]]:
        problem: dict[str, Any] = {"title": HTTPStatus(status).phrase, "status": status, "detail": message}
        if errors:
            problem["errors"] = errors
        return status, problem, {"Content-Type": "application/problem+json"}

    def _route(self, method: str, path: str, body: Any) -> tuple[int, Any, dict[str, str]]:
        from urllib.parse import unquote

        gpu = re.fullmatch(r"/v2/catalog/gpus/([^/]+)", path)
        if method == "GET" and gpu is not None:
            gpu_id = unquote(gpu.group(1))
            if gpu_id not in self.prices:
                return self._error(404, f"GPU type {gpu_id} not found")
            secure, community = self.prices[gpu_id]
            return 200, {
                "id": gpu_id, "name": gpu_id.split()[-1], "pool": None, "manufacturer": "NVIDIA", "memory": 80,
                "secure": True, "community": True, "price": {"secure": secure, "community": community},
                "maxCount": {"secure": 8, "community": 8},
            }, {}  # fmt: skip
        if method == "POST" and path == "/v2/pods":
            problems = _create_pod_problems(body)
            if problems:
                return self._error(422, "Request validation failed.", problems)
            pod = {"id": self.pod_id, "name": body["name"], "status": "PROVISIONING", "image": body.get("image")}
            return 201, pod | {"gpu": body.get("gpu"), "cloud": body.get("cloud", "SECURE"), "cost": 0.0}, {}
        return self._error(404, "resource not found")


def _create_pod_problems(body: Any) -> list[str]:
    """``body`` against RunPod's ``CreatePodRequest`` schema (runpod_v2_reference.json), one line per problem."""
    import jsonschema

    reference = json.loads(RUNPOD_V2_REFERENCE.read_text())
    schema = {"$ref": "#/components/schemas/CreatePodRequest", "components": reference["components"]}
    validator = jsonschema.Draft202012Validator(schema)
    errors = validator.iter_errors(body)
    return [f"{'.'.join(map(str, error.absolute_path)) or '$'}: {error.message}" for error in errors]


class FakeVastLaunch(FakeProvider):
    """Vast.ai's offer search and rental. ``offers``: what the market holds now."""

    kind = "vast-launch"
    contract = 7835610

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.offers: list[dict[str, Any]] = [
            {"id": 111, "gpu_name": "RTX 4090", "num_gpus": 1, "dph_total": 0.41, "disk_space": 300.0},
            {"id": 222, "gpu_name": "RTX 4090", "num_gpus": 1, "dph_total": 0.33, "disk_space": 150.0},
            {"id": 333, "gpu_name": "H100 SXM", "num_gpus": 2, "dph_total": 4.10, "disk_space": 500.0},
        ]
        for offer in self.offers:
            offer |= {"verified": True, "external": False, "rentable": True, "rented": False, "cuda_max_good": 12.8}

    def rented(self) -> list[tuple[str, Any]]:
        return [(call.path, call.body) for call in self.calls if call.method == "PUT" and call.status == 200]

    def _error(self, status: int, message: str) -> tuple[int, Any, dict[str, str]]:
        return status, {"success": False, "error": message, "msg": message}, {}

    def _route(self, method: str, path: str, body: Any) -> tuple[int, Any, dict[str, str]]:
        if method == "POST" and path == "/api/v0/bundles/":
            if not isinstance(body, dict):
                return self._error(400, "the query must be a JSON object")
            found = [offer for offer in self.offers if _matches(offer, body)]
            for field, direction in reversed(body.get("order") or []):
                found.sort(key=lambda offer: offer[field], reverse=direction == "desc")
            return 200, {"offers": found[: int(body.get("limit") or 64)]}, {}
        ask = re.fullmatch(r"/api/v0/asks/(\d+)/", path)
        if method == "PUT" and ask is not None:
            if int(ask.group(1)) not in {offer["id"] for offer in self.offers}:
                return self._error(404, "no_such_ask")
            missing = [key for key in ("client_id", "image", "disk", "runtype", "env") if key not in (body or {})]
            if missing or not isinstance(body["env"], dict):
                return self._error(400, f"invalid_args: {missing or 'env must be an object'}")
            return 200, {"success": True, "new_contract": self.contract}, {}
        return self._error(404, "not found")


def _matches(offer: dict[str, Any], query: dict[str, Any]) -> bool:
    compare = {"eq": lambda a, b: a == b, "gte": lambda a, b: a >= b, "lte": lambda a, b: a <= b}
    for field, condition in query.items():
        if isinstance(condition, dict) and field in offer:
            for operator, wanted in condition.items():
                if not compare[operator](offer[field], wanted):
                    return False
    return True
