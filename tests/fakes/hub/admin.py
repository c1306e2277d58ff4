"""The admin API of the local Hub (for tests in another process) and ``RemoteHub``, its client."""

from __future__ import annotations

import json
import re
import secrets
import urllib.error
import urllib.request
from collections.abc import Iterable
from dataclasses import asdict
from typing import TYPE_CHECKING, Any
from urllib.parse import urlencode

from tests.fakes.hub.model import HubError

if TYPE_CHECKING:
    from tests.fakes.hub.http import _Handler


class AdminMixin:
    """The ``/_admin/`` routes of ``HubServer``."""

    def _admin(self, h: _Handler, path: str, query: dict[str, list[str]]) -> None:
        q = {k: v[0] for k, v in query.items()}
        kw = {"repo_type": q.get("repo_type", "model")}
        route = (h.command, path.removeprefix("/_admin/").rstrip("/"))
        if route == ("PUT", "files"):
            local = self.root / "tmp" / f"admin-{secrets.token_hex(8)}"
            try:
                with open(local, "wb") as f:
                    for chunk in h.body_chunks():
                        f.write(chunk)
                lfs = {"true": True, "false": False}.get(q.get("lfs", "").lower())
                message = q.get("message", f"Upload {q['path']}")
                oid = self.commit(
                    q["repo_id"], {q["path"]: local}, revision=q.get("revision", "main"), message=message, lfs=lfs, **kw
                )
            finally:
                local.unlink(missing_ok=True)
            h.send_json(200, {"commit": oid})
            return
        body = h.read_json() if h.command in ("POST", "PUT") else (h.drain() or {})
        result: Any = {}
        if route == ("GET", "health"):
            result = {"ok": True, "url": self.url}
        elif route == ("POST", "tokens"):
            orgs, name, scoped = body.get("orgs", ()), body.get("name"), body.get("scoped")
            self.add_token(body["token"], body["user"], body.get("role", "write"), orgs=orgs, name=name, scoped=scoped)
        elif route == ("POST", "repos"):
            flags = {"private": bool(body.get("private")), "exist_ok": bool(body.get("exist_ok"))}
            result = {"url": self.create_repo(body["repo_id"], repo_type=body.get("repo_type", "model"), **flags)}
        elif route == ("DELETE", "repos"):
            self.delete_repo(q["repo_id"], **kw)
        elif route == ("GET", "files"):
            blob = self.blob_path(q["repo_id"], q["path"], revision=q.get("revision", "main"), **kw)
            size = blob.stat().st_size
            h.start_response(200, {"Content-Type": "application/octet-stream"}, size)
            h.write_body(None, blob, size)
            return
        elif route == ("GET", "commits"):
            commits = self.commits(q["repo_id"], revision=q.get("revision", "main"), **kw)
            keys = ("oid", "parent", "summary", "description", "author", "timestamp")
            result = {"commits": [{**{n: getattr(k, n) for n in keys}, "files": sorted(k.files)} for k in commits]}
        elif route == ("POST", "faults"):
            result = {"id": self.inject(**body).id}
        elif route == ("GET", "faults"):
            result = {"faults": [f.to_json() for f in self.faults]}
        elif route == ("DELETE", "faults"):
            self.clear_faults()
        elif route == ("GET", "log"):
            served: dict[str, int] = {}
            for r in self.requests:
                served[r.path] = served.get(r.path, 0) + r.bytes_out
            result = {"requests": [asdict(r) for r in self.requests], "bytes_served": served}
        elif route == ("DELETE", "log"):
            self.reset_log()
        elif route == ("POST", "config"):
            if "commit_rate_limit" in body:
                self.set_commit_rate_limit(body["commit_rate_limit"], float(body.get("commit_rate_window", 3600)))
            if "xet" in body:
                self.set_xet(bool(body["xet"]), token_ttl=body.get("xet_token_ttl"))
            if "cas_over_http" in body:
                self.set_cas_over_http(bool(body["cas_over_http"]))
            if "cas_bandwidth" in body:  # bytes/s; null: no cap
                self.set_cas_bandwidth(int(body["cas_bandwidth"]) if body["cas_bandwidth"] else None)
            result = self._admin_config()
        elif route == ("GET", "config"):
            result = self._admin_config()
        else:
            raise HubError(404, f"Unknown admin route {route}")
        h.send_json(200, result)

    def _admin_config(self) -> dict[str, Any]:
        limit = self._rate_limit
        return {
            "xet": self.xet,
            "xet_token_ttl": self.xet_token_ttl,
            "cas_over_http": self.cas_over_http,
            "cas_bandwidth": self.cas_bandwidth,
            "commit_rate_limit": limit[0] if limit else None,
        }


