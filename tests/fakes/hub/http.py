"""The HTTP side of the local Hub: request parsing, routing table, responses, fault application, server."""

from __future__ import annotations

import contextlib
import io
import json
import re
import socket
import threading
import time
import traceback
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs, urlsplit

from tests.fakes.hub.faults import HOLD_AT_MOST
from tests.fakes.hub.model import CHUNK, MAX_JSON_BODY, HubError, RequestRecord, Token, _Abort

if TYPE_CHECKING:
    from tests.fakes.hub.server import HubServer


@dataclass
class _Call:
    """One parsed Hub API request, handed to the endpoint methods."""

    method: str
    user: Token | None
    repo_type: str
    repo_id: str
    rev: str
    path: str
    query: dict[str, list[str]]
    key: str


_T = r"(?P<t>models|datasets|spaces)"
_P = r"(?:(?P<t>datasets|spaces)/)?"
_R = r"(?P<repo>[^/]+/[^/]+)"
_ROUTES: list[tuple[str, re.Pattern[str], str]] = [
    (m, re.compile(rx), name)
    for m, rx, name in [
        ("GET", r"/api/whoami-v2", "whoami"),
        ("POST", r"/api/repos/create", "create_repo"),
        ("DELETE", r"/api/repos/delete", "delete_repo"),
        ("POST", r"/api/validate-yaml", "validate_yaml"),
        ("GET", rf"/api/{_T}/{_R}(?:/revision/(?P<rev>[^/]+))?", "repo_info"),
        ("GET", rf"/api/{_T}/{_R}/tree/(?P<rev>[^/]+)(?:/(?P<path>.*))?", "tree"),
        ("POST", rf"/api/{_T}/{_R}/paths-info/(?P<rev>[^/]+)", "paths_info"),
        ("GET", rf"/api/{_T}/{_R}/commits/(?P<rev>[^/]+)", "list_commits"),
        ("GET", rf"/api/{_T}/{_R}/refs", "refs"),
        ("POST", rf"/api/{_T}/{_R}/preupload/(?P<rev>[^/]+)", "preupload"),
        ("GET", rf"/api/{_T}/{_R}/xet-read-token/(?P<rev>[^/]+)", "xet_read_token"),
        ("GET", rf"/api/{_T}/{_R}/xet-write-token/(?P<rev>[^/]+)", "xet_write_token"),
        ("POST", rf"/api/{_T}/{_R}/commit/(?P<rev>[^/]+)", "commit"),
        ("POST", rf"/api/{_T}/{_R}/branch/(?P<rev>[^/]+)", "create_branch"),
        ("POST", rf"/api/{_T}/{_R}/tag/(?P<rev>[^/]+)", "create_tag"),
        ("POST", rf"/{_P}{_R}\.git/info/lfs/objects/batch", "lfs_batch"),
        ("POST", rf"/{_P}{_R}\.git/info/lfs/objects/verify", "lfs_verify"),
        ("PUT", r"/_lfs/(?P<key>[A-Za-z0-9_-]+)", "lfs_put"),
        ("GET", rf"/{_P}{_R}/resolve/(?P<rev>[^/]+)/(?P<path>.+)", "resolve"),
        ("HEAD", rf"/{_P}{_R}/resolve/(?P<rev>[^/]+)/(?P<path>.+)", "resolve"),
    ]
]


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as the client's connection pool expects
    server: _Server

    def do_GET(self) -> None:
        self._handle()

    do_HEAD = do_POST = do_PUT = do_DELETE = do_GET

    def log_message(self, format: str, *args: Any) -> None:
        pass  # the request log replaces stderr noise

    def setup(self) -> None:
        super().setup()
        self.server.track(self.connection, add=True)

    def finish(self) -> None:
        try:
            super().finish()
        finally:
            self.server.track(self.connection, add=False)

    # -- request body -------------------------------------------------------------------------------
    def _init_body(self) -> None:
        self._chunked = "chunked" in self.headers.get("Transfer-Encoding", "").lower()
        self._remaining = 0 if self._chunked else int(self.headers.get("Content-Length") or 0)
        self._body_done = not self._chunked and self._remaining == 0

    def body_chunks(self) -> Iterator[bytes]:
        """The request body in pieces; handles Content-Length and chunked transfer encoding."""
        while not self._body_done:
            if self._chunked:
                size = int(self.rfile.readline(1024).split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    while self.rfile.readline(65537) not in (b"\r\n", b"\n", b""):
                        pass  # trailers
                    self._body_done = True
                    return
            else:
                size = self._remaining
            while size > 0:
                data = self.rfile.read(min(CHUNK, size))
                if not data:
                    raise _Abort()
                size -= len(data)
                self.record.bytes_in += len(data)
                if not self._chunked:
                    self._remaining = size
                yield data
            if self._chunked:
                self.rfile.readline(1024)  # CRLF after each chunk
            else:
                self._body_done = True

    def read_body(self, limit: int = MAX_JSON_BODY) -> bytes:
        buf = bytearray()
        for data in self.body_chunks():
            buf += data
            if len(buf) > limit:
                raise HubError(413, "Request body too large")
        return bytes(buf)

    def read_json(self) -> Any:
        raw = self.read_body()
        ctype = self.headers.get("Content-Type", "")
        try:
            if "application/x-www-form-urlencoded" in ctype:
                return {k: v if len(v) > 1 or k == "paths" else v[0] for k, v in parse_qs(raw.decode()).items()}
            return json.loads(raw or b"{}")
        except (ValueError, UnicodeDecodeError) as e:
            raise HubError(400, f"Invalid request body: {e}") from e

    def drain(self) -> None:
        """Always consume the body before answering, or keep-alive parses leftovers as the next request."""
        for _ in self.body_chunks():
            pass

    # -- responses ----------------------------------------------------------------------------------
    @property
    def base_url(self) -> str:
        """Echo the client's own Host, so hrefs work whether it came via 127.0.0.1, localhost or a container."""
        host = self.headers.get("Host") or f"{self.server.hub.host}:{self.server.hub.port}"
        return f"http://{host}"

    def start_response(self, status: int, headers: Mapping[str, str], length: int) -> None:
        self.record.status = status
        if self.muted:
            return
        self.send_response(status)
        for k, v in headers.items():
            self.send_header(k, v)
        self.send_header("Content-Length", str(length))
        self.end_headers()

    def send_json(self, status: int, obj: Any, headers: Mapping[str, str] | None = None) -> None:
        body = json.dumps(obj).encode()
        self.start_response(status, {"Content-Type": "application/json", **(headers or {})}, len(body))
        self.write_body(body, None, len(body))

    def send_error_json(self, err: HubError) -> None:
        headers = {"X-Error-Message": err.message, **err.headers}
        if err.code:
            headers["X-Error-Code"] = err.code
        self.send_json(err.status, {"error": err.message}, headers)

    def write_body(self, data: bytes | None, path: Path | None, length: int, offset: int = 0) -> None:
        """Send ``data`` or ``length`` bytes of file ``path`` from ``offset``, shaped by the request's fault."""
        if self.muted or self.command == "HEAD" or length == 0:
            return
        fault = self.fault
        limit = length
        if fault is not None and fault.kind == "reset-body":
            limit = min(length, fault.after_bytes if fault.after_bytes is not None else length // 2)
        rate = fault.rate if fault is not None and fault.kind == "slow" else None
        if limit == length and rate is None:
            # Counted before sending: a test reading the log right after the client returns must see it.
            self.record.bytes_out += length
            if data is not None:
                self.wfile.write(data)
            else:
                assert path is not None
                with open(path, "rb") as f:
                    self.connection.sendfile(f, offset, length)  # zero-copy, any size
            return
        piece = max(1, min(64 * 1024, rate // 20)) if rate else 64 * 1024
        with io.BytesIO(data) if data is not None else open(path, "rb") as src:  # type: ignore[arg-type]
            src.seek(0 if data is not None else offset)
            sent = 0
            while sent < limit and (chunk := src.read(min(piece, limit - sent))):
                self.record.bytes_out += len(chunk)
                self.wfile.write(chunk)
                sent += len(chunk)
                if rate:
                    time.sleep(len(chunk) / rate)  # throttle: the "slow body" fault
                    if fault is not None and fault.lifted and sent < limit:
                        raise _Abort()  # the fault was lifted (its test is over): the trickle ends with it
        if limit < length:
            raise _Abort()

    # -- dispatch -----------------------------------------------------------------------------------
    def _handle(self) -> None:
        hub = self.server.hub
        started = time.monotonic()
        url = urlsplit(self.path)
        self.muted, self.fault, self.user = False, None, None
        # Logged on arrival and updated in place, so the log is complete as soon as the client has its answer.
        self.record = RequestRecord(
            self.command, url.path, url.query, 0, 0, 0, None, None, self.headers.get("Range"), time.time(), 0.0
        )
        self._init_body()
        admin = url.path.startswith("/_admin/")
        try:
            if admin:
                hub._admin(self, url.path, parse_qs(url.query))
            else:
                hub._log_request(self.record)
                self.fault = hub._pick_fault(self.command, url.path)
                self.record.fault = self.fault.label if self.fault else None
                self._apply_fault_before()
                hub._route(self, url.path, parse_qs(url.query))
        except HubError as err:
            self.drain()
            self.send_error_json(err)
        except _Abort:
            self.close_connection = True
        except (ConnectionError, TimeoutError):
            self.close_connection = True  # the client went away; nothing to answer
        except Exception as err:  # a server bug: answer 500 (visible in the test) and print the traceback
            traceback.print_exc()
            try:
                self.drain()
                self.send_error_json(HubError(500, f"hubserver internal error: {err!r}"))
            except Exception:
                self.close_connection = True
        finally:
            if self.muted:
                self.close_connection = True
            if not self._body_done:
                self.close_connection = True  # unread body: the connection cannot be reused
            self.record.duration = time.monotonic() - started

    def _apply_fault_before(self) -> None:
        fault = self.fault
        if fault is None:
            return
        if fault.kind == "status":
            headers = {"Retry-After": str(fault.retry_after)} if fault.status == 429 else {}
            if fault.status == 429 and fault.reset is not None:
                headers = {"RateLimit": f'"api";r=0;t={fault.reset}', "RateLimit-Policy": '"api";q=500;w=300'}
            raise HubError(fault.status, f"Injected fault: HTTP {fault.status}", fault.code, headers)
        if fault.kind == "hold":
            until = time.monotonic() + HOLD_AT_MOST
            while not fault.lifted and time.monotonic() < until:
                time.sleep(0.02)
            return
        if fault.kind == "reset":
            self.drain()  # closing with unread input would turn our FIN into a RST
            raise _Abort()
        if fault.kind == "apply-then-reset":
            self.muted = True
        # "cas-unwritable" is answered by the Xet token endpoints: a CAS URL where nothing can be written.


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False  # idle keep-alive connections must not block stop()
    allow_reuse_address = True

    def __init__(self, address: tuple[str, int], hub: HubServer):
        self.hub = hub
        self._conns: set[socket.socket] = set()
        self._conns_lock = threading.Lock()
        super().__init__(address, _Handler)

    def track(self, conn: socket.socket, *, add: bool) -> None:
        with self._conns_lock:
            (self._conns.add if add else self._conns.discard)(conn)

    def close_all(self) -> None:
        with self._conns_lock:
            conns = list(self._conns)
        for conn in conns:
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)  # wake handler threads idling on keep-alive reads
