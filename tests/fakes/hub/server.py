"""A local Hugging Face Hub for tests: the subset of the Hub HTTP API that ``huggingface_hub`` uses.

Python standard library only, so it runs in-process (``from tests.fakes.hub.server import HubServer``) or as a
separate process (container tests, benchmarks)::

    python tests/hubserver.py --host 127.0.0.1 --port 0 --data DIR \\
        [--token TOKEN:USER:ROLE[:ORG,ORG...] ...] [--ready-file PATH]

It prints its URL on stdout once listening and, with ``--ready-file``, writes it there (atomically).
SIGTERM/SIGINT stop it.

Clients set ``HF_ENDPOINT=<url>`` before ``huggingface_hub`` is imported. Both transfer paths of the Hub:

* Xet (default; ``xet=False`` / ``--no-xet`` / ``set_xet(False)`` for a Hub or mirror without it). The CAS
  is a folder, ``<root>/cas``, that hf_xet reads and writes itself (endpoint ``local://<root>/cas``).
  ``GET /api/{t}/{repo}/xet-write-token/{rev}`` and ``xet-read-token/{rev}`` answer ``X-Xet-Cas-Url``,
  ``X-Xet-Access-Token``, ``X-Xet-Token-Expiration`` (and the same as JSON, which hf_xet's refresh reads);
  tokens live ``xet_token_ttl`` seconds. A commit's ``lfsFile`` names only the sha256: the server maps it
  to the Xet file hash by reading the shards the client wrote (``shard_files``). ``resolve`` of a Xet file
  sends ``X-Xet-Hash`` and ``Link: <xet-read-token>; rel="xet-auth"``; a plain GET still serves the bytes
  (rebuilt from the CAS on first use), as the Hub's resolve redirect does. The Python API stores LFS files
  in the CAS too, so seeded files are Xet-backed.
* LFS: clients with ``HF_HUB_DISABLE_XET=1`` take preupload -> LFS batch -> PUT -> NDJSON commit, and
  plain HTTP downloads.

Model
-----
Repos (models, datasets, spaces; public or private) live in memory and die with the process; file
contents live on disk under ``<root>/blobs/<sha256>`` and are streamed both ways (a 1 GiB round trip
peaks at ~30 MiB RSS). Every commit keeps a full snapshot of the tree, so branches, tags and the 40-hex
sha of any past commit resolve. Commits go to existing branches only (``create_branch`` first), as on
the Hub. ``create_repo`` makes an initial ``.gitattributes`` commit, like the Hub. Preupload answers
``lfs`` for files >= 10 MiB, with a NUL byte in the first 512 bytes, or with a binary suffix
(``LFS_PATTERNS``), else ``regular``; it returns the remote oid so unchanged files are skipped.
ETags: git blob sha1 for regular files, sha256 for LFS files (quoted), as on the Hub.

Auth, as on the Hub: tokens map to (user, role ``read``|``write``, orgs). A bad token is a 401
"Invalid credentials in Authorization header" everywhere. A private or missing repo is a 401 +
``X-Error-Code: RepoNotFound`` without a token and a 404 RepoNotFound with a token lacking access (the
client raises ``RepositoryNotFoundError`` for both). A read token cannot write (403), nobody writes
outside their user/org namespaces (403), anonymous writes are refused (401). The LFS upload href carries
its own unguessable key instead of an Authorization header (the client sends none there).

Python API (all ``repo_type`` arguments default to ``"model"``; ``revision`` to ``"main"``; errors raise
``HubError`` with ``status``/``code``/``message``)
---------------------------------------------------------------------------------------------
``HubServer(root=None, *, host="127.0.0.1", port=0)``  binds at once (``url`` is known); ``root=None``
    uses a temp dir that ``stop()`` removes.
``start() -> HubServer``, ``stop()``, ``with HubServer() as hub:``; ``url``, ``host``, ``port``, ``root``.
``add_token(token, user, role="write", *, orgs=(), name=None)``, ``remove_token(token)``.
``create_repo(repo_id, *, repo_type, private=False, exist_ok=False, author="hubserver") -> str`` (url);
    ``delete_repo(repo_id, *, repo_type)``; ``repo_exists(repo_id, *, repo_type) -> bool``.
``commit(repo_id, files: Mapping[str, bytes | os.PathLike | None], *, repo_type, revision, message,
    author, lfs=None) -> str``: one commit; bytes = content, a path = local file (streamed), None =
    delete (``"dir/"`` deletes a folder); ``lfs`` forces the storage mode. Returns the commit sha.
``upload_bytes(repo_id, path_in_repo, data, **kw) -> str``, ``upload_file(repo_id, path_in_repo,
    local_path, **kw) -> str``, ``delete_file(repo_id, path_in_repo, **kw) -> str``.
``create_branch(repo_id, branch, *, repo_type, revision="main")``, ``create_tag(repo_id, tag, ...)``.
``head(repo_id, *, repo_type, revision) -> str``; ``commits(repo_id, *, repo_type, revision) ->
    list[Commit]`` (newest first); ``files(...) -> dict[str, FileEntry]``; ``file_bytes(repo_id, path,
    *, repo_type, revision) -> bytes``; ``blob_path(...) -> Path`` (for big files).
``inject(kind, *, method=None, path=None, share=1.0, times=None, skip=0, seed=None, status=None,
    retry_after=0, after_bytes=None, rate=None) -> Fault``; ``clear_faults()``; ``faults``.
    ``kind``: ``"500"``/``"503"``/``"429"``/any status (``"status"`` + ``status=``), ``"reset"`` (drop
    the connection without a response), ``"reset-body"`` (headers + ``after_bytes`` (default: half) of
    the body, then drop), ``"slow"`` (body at ``rate`` bytes/s), ``"apply-then-reset"`` (handle the
    request, e.g. apply a commit, then drop the connection instead of answering). ``method``/``path``
    are regexes (``re.search`` on the URL path, no query); ``skip`` lets the first N matches pass,
    ``times`` limits the fault to the next N selected requests, ``share`` (0..1) selects a random share
    (``seed`` for reproducibility); ``"cas-unwritable"`` (on a Xet token route: hand out a CAS URL where
    nothing can be written). ``Fault`` is a context manager that removes itself on exit and has
    ``fired``. Admin requests are never faulted.
``set_commit_rate_limit(limit: int | None, window_s=3600.0)``: more HTTP commits than ``limit`` per
    window and repo get 429 + Retry-After (the Hub allows 128/hour/repo). Off by default. (On a retried
    429 the client sleeps Retry-After + 1 s; use ``retry_after=0`` in faults.)
``requests -> list[RequestRecord]`` (method, path, query, status, bytes_in, bytes_out, user, fault,
    range), ``find_requests(method=None, path=None)``, ``bytes_served(path=None) -> int`` (response body
    bytes, path regex), ``reset_log()``. Status 0 = no response was sent. Records are logged when the
    request arrives and updated in place, so the log is complete once the client has its answer.

Useful path regexes for ``inject``/``find_requests``: ``/preupload/``, ``/info/lfs/objects/batch``,
``^/_lfs/`` (LFS PUT), ``/commit/``, ``/resolve/``, ``/tree/``, ``/paths-info/``, ``/commits/``.

Admin API (JSON; for tests in another process; ``RemoteHub(url)`` wraps it with the same names; no
auth, so keep the server on a loopback address)
---------------------------------------------------------------------------------------------
``GET /_admin/health`` | ``POST /_admin/tokens`` {token,user,role,orgs,name} |
``POST /_admin/repos`` {repo_id,repo_type,private,exist_ok} -> {url} | ``DELETE /_admin/repos?repo_id=&repo_type=`` |
``PUT /_admin/files?repo_id=&path=&repo_type=&revision=&message=&lfs=`` raw body (streamed) -> {commit} |
``GET /_admin/files?repo_id=&path=&repo_type=&revision=`` -> raw bytes |
``GET /_admin/commits?repo_id=&repo_type=&revision=`` -> {commits:[...]} |
``POST /_admin/faults`` {kind, ...inject kwargs} -> {id} | ``GET /_admin/faults`` | ``DELETE /_admin/faults`` |
``GET /_admin/log`` -> {requests:[...], bytes_served:{path:n}} | ``DELETE /_admin/log`` |
``POST /_admin/config`` {commit_rate_limit, commit_rate_window, xet, xet_token_ttl}.

``set_xet(enabled, *, token_ttl=None)``; ``cas``, ``cas_url``.

Not supported: multipart LFS, pull requests (``create_pr``), pagination (lists come in one page),
.gitignore handling in preupload, gated repos.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import fnmatch
import hashlib
import io
import itertools
import json
import math
import os
import random
import re
import secrets
import shutil
import signal
import socket
import struct
import sys
import tempfile
import threading
import time
import traceback
import urllib.error
import urllib.request
import warnings
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import asdict, dataclass, field, fields
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, unquote, urlencode, urlsplit

CHUNK = 1024 * 1024
LFS_THRESHOLD = 10 * 1024 * 1024
MAX_JSON_BODY = 512 * 1024 * 1024  # regular files arrive base64-inline in the commit body
LFS_PATTERNS = (
    "*.7z", "*.arrow", "*.bin", "*.bz2", "*.ckpt", "*.ftz", "*.gz", "*.h5", "*.joblib", "*.mlmodel",
    "*.model", "*.msgpack", "*.npy", "*.npz", "*.onnx", "*.ot", "*.parquet", "*.pb", "*.pickle", "*.pkl",
    "*.pt", "*.pth", "*.rar", "*.safetensors", "*.tar", "*.tar.*", "*.tflite", "*.tgz", "*.wasm", "*.xz",
    "*.zip", "*.zst", "*tfevents*", "*.jpg", "*.jpeg", "*.png", "*.webp", "*.mp3", "*.wav", "*.mp4",
)  # fmt: skip
GITATTRIBUTES = "".join(f"{p} filter=lfs diff=lfs merge=lfs -text\n" for p in LFS_PATTERNS)
TYPE_FROM_PLURAL = {"models": "model", "datasets": "dataset", "spaces": "space", None: "model"}
PLURAL = {"model": "models", "dataset": "datasets", "space": "spaces"}
URL_PREFIX = {"model": "", "dataset": "datasets/", "space": "spaces/"}
FAULT_KINDS = ("status", "reset", "reset-body", "slow", "apply-then-reset", "cas-unwritable")
XET_TOKEN_TTL = 3600.0  # seconds a CAS access token lives, as on the Hub
# Xet shard layout (xet-core spec/shard.md): a 48-byte header (32-byte tag, version, footer size), then the
# File Info section: per file a 48-byte header (file hash, flags, entry count, unused), its data-sequence
# entries (48 bytes: xorb hash, flags, unpacked bytes, chunk range), as many verification entries when flag
# bit 31 is set, and one metadata extension (the file's sha256, 48 bytes) when bit 30 is set; an all-ones
# file hash ends the section. Hashes are four little-endian u64 words; their hex form prints each word.
SHARD_TAG = b"HFRepoMetaData\x00UigEj{\x81W\x83\xa5\xbd\xd9\\\xcd\xd1J\xa9"
_SHARD_ENTRY = 48
_FLAG_VERIFICATION, _FLAG_METADATA_EXT = 1 << 31, 1 << 30
_HEX40 = re.compile(r"[0-9a-f]{40}")
_HEX64 = re.compile(r"[0-9a-f]{64}")
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,95}")


def git_blob_sha1(data: bytes) -> str:
    """The git object id of a blob (what the Hub uses as ETag for regular files)."""
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def lfs_pointer(sha256: str, size: int) -> bytes:
    return f"version https://git-lfs.github.com/spec/v1\noid sha256:{sha256}\nsize {size}\n".encode()


def iso(ts: float) -> str:
    """Hub date format; the client parses exactly '%Y-%m-%dT%H:%M:%S.%fZ'."""
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(ts)) + f".{int(ts * 1000) % 1000:03d}Z"


def wants_lfs(path: str, size: int, sample: bytes) -> bool:
    name = path.rsplit("/", 1)[-1]
    return size >= LFS_THRESHOLD or b"\0" in sample or any(fnmatch.fnmatch(name, p) for p in LFS_PATTERNS)


def _file_chunks(path: Path) -> Iterator[bytes]:
    with open(path, "rb") as f:
        while data := f.read(CHUNK):
            yield data


def merkle_hex(raw: bytes) -> str:
    """A Xet hash as its 64-hex name: each of the four little-endian u64 words printed big-endian."""
    return "".join(raw[i : i + 8][::-1].hex() for i in range(0, 32, 8))


def shard_files(data: bytes) -> dict[str, tuple[str, int]]:
    """sha256 -> (Xet file hash, size) of every file a shard describes with its sha256 (see SHARD_TAG)."""
    if data[:32] != SHARD_TAG:
        return {}
    found, pos = {}, 48
    while pos + _SHARD_ENTRY <= len(data):
        file_hash = data[pos : pos + 32]
        flags, count = struct.unpack_from("<II", data, pos + 32)
        pos += _SHARD_ENTRY
        if file_hash == b"\xff" * 32:
            break
        size = sum(struct.unpack_from("<I", data, pos + i * _SHARD_ENTRY + 36)[0] for i in range(count))
        pos += _SHARD_ENTRY * count * (2 if flags & _FLAG_VERIFICATION else 1)
        if flags & _FLAG_METADATA_EXT:
            found[merkle_hex(data[pos : pos + 32])] = (merkle_hex(file_hash), size)
            pos += _SHARD_ENTRY
    return found


def check_path(path: str) -> str:
    parts = path.split("/")
    if not path or path.startswith("/") or any(p in ("", ".", "..") for p in parts) or ".git" in parts:
        raise HubError(400, f"Invalid path in repo: {path!r}")
    return path


class HubError(Exception):
    """An HTTP error answered the Hub way: JSON {"error": message} plus X-Error-Code/X-Error-Message."""

    def __init__(self, status: int, message: str, code: str | None = None, headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status, self.message, self.code, self.headers = status, message, code, headers or {}


class _Abort(Exception):
    """Drop the connection now, without (the rest of) a response."""


@dataclass(frozen=True)
class FileEntry:
    path: str
    size: int
    sha256: str  # key of the blob on disk
    git_oid: str  # git sha1 of the content (regular) or of the LFS pointer (LFS)
    lfs: bool
    xet_hash: str | None = None  # stored in the Xet CAS (an LFS file whose bytes the client sent there)

    @property
    def etag(self) -> str:
        return self.sha256 if self.lfs else self.git_oid

    def tree_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"type": "file", "oid": self.git_oid, "size": self.size, "path": self.path}
        if self.lfs:
            pointer_size = len(lfs_pointer(self.sha256, self.size))
            out["lfs"] = {"oid": self.sha256, "size": self.size, "pointerSize": pointer_size}
        if self.xet_hash:
            out["xetHash"] = self.xet_hash
        return out


@dataclass(frozen=True)
class Commit:
    oid: str
    parent: str | None
    summary: str
    description: str
    author: str
    timestamp: float
    files: Mapping[str, FileEntry]  # full snapshot of the tree


@dataclass
class Repo:
    repo_type: str
    repo_id: str
    private: bool
    created: float
    branches: dict[str, str] = field(default_factory=dict)
    tags: dict[str, str] = field(default_factory=dict)
    commits: dict[str, Commit] = field(default_factory=dict)
    lfs_oids: set[str] = field(default_factory=set)  # LFS objects this repo already holds
    commit_times: list[float] = field(default_factory=list)  # HTTP commits, for the rate limit

    def resolve(self, revision: str) -> Commit:
        rev = revision.removeprefix("refs/heads/").removeprefix("refs/tags/")
        oid = self.branches.get(rev) or self.tags.get(rev)
        if oid is None and _HEX40.fullmatch(revision) and revision in self.commits:
            oid = revision
        if oid is None:
            raise HubError(404, f"Invalid rev id: {revision}", "RevisionNotFound")
        return self.commits[oid]

    def history(self, start: Commit) -> Iterator[Commit]:
        commit: Commit | None = start
        while commit is not None:
            yield commit
            commit = self.commits.get(commit.parent) if commit.parent else None


@dataclass(frozen=True)
class Token:
    token: str
    user: str
    role: str  # "read" | "write"
    orgs: frozenset[str]
    name: str

    @property
    def namespaces(self) -> frozenset[str]:
        return self.orgs | {self.user}


@dataclass
class RequestRecord:
    """One request to the Hub API, logged on arrival and updated as it proceeds."""

    method: str
    path: str
    query: str
    status: int  # 0: no response (reset); with "apply-then-reset", what the handler decided but never sent
    bytes_in: int
    bytes_out: int  # response body bytes
    user: str | None
    fault: str | None
    range: str | None
    started: float
    duration: float


@dataclass
class Fault:
    kind: str
    status: int = 500
    method: str | None = None
    path: str | None = None
    share: float = 1.0
    times: int | None = None
    skip: int = 0
    seed: int | None = None
    retry_after: int = 0
    after_bytes: int | None = None
    rate: int | None = None
    fired: int = 0
    id: str = field(default_factory=lambda: secrets.token_hex(4))
    _seen: int = field(default=0, repr=False)
    _rng: random.Random = field(default_factory=random.Random, repr=False)
    _hub: HubServer | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        if self.kind.isdigit():
            self.kind, self.status = "status", int(self.kind)
        if self.kind not in FAULT_KINDS:
            raise ValueError(f"unknown fault kind {self.kind!r}; one of {FAULT_KINDS} or a status code")
        if self.kind == "slow" and not self.rate:
            raise ValueError("a 'slow' fault needs rate= (bytes per second)")
        self._rng = random.Random(self.seed)

    def _select(self, method: str, path: str) -> bool:
        """Called under the hub lock: does this fault hit this request?"""
        if self.method and not re.fullmatch(self.method, method, re.IGNORECASE):
            return False
        if self.path and not re.search(self.path, path):
            return False
        self._seen += 1
        if self._seen <= self.skip or (self.times is not None and self.fired >= self.times):
            return False
        if self.share < 1.0 and self._rng.random() >= self.share:
            return False
        self.fired += 1
        return True

    @property
    def label(self) -> str:
        return str(self.status) if self.kind == "status" else self.kind

    def to_json(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self) if not f.name.startswith("_")}

    def remove(self) -> None:
        if self._hub is not None:
            self._hub._remove_fault(self)

    def __enter__(self) -> Fault:
        return self

    def __exit__(self, *exc: object) -> None:
        self.remove()


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
            raise HubError(fault.status, f"Injected fault: HTTP {fault.status}", None, headers)
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


class HubServer:
    """The Hub. See the module docstring for the API."""

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
        self, token: str, user: str, role: str = "write", *, orgs: Iterable[str] = (), name: str | None = None
    ) -> None:
        if role not in ("read", "write"):
            raise ValueError("role must be 'read' or 'write'")
        with self._lock:
            self._tokens[token] = Token(token, user, role, frozenset(orgs), name or f"{user}-{role}")

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

    def inject(self, kind: str, **kwargs: Any) -> Fault:
        fault = Fault(kind, **kwargs)
        fault._hub = self
        with self._lock:
            self._faults.append(fault)
        return fault

    def clear_faults(self) -> None:
        with self._lock:
            self._faults.clear()

    @property
    def faults(self) -> list[Fault]:
        with self._lock:
            return list(self._faults)

    def _remove_fault(self, fault: Fault) -> None:
        with self._lock:
            if fault in self._faults:
                self._faults.remove(fault)

    def _pick_fault(self, method: str, path: str) -> Fault | None:
        with self._lock:
            return next((f for f in self._faults if f._select(method, path)), None)

    # -- request log --------------------------------------------------------------------------------
    def _log_request(self, record: RequestRecord) -> None:
        with self._lock:
            self._log.append(record)

    @property
    def requests(self) -> list[RequestRecord]:
        with self._lock:
            return list(self._log)

    def find_requests(self, method: str | None = None, path: str | None = None) -> list[RequestRecord]:
        return [
            r
            for r in self.requests
            if (method is None or r.method == method.upper()) and (path is None or re.search(path, r.path))
        ]

    def bytes_served(self, path: str | None = None) -> int:
        return sum(r.bytes_out for r in self.find_requests(path=path))

    def reset_log(self) -> None:
        with self._lock:
            self._log.clear()

    # -- blobs --------------------------------------------------------------------------------------
    def _blob(self, sha256: str) -> Path:
        return self.root / "blobs" / sha256

    def _store_bytes(self, data: bytes) -> str:
        sha = hashlib.sha256(data).hexdigest()
        if not self._blob(sha).exists():
            tmp = self.root / "tmp" / secrets.token_hex(8)
            tmp.write_bytes(data)
            os.replace(tmp, self._blob(sha))
        return sha

    def _store_stream(self, chunks: Iterable[bytes]) -> tuple[str, int]:
        """Stream to a temp file while hashing; never holds the content in memory."""
        tmp = self.root / "tmp" / secrets.token_hex(8)
        digest, size = hashlib.sha256(), 0
        try:
            with open(tmp, "wb") as f:
                for chunk in chunks:
                    digest.update(chunk)
                    f.write(chunk)
                    size += len(chunk)
            sha = digest.hexdigest()
            os.replace(tmp, self._blob(sha))
        finally:
            tmp.unlink(missing_ok=True)
        return sha, size

    def _entry_from_bytes(self, path: str, data: bytes, lfs: bool | None) -> FileEntry:
        lfs = wants_lfs(path, len(data), data[:512]) if lfs is None else lfs
        sha = self._store_bytes(data)
        if lfs and self.xet:
            return self._entry_from_file(path, self._blob(sha), True)
        oid = git_blob_sha1(lfs_pointer(sha, len(data))) if lfs else git_blob_sha1(data)
        return FileEntry(path, len(data), sha, oid, lfs)

    def _entry_from_file(self, path: str, local: Path, lfs: bool | None) -> FileEntry:
        size = local.stat().st_size
        with open(local, "rb") as f:
            sample = f.read(512)
        if not (wants_lfs(path, size, sample) if lfs is None else lfs):
            return self._entry_from_bytes(path, local.read_bytes(), False)

        sha, size = self._store_stream(_file_chunks(local))
        xet_hash = self._xet_upload(local) if self.xet else None  # the Hub stores new LFS files in Xet
        return FileEntry(path, size, sha, git_blob_sha1(lfs_pointer(sha, size)), True, xet_hash)

    def _lfs_entry(self, repo: Repo, path: str, sha: str, size: int | None) -> FileEntry:
        blob = self._blob(sha)
        xet = self._xet_file(sha) if _HEX64.fullmatch(sha) else None
        if xet is not None and not blob.exists():  # in the CAS only: its bytes are rebuilt when first read
            if size is not None and size != xet[1]:
                raise HubError(422, f"Xet file {sha} for {path!r} has {xet[1]} bytes, not {size}")
            return FileEntry(path, xet[1], sha, git_blob_sha1(lfs_pointer(sha, xet[1])), True, xet[0])
        if not _HEX64.fullmatch(sha) or not blob.exists() or (size is not None and blob.stat().st_size != size):
            raise HubError(422, f"LFS object {sha} for {path!r} was not uploaded")
        size = blob.stat().st_size
        return FileEntry(path, size, sha, git_blob_sha1(lfs_pointer(sha, size)), True, xet and xet[0])

    # -- Xet storage --------------------------------------------------------------------------------
    @property
    def cas_url(self) -> str:
        """The CAS endpoint the Hub hands out: hf_xet reads and writes xorbs and shards in this folder."""
        return f"local://{self.cas}"

    def _xet_file(self, sha256: str) -> tuple[str, int] | None:
        """(Xet hash, size) of content a client uploaded to the CAS, read from the shards it wrote there."""
        with self._lock:
            if sha256 not in self._xet_files:
                for shard in sorted(self.cas.rglob("*.mdb")) if self.cas.is_dir() else ():
                    if shard.name in self._shards_read:
                        continue
                    try:
                        self._xet_files.update(shard_files(shard.read_bytes()))
                        self._shards_read.add(shard.name)
                    except OSError:
                        continue  # being written: read again next time
            return self._xet_files.get(sha256)

    def _xet_upload(self, local: Path) -> str:
        """Store ``local`` in the CAS (what a client's hf_xet does), returning its Xet hash."""
        import hf_xet

        self.cas.mkdir(exist_ok=True)
        with warnings.catch_warnings():  # the one-call API is deprecated, and just what a server needs
            warnings.simplefilter("ignore", DeprecationWarning)
            info = hf_xet.upload_files([str(local)], self.cas_url, None, None, None, None)[0]
        with self._lock:
            self._xet_files[info.sha256] = (info.hash, info.file_size)
        return info.hash

    def _ensure_blob(self, entry: FileEntry) -> Path:
        """The bytes of ``entry`` on disk: Xet-uploaded files are rebuilt from the CAS on first use."""
        blob = self._blob(entry.sha256)
        if blob.exists() or not entry.xet_hash:
            return blob
        import hf_xet

        tmp = self.root / "tmp" / secrets.token_hex(8)
        try:
            info = hf_xet.PyXetDownloadInfo(str(tmp), entry.xet_hash, entry.size)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", DeprecationWarning)
                hf_xet.download_files([info], self.cas_url, None, None, None, None)
            sha, _ = self._store_stream(_file_chunks(tmp))
        finally:
            tmp.unlink(missing_ok=True)
        if sha != entry.sha256:
            raise HubError(500, f"the CAS rebuilt {entry.path} with sha256 {sha}, expected {entry.sha256}")
        return blob

    def _xet_token(self, h: _Handler, c: _Call, write: bool) -> None:
        h.drain()
        if not self.xet:
            raise HubError(404, f"Not found: {c.method} {h.record.path}")  # a Hub without Xet storage
        with self._lock:
            if write:
                self._writable(c)
            else:
                self._readable(c).resolve(c.rev)
            token, ttl = secrets.token_urlsafe(24), self.xet_token_ttl
            expiry = int(time.time() + ttl)
            self._xet_tokens[token] = (c.user.user if c.user else "", expiry)
        cas = self.cas_url
        if h.fault is not None and h.fault.kind == "cas-unwritable":
            blocker = self.root / "cas-blocked"  # a file where the client's hf_xet needs a folder
            blocker.touch()
            cas = f"local://{blocker}/cas"
        else:
            self.cas.mkdir(exist_ok=True)
        headers = {"X-Xet-Cas-Url": cas, "X-Xet-Access-Token": token, "X-Xet-Token-Expiration": str(expiry)}
        # hf_xet refreshes from the JSON body, huggingface_hub reads the headers: the Hub sends both.
        h.send_json(200, {"accessToken": token, "exp": expiry, "casUrl": cas}, headers)

    def _api_xet_read_token(self, h: _Handler, c: _Call) -> None:
        self._xet_token(h, c, write=False)

    def _api_xet_write_token(self, h: _Handler, c: _Call) -> None:
        self._xet_token(h, c, write=True)

    # -- repos & commits (shared by the Python API and the HTTP endpoints) ---------------------------
    def _repo(self, repo_type: str, repo_id: str) -> Repo:
        repo = self._repos.get((repo_type, repo_id))
        if repo is None:
            raise HubError(404, "Repository not found", "RepoNotFound")
        return repo

    def _new_oid(self, *parts: object) -> str:
        return hashlib.sha1(repr((*parts, next(self._counter), time.time_ns())).encode()).hexdigest()

    def _make_commit(
        self,
        repo: Repo,
        branch: str,
        ops: list[tuple[str, FileEntry | None]],
        summary: str,
        description: str = "",
        author: str = "hubserver",
        parent_commit: str | None = None,
    ) -> Commit:
        """Apply additions (entry) and deletions (None; a path ending in '/' is a folder) to ``branch``."""
        with self._lock:
            if branch not in repo.branches:
                raise HubError(404, f"Invalid rev id: {branch}", "RevisionNotFound")
            head = repo.commits[repo.branches[branch]]
            if parent_commit is not None and parent_commit != head.oid:
                # The Hub's optimistic concurrency check: someone committed since the client looked.
                raise HubError(412, "A commit has happened since. Please refresh and try again.")
            files = dict(head.files)
            for path, entry in ops:
                if entry is not None:
                    files[path] = entry
                elif path.endswith("/"):
                    doomed = [p for p in files if p.startswith(path)]
                    if not doomed:
                        raise HubError(404, f"A folder with this name doesn't exist: {path}", "EntryNotFound")
                    for p in doomed:
                        del files[p]
                elif path in files:
                    del files[path]
                else:  # the client looks for this wording to hint at is_folder=True
                    raise HubError(404, f"A file with this name doesn't exist: {path}", "EntryNotFound")
            oid = self._new_oid(head.oid, summary)
            commit = Commit(oid, head.oid, summary, description, author, time.time(), files)
            repo.commits[commit.oid] = commit
            repo.branches[branch] = commit.oid
            repo.lfs_oids.update(e.sha256 for e in files.values() if e.lfs)
            return commit

    def _create_repo(self, repo_type: str, repo_id: str, private: bool, author: str) -> Repo:
        ns, _, name = repo_id.partition("/")
        if repo_type not in PLURAL or not _NAME.fullmatch(ns) or not _NAME.fullmatch(name):
            raise HubError(400, f"Invalid repo type or name: {repo_type} {repo_id!r}")
        with self._lock:
            if (repo_type, repo_id) in self._repos:
                raise HubError(409, f"You already created this {repo_type} repo")
            now = time.time()
            entry = self._entry_from_bytes(".gitattributes", GITATTRIBUTES.encode(), False)
            initial = Commit(self._new_oid(repo_id), None, "initial commit", "", author, now, {entry.path: entry})
            repo = Repo(repo_type, repo_id, private, now, {"main": initial.oid}, {}, {initial.oid: initial})
            self._repos[(repo_type, repo_id)] = repo
            return repo

    def repo_url(self, repo_id: str, repo_type: str = "model", base: str | None = None) -> str:
        return f"{base or self.url}/{URL_PREFIX[repo_type]}{repo_id}"

    # -- Python API ---------------------------------------------------------------------------------
    def create_repo(
        self,
        repo_id: str,
        *,
        repo_type: str = "model",
        private: bool = False,
        exist_ok: bool = False,
        author: str = "hubserver",
    ) -> str:
        try:
            self._create_repo(repo_type, repo_id, private, author)
        except HubError as err:
            if not (exist_ok and err.status == 409):
                raise
        return self.repo_url(repo_id, repo_type)

    def delete_repo(self, repo_id: str, *, repo_type: str = "model") -> None:
        with self._lock:
            self._repos.pop((repo_type, repo_id), None)

    def repo_exists(self, repo_id: str, *, repo_type: str = "model") -> bool:
        with self._lock:
            return (repo_type, repo_id) in self._repos

    def commit(
        self,
        repo_id: str,
        files: Mapping[str, bytes | os.PathLike[str] | None],
        *,
        repo_type: str = "model",
        revision: str = "main",
        message: str = "Upload files with hubserver",
        author: str = "hubserver",
        lfs: bool | None = None,
    ) -> str:
        repo = self._repo(repo_type, repo_id)
        ops: list[tuple[str, FileEntry | None]] = []
        for path, content in files.items():
            check_path(path.rstrip("/"))
            if content is None:
                ops.append((path, None))
            elif isinstance(content, (bytes, bytearray, memoryview)):
                ops.append((path, self._entry_from_bytes(path, bytes(content), lfs)))
            else:
                ops.append((path, self._entry_from_file(path, Path(content), lfs)))
        return self._make_commit(repo, revision, ops, message, author=author).oid

    def upload_bytes(self, repo_id: str, path_in_repo: str, data: bytes, **kwargs: Any) -> str:
        return self.commit(repo_id, {path_in_repo: data}, **kwargs)

    def upload_file(self, repo_id: str, path_in_repo: str, local_path: str | os.PathLike[str], **kwargs: Any) -> str:
        return self.commit(repo_id, {path_in_repo: Path(local_path)}, **kwargs)

    def delete_file(self, repo_id: str, path_in_repo: str, **kwargs: Any) -> str:
        return self.commit(repo_id, {path_in_repo: None}, **kwargs)

    def create_branch(self, repo_id: str, branch: str, *, repo_type: str = "model", revision: str = "main") -> None:
        with self._lock:
            repo = self._repo(repo_type, repo_id)
            if branch in repo.branches:
                raise HubError(409, f"Reference already exists: refs/heads/{branch}")
            repo.branches[branch] = repo.resolve(revision).oid

    def create_tag(self, repo_id: str, tag: str, *, repo_type: str = "model", revision: str = "main") -> None:
        with self._lock:
            repo = self._repo(repo_type, repo_id)
            if tag in repo.tags:
                raise HubError(409, f"Tag already exists: {tag}")
            repo.tags[tag] = repo.resolve(revision).oid

    def head(self, repo_id: str, *, repo_type: str = "model", revision: str = "main") -> str:
        with self._lock:
            return self._repo(repo_type, repo_id).resolve(revision).oid

    def commits(self, repo_id: str, *, repo_type: str = "model", revision: str = "main") -> list[Commit]:
        with self._lock:
            repo = self._repo(repo_type, repo_id)
            return list(repo.history(repo.resolve(revision)))

    def files(self, repo_id: str, *, repo_type: str = "model", revision: str = "main") -> dict[str, FileEntry]:
        with self._lock:
            return dict(self._repo(repo_type, repo_id).resolve(revision).files)

    def blob_path(self, repo_id: str, path: str, *, repo_type: str = "model", revision: str = "main") -> Path:
        entry = self.files(repo_id, repo_type=repo_type, revision=revision).get(path)
        if entry is None:
            raise HubError(404, f"Entry not found: {path}", "EntryNotFound")
        return self._ensure_blob(entry)

    def file_bytes(self, repo_id: str, path: str, *, repo_type: str = "model", revision: str = "main") -> bytes:
        return self.blob_path(repo_id, path, repo_type=repo_type, revision=revision).read_bytes()

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
                "auth": {"type": "access_token", "accessToken": {"displayName": u.name, "role": u.role}},
            },
        )

    def _api_create_repo(self, h: _Handler, c: _Call) -> None:
        body = h.read_json()
        repo_type = body.get("type") or "model"
        ns = body.get("organization") or (c.user.user if c.user else None)
        repo_id = f"{ns}/{body.get('name')}"
        if c.user is None:
            raise HubError(401, "Invalid username or password.")
        if ns not in c.user.namespaces or c.user.role != "write":
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
        h.drain()
        h.send_json(200, {"errors": [], "warnings": []})

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

    def _api_lfs_batch(self, h: _Handler, c: _Call) -> None:
        body = h.read_json()
        repo = self._writable(c)
        lfs_headers = {"Content-Type": "application/vnd.git-lfs+json"}
        if body.get("operation") != "upload":
            raise HubError(400, "hubserver only supports the LFS 'upload' operation")
        objects = []
        for obj in body.get("objects", []):
            oid, size = str(obj.get("oid")), int(obj.get("size", -1))
            if not _HEX64.fullmatch(oid) or size < 0:
                objects.append({"oid": oid, "size": size, "error": {"code": 422, "message": "Invalid oid or size"}})
                continue
            with self._lock:
                stored = oid in repo.lfs_oids and self._blob(oid).exists()
                if not stored:
                    key = secrets.token_urlsafe(32)  # the credential of the auth-less PUT
                    self._uploads[key] = ((repo.repo_type, repo.repo_id), oid, size)
            if stored:
                objects.append({"oid": oid, "size": size})  # no actions: nothing to upload
                continue
            verify = f"{self.repo_url(repo.repo_id, repo.repo_type, h.base_url)}.git/info/lfs/objects/verify"
            actions = {"upload": {"href": f"{h.base_url}/_lfs/{key}"}, "verify": {"href": verify}}
            objects.append({"oid": oid, "size": size, "authenticated": True, "actions": actions})
        h.send_json(200, {"transfer": "basic", "objects": objects, "hash_algo": "sha256"}, lfs_headers)

    def _api_lfs_put(self, h: _Handler, c: _Call) -> None:
        with self._lock:
            upload = self._uploads.get(c.key)
            spent = self._used_uploads.get(c.key)
        if upload is None:
            if spent is not None and self._blob(spent).exists():
                h.drain()  # a retry of a PUT whose response was lost: already stored, nothing to do
                h.send_json(200, {})
                return
            raise HubError(403, "Invalid or expired upload URL")
        repo_key, oid, size = upload
        sha, got = self._store_stream(h.body_chunks())
        if sha != oid or got != size:
            raise HubError(400, f"Uploaded content does not match: sha256 {sha} size {got}, expected {oid} {size}")
        with self._lock:
            self._uploads.pop(c.key, None)
            self._used_uploads[c.key] = oid
            repo = self._repos.get(repo_key)
            if repo is not None:
                repo.lfs_oids.add(oid)
        h.send_json(200, {})

    def _api_lfs_verify(self, h: _Handler, c: _Call) -> None:
        body = h.read_json()
        repo = self._writable(c)
        oid, size = str(body.get("oid")), body.get("size")
        blob = self._blob(oid)
        if oid not in repo.lfs_oids or not blob.exists() or blob.stat().st_size != size:
            raise HubError(404, f"LFS object {oid} not found")
        h.send_json(200, {"message": "Object verified"})

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

    # -- admin API ----------------------------------------------------------------------------------
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
            orgs, name = body.get("orgs", ()), body.get("name")
            self.add_token(body["token"], body["user"], body.get("role", "write"), orgs=orgs, name=name)
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
        else:
            raise HubError(404, f"Unknown admin route {route}")
        h.send_json(200, result)


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
            raise HubError(err.code, err.read().decode(errors="replace"), err.headers.get("X-Error-Code")) from err

    def health(self) -> dict[str, Any]:
        return self._call("GET", "health")

    def add_token(
        self, token: str, user: str, role: str = "write", *, orgs: Iterable[str] = (), name: str | None = None
    ) -> None:
        self._call("POST", "tokens", {"token": token, "user": user, "role": role, "orgs": list(orgs), "name": name})

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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Local Hugging Face Hub for tests")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--data", help="directory for blobs (default: a temp dir removed on exit)")
    parser.add_argument("--token", action="append", default=[], metavar="TOKEN:USER:ROLE[:ORG,...]")
    parser.add_argument("--ready-file", help="write the URL here once listening")
    parser.add_argument("--no-xet", action="store_true", help="a Hub without Xet storage: LFS only")
    args = parser.parse_args(argv)
    hub = HubServer(args.data, host=args.host, port=args.port, xet=not args.no_xet)
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
