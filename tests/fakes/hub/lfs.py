"""The Git LFS routes of the local Hub: batch, PUT and verify."""

from __future__ import annotations

import secrets
from typing import TYPE_CHECKING

from tests.fakes.hub.model import _HEX64, HubError

if TYPE_CHECKING:
    from tests.fakes.hub.http import _Call, _Handler


class LfsMixin:
    """The LFS endpoints of ``HubServer``."""

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
