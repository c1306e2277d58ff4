"""The Hub's repo HTTP API: auth, routing, repo info, trees, commits, branches, tags, preupload, resolve."""

from __future__ import annotations

import base64
import hashlib
import json
import math
import re
import time
from collections.abc import Iterable
from typing import Any
from urllib.parse import unquote

from tests.fakes.hub import card_rules
from tests.fakes.hub.http import _ROUTES, _Call, _Handler
from tests.fakes.hub.model import (
    PLURAL,
    TYPE_FROM_PLURAL,
    Commit,
    FileEntry,
    HubError,
    Repo,
    Token,
    check_path,
    iso,
    lfs_pointer,
    wants_lfs,
)


class GitApiMixin:
    """The HTTP endpoints of ``HubServer`` for repos, commits and downloads."""

    # -- HTTP: auth ---------------------------------------------------------------------------------
    def _auth(self, h: _Handler) -> Token | None:
        header = h.headers.get("Authorization", "")
        if not header:
            return None
        token = self._tokens.get(header.removeprefix("Bearer ").strip())
        if token is None:
            # The client recognises this exact message and does not turn it into RepoNotFound.
            raise HubError(401, "Invalid credentials in Authorization header")
        return token

    def _readable(self, c: _Call) -> Repo:
        repo = self._repos.get((c.repo_type, c.repo_id))
        if repo is None or (repo.private and (c.user is None or c.repo_id.split("/")[0] not in c.user.namespaces)):
            # Like the Hub: don't reveal whether a private repo exists.
            if c.user is None:
                raise HubError(401, "Invalid username or password.", "RepoNotFound")
            raise HubError(404, "Repository not found", "RepoNotFound")
        return repo

    def _writable(self, c: _Call) -> Repo:
        repo = self._readable(c)
        if c.user is None:
            raise HubError(401, "Invalid username or password.")
        if c.repo_id.split("/")[0] not in c.user.namespaces:
            raise HubError(403, f"You don't have the rights to write to {c.repo_id}")
        if c.user.role != "write":
            raise HubError(403, "You have read access but not the required permissions for this operation.")
        if not c.user.may_write(c.repo_type, c.repo_id):  # a fine-grained token without a grant here
            raise HubError(403, f"This fine-grained token has no write access to {c.repo_id}")
        return repo

    def _route(self, h: _Handler, path: str, query: dict[str, list[str]]) -> None:
        method = h.command
        for route_method, rx, name in _ROUTES:
            m = rx.fullmatch(path)
            if m is None or route_method != method:
                continue
            g = m.groupdict()
            if name != "lfs_put":  # the LFS PUT carries no auth: its URL key is the credential
                h.user = self._auth(h)
                h.record.user = h.user.user if h.user else None
            rev = g.get("rev")
            call = _Call(
                method=method,
                user=h.user,
                repo_type=TYPE_FROM_PLURAL[g.get("t")],
                repo_id=g.get("repo") or "",
                rev=unquote(rev) if rev else "main",
                path=unquote(g.get("path") or ""),
                query=query,
                key=g.get("key") or "",
            )
            getattr(self, f"_api_{name}")(h, call)
            return
        raise HubError(404, f"Not found: {method} {path}")

    # -- HTTP: endpoints ----------------------------------------------------------------------------
    def _api_whoami(self, h: _Handler, c: _Call) -> None:
        h.drain()
        if c.user is None:
            raise HubError(401, "Invalid username or password.")
        u = c.user
        h.send_json(
            200,
            {
                "type": "user",
                "id": hashlib.sha1(u.user.encode()).hexdigest()[:24],
                "name": u.user,
                "fullname": u.user,
                "isPro": False,
                "canPay": False,
                "orgs": [{"type": "org", "name": o} for o in sorted(u.orgs)],
                "auth": u.auth(),
            },
        )

    def _api_create_repo(self, h: _Handler, c: _Call) -> None:
        body = h.read_json()
        repo_type = body.get("type") or "model"
        ns = body.get("organization") or (c.user.user if c.user else None)
        repo_id = f"{ns}/{body.get('name')}"
        if c.user is None:
            raise HubError(401, "Invalid username or password.")
        if not c.user.may_write(repo_type, repo_id, create=True):
            raise HubError(403, f'You don\'t have the rights to create a {repo_type} under the namespace "{ns}"')
        private = body.get("visibility", "private" if body.get("private") else "public") == "private"
        try:
            self._create_repo(repo_type, repo_id, private, c.user.user)
        except HubError as err:
            if err.status == 409:  # the client reads "url" even from the 409 (exist_ok=True)
                h.send_json(409, {"error": err.message, "url": self.repo_url(repo_id, repo_type, h.base_url)})
                return
            raise
        h.send_json(200, {"url": self.repo_url(repo_id, repo_type, h.base_url), "name": repo_id, "id": repo_id})

    def _api_delete_repo(self, h: _Handler, c: _Call) -> None:
        body = h.read_json()
        c.repo_type = body.get("type") or "model"
        c.repo_id = f"{body.get('organization') or (c.user.user if c.user else '')}/{body.get('name')}"
        self._writable(c)
        self.delete_repo(c.repo_id, repo_type=c.repo_type)
        h.send_json(200, {})

    def _api_validate_yaml(self, h: _Handler, c: _Call) -> None:
        body = h.read_json()
        found = card_rules.errors(str((body or {}).get("content") or ""))
        h.send_json(400 if found else 200, {"errors": [{"message": m} for m in found], "warnings": []})

    def _api_repo_info(self, h: _Handler, c: _Call) -> None:
        h.drain()
        with self._lock:
            repo = self._readable(c)
            commit = repo.resolve(c.rev)
        siblings = []
        for e in sorted(commit.files.values(), key=lambda e: e.path):
            sib: dict[str, Any] = {"rfilename": e.path, "size": e.size, "blobId": e.git_oid}
            if e.lfs:
                sib["lfs"] = {"size": e.size, "sha256": e.sha256, "pointerSize": len(lfs_pointer(e.sha256, e.size))}
            siblings.append(sib)
        info: dict[str, Any] = {
            "_id": hashlib.sha1(f"{repo.repo_type}/{repo.repo_id}".encode()).hexdigest()[:24],
            "id": repo.repo_id,
            "author": repo.repo_id.split("/")[0],
            "sha": commit.oid,
            "private": repo.private,
            "gated": False,
            "disabled": False,
            "lastModified": iso(commit.timestamp),
            "createdAt": iso(repo.created),
            "tags": [],
            "downloads": 0,
            "likes": 0,
            "siblings": siblings,
        }
        if repo.repo_type == "model":
            info["modelId"] = repo.repo_id
        h.send_json(200, info)

    def _last_commit(self, repo: Repo, start: Commit, path: str, is_dir: bool) -> dict[str, str]:
        def state(commit: Commit) -> object:
            if is_dir:
                return sorted((p, e.etag) for p, e in commit.files.items() if p.startswith(path + "/"))
            entry = commit.files.get(path)
            return entry.etag if entry else None

        last = start
        for commit in repo.history(start):
            if state(commit) != state(start):
                break
            last = commit
        return {"id": last.oid, "title": last.summary, "date": iso(last.timestamp)}

    def _listing(self, repo: Repo, commit: Commit, paths: Iterable[str], expand: bool) -> list[dict[str, Any]]:
        """Tree entries for ``paths`` (files or folders) of ``commit``; missing paths are skipped."""
        out = []
        for path in paths:
            entry = commit.files.get(path)
            if entry is not None:
                item = entry.tree_json()
            else:
                inside = sorted((p, e.etag) for p, e in commit.files.items() if p.startswith(path + "/"))
                if not inside:
                    continue
                item = {"type": "directory", "oid": hashlib.sha1(repr(inside).encode()).hexdigest(), "path": path}
            if expand:
                item["lastCommit"] = self._last_commit(repo, commit, path, entry is None)
            out.append(item)
        return out

    def _api_tree(self, h: _Handler, c: _Call) -> None:
        h.drain()
        recursive = c.query.get("recursive", ["false"])[0].lower() in ("1", "true")
        expand = c.query.get("expand", ["false"])[0].lower() in ("1", "true")
        with self._lock:
            repo = self._readable(c)
            commit = repo.resolve(c.rev)
        base = c.path.strip("/")
        prefix = base + "/" if base else ""
        paths: set[str] = set()
        for p in commit.files:
            if not p.startswith(prefix):
                continue
            parts = p[len(prefix) :].split("/")
            depth = len(parts) if recursive else 1
            for i in range(1, depth + 1):
                paths.add(prefix + "/".join(parts[:i]))
        if base and not paths:
            raise HubError(404, f"Entry not found: {base}", "EntryNotFound", {"X-Repo-Commit": commit.oid})
        h.send_json(200, self._listing(repo, commit, sorted(paths), expand))

    def _api_paths_info(self, h: _Handler, c: _Call) -> None:
        body = h.read_json()
        paths = body.get("paths", [])
        paths = [paths] if isinstance(paths, str) else paths
        expand = str(body.get("expand", "false")).lower() in ("1", "true")
        with self._lock:
            repo = self._readable(c)
            commit = repo.resolve(c.rev)
        h.send_json(200, self._listing(repo, commit, [p.strip("/") for p in paths], expand))

    def _api_list_commits(self, h: _Handler, c: _Call) -> None:
        h.drain()
        with self._lock:
            repo = self._readable(c)
            history = list(repo.history(repo.resolve(c.rev)))
        h.send_json(
            200,
            [
                {
                    "id": k.oid,
                    "title": k.summary,
                    "message": k.description,
                    "date": iso(k.timestamp),
                    "authors": [{"user": k.author, "avatar": ""}],
                }
                for k in history
            ],
        )

    def _api_refs(self, h: _Handler, c: _Call) -> None:
        h.drain()
        with self._lock:
            repo = self._readable(c)
            branches = [{"name": n, "ref": f"refs/heads/{n}", "targetCommit": o} for n, o in repo.branches.items()]
            tags = [{"name": n, "ref": f"refs/tags/{n}", "targetCommit": o} for n, o in repo.tags.items()]
        h.send_json(200, {"branches": branches, "converts": [], "tags": tags, "pullRequests": []})

    def _writable_branch(self, c: _Call) -> tuple[Repo, Commit]:
        if "create_pr" in c.query:
            raise HubError(400, "hubserver does not support pull requests (create_pr)")
        with self._lock:
            repo = self._writable(c)
            if c.rev not in repo.branches:  # commits go to branches only, as on the Hub
                raise HubError(404, f"Invalid rev id: {c.rev}", "RevisionNotFound")
            return repo, repo.commits[repo.branches[c.rev]]

    def _api_preupload(self, h: _Handler, c: _Call) -> None:
        body = h.read_json()
        _, head = self._writable_branch(c)
        out = []
        for f in body.get("files", []):
            path = check_path(f["path"])
            sample = base64.b64decode(f.get("sample") or "")
            mode = "lfs" if wants_lfs(path, int(f.get("size", 0)), sample) else "regular"
            existing = head.files.get(path)
            # The remote oid lets the client skip unchanged files (it compares with its own sha1/sha256).
            out.append({"path": path, "uploadMode": mode, "shouldIgnore": False, "oid": existing and existing.etag})
        h.send_json(200, {"files": out, "commitOid": head.oid})

    def _api_commit(self, h: _Handler, c: _Call) -> None:
        raw = h.read_body()
        repo, _ = self._writable_branch(c)
        try:
            items = [json.loads(line) for line in raw.splitlines() if line.strip()]
        except ValueError as e:
            raise HubError(400, f"Invalid NDJSON commit payload: {e}") from e
        header = next((i["value"] for i in items if i.get("key") == "header"), None)
        if not header or not header.get("summary"):
            raise HubError(400, "Commit header with a summary is required")
        ops: list[tuple[str, FileEntry | None]] = []
        for item in items:
            key, value = item.get("key"), item.get("value") or {}
            if key == "file":
                path = check_path(value["path"])
                ops.append((path, self._entry_from_bytes(path, base64.b64decode(value["content"]), False)))
            elif key == "lfsFile":
                path = check_path(value["path"])
                with self._lock:
                    known = value["oid"] in repo.lfs_oids
                # Uploaded through Xet: the commit names only the sha256; the client's shard maps it to the file.
                if not known and self._xet_file(str(value["oid"])) is None:
                    raise HubError(422, f"LFS object {value['oid']} was not uploaded to this repo")
                ops.append((path, self._lfs_entry(repo, path, value["oid"], value.get("size"))))
            elif key in ("deletedFile", "deletedFolder"):
                path = check_path(value["path"].rstrip("/"))
                ops.append((path + "/" if key == "deletedFolder" else path, None))
            elif key != "header":
                raise HubError(400, f"Unsupported commit operation: {key}")
        with self._lock:
            if self._rate_limit is not None:
                limit, window = self._rate_limit
                now = time.time()
                repo.commit_times[:] = [t for t in repo.commit_times if t > now - window]
                if len(repo.commit_times) >= limit:
                    wait = max(1, math.ceil(repo.commit_times[0] + window - now))
                    message = f"You have exceeded the rate limit of {limit} commits per {window:g} s"
                    raise HubError(429, message, None, {"Retry-After": str(wait)})
            author = c.user.user if c.user else "anonymous"
            summary, description = header["summary"], header.get("description") or ""
            commit = self._make_commit(repo, c.rev, ops, summary, description, author, header.get("parentCommit"))
            repo.commit_times.append(commit.timestamp)
        url = f"{self.repo_url(repo.repo_id, repo.repo_type, h.base_url)}/commit/{commit.oid}"
        h.send_json(200, {"success": True, "commitOid": commit.oid, "commitUrl": url, "hookOutput": ""})

    def _api_create_branch(self, h: _Handler, c: _Call) -> None:
        body = h.read_json()
        with self._lock:
            self._writable(c)
            if c.rev.startswith("refs/") or not c.rev:
                raise HubError(400, f"Invalid branch name: {c.rev}")
            self.create_branch(c.repo_id, c.rev, repo_type=c.repo_type, revision=body.get("startingPoint") or "main")
        h.send_json(200, {})

    def _api_create_tag(self, h: _Handler, c: _Call) -> None:
        body = h.read_json()
        with self._lock:
            self._writable(c)
            self.create_tag(c.repo_id, body["tag"], repo_type=c.repo_type, revision=c.rev)
        h.send_json(200, {})

    def _api_resolve(self, h: _Handler, c: _Call) -> None:
        h.drain()
        with self._lock:
            repo = self._readable(c)
            commit = repo.resolve(c.rev)
        entry = commit.files.get(c.path)
        if entry is None:
            # X-Repo-Commit lets the client cache the file's absence (.no_exist).
            raise HubError(404, "Entry not found", "EntryNotFound", {"X-Repo-Commit": commit.oid})
        headers = {
            "Content-Type": "application/octet-stream",
            "ETag": f'"{entry.etag}"',
            "X-Repo-Commit": commit.oid,
            "Accept-Ranges": "bytes",
        }
        if entry.lfs:
            headers.update({"X-Linked-Size": str(entry.size), "X-Linked-Etag": f'"{entry.sha256}"'})
        if entry.xet_hash and self.xet:
            # As the Hub: the Xet hash, and where to get a read token for the CAS (also the refresh route).
            refresh = f"{h.base_url}/api/{PLURAL[repo.repo_type]}/{repo.repo_id}/xet-read-token/{commit.oid}"
            headers.update({"X-Xet-Hash": entry.xet_hash, "Link": f'<{refresh}>; rel="xet-auth"'})
        start, length, status = 0, entry.size, 200
        wanted = h.headers.get("Range") if c.method == "GET" else None
        if wanted:
            m = re.fullmatch(r"bytes=(\d*)-(\d*)", wanted.strip())
            if m and (m[1] or m[2]):
                if m[1]:
                    start, end = int(m[1]), int(m[2]) if m[2] else entry.size - 1
                else:
                    start, end = max(0, entry.size - int(m[2])), entry.size - 1
                end = min(end, entry.size - 1)
                if start >= entry.size or start > end:
                    unsatisfiable = {"Content-Range": f"bytes */{entry.size}"}
                    raise HubError(416, "Requested range not satisfiable", None, unsatisfiable)
                status, length = 206, end - start + 1
                headers["Content-Range"] = f"bytes {start}-{end}/{entry.size}"
        blob = self._ensure_blob(entry) if c.method == "GET" else None  # a plain GET of a Xet file too
        h.start_response(status, headers, length)
        h.write_body(None, blob, length, start)
