"""A webhook receiver on a real socket, for apprise's ``json://host:port/path`` (NOTIFY in tests).

``Receiver(mode)``: ``ok`` answers 200, ``500`` answers 500, ``hang`` reads the request and never
answers (until ``stop``). Every POST's JSON body is kept in ``messages`` (apprise's JSON plugin sends
``{"version", "title", "message", "type", "attachments"}``), in arrival order.
"""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class Receiver:
    def __init__(self, mode: str = "ok") -> None:
        self.mode = mode
        self.messages: list[dict[str, Any]] = []
        self.arrived = threading.Condition()
        self._release = threading.Event()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                with receiver.arrived:
                    sender = {"user_agent": self.headers.get("User-Agent")}
                    receiver.messages.append({"path": self.path, **sender, **json.loads(body or b"{}")})
                    receiver.arrived.notify_all()
                if receiver.mode == "hang":
                    receiver._release.wait()
                    return
                self.send_response(500 if receiver.mode == "500" else 200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *_args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> Receiver:
        self._thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self.stop()

    def stop(self) -> None:
        self._release.set()
        self.server.shutdown()
        self.server.server_close()

    @property
    def url(self) -> str:
        return f"json://127.0.0.1:{self.server.server_address[1]}/hook"

    def wait_for(self, count: int, timeout: float = 30.0) -> list[dict[str, Any]]:
        """The first ``count`` messages, once they came (or what came within ``timeout``)."""
        end = time.monotonic() + timeout
        with self.arrived:
            while len(self.messages) < count and time.monotonic() < end:
                self.arrived.wait(max(0.0, end - time.monotonic()))
            return list(self.messages)

    def titled(self, word: str) -> list[dict[str, Any]]:
        return [message for message in self.messages if word in str(message.get("title"))]
