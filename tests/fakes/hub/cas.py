"""The Xet CAS of the local Hub over HTTP: what hf_xet's network client talks to on the real Hub.

Routes (Xet CAS API, xet-core ``openapi/cas.openapi.yaml``), under ``<hub>/cas``, with the CAS access token
of the xet-*-token routes as ``Authorization: Bearer`` (401 when unknown or expired):

* ``GET /v1/chunks/{prefix}/{hash}``: global dedup; always 404 ("not tracked"), which the protocol allows.
* ``POST /v1/xorbs/default/{hash}``: a serialized xorb, stored as ``xet/xorbs/xorbs/default.{hash}``.
* ``POST /v1/shards``: a shard; 400 when it names a xorb the CAS lacks. Stored under ``xet/xorbs/shards``.
* ``GET /v1/reconstructions/{file}`` (``Range: bytes=a-b`` optional): terms and one fetch URL per term.
* ``GET /cas/xorbs/default/{hash}``: the xorb bytes, honouring ``Range`` (the "presigned" data URL).
* ``POST /v1/telemetry``: accepted and dropped.
The v2 reconstruction and shard routes and the xorb-grant routes answer 404: hf_xet falls back to v1.

The folder layout is hf_xet's own for ``local://`` CAS folders, so files the server stores itself (the
Python API, through ``local://``: it is its own client there) and files clients send over HTTP are one CAS.
"""

from __future__ import annotations

import os
import re
import secrets
import struct
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from tests.fakes.hub.model import HubError

if TYPE_CHECKING:
    from tests.fakes.hub.faults import Fault
    from tests.fakes.hub.http import _Handler
    from tests.fakes.hub.model import RequestRecord

_E = 48  # every shard record is 48 bytes (xet-core metadata_shard)
_BOOKEND = b"\xff" * 32
_FLAG_VERIFICATION, _FLAG_METADATA_EXT = 1 << 31, 1 << 30
_INTERNAL = "/cas-internal"


def hex_of(raw: bytes) -> str:
    """A Xet hash's 64-hex name: each little-endian u64 word printed big-endian."""
    return "".join(raw[i : i + 8][::-1].hex() for i in range(0, 32, 8))


@dataclass
class ShardIndex:
    """What the shards say: file hash -> terms (xorb, first chunk, end chunk, bytes), xorb -> chunk table."""

    files: dict[str, list[tuple[str, int, int, int]]] = field(default_factory=dict)
    xorbs: dict[str, list[tuple[int, int]]] = field(default_factory=dict)  # per chunk: (unpacked offset, bytes)

    def add(self, data: bytes) -> None:
        """Read a shard: the file-info section, then the xorb-info section, each ended by a bookend."""
        pos = _E
        while pos + _E <= len(data):
            file_hash = data[pos : pos + 32]
            flags, count = struct.unpack_from("<II", data, pos + 32)
            pos += _E
            if file_hash == _BOOKEND:
                break
            terms = []
            for i in range(count):
                at = pos + i * _E
                _, size, first, end = struct.unpack_from("<IIII", data, at + 32)
                terms.append((hex_of(data[at : at + 32]), first, end, size))
            self.files[hex_of(file_hash)] = terms
            pos += _E * count * (2 if flags & _FLAG_VERIFICATION else 1)
            pos += _E if flags & _FLAG_METADATA_EXT else 0
        while pos + _E <= len(data):
            xorb = data[pos : pos + 32]
            (count,) = struct.unpack_from("<I", data, pos + 36)
            pos += _E
            if xorb == _BOOKEND:
                break
            chunks = [struct.unpack_from("<II", data, pos + i * _E + 32) for i in range(count)]
            self.xorbs[hex_of(xorb)] = [(int(a), int(b)) for a, b in chunks]
            pos += _E * count

    @staticmethod
    def xorbs_of(data: bytes) -> set[str]:
        """The xorbs a shard's files are made of."""
        index = ShardIndex()
        index.add(data)
        return {t[0] for terms in index.files.values() for t in terms}


