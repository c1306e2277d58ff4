"""Storage Buckets of the local Hub: mutable, history-free, Xet-only file stores (huggingface_hub >= 1.5).

The routes, as huggingface_hub 2.4.0 calls them (``hf_api.py``)::

    POST /api/buckets/{ns}/{name}                 create_bucket ({"visibility"}; ns "me" = the caller; 409 if it exists)
    GET  /api/buckets/{id}                        bucket_info -> {id, private, createdAt, size, totalFiles}
    DELETE /api/buckets/{id}                      delete_bucket
    POST /api/buckets/{id}/batch                  batch_bucket_files: NDJSON addFile/copyFile/deleteFile lines,
                                                  each add naming a ``xetHash`` already in the CAS; not
                                                  transactional: 200 {"failed": [...]} (422 when all failed)
    GET  /api/buckets/{id}/tree[/{prefix}]        list_bucket_tree (?recursive=true), one page
    POST /api/buckets/{id}/paths-info             get_bucket_paths_info ({"paths"}; missing paths left out)
    HEAD|GET /buckets/{id}/resolve/{path}         get_bucket_file_metadata / download_bucket_files: X-Xet-Hash,
                                                  X-Linked-Size, Link <xet-read-token>; rel="xet-auth"
    GET  /api/buckets/{id}/xet-{read,write}-token the CAS token, as for repos (no revision)

A missing or hidden bucket is 404 (401 anonymous) with ``X-Error-Code: RepoNotFound``, which the client
turns into ``BucketNotFoundError``. Faults (``inject``) apply to these routes like to any other.

Python API: ``create_bucket(bucket_id, *, private=True)``, ``bucket_files(bucket_id) -> {path: BucketEntry}``,
``bucket_bytes(bucket_id, path) -> bytes``, ``set_buckets(enabled)`` (False: a Hub or mirror without
buckets, every bucket route is a plain 404), ``deny_buckets(token)`` (a fine-grained token that may
write repos but not buckets: 403 on create and writes), ``refuse_bucket_paths(regex, times=None)`` (the
operations of a batch whose path matches fail, listed in ``failed``, the rest applied, as the Hub answers
a partly failed batch; ``None`` stops it). The Xet token routes hand out the CAS the Hub serves (over
HTTP unless ``set_cas_over_http(False)``), like a repo's.
"""

from __future__ import annotations

import json
import re
import secrets
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote

from tests.fakes.hub.http import _ROUTES
from tests.fakes.hub.model import HubError, check_path, iso
from tests.fakes.hub.xet import shard_entries

if TYPE_CHECKING:
    from tests.fakes.hub.http import _Call, _Handler

_B = r"(?P<repo>[^/]+/[^/]+)"
BUCKET_ROUTES = [
    ("POST", rf"/api/buckets/{_B}", "bucket_create"),
    ("GET", rf"/api/buckets/{_B}", "bucket_info"),
    ("DELETE", rf"/api/buckets/{_B}", "bucket_delete"),
    ("POST", rf"/api/buckets/{_B}/batch", "bucket_batch"),
    ("GET", rf"/api/buckets/{_B}/tree(?:/(?P<path>.*))?", "bucket_tree"),
    ("POST", rf"/api/buckets/{_B}/paths-info", "bucket_paths_info"),
    ("GET", rf"/api/buckets/{_B}/xet-read-token", "bucket_xet_read_token"),
    ("GET", rf"/api/buckets/{_B}/xet-write-token", "bucket_xet_write_token"),
    ("GET", rf"/buckets/{_B}/resolve/(?P<path>.+)", "bucket_resolve"),
    ("HEAD", rf"/buckets/{_B}/resolve/(?P<path>.+)", "bucket_resolve"),
]


def register_routes() -> None:
    """Add the bucket routes to the Hub's routing table (once)."""
    import re

    if not any(name == "bucket_create" for _, _, name in _ROUTES):
        _ROUTES.extend((m, re.compile(rx), name) for m, rx, name in BUCKET_ROUTES)


