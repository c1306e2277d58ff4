"""The local Hub server (see the package docstring); run it alone with ``python -m tests.fakes.hub``."""

from __future__ import annotations

import argparse
import itertools
import os
import shutil
import signal
import sys
import tempfile
import threading
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from tests.fakes.hub.admin import AdminMixin
from tests.fakes.hub.buckets import BucketsMixin
from tests.fakes.hub.cas import CasMixin
from tests.fakes.hub.faults import Fault, FaultsMixin
from tests.fakes.hub.git_api import GitApiMixin
from tests.fakes.hub.history import HistoryMixin
from tests.fakes.hub.history import register_routes as register_squash
from tests.fakes.hub.http import _Server
from tests.fakes.hub.lfs import LfsMixin
from tests.fakes.hub.model import Repo, RequestRecord, Token
from tests.fakes.hub.storage import StorageMixin
from tests.fakes.hub.xet import XET_TOKEN_TTL, XetMixin


class HubServer(
    CasMixin, StorageMixin, XetMixin, GitApiMixin, LfsMixin, FaultsMixin, AdminMixin, BucketsMixin, HistoryMixin
):
    """The Hub. See the package docstring (tests/fakes/hub/__init__.py) for the API."""

    def __init__(
        self, root: str | os.PathLike[str] | None = None, *, host: str = "127.0.0.1", port: int = 0, xet: bool = True
    ):
        self._own_root = root is None
        self.root = Path(tempfile.mkdtemp(prefix="hubserver-") if root is None else root)
        (self.root / "blobs").mkdir(parents=True, exist_ok=True)
        (self.root / "tmp").mkdir(parents=True, exist_ok=True)
        self._lock = threading.RLock()
        self._repos: dict[tuple[str, str], Repo] = {}
        self._tokens: dict[str, Token] = {}
        self._faults: list[Fault] = []
        self._log: list[RequestRecord] = []
        self._uploads: dict[str, tuple[tuple[str, str], str, int]] = {}  # key -> (repo key, sha256, size)
        self._used_uploads: dict[str, str] = {}  # spent key -> sha256, so a retried PUT stays idempotent
        self._rate_limit: tuple[int, float] | None = None
        self._counter = itertools.count()
        self.xet = xet  # a Hub with Xet storage (the real one); False: a Hub or mirror that speaks LFS only
        self.xet_token_ttl = XET_TOKEN_TTL
        self.cas = self.root / "cas"  # the Xet CAS: the client's hf_xet writes xorbs and shards here itself
        self._xet_files: dict[str, tuple[str, int]] = {}  # sha256 -> (Xet file hash, size), from the shards
        self._shards_read: set[str] = set()
        self._xet_tokens: dict[str, tuple[str, float]] = {}  # CAS access token -> (user, expiry)
        self._init_buckets()  # Storage Buckets: tests/fakes/hub/buckets.py
        register_squash()  # super-squash: tests/fakes/hub/history.py
        self._httpd = _Server((host, port), self)  # bind now: the URL is known before serving
        self.host = "127.0.0.1" if host in ("", "0.0.0.0") else host
        self.port: int = self._httpd.server_address[1]
        self.url = f"http://{self.host}:{self.port}"
        self._thread: threading.Thread | None = None

    # -- lifecycle ----------------------------------------------------------------------------------
    def start(self) -> HubServer:
        if self._thread is None:
            self._thread = threading.Thread(
                target=self._httpd.serve_forever, kwargs={"poll_interval": 0.1}, name="hubserver", daemon=True
            )
            self._thread.start()
        return self

    def stop(self) -> None:
        if self._thread is not None:
            self._httpd.shutdown()
            self._thread.join()
            self._thread = None
        self._httpd.server_close()
        self._httpd.close_all()
        if self._own_root:
            shutil.rmtree(self.root, ignore_errors=True)

    def __enter__(self) -> HubServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- configuration ------------------------------------------------------------------------------
    def add_token(
        self,
        token: str,
        user: str,
        role: str = "write",
        *,
        orgs: Iterable[str] = (),
        name: str | None = None,
        scoped: Iterable[Mapping[str, Any]] | None = None,
    ) -> None:
        """``scoped``: a fine-grained token's grants (``Token.scoped``); without ``repo.write`` on a namespace it
        may write no bucket either."""
        if role not in ("read", "write"):
            raise ValueError("role must be 'read' or 'write'")
        grants = (
            None
            if scoped is None
            else tuple({"entity": dict(grant["entity"]), "permissions": list(grant["permissions"])} for grant in scoped)
        )
        with self._lock:
            self._tokens[token] = Token(token, user, role, frozenset(orgs), name or f"{user}-{role}", grants)
        if grants is not None and not any(
            g["entity"]["type"] in ("user", "org") and "repo.write" in g["permissions"] for g in grants
        ):
            self.deny_buckets(token)

    def remove_token(self, token: str) -> None:
        with self._lock:
            self._tokens.pop(token, None)

    def set_xet(self, enabled: bool, *, token_ttl: float | None = None) -> None:
        """Xet on (the Hub) or off (LFS only); ``token_ttl``: seconds a CAS token lives (short: refreshes)."""
        with self._lock:
            self.xet = enabled
            self.xet_token_ttl = XET_TOKEN_TTL if token_ttl is None else token_ttl

    def set_commit_rate_limit(self, limit: int | None, window_s: float = 3600.0) -> None:
        with self._lock:
            self._rate_limit = (limit, window_s) if limit is not None else None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Local Hugging Face Hub for tests")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--data", help="directory for blobs (default: a temp dir removed on exit)")
    parser.add_argument("--token", action="append", default=[], metavar="TOKEN:USER:ROLE[:ORG,...]")
    parser.add_argument("--ready-file", help="write the URL here once listening")
    parser.add_argument("--no-xet", action="store_true", help="a Hub without Xet storage: LFS only")
    parser.add_argument("--local-cas", action="store_true", help="hand out local://DIR/cas, not the CAS over HTTP")
    parser.add_argument("--cas-bandwidth", type=int, metavar="BYTES_PER_S", help="cap the CAS's link")
    args = parser.parse_args(argv)
    hub = HubServer(args.data, host=args.host, port=args.port, xet=not args.no_xet)
    hub.set_cas_over_http(not args.local_cas)
    hub.set_cas_bandwidth(args.cas_bandwidth)
    for spec in args.token:
        token, user, role, *orgs = spec.split(":")
        hub.add_token(token, user, role, orgs=orgs[0].split(",") if orgs and orgs[0] else ())
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    hub.start()
    print(hub.url, flush=True)
    if args.ready_file:
        tmp = f"{args.ready_file}.tmp"
        Path(tmp).write_text(hub.url + "\n")
        os.replace(tmp, args.ready_file)  # readers never see a half-written URL
    stop.wait()
    hub.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
