"""Safe, streaming tar extraction: bytes in (as they arrive), a checked folder out.

The archive comes from someone else: every member is checked before anything is written. Refused:
absolute names, ``..``, members inside a symlink, symlinks whose target leaves the folder,
hardlinks to anything but a regular file already extracted, device files, FIFOs, sparse and
unknown member types. setuid/setgid/sticky bits and group/other write bits are dropped; owners are
never set. The extracted total is capped (disk space, gzip bombs). A failure removes the folder,
so a refused archive leaves nothing behind (a stop request leaves it to the next start).

Members are parsed from a forward-only stream (``tarfile`` only parses the headers), so the
archive is never held in memory or re-read, and extraction runs while the download is still
going; file contents are written by a few threads (``writers``) while the next headers are parsed.
Where the Python has it (3.11.4 and later: the image's does), ``tarfile.data_filter`` also judges each
member before it is written, resolving its name and a link's target on disk as they stand then.
"""

from __future__ import annotations

import os
import shutil
import stat
import tarfile
import zlib
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import (
    CorruptArchiveError,
    DiskSpaceError,
    StopRequested,
    UnsafeArchiveError,
)
from .writers import REPACK, WRITERS, Writers, create_file, disk_error, replacing

GZIP_MAGIC = b"\x1f\x8b"
_OUT_CHUNK = 1 << 20  # bound on one piece of gunzipped output (a gzip bomb never sits in memory)
_REGULAR_TYPES = frozenset({tarfile.REGTYPE, tarfile.AREGTYPE, tarfile.CONTTYPE})
_DATA_YAML_NAMES = frozenset({"data.yaml", "dataset.yaml"})
# Files up to this size are handed to writer threads; bigger ones are streamed to disk from here.
_SMALL_FILE = 8 << 20
# PAX and GNU long-name headers are read whole by ``tarfile``: the headers of one member may take
# this much, never more (paths are at most 4 KiB, an extended attribute at most 64 KiB on Linux).
MAX_HEADER_BYTES = 1 << 20
GB = 1e9
# tarfile's own filter for untrusted archives (None on a Python older than 3.11.4).
_DATA_FILTER = getattr(tarfile, "data_filter", None)
# A stop request (preemption, Ctrl-C, deadline, cost limit) must not spend its short grace period deleting a
# half-extracted folder: it is left as it is, and the next start removes it before extracting again.
STOP_REQUESTS = (KeyboardInterrupt, StopRequested)


@dataclass
class ExtractReport:
    files: int = 0
    directories: int = 0
    links: int = 0
    bytes: int = 0  # content bytes of the regular files
    data_yamls: list[str] = field(default_factory=list)  # data.yaml/dataset.yaml paths, relative to the root


class ChunkReader:
    """A forward-only file object over an iterator of byte chunks (what ``tarfile`` needs: read, seek, tell).

    Every byte taken from the stream, headers and padding included, counts against ``max_bytes``;
    ``read`` (what ``tarfile`` uses for headers) refuses to take more than ``MAX_HEADER_BYTES``
    since the last ``header_starts()``, before it holds them in memory."""

    def __init__(self, chunks: Iterable[bytes], max_bytes: int | None = None) -> None:
        self._chunks = iter(chunks)
        self._buf = memoryview(b"")
        self._at = 0  # read position inside _buf
        self._pos = 0  # absolute position of the stream
        self._taken = 0  # bytes taken from the stream so far
        self._max_bytes = max_bytes
        self._header_from = 0

    def _fill(self) -> bool:
        for chunk in self._chunks:
            if chunk:
                self._taken += len(chunk)
                if self._max_bytes is not None and self._taken > self._max_bytes:
                    raise _too_big(self._max_bytes)
                self._buf, self._at = memoryview(chunk), 0
                return True
        return False

    def header_starts(self) -> None:
        self._header_from = self._pos

    def pieces(self, size: int) -> Iterator[memoryview]:
        """The next ``size`` bytes as views on the chunks (no copy); fewer at the end of the stream."""
        while size > 0:
            if self._at >= len(self._buf) and not self._fill():
                return
            piece = self._buf[self._at : self._at + size]
            self._at += len(piece)
            self._pos += len(piece)
            size -= len(piece)
            yield piece

    def read(self, size: int = -1) -> bytes:
        if size is None or size < 0 or self._pos + size - self._header_from > MAX_HEADER_BYTES:
            raise UnsafeArchiveError(
                f"the tar has headers of more than {MAX_HEADER_BYTES >> 20} MiB for one member"
                f" (at byte {self._header_from}): refused",
                REPACK,
            )
        if self._at + size <= len(self._buf):  # the common case: a header inside the current chunk
            data = self._buf[self._at : self._at + size].tobytes()
            self._at += size
            self._pos += size
            return data
        return b"".join(bytes(piece) for piece in self.pieces(size))

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = os.SEEK_SET) -> int:
        target = offset if whence == os.SEEK_SET else self._pos + offset
        if whence not in (os.SEEK_SET, os.SEEK_CUR) or target < self._pos:
            raise OSError("a streamed archive can only be read forward")
        for _ in self.pieces(target - self._pos):
            pass
        return self._pos

    def seekable(self) -> bool:
        return False


