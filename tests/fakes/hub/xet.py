"""Xet storage of the local Hub: shard parsing, the CAS on disk, and the CAS token routes."""

from __future__ import annotations

import secrets
import struct
import time
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from tests.fakes.hub.model import FileEntry, HubError, _file_chunks

if TYPE_CHECKING:
    from tests.fakes.hub.http import _Call, _Handler


XET_TOKEN_TTL = 3600.0  # seconds a CAS access token lives, as on the Hub
# Xet shard layout (xet-core spec/shard.md): a 48-byte header (32-byte tag, version, footer size), then the
# File Info section: per file a 48-byte header (file hash, flags, entry count, unused), its data-sequence
# entries (48 bytes: xorb hash, flags, unpacked bytes, chunk range), as many verification entries when flag
# bit 31 is set, and one metadata extension (the file's sha256, 48 bytes) when bit 30 is set; an all-ones
# file hash ends the section. Hashes are four little-endian u64 words; their hex form prints each word.
SHARD_TAG = b"HFRepoMetaData\x00UigEj{\x81W\x83\xa5\xbd\xd9\\\xcd\xd1J\xa9"
_SHARD_ENTRY = 48
_FLAG_VERIFICATION, _FLAG_METADATA_EXT = 1 << 31, 1 << 30


def merkle_hex(raw: bytes) -> str:
    """A Xet hash as its 64-hex name: each of the four little-endian u64 words printed big-endian."""
    return "".join(raw[i : i + 8][::-1].hex() for i in range(0, 32, 8))


def shard_entries(data: bytes) -> Iterator[tuple[str, int, str | None]]:
    """(Xet file hash, size, sha256 or None) of every file a shard describes (see SHARD_TAG)."""
    if data[:32] != SHARD_TAG:
        return
    pos = 48
    while pos + _SHARD_ENTRY <= len(data):
        file_hash = data[pos : pos + 32]
        flags, count = struct.unpack_from("<II", data, pos + 32)
        pos += _SHARD_ENTRY
        if file_hash == b"\xff" * 32:
            break
        size = sum(struct.unpack_from("<I", data, pos + i * _SHARD_ENTRY + 36)[0] for i in range(count))
        pos += _SHARD_ENTRY * count * (2 if flags & _FLAG_VERIFICATION else 1)
        sha256 = None
        if flags & _FLAG_METADATA_EXT:
            sha256 = merkle_hex(data[pos : pos + 32])
            pos += _SHARD_ENTRY
        yield merkle_hex(file_hash), size, sha256


def shard_files(data: bytes) -> dict[str, tuple[str, int]]:
    """sha256 -> (Xet file hash, size) of every file a shard describes with its sha256."""
    return {sha256: (xet_hash, size) for xet_hash, size, sha256 in shard_entries(data) if sha256 is not None}


class XetMixin:
    """The Xet half of ``HubServer``: files in the CAS and the xet-read/write-token routes."""

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
                hf_xet.download_files([info], *self.cas_rebuild_client(), None, None)
            sha, _ = self._store_stream(_file_chunks(tmp))
        finally:
            tmp.unlink(missing_ok=True)
        if sha != entry.sha256:
            raise HubError(500, f"the CAS rebuilt {entry.path} with sha256 {sha}, expected {entry.sha256}")
        return blob

    def _xet_token(self, h: _Handler, c: _Call, write: bool) -> None:
        # hf_xet's network client against the CAS routes (cas.py); local:// only where a test asks for it
        authorize = self._writable if write else lambda c: self._readable(c).resolve(c.rev)
        self.grant_xet_token(h, c, authorize, over_http=self.cas_over_http)

    def grant_xet_token(self, h: _Handler, c: _Call, authorize: Callable[[_Call], object], *, over_http: bool) -> None:
        """Answer a xet-read/write-token route (repos and buckets alike): ``authorize(c)`` raises when the
        caller may not; the CAS URL is the HTTP one (``over_http``) or ``local://`` (and a "cas-unwritable"
        fault hands out a local path where nothing can be written)."""
        h.drain()
        if not self.xet:
            raise HubError(404, f"Not found: {c.method} {h.record.path}")  # a Hub without Xet storage
        with self._lock:
            authorize(c)
            token, expiry = secrets.token_urlsafe(24), int(time.time() + self.xet_token_ttl)
            self._xet_tokens[token] = (c.user.user if c.user else "", expiry)
        cas = self.cas_http_url(h.base_url) if over_http else self.cas_url
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
