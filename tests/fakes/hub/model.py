"""What the local Hub stores: repos, commits, file entries, tokens, request records; Hub-format helpers."""

from __future__ import annotations

import fnmatch
import hashlib
import re
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

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
    # A fine-grained token's grants, as whoami-v2 lists them (``fineGrained.scoped``): ``{"entity": {"type": "user"
    # | "org" | "model" | "dataset" | "space", "name": ...}, "permissions": [...]}``; None for a read/write token.
    scoped: tuple[dict[str, Any], ...] | None = None

    @property
    def namespaces(self) -> frozenset[str]:
        return self.orgs | {self.user}

    def may_write(self, repo_type: str, repo_id: str, *, create: bool = False) -> bool:
        """Write (or create) ``repo_id``: a write token in its namespaces; a fine-grained one where a grant has
        ``repo.write``: on the namespace (create and write), or on that repo alone (write only)."""
        namespace = repo_id.split("/")[0]
        if self.role != "write" or namespace not in self.namespaces:
            return False
        if self.scoped is None:
            return True
        for grant in self.scoped:
            entity = grant["entity"]
            if "repo.write" not in grant["permissions"]:
                continue
            if entity["type"] in ("user", "org") and entity["name"] == namespace:
                return True
            if not create and entity["type"] == repo_type and entity["name"] == repo_id:
                return True
        return False

    def auth(self) -> dict[str, Any]:
        """whoami-v2's ``auth`` block for this token."""
        access: dict[str, Any] = {"displayName": self.name, "role": self.role}
        if self.scoped is not None:
            scoped = [
                {"entity": {"_id": _entity_id(g["entity"]["name"]), **g["entity"]}, "permissions": g["permissions"]}
                for g in self.scoped
            ]
            fine = {"canReadGatedRepos": False, "global": [], "scoped": scoped}
            access |= {"role": "fineGrained", "fineGrained": fine}
        return {"type": "access_token", "accessToken": access}


def _entity_id(name: str) -> str:
    return hashlib.sha1(name.encode()).hexdigest()[:24]


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
