"""Local stand-ins for the providers' instance APIs, for tests and benchmarks.

Each server implements the documented endpoints for one instance, checks the Bearer key,
records every call and can be told to fail:

- ``FakeVast``: ``GET``/``PUT {"state": "stopped"}``/``DELETE`` on ``/api/v0/instances/{id}/``;
  the state reads as ``{"instances": {actual_status, intended_status, cur_state}}``, 404 once destroyed.
- ``FakeRunPod``: ``GET``/``DELETE`` on ``/v1/pods/{id}``, ``POST /v1/pods/{id}/stop``;
  the state reads as ``{"id", "desiredStatus": RUNNING|EXITED}``, 404 once deleted.

Point the agent at them with ``VAST_API_URL`` / ``RUNPOD_API_URL`` (``server.env()``).
"""

from __future__ import annotations

import json
import re
import threading
import time
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass(frozen=True)
class Call:
    method: str
    path: str
    authorization: str | None
    body: Any
    status: int
    at: float  # time.time() when the request arrived


@dataclass
class Fault:
    status: int
    method: str | None = None  # None: every method
    times: int | None = None  # None: for ever
    retry_after: float | None = None
    body: Any = None


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
    def handle(self, method: str, path: str, authorization: str | None, body: Any) -> tuple[int, Any, dict[str, str]]:
        with self._lock:
            answer = self._answer(method, path, authorization, body)
            self.calls.append(Call(method, path, authorization, body, answer[0], time.time()))
            return answer

    def _answer(self, method: str, path: str, authorization: str | None, body: Any) -> tuple[int, Any, dict[str, str]]:
        if authorization != f"Bearer {self.key}":
            return 401, {"error": "invalid api key"}, {}
        for fault in self._faults:
            if fault.times != 0 and (fault.method is None or fault.method == method):
                if fault.times is not None:
                    fault.times -= 1
                headers = {} if fault.retry_after is None else {"Retry-After": f"{fault.retry_after:g}"}
                return fault.status, fault.body if fault.body is not None else {"error": "injected"}, headers
        return self._route(method, path, body)

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
                return not_found
            record = {
                "id": int(self.instance_id) if self.instance_id.isdigit() else self.instance_id,
                "actual_status": "running",  # the container runs until the host acts on the request
                "intended_status": "stopped" if shown == "stopped" else "running",
                "cur_state": "running",
            }
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


class FakeRunPod(FakeProvider):
    kind = "runpod"

    def env(self) -> dict[str, str]:
        return {"RUNPOD_POD_ID": self.instance_id, "RUNPOD_API_KEY": self.key, "RUNPOD_API_URL": self.url}

    def _route(self, method: str, path: str, body: Any) -> tuple[int, Any, dict[str, str]]:
        match = re.fullmatch(r"/v1/pods/([^/]+)(/stop)?", path)
        if match is None or match.group(1) != self.instance_id:
            return 404, {"error": "pod not found"}, {}
        if method == "GET" and not match.group(2):
            shown = self._visible_state()
            return (404, {"error": "pod not found"}, {}) if shown == "destroyed" else (200, self._pod(shown), {})
        if self.state == "destroyed":
            return 404, {"error": "pod not found"}, {}
        if match.group(2):
            if method != "POST":
                return 405, {"error": "method not allowed"}, {}
            self.state = "stopped"
            return 200, self._pod("stopped"), {}
        if method == "DELETE":
            self.state = "destroyed"
            return 204, None, {}
        return 405, {"error": "method not allowed"}, {}

    def _pod(self, state: str) -> dict[str, Any]:
        return {"id": self.instance_id, "desiredStatus": {"stopped": "EXITED"}.get(state, "RUNNING"), "costPerHr": 0.74}


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
                self.command, self.path.split("?")[0], self.headers.get("Authorization"), body
            )
            data = b"" if payload is None or status == 204 else json.dumps(payload).encode()
            self.send_response(status)
            for name, value in headers.items():
                self.send_header(name, value)
            if data:
                self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        do_GET = do_PUT = do_POST = do_DELETE = _serve

        def log_message(self, format: str, *args: Any) -> None:
            pass

    return Handler