def shard_file_sizes(data: bytes) -> dict[str, int]:
    """Xet file hash -> size of every file a shard describes (with or without its sha256)."""
    return {xet_hash: size for xet_hash, size, _ in shard_entries(data)}


@dataclass(frozen=True)
class BucketEntry:
    path: str
    xet_hash: str
    size: int
    mtime: float  # seconds, as the client sent it (ms)
    uploaded: float
    content_type: str | None = None

    def json(self) -> dict[str, Any]:
        return {
            "type": "file",
            "path": self.path,
            "size": self.size,
            "xetHash": self.xet_hash,
            "mtime": iso(self.mtime),
            "uploadedAt": iso(self.uploaded),
        }


@dataclass
class Bucket:
    bucket_id: str
    private: bool
    created: float
    files: dict[str, BucketEntry] = field(default_factory=dict)


class BucketsMixin:
    """The bucket half of ``HubServer`` (see the module docstring)."""

    def _init_buckets(self) -> None:
        register_routes()
        self._buckets: dict[str, Bucket] = {}
        self.buckets_enabled = True
        self._bucket_denied: set[str] = set()
        self._xet_sizes: dict[str, int] = {}  # Xet file hash -> size, from the shards clients wrote
        self._bucket_shards_read: set[str] = set()
        self._bucket_bytes: dict[str, bytes] = {}  # Xet hash -> small file's bytes (bucket_bytes)
        self._bucket_refused: tuple[re.Pattern[str], int | None] | None = None  # refuse_bucket_paths

    # -- Python API ---------------------------------------------------------------------------------
    def set_buckets(self, enabled: bool) -> None:
        with self._lock:
            self.buckets_enabled = enabled

    def refuse_bucket_paths(self, path: str | None, *, times: int | None = None) -> None:
        """Fail the batch operations on paths matching the regex ``path`` (``times``: the next N of them)."""
        with self._lock:
            self._bucket_refused = (re.compile(path), times) if path is not None else None

    def _refused(self, path: str) -> bool:
        with self._lock:
            if self._bucket_refused is None or not self._bucket_refused[0].search(path):
                return False
            pattern, times = self._bucket_refused
            if times is not None:
                self._bucket_refused = (pattern, times - 1) if times > 1 else None
            return True

    def deny_buckets(self, token: str) -> None:
        with self._lock:
            self._bucket_denied.add(token)

    def create_bucket(self, bucket_id: str, *, private: bool = True) -> None:
        with self._lock:
            if bucket_id in self._buckets:
                raise HubError(409, f"Bucket {bucket_id} already exists")
            self._buckets[bucket_id] = Bucket(bucket_id, private, time.time())

    def bucket_files(self, bucket_id: str) -> dict[str, BucketEntry]:
        with self._lock:
            return dict(self._bucket(bucket_id).files)

    def bucket_bytes(self, bucket_id: str, path: str) -> bytes:
        entry = self.bucket_files(bucket_id)[path]
        cached = self._bucket_bytes.get(entry.xet_hash)  # content-addressed: never stale
        if cached is not None:
            return cached
        tmp = self._bucket_rebuild(entry)
        try:
            data = tmp.read_bytes()
        finally:
            tmp.unlink(missing_ok=True)
        if len(data) <= 1024 * 1024:
            self._bucket_bytes[entry.xet_hash] = data
        return data

    # -- helpers ------------------------------------------------------------------------------------
    def _bucket(self, bucket_id: str) -> Bucket:
        bucket = self._buckets.get(bucket_id)
        if bucket is None:
            raise HubError(404, "Bucket not found", "RepoNotFound")
        return bucket

    def _bucket_readable(self, c: _Call) -> Bucket:
        bucket = self._buckets.get(c.repo_id)
        ns = c.repo_id.split("/")[0]
        if bucket is None or (bucket.private and (c.user is None or ns not in c.user.namespaces)):
            if c.user is None:
                raise HubError(401, "Invalid username or password.", "RepoNotFound")
            raise HubError(404, "Bucket not found", "RepoNotFound")
        return bucket

    def _bucket_may_write(self, c: _Call, ns: str) -> None:
        if c.user is None:
            raise HubError(401, "Invalid username or password.")
        if ns not in c.user.namespaces or c.user.role != "write" or c.user.token in self._bucket_denied:
            raise HubError(403, f"You don't have the rights to write to buckets under the namespace {ns!r}")

    def _bucket_writable(self, c: _Call) -> Bucket:
        bucket = self._bucket_readable(c)
        self._bucket_may_write(c, c.repo_id.split("/")[0])
        return bucket

    def _gate(self, h: _Handler) -> None:
        """A Hub without buckets (a mirror, an older self-hosted Hub): plain 404, no error code."""
        if not self.buckets_enabled:
            h.drain()
            raise HubError(404, f"Not found: {h.command} {h.record.path}")

    def _xet_size(self, xet_hash: str) -> int | None:
        """Size of a file a client uploaded to the CAS, read from the shards it wrote there."""
        with self._lock:
            if xet_hash not in self._xet_sizes:
                for shard in sorted(self.cas.rglob("*.mdb")) if self.cas.is_dir() else ():
                    if shard.name in self._bucket_shards_read:
                        continue
                    try:
                        self._xet_sizes.update(shard_file_sizes(shard.read_bytes()))
                        self._bucket_shards_read.add(shard.name)
                    except OSError:
                        continue  # being written: read again next time
                for known, size in self._xet_files.values():  # files the repo side put in the CAS
                    self._xet_sizes.setdefault(known, size)
            return self._xet_sizes.get(xet_hash)

    def _bucket_rebuild(self, entry: BucketEntry) -> Path:
        """The bytes of a bucket file, rebuilt from the CAS into a temp file (the caller removes it)."""
        import hf_xet

        tmp = self.root / "tmp" / secrets.token_hex(8)
        info = hf_xet.PyXetDownloadInfo(str(tmp), entry.xet_hash, entry.size)
        for attempt in range(50):
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore", DeprecationWarning)
                    hf_xet.download_files([info], *self.cas_rebuild_client(), None, None)
                return tmp
            except RuntimeError as error:  # a local CAS is one database: a client process may hold it
                if "already open" not in str(error) or attempt == 49:
                    raise
                time.sleep(0.1)
        return tmp

    # -- HTTP ---------------------------------------------------------------------------------------
    def _api_bucket_create(self, h: _Handler, c: _Call) -> None:
        self._gate(h)
        body = h.read_json()
        ns, name = c.repo_id.split("/")
        if ns == "me" and c.user is not None:
            ns = c.user.user
        self._bucket_may_write(c, ns)
        bucket_id = f"{ns}/{name}"
        url = f"{h.base_url}/buckets/{bucket_id}"
        with self._lock:
            if bucket_id in self._buckets:
                h.send_json(409, {"error": f"Bucket {bucket_id} already exists", "url": url})
                return
            self.create_bucket(bucket_id, private=body.get("visibility", "public") == "private")
        h.send_json(200, {"url": url, "name": bucket_id, "id": bucket_id})

    def _api_bucket_info(self, h: _Handler, c: _Call) -> None:
        self._gate(h)
        h.drain()
        with self._lock:
            b = self._bucket_readable(c)
            files = list(b.files.values())
        body = {
            "id": b.bucket_id,
            "private": b.private,
            "createdAt": iso(b.created),
            "size": sum(f.size for f in files),
            "totalFiles": len(files),
        }
        h.send_json(200, body)

    def _api_bucket_delete(self, h: _Handler, c: _Call) -> None:
        self._gate(h)
        h.drain()
        with self._lock:
            self._bucket_writable(c)
            del self._buckets[c.repo_id]
        h.send_json(200, {})

    def _api_bucket_batch(self, h: _Handler, c: _Call) -> None:
        self._gate(h)
        raw = h.read_body()
        with self._lock:
            bucket = self._bucket_writable(c)
        failed: list[dict[str, str]] = []
        sent = 0
        for line in raw.splitlines():
            if not line.strip():
                continue
            sent += 1
            try:
                op = json.loads(line)
                path = check_path(str(op.get("path", "")))
            except (ValueError, HubError) as e:
                failed.append({"path": "", "error": f"invalid operation: {e}"})
                continue
            kind = op.get("type")
            if self._refused(path):
                failed.append({"path": path, "error": "refused by the test (refuse_bucket_paths)"})
                continue
            if kind == "deleteFile":
                with self._lock:
                    bucket.files.pop(path, None)
            elif kind in ("addFile", "copyFile"):
                xet_hash = str(op.get("xetHash") or "")
                size = self._xet_size(xet_hash)
                if size is None:  # the Hub refuses a hash its CAS does not hold
                    failed.append({"path": path, "error": f"Xet file {xet_hash!r} not found"})
                    continue
                mtime = float(op.get("mtime") or time.time() * 1000) / 1000
                entry = BucketEntry(path, xet_hash, size, mtime, time.time(), op.get("contentType"))
                with self._lock:
                    bucket.files[path] = entry
            else:
                failed.append({"path": path, "error": f"unknown operation type {kind!r}"})
        h.send_json(422 if failed and len(failed) == sent else 200, {"failed": failed})

    def _api_bucket_tree(self, h: _Handler, c: _Call) -> None:
        self._gate(h)
        h.drain()
        recursive = (c.query.get("recursive") or ["false"])[0].lower() == "true"
        prefix = unquote(c.path).strip("/")
        with self._lock:
            files = sorted(self._bucket_readable(c).files.values(), key=lambda f: f.path)
        base = f"{prefix}/" if prefix else ""
        out: list[dict[str, Any]] = []
        folders: dict[str, float] = {}
        for f in files:
            if prefix and f.path != prefix and not f.path.startswith(base):
                continue
            rest = f.path[len(base) :] if f.path != prefix else f.path.rsplit("/", 1)[-1]
            if recursive or "/" not in rest:
                out.append(f.json())
            else:
                folder = base + rest.split("/", 1)[0]
                folders[folder] = max(folders.get(folder, 0.0), f.uploaded)
        out += [{"type": "directory", "path": p, "uploadedAt": iso(t)} for p, t in sorted(folders.items())]
        h.send_json(200, out)

    def _api_bucket_paths_info(self, h: _Handler, c: _Call) -> None:
        self._gate(h)
        body = h.read_json()
        with self._lock:
            files = dict(self._bucket_readable(c).files)
        paths = body.get("paths") or []
        h.send_json(200, [files[p].json() for p in paths if p in files])

    def _api_bucket_resolve(self, h: _Handler, c: _Call) -> None:
        self._gate(h)
        h.drain()
        with self._lock:
            entry = self._bucket_readable(c).files.get(c.path)
        if entry is None:
            raise HubError(404, "Entry not found", "EntryNotFound")
        refresh = f"{h.base_url}/api/buckets/{c.repo_id}/xet-read-token"
        headers = {
            "Content-Type": entry.content_type or "application/octet-stream",
            "ETag": f'"{entry.xet_hash}"',
            "X-Linked-Size": str(entry.size),
            "X-Xet-Hash": entry.xet_hash,
            "Link": f'<{refresh}>; rel="xet-auth"',
        }
        if c.method == "HEAD":
            h.start_response(200, headers, entry.size)
            return
        blob = self._bucket_rebuild(entry)  # a plain GET: the bytes, as the Hub's redirect serves them
        try:
            h.start_response(200, headers, entry.size)
            h.write_body(None, blob, entry.size)
        finally:
            blob.unlink(missing_ok=True)

    def _bucket_xet_token(self, h: _Handler, c: _Call, write: bool) -> None:
        self._gate(h)
        authorize = self._bucket_writable if write else self._bucket_readable
        self.grant_xet_token(h, c, authorize, over_http=self.cas_over_http)

    def _api_bucket_xet_read_token(self, h: _Handler, c: _Call) -> None:
        self._bucket_xet_token(h, c, write=False)

    def _api_bucket_xet_write_token(self, h: _Handler, c: _Call) -> None:
        self._bucket_xet_token(h, c, write=True)