def gunzip_if_needed(chunks: Iterable[bytes]) -> Iterator[bytes]:
    """Pass a tar through; decompress it on the fly when it starts like gzip."""
    source = iter(chunks)
    head = b""
    for chunk in source:
        head += chunk
        if len(head) >= len(GZIP_MAGIC):
            break
    if not head.startswith(GZIP_MAGIC):
        if head:
            yield head
        yield from source
        return
    yield from _gunzip(head, source)


def _gunzip(head: bytes, source: Iterator[bytes]) -> Iterator[bytes]:
    decompressor = zlib.decompressobj(wbits=31)
    pending = head
    try:
        while True:
            while pending:
                out = decompressor.decompress(pending, _OUT_CHUNK)
                if out:
                    yield out
                if decompressor.eof:
                    # Another gzip member may follow (concatenated files); zero padding may too.
                    pending = decompressor.unused_data
                    if not pending.strip(b"\0"):
                        pending = b""
                        break
                    decompressor = zlib.decompressobj(wbits=31)
                else:
                    pending = decompressor.unconsumed_tail
            chunk = next(source, None)
            if chunk is None:
                break
            if decompressor.eof and not chunk.strip(b"\0"):
                continue
            if decompressor.eof:
                decompressor = zlib.decompressobj(wbits=31)
            pending = chunk
    except zlib.error as error:
        raise CorruptArchiveError(f"the archive is not valid gzip: {error}", _REUPLOAD) from None
    if not decompressor.eof:
        raise CorruptArchiveError("the gzip stream ends early: the archive is truncated", _REUPLOAD)


def extract(
    chunks: Iterable[bytes],
    target: Path,
    *,
    max_bytes: int | None = None,
    on_member: Callable[[ExtractReport], None] | None = None,
) -> ExtractReport:
    """Extract the tar (or tar.gz) streamed by ``chunks`` into ``target``, which must not exist yet.

    ``max_bytes`` caps the extracted total. On a failure ``target`` is removed and the error
    raised: ``UnsafeArchiveError`` (naming the member), ``CorruptArchiveError``, ``DiskSpaceError``.
    """
    target.mkdir(parents=True)
    try:
        return _Extractor(target, max_bytes, on_member).run(ChunkReader(gunzip_if_needed(chunks), max_bytes))
    except BaseException as error:
        if not isinstance(error, STOP_REQUESTS):
            shutil.rmtree(target, ignore_errors=True)
        raise


def read_file(path: Path, chunk_size: int = _OUT_CHUNK) -> Iterator[bytes]:
    """A local file as chunks, for ``extract``."""
    with open(path, "rb") as handle:
        while chunk := handle.read(chunk_size):
            yield chunk