class Pacer:
    """A bandwidth cap shared by every connection it paces: bytes go out no faster than ``rate`` per second."""

    PIECE = 256 * 1024

    def __init__(self, rate: int) -> None:
        self.rate, self._next, self._lock = rate, time.monotonic(), threading.Lock()

    def take(self, n: int) -> None:
        with self._lock:
            now = time.monotonic()
            self._next = max(self._next, now) + n / self.rate
            wait = self._next - now - n / self.rate  # this piece's turn starts when the previous ones are out
        if wait > 0:
            time.sleep(wait)


class CasMixin:
    """The ``/cas/`` routes of ``HubServer``; everything else goes on to the Hub's own routing."""

    cas_over_http = True  # False: the token routes hand out local://<root>/cas (hf_xet reads/writes it itself)
    cas_pacer: Pacer | None = None

    def set_cas_bandwidth(self, bytes_per_s: int | None) -> None:
        """Cap the CAS data URLs and xorb uploads together at ``bytes_per_s`` (a link's speed); None: no cap."""
        self.cas_pacer = Pacer(bytes_per_s) if bytes_per_s else None

    @property
    def cas_bandwidth(self) -> int | None:
        return self.cas_pacer.rate if self.cas_pacer is not None else None

    def set_cas_over_http(self, enabled: bool) -> None:
        """The CAS over HTTP (hf_xet's network client) or ``local://`` (hf_xet opens the folder itself)."""
        self.cas_over_http = enabled

    def cas_http_url(self, base_url: str) -> str:
        return f"{base_url}/cas"

    @property
    def _cas_index(self) -> ShardIndex:
        index: ShardIndex | None = self.__dict__.get("_cas_index_v")
        if index is None:
            index = self.__dict__["_cas_index_v"] = ShardIndex()
            self.__dict__["_cas_shards_v"] = set()
        with self._lock:
            for shard in sorted(self.cas.rglob("*.mdb")) if self.cas.is_dir() else ():
                if shard.name not in self.__dict__["_cas_shards_v"]:
                    try:
                        index.add(shard.read_bytes())
                    except OSError:
                        continue  # being written: read again next time
                    self.__dict__["_cas_shards_v"].add(shard.name)
        return index

    def _xorb_path(self, xorb: str) -> Path:
        return self.cas / "xet" / "xorbs" / "xorbs" / f"default.{xorb}"

    def cas_rebuild_client(self) -> tuple[str, tuple[str, int] | None]:
        """(endpoint, token) for the server's own hf_xet when it rebuilds a file's bytes from the CAS.

        Over HTTP it uses ``/cas-internal``: the same routes, never logged nor faulted, so that a test sees
        only its client's requests (hf_xet's ``local://`` client finds no file that came in over HTTP).
        """
        if not self.cas_over_http:
            return self.cas_url, None
        token, expiry = secrets.token_urlsafe(24), int(time.time() + 3600)
        with self._lock:
            self._xet_tokens[token] = ("hubserver", expiry)
        return f"{self.url}{_INTERNAL}", (token, expiry)

    def _log_request(self, record: RequestRecord) -> None:
        if not record.path.startswith(_INTERNAL + "/"):
            super()._log_request(record)  # type: ignore[misc]

    def _pick_fault(self, method: str, path: str) -> Fault | None:
        if path.startswith(_INTERNAL + "/"):
            return None
        return super()._pick_fault(method, path)  # type: ignore[misc,no-any-return]

    def _route(self, h: _Handler, path: str, query: dict[str, list[str]]) -> None:
        prefix = next((p for p in ("/cas", _INTERNAL) if path.startswith(p + "/")), None)
        if prefix is None:
            super()._route(h, path, query)  # type: ignore[misc]
            return
        rest, method = path[len(prefix) :], h.command
        if method == "GET" and (m := re.fullmatch(r"/xorbs/default/([0-9a-f]{64})", rest)):
            self._cas_data(h, m[1], query)
            return
        h.record.user = h.cas_user = self._cas_auth(h)  # type: ignore[attr-defined]
        if method == "GET" and (m := re.fullmatch(r"/v1/reconstructions/([0-9a-f]{64})", rest)):
            self._cas_reconstruction(h, m[1])
        elif method == "POST" and (m := re.fullmatch(r"/v1/xorbs/default/([0-9a-f]{64})", rest)):
            self._cas_put_xorb(h, m[1])
        elif method == "POST" and rest == "/v1/shards":
            self._cas_put_shard(h)
        elif method == "POST" and rest == "/v1/telemetry":
            h.drain()
            h.send_json(200, {})
        else:  # v2 routes, xorb grants, global dedup: "not here", and hf_xet uses the v1 routes above
            h.drain()
            raise HubError(404, f"Not found: {method} {path}")

    def _cas_auth(self, h: _Handler) -> str:
        token = (h.headers.get("Authorization") or "").removeprefix("Bearer ").strip()
        with self._lock:
            user, expiry = self._xet_tokens.get(token, (None, 0.0))
        # A minute of grace, like the client's refresh margin: a test's 1 s token must not fail mid-upload.
        if user is None or expiry + 60 <= time.time():
            h.drain()
            raise HubError(401, "CAS token missing, unknown or expired")
        return str(user)

    def _cas_put_xorb(self, h: _Handler, xorb: str) -> None:
        target = self._xorb_path(xorb)
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.root / "tmp" / f"xorb-{secrets.token_hex(8)}"
        try:
            with open(tmp, "wb") as f:
                for data in h.body_chunks():  # streamed: a xorb is up to 64 MiB
                    if self.cas_pacer is not None:
                        self.cas_pacer.take(len(data))
                    f.write(data)
            if tmp.stat().st_size < 8:
                raise HubError(400, f"xorb {xorb}: not a serialized xorb")
            inserted = not target.exists()
            os.replace(tmp, target)  # whole or not at all: a dropped upload leaves no torn xorb
        finally:
            tmp.unlink(missing_ok=True)
        h.send_json(200, {"was_inserted": inserted})

    def _cas_put_shard(self, h: _Handler) -> None:
        import hashlib

        data = h.read_body(limit=256 * 1024 * 1024)
        missing = sorted(x for x in ShardIndex.xorbs_of(data) if not self._xorb_path(x).exists())
        if missing:  # as the CAS: a shard may only name xorbs it holds (nothing committed half-uploaded)
            raise HubError(400, f"shard names xorbs the CAS lacks: {', '.join(missing[:3])}")
        folder = self.cas / "xet" / "xorbs" / "shards"
        folder.mkdir(parents=True, exist_ok=True)
        target = folder / f"{hashlib.sha256(data).hexdigest()}.mdb"
        existed = target.exists()
        tmp = self.root / "tmp" / f"shard-{secrets.token_hex(8)}"
        tmp.write_bytes(data)
        os.replace(tmp, target)
        h.send_json(200, {"result": 0 if existed else 1})

    def _cas_reconstruction(self, h: _Handler, file_hash: str) -> None:
        h.drain()
        index = self._cas_index
        terms = index.files.get(file_hash)
        if terms is None:
            raise HubError(404, f"file {file_hash} is not in the CAS")
        size = sum(t[3] for t in terms)
        start, last = 0, size - 1
        if rng := re.fullmatch(r"bytes=(\d+)-(\d*)", h.headers.get("Range") or ""):
            start, last = int(rng[1]), min(last, int(rng[2])) if rng[2] else last
            if start >= size or last < start:
                raise HubError(416, f"range {rng[0]} outside a file of {size} bytes")
        out_terms, fetch, offset_first, pos = [], {}, 0, 0
        sig = secrets.token_urlsafe(12)  # the "presigned" data URLs: who asked, valid as long as a CAS token
        with self._lock:
            self.__dict__.setdefault("_cas_sigs", {})[sig] = (h.cas_user, time.time() + 3600)  # type: ignore[attr-defined]
        base = h.base_url + ("/cas" if h.record.path.startswith("/cas/") else _INTERNAL)
        for xorb, first, end, _ in terms:
            table = index.xorbs.get(xorb)
            if table is None:
                raise HubError(500, f"xorb {xorb} of file {file_hash} is in no shard")
            kept: list[int] = []
            for c in range(first, end):
                n = table[c][1]
                if pos + n > start and pos <= last:
                    if not out_terms and not kept:
                        offset_first = start - pos
                    kept.append(c)
                pos += n
            if not kept:
                continue
            lo, hi = kept[0], kept[-1] + 1
            offsets = self._chunk_offsets(xorb)
            byte_lo, byte_hi = offsets[lo], offsets[hi]
            unpacked = sum(table[c][1] for c in range(lo, hi))
            out_terms.append({"hash": xorb, "unpacked_length": unpacked, "range": {"start": lo, "end": hi}})
            info = {
                "range": {"start": lo, "end": hi},
                "url": f"{base}/xorbs/default/{xorb}?sig={sig}",
                "url_range": {"start": byte_lo, "end": byte_hi - 1},
            }
            fetch.setdefault(xorb, []).append(info)
        h.send_json(200, {"offset_into_first_range": offset_first, "terms": out_terms, "fetch_info": fetch})

    def _chunk_offsets(self, xorb: str) -> list[int]:
        """Where each stored chunk of ``xorb`` starts, and where the last ends (the shard's offsets count
        unpacked bytes): each chunk's 8-byte header gives its stored length; ``XETBLOB`` starts the footer."""
        cache: dict[str, list[int]] = self.__dict__.setdefault("_cas_offsets", {})
        if xorb not in cache:
            offsets, at = [0], 0
            with open(self._xorb_path(xorb), "rb") as f:
                while len(header := f.read(8)) == 8 and not header.startswith(b"XETBLOB"):
                    at += 8 + int.from_bytes(header[1:4], "little")
                    offsets.append(at)
                    f.seek(at)
            cache[xorb] = offsets
        return cache[xorb]

    def _cas_data(self, h: _Handler, xorb: str, query: dict[str, list[str]]) -> None:
        h.drain()
        with self._lock:
            user, expiry = self.__dict__.get("_cas_sigs", {}).get((query.get("sig") or [""])[0], (None, 0.0))
        if user is None or expiry <= time.time():
            raise HubError(403, "data URL signature unknown or expired")
        h.record.user = user
        path = self._xorb_path(xorb)
        if not path.exists():
            raise HubError(404, f"xorb {xorb} not found")
        size = path.stat().st_size
        rng = re.fullmatch(r"bytes=(\d+)-(\d*)", h.headers.get("Range") or "")
        if rng is None:
            h.start_response(200, {"Content-Type": "application/octet-stream"}, size)
            h.write_body(None, path, size)
            return
        lo = int(rng[1])
        hi = min(size - 1, int(rng[2])) if rng[2] else size - 1
        if lo > hi:
            raise HubError(416, f"range {rng[0]} outside a xorb of {size} bytes")
        headers = {"Content-Type": "application/octet-stream", "Content-Range": f"bytes {lo}-{hi}/{size}"}
        h.start_response(206, headers, hi - lo + 1)
        pacer = self.cas_pacer
        if pacer is None or h.fault is not None or h.muted:  # a fault shapes the body its own way
            h.write_body(None, path, hi - lo + 1, lo)
            return
        with open(path, "rb") as f:
            f.seek(lo)
            left = hi - lo + 1
            while left > 0 and (piece := f.read(min(Pacer.PIECE, left))):
                pacer.take(len(piece))
                h.record.bytes_out += len(piece)
                h.wfile.write(piece)
                left -= len(piece)