class RemoteHub:
    """The admin API of a hubserver in another process, with the same method names as ``HubServer``."""

    def __init__(self, url: str):
        self.url = url.rstrip("/")

    def _call(self, method: str, route: str, body: Any = None, *, params: dict[str, Any] | None = None) -> Any:
        url = f"{self.url}/_admin/{route}" + (f"?{urlencode(params)}" if params else "")
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(url, data=data, method=method, headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=60) as resp:
                raw = resp.read()
                return json.loads(raw) if resp.headers.get("Content-Type") == "application/json" else raw
        except urllib.error.HTTPError as err:
            with err:
                raise HubError(err.code, err.read().decode(errors="replace"), err.headers.get("X-Error-Code")) from err

    def health(self) -> dict[str, Any]:
        return self._call("GET", "health")

    def add_token(
        self,
        token: str,
        user: str,
        role: str = "write",
        *,
        orgs: Iterable[str] = (),
        name: str | None = None,
        scoped: Iterable[dict[str, Any]] | None = None,
    ) -> None:
        body = {"token": token, "user": user, "role": role, "orgs": list(orgs), "name": name}
        self._call("POST", "tokens", body | ({} if scoped is None else {"scoped": list(scoped)}))

    def create_repo(
        self, repo_id: str, *, repo_type: str = "model", private: bool = False, exist_ok: bool = False
    ) -> str:
        body = {"repo_id": repo_id, "repo_type": repo_type, "private": private, "exist_ok": exist_ok}
        return self._call("POST", "repos", body)["url"]

    def upload_bytes(self, repo_id: str, path_in_repo: str, data: bytes, **kwargs: Any) -> str:
        extra = {k: str(v).lower() if isinstance(v, bool) else v for k, v in kwargs.items()}
        params = {"repo_id": repo_id, "path": path_in_repo, **extra}
        req = urllib.request.Request(f"{self.url}/_admin/files?{urlencode(params)}", data=data, method="PUT")
        with urllib.request.urlopen(req, timeout=600) as resp:
            return json.loads(resp.read())["commit"]

    def file_bytes(self, repo_id: str, path: str, *, repo_type: str = "model", revision: str = "main") -> bytes:
        params = {"repo_id": repo_id, "path": path, "repo_type": repo_type, "revision": revision}
        return self._call("GET", "files", params=params)

    def commits(self, repo_id: str, *, repo_type: str = "model", revision: str = "main") -> list[dict[str, Any]]:
        params = {"repo_id": repo_id, "repo_type": repo_type, "revision": revision}
        return self._call("GET", "commits", params=params)["commits"]

    def inject(self, kind: str, **kwargs: Any) -> str:
        return self._call("POST", "faults", {"kind": kind, **kwargs})["id"]

    def clear_faults(self) -> None:
        self._call("DELETE", "faults")

    @property
    def requests(self) -> list[dict[str, Any]]:
        return self._call("GET", "log")["requests"]

    def bytes_served(self, path: str | None = None) -> int:
        return sum(r["bytes_out"] for r in self.requests if path is None or re.search(path, r["path"]))

    def reset_log(self) -> None:
        self._call("DELETE", "log")

    def set_commit_rate_limit(self, limit: int | None, window_s: float = 3600.0) -> None:
        self._call("POST", "config", {"commit_rate_limit": limit, "commit_rate_window": window_s})

    def set_xet(self, enabled: bool, *, token_ttl: float | None = None) -> None:
        self._call("POST", "config", {"xet": enabled, "xet_token_ttl": token_ttl})

    def set_cas_over_http(self, enabled: bool) -> None:
        self._call("POST", "config", {"cas_over_http": enabled})

    def set_cas_bandwidth(self, bytes_per_s: int | None) -> None:
        self._call("POST", "config", {"cas_bandwidth": bytes_per_s})

    def config(self) -> dict[str, Any]:
        """The switches ``POST /_admin/config`` sets: xet, xet_token_ttl, cas_over_http, cas_bandwidth, ..."""
        return self._call("GET", "config")