class _Extractor:
    def __init__(self, root: Path, max_bytes: int | None, on_member: Callable[[ExtractReport], None] | None) -> None:
        self.root = str(root)
        self.max_bytes = max_bytes
        self.on_member = on_member
        self.report = ExtractReport()
        self.symlinks: set[str] = set()  # relative paths of the symlinks made so far
        self.made_dirs: set[str] = {""}
        self.writers = Writers(WRITERS)

    def run(self, reader: ChunkReader) -> ExtractReport:
        try:
            archive = tarfile.TarFile(fileobj=reader, mode="r")  # type: ignore[arg-type]
        except tarfile.ReadError as error:
            raise CorruptArchiveError(f"the file is not a tar archive ({error})", "upload a .tar or .tar.gz") from None
        except RecursionError:
            raise _header_chain(0) from None
        # firstmember and members are private TarFile attributes, absent from typeshed
        member = archive.firstmember  # type: ignore[attr-defined]
        archive.firstmember = None  # type: ignore[attr-defined]
        archive.members = []  # type: ignore[attr-defined]  # headers are not kept: a million-file archive stays small in memory
        try:
            while member is not None:
                self._one(member, reader)
                if self.on_member is not None:
                    self.on_member(self.report)
                member = self._next(archive, reader)
            self.writers.flush()
        except BaseException:
            self.writers.cancel()  # what is still queued is dropped: the folder is going away
            raise
        finally:
            self.writers.close()  # every write has ended before the caller removes the folder
        self._check_symlink_targets()
        return self.report

    @staticmethod
    def _next(archive: tarfile.TarFile, reader: ChunkReader) -> tarfile.TarInfo | None:
        """The next header, telling a proper end of archive from a truncated or damaged one."""
        try:
            reader.seek(archive.offset)
            reader.header_starts()
            return archive.tarinfo.fromtarfile(archive)
        except tarfile.EOFHeaderError:  # type: ignore[attr-defined]  # in tarfile, not in typeshed
            return None  # the end-of-archive zero block
        except tarfile.EmptyHeaderError:  # type: ignore[attr-defined]
            raise CorruptArchiveError(
                "the tar ends without its end-of-archive marker: it is truncated", _REUPLOAD
            ) from None
        except (tarfile.HeaderError, tarfile.ReadError, OSError) as error:
            raise CorruptArchiveError(
                f"the tar is truncated or damaged at byte {archive.offset}: {error}", _REUPLOAD
            ) from None
        except RecursionError:  # a chain of extended headers, each announcing another
            raise _header_chain(archive.offset) from None

    # -- one member ------------------------------------------------------------------------
    def _one(self, member: tarfile.TarInfo, reader: ChunkReader) -> None:
        relative = self._safe_name(member)
        if relative is None:
            return  # the archive's own root ("." or "./")
        member = _filtered(member, self.root)
        if member.type in _REGULAR_TYPES and not member.issparse():
            self._file(member, relative, reader)
        elif member.type == tarfile.DIRTYPE:
            self._directory(relative, member.name)
        elif member.type == tarfile.SYMTYPE:
            self._symlink(member, relative)
        elif member.type == tarfile.LNKTYPE:
            self._hardlink(member, relative)
        else:
            raise UnsafeArchiveError(
                f"the tar holds {member.name!r}, a {_kind(member)}: refused", "repack the dataset with files only"
            )

    def _safe_name(self, member: tarfile.TarInfo) -> str | None:
        name = member.name
        if "\0" in name or "\0" in member.linkname:  # only a PAX header can carry one
            raise UnsafeArchiveError(f"the tar holds {name!r}, a name with a NUL byte: refused", REPACK)
        if name.startswith("/"):
            raise UnsafeArchiveError(f"the tar holds {name!r}, an absolute path: refused", REPACK)
        parts = [part for part in name.split("/") if part not in ("", ".")]
        if ".." in parts:
            raise UnsafeArchiveError(f"the tar holds {name!r}, which climbs out with '..': refused", REPACK)
        if not parts:
            return None
        relative = "/".join(parts)
        if self.symlinks:
            for depth in range(1, len(parts)):
                if "/".join(parts[:depth]) in self.symlinks:
                    raise UnsafeArchiveError(f"the tar puts {name!r} inside a symlink: refused", REPACK)
        return relative

    def _path(self, relative: str) -> str:
        return os.path.join(self.root, relative)

    def _parent(self, relative: str) -> None:
        parent = relative.rpartition("/")[0]
        if parent not in self.made_dirs:
            try:
                os.makedirs(self._path(parent), mode=0o755, exist_ok=True)
            except (FileExistsError, NotADirectoryError):
                raise UnsafeArchiveError(
                    f"the tar holds {parent!r} both as a file and as a folder: refused", REPACK
                ) from None
            except OSError as error:
                raise disk_error(error, parent) from None
            while parent and parent not in self.made_dirs:
                self.made_dirs.add(parent)
                parent = parent.rpartition("/")[0]

    def _file(self, member: tarfile.TarInfo, relative: str, reader: ChunkReader) -> None:
        self.report.bytes += member.size
        if self.max_bytes is not None and self.report.bytes > self.max_bytes:
            raise _too_big(self.max_bytes)
        self._parent(relative)
        path = self._path(relative)
        # Owner read/write always; exec bits kept; setuid/setgid/sticky and group/other write dropped.
        mode = (member.mode & 0o755) | 0o600
        if relative in self.symlinks:  # a file replacing a symlink of the same name from earlier in the tar
            self.writers.flush()
            os.unlink(path)
            self.symlinks.discard(relative)
        reader.seek(member.offset_data)
        if member.size <= _SMALL_FILE:
            data = b"".join(reader.pieces(member.size))
            if len(data) < member.size:
                raise CorruptArchiveError(f"the tar ends inside {member.name!r}: it is truncated", _REUPLOAD)
            self.writers.submit(path, relative, mode, data)
        else:
            self.writers.flush()  # same-name members are written in tar order
            try:
                fd = create_file(path, relative, mode)
            except OSError as error:
                raise disk_error(error, relative) from None
            try:
                left = member.size
                for piece in reader.pieces(member.size):
                    while piece:
                        written = os.write(fd, piece)
                        piece = piece[written:]
                        left -= written
            except OSError as error:
                raise disk_error(error, relative) from None
            finally:
                os.close(fd)
            if left:
                raise CorruptArchiveError(f"the tar ends inside {member.name!r}: it is truncated", _REUPLOAD)
        self.report.files += 1
        # The same member twice in a tar is one file (the later copy replaced the earlier).
        if relative.rpartition("/")[2] in _DATA_YAML_NAMES and relative not in self.report.data_yamls:
            self.report.data_yamls.append(relative)

    def _create(self, path: str, relative: str, make: Callable[[], int]) -> int:
        """Run ``make``; a file or link of the same name from earlier in the tar is replaced, as tar does."""
        try:
            created = replacing(path, relative, make)
        except OSError as error:
            raise disk_error(error, relative) from None
        self.symlinks.discard(relative)  # whatever stood here is gone; a new symlink is added by its caller
        return created

    def _directory(self, relative: str, name: str) -> None:
        path = self._path(relative)
        if relative not in self.made_dirs:
            self._parent(relative)
            try:
                os.mkdir(path, 0o755)
            except FileExistsError:
                if not stat.S_ISDIR(os.lstat(path).st_mode):
                    raise UnsafeArchiveError(
                        f"the tar holds {name!r} both as a file and as a folder: refused", REPACK
                    ) from None
            except OSError as error:
                raise disk_error(error, relative) from None
            self.made_dirs.add(relative)
        self.report.directories += 1

    def _symlink(self, member: tarfile.TarInfo, relative: str) -> None:
        target = member.linkname
        parent = relative.rpartition("/")[0]
        resolved = os.path.normpath(os.path.join(parent, target)) if target else ""
        if not target or target.startswith("/") or resolved == ".." or resolved.startswith("../"):
            raise UnsafeArchiveError(
                f"the tar holds {member.name!r}, a symlink to {target!r} outside the dataset: refused", REPACK
            )
        self.writers.flush()  # a pending file of the same name must not land after the link
        self._parent(relative)
        path = self._path(relative)

        def make() -> int:
            os.symlink(target, path)
            return 0

        self._create(path, relative, make)
        self.symlinks.add(relative)
        self.report.links += 1

    def _hardlink(self, member: tarfile.TarInfo, relative: str) -> None:
        source = member.linkname
        parts = [part for part in source.split("/") if part not in ("", ".")]
        source_relative = "/".join(parts)
        # Only to a regular file this archive already wrote: inside the folder, not through a symlink.
        refused = (
            source.startswith("/")
            or ".." in parts
            or source_relative in ("", relative)
            or any("/".join(parts[:depth]) in self.symlinks for depth in range(1, len(parts) + 1))
        )
        if not refused:
            self.writers.flush()  # the source may still be on its way to disk
            try:
                refused = not stat.S_ISREG(os.lstat(self._path(source_relative)).st_mode)
            except OSError:
                refused = True
        if refused:
            raise UnsafeArchiveError(
                f"the tar holds {member.name!r}, a hardlink to {source!r}, which is not a file of the dataset: refused",
                REPACK,
            )
        self._parent(relative)
        path = self._path(relative)
        source_path = self._path(source_relative)

        def make() -> int:
            os.link(source_path, path, follow_symlinks=False)
            return 0

        self._create(path, relative, make)
        self.report.links += 1

    def _check_symlink_targets(self) -> None:
        """Symlinks can point through each other (``a -> .``, ``b -> a/..``): resolve them all on disk."""
        root = os.path.realpath(self.root)
        for relative in sorted(self.symlinks):
            resolved = os.path.realpath(self._path(relative))
            if resolved != root and not resolved.startswith(root + os.sep):
                raise UnsafeArchiveError(
                    f"the tar holds {relative!r}, a symlink that resolves outside the dataset: refused", REPACK
                )


