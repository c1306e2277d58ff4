"""Repo storage of the local Hub: blobs on disk, repos and commits in memory, and the Python API on them."""

from __future__ import annotations

import hashlib
import os
import secrets
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from tests.fakes.hub.model import (
    _HEX64,
    _NAME,
    GITATTRIBUTES,
    PLURAL,
    URL_PREFIX,
    Commit,
    FileEntry,
    HubError,
    Repo,
    _file_chunks,
    check_path,
    git_blob_sha1,
    lfs_pointer,
    wants_lfs,
)


class StorageMixin:
    """Blobs, repos, commits and the Python API of ``HubServer``."""

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
