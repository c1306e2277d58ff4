"""Safe zip extraction: the same rules as the tar's (``extract``), for the archives people download as .zip.

A zip's directory sits at its end, so it is read from a file on disk (the download is kept whole first).
Every member is checked before anything is written: absolute names, drive letters, ``..`` and names
that land outside the folder are refused; symlinks (Unix mode bits in the member's external
attributes) and encrypted members are refused; the extracted total is capped against the sizes the
members announce and against the bytes actually written (a zip bomb that lies about its size stops
at the cap). Files are created never through a symlink (``writers.create_file``); a failure removes
the folder.
"""

from __future__ import annotations

import os
import shutil
import stat
import zipfile
from pathlib import Path

from ..errors import CorruptArchiveError, UnsafeArchiveError
from .extract import _DATA_YAML_NAMES, STOP_REQUESTS, ExtractReport, _too_big
from .writers import create_file, disk_error

REPACK_ZIP = "repack the dataset with relative paths inside one folder (cd DIR && zip -r ../data.zip .)"
_PIECE = 1 << 20


def is_zip(name: str) -> bool:
    return name.lower().endswith(".zip")


def extract_zip(path: Path, target: Path, *, max_bytes: int | None = None) -> ExtractReport:
    """Extract the zip at ``path`` into ``target`` (which must not exist yet); see the module's rules."""
    target.mkdir(parents=True)
    try:
        return _extract(path, target, max_bytes)
    except BaseException as error:
        if not isinstance(error, STOP_REQUESTS):
            shutil.rmtree(target, ignore_errors=True)
        raise


def _extract(path: Path, target: Path, max_bytes: int | None) -> ExtractReport:
    try:
        archive = zipfile.ZipFile(path)
    except (zipfile.BadZipFile, OSError) as error:
        raise CorruptArchiveError(f"the file is not a zip archive ({error})", "upload the .zip again") from None
    report = ExtractReport()
    with archive:
        members = archive.infolist()
        announced = sum(member.file_size for member in members)
        if max_bytes is not None and announced > max_bytes:
            raise _too_big(max_bytes)
        made: set[str] = {""}
        for member in members:
            relative = _safe_name(member)
            if relative is None:
                continue
            if member.is_dir():
                _makedirs(target, relative, made)
                report.directories += 1
                continue
            _makedirs(target, relative.rpartition("/")[0], made)
            report.bytes += _write(archive, member, target, relative, report.bytes, max_bytes)
            report.files += 1
            if relative.rpartition("/")[2] in _DATA_YAML_NAMES and relative not in report.data_yamls:
                report.data_yamls.append(relative)
    return report


def _safe_name(member: zipfile.ZipInfo) -> str | None:
    name = member.filename
    mode = member.external_attr >> 16
    if "\0" in name:
        raise UnsafeArchiveError(f"the zip holds {name!r}, a name with a NUL byte: refused", REPACK_ZIP)
    if name.startswith(("/", "\\")) or (len(name) > 1 and name[1] == ":"):
        raise UnsafeArchiveError(f"the zip holds {name!r}, an absolute path: refused", REPACK_ZIP)
    parts = [part for part in name.replace("\\", "/").split("/") if part not in ("", ".")]
    if ".." in parts:
        raise UnsafeArchiveError(f"the zip holds {name!r}, which climbs out with '..': refused", REPACK_ZIP)
    if stat.S_ISLNK(mode):
        raise UnsafeArchiveError(f"the zip holds {name!r}, a symlink: refused", "repack the dataset with files only")
    if member.flag_bits & 0x1:
        raise UnsafeArchiveError(f"the zip holds {name!r}, an encrypted member: refused", "zip it without a password")
    return "/".join(parts) or None


def _makedirs(target: Path, relative: str, made: set[str]) -> None:
    if relative in made:
        return
    try:
        os.makedirs(target / relative, mode=0o755, exist_ok=True)
    except (FileExistsError, NotADirectoryError):
        raise UnsafeArchiveError(
            f"the zip holds {relative!r} both as a file and as a folder: refused", REPACK_ZIP
        ) from None
    except OSError as error:
        raise disk_error(error, relative) from None
    made.add(relative)


def _write(
    archive: zipfile.ZipFile, member: zipfile.ZipInfo, target: Path, relative: str, done: int, max_bytes: int | None
) -> int:
    """One member to disk; its bytes. zipfile checks the CRC at the end of each member."""
    mode = ((member.external_attr >> 16) & 0o755) | 0o600
    try:
        fd = create_file(str(target / relative), relative, mode)
    except OSError as error:
        raise disk_error(error, relative) from None
    written = 0
    try:
        with archive.open(member) as source:
            while piece := source.read(_PIECE):
                written += len(piece)
                if max_bytes is not None and done + written > max_bytes:
                    raise _too_big(max_bytes)
                view = memoryview(piece)
                while view:
                    view = view[os.write(fd, view) :]
    except (zipfile.BadZipFile, EOFError, NotImplementedError, RuntimeError) as error:
        raise CorruptArchiveError(f"the zip's {member.filename!r} cannot be read: {error}", "upload it again") from None
    except OSError as error:
        raise disk_error(error, relative) from None
    finally:
        os.close(fd)
    return written