_REUPLOAD = "upload the tar again"


def _too_big(max_bytes: int) -> DiskSpaceError:
    return DiskSpaceError(
        f"the dataset unpacks to more than the {max_bytes / GB:.1f} GB of disk left for it",
        "use a bigger disk (see `trainbox plan`)",
    )


def _header_chain(offset: int) -> UnsafeArchiveError:
    return UnsafeArchiveError(f"the tar chains extended headers without end (at byte {offset}): refused", REPACK)


def _filtered(member: tarfile.TarInfo, root: str) -> tarfile.TarInfo:
    """``member`` as tarfile's ``data`` filter passes it (ownership dropped, mode bits limited), beside the
    checks above; a member it refuses is an ``UnsafeArchiveError`` like theirs."""
    if _DATA_FILTER is None:
        return member
    try:
        filtered: tarfile.TarInfo = _DATA_FILTER(member, root)
    except tarfile.FilterError as error:
        if isinstance(error, tarfile.SpecialFileError):
            what = f"a {_kind(member)}"
        elif isinstance(error, (tarfile.AbsoluteLinkError, tarfile.LinkOutsideDestinationError)):
            kind = "symlink" if member.issym() else "hardlink"
            what = f"a {kind} to {member.linkname!r}, which resolves outside the dataset"
        else:  # AbsolutePathError, OutsideDestinationError: the name itself leaves the folder
            what = "a name that resolves outside the dataset"
        raise UnsafeArchiveError(
            f"the tar holds {member.name!r}, {what} (tarfile's data filter): refused", REPACK
        ) from None
    return filtered


def _kind(member: tarfile.TarInfo) -> str:
    if member.ischr():
        return "character device"
    if member.isblk():
        return "block device"
    if member.isfifo():
        return "FIFO"
    if member.issparse():
        return "sparse file"
    return f"member of unsupported type {member.type!r}"
