"""The safe extractor against hostile, broken and ordinary archives (built in memory, extracted for real)."""

from __future__ import annotations

import gzip
import io
import os
import stat
import tarfile
import tracemalloc
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from entrypoint.dataset import extract
from entrypoint.errors import (
    CorruptArchiveError,
    CostLimitError,
    DeadlineError,
    DiskSpaceError,
    PreemptedError,
    StopRequested,
    UnsafeArchiveError,
    UserInterruptError,
)

Member = tuple[tarfile.TarInfo, bytes | None]


def info(name: str, kind: bytes = tarfile.REGTYPE, *, data: bytes = b"", link: str = "", mode: int = 0o644) -> Member:
    member = tarfile.TarInfo(name)
    member.type, member.linkname, member.mode = kind, link, mode
    if kind in (tarfile.CHRTYPE, tarfile.BLKTYPE):
        member.devmajor, member.devminor = 1, 3
    if kind == tarfile.REGTYPE:
        member.size = len(data)
        return member, data
    return member, None


def tar_bytes(*members: Member, fmt: int = tarfile.PAX_FORMAT) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=fmt) as archive:
        for member, data in members:
            archive.addfile(member, io.BytesIO(data) if data is not None else None)
    return buffer.getvalue()


def pieces(data: bytes, size: int) -> Iterator[bytes]:
    """The bytes in chunks of ``size``, as a download delivers them."""
    return (data[start : start + size] for start in range(0, len(data), size))


def tree(root: Path) -> dict[str, str]:
    """Every path under ``root`` with its kind and content: a snapshot to compare."""
    found = {}
    for folder, dirs, files in os.walk(root):
        for name in dirs + files:
            path = Path(folder, name)
            mode = path.lstat().st_mode
            if stat.S_ISLNK(mode):
                found[str(path.relative_to(root))] = f"-> {os.readlink(path)}"
            elif stat.S_ISREG(mode):
                found[str(path.relative_to(root))] = path.read_bytes().hex()
            else:
                found[str(path.relative_to(root))] = "dir"
    return found


@pytest.fixture
def place(tmp_path: Path) -> Path:
    """A workspace with a sentinel file outside the dataset folder, which must never change."""
    (tmp_path / "outside").mkdir()
    (tmp_path / "outside" / "secret.txt").write_text("keep me\n")
    return tmp_path


def refused(place: Path, data: bytes, expect: type[Exception], *, chunk: int = 4096, **kwargs: int) -> str:
    """Extract ``data`` into place/dataset; it must fail with ``expect``, leaving ``place`` exactly as it was."""
    before = tree(place)
    with pytest.raises(expect) as caught:
        extract.extract(pieces(data, chunk), place / "dataset", **kwargs)
    assert tree(place) == before  # nothing written outside, and the dataset folder itself is gone
    assert not (place / "dataset").exists()
    return str(caught.value)


# -- the malicious-archive catalogue -----------------------------------------------------------
@pytest.mark.parametrize("name", ["../outside/evil.txt", "a/../../outside/evil.txt", "./../evil.txt", "a/b/../../.."])
def test_traversal_is_refused(place: Path, name: str) -> None:
    data = tar_bytes(info("ok.txt", data=b"fine"), info(name, data=b"pwned"))
    message = refused(place, data, UnsafeArchiveError)
    assert name in message and "'..'" in message


def test_absolute_path_is_refused(place: Path) -> None:
    target = str(place / "outside" / "evil.txt")
    message = refused(place, tar_bytes(info(target, data=b"pwned")), UnsafeArchiveError)
    assert target in message and "absolute" in message


@pytest.mark.parametrize("link", ["../../outside", "/etc", "../b/../../../outside/secret.txt", "../..", ""])
def test_symlink_escape_is_refused(place: Path, link: str) -> None:
    data = tar_bytes(info("a", tarfile.DIRTYPE, mode=0o755), info("a/link", tarfile.SYMTYPE, link=link))
    message = refused(place, data, UnsafeArchiveError)
    assert "a/link" in message and "symlink" in message


def test_writing_through_a_symlink_is_refused(place: Path) -> None:
    # The link itself points inside, but a member placed "in" it is a classic escape vector.
    data = tar_bytes(
        info("sub", tarfile.DIRTYPE, mode=0o755),
        info("door", tarfile.SYMTYPE, link="sub"),
        info("door/file.txt", data=b"through the door"),
    )
    message = refused(place, data, UnsafeArchiveError)
    assert "door/file.txt" in message and "inside a symlink" in message


def test_symlink_chain_that_resolves_outside_is_refused(place: Path) -> None:
    # Each link looks harmless on its own ("a" is ".", "a/.." is lexically "."), together they escape.
    data = tar_bytes(info("a", tarfile.SYMTYPE, link="."), info("b", tarfile.SYMTYPE, link="a/.."))
    message = refused(place, data, UnsafeArchiveError)
    assert "'b'" in message and "resolves outside" in message


@pytest.mark.parametrize("source", ["../outside/secret.txt", str(Path("/etc/hostname")), "missing.txt", "lnk"])
def test_hardlink_escape_is_refused(place: Path, source: str) -> None:
    data = tar_bytes(
        info("file.txt", data=b"inside"),
        info("lnk", tarfile.SYMTYPE, link="file.txt"),
        info("hard", tarfile.LNKTYPE, link=source),
    )
    message = refused(place, data, UnsafeArchiveError)
    assert "'hard'" in message and "hardlink" in message


def test_hardlink_to_the_sentinel_by_absolute_path_is_refused(place: Path) -> None:
    secret = str(place / "outside" / "secret.txt")
    message = refused(place, tar_bytes(info("hard", tarfile.LNKTYPE, link=secret)), UnsafeArchiveError)
    assert secret in message
    assert os.stat(secret).st_nlink == 1


@pytest.mark.parametrize(
    ("kind", "word"),
    [(tarfile.CHRTYPE, "character device"), (tarfile.BLKTYPE, "block device"), (tarfile.FIFOTYPE, "FIFO")],
)
def test_device_files_and_fifos_are_refused(place: Path, kind: bytes, word: str) -> None:
    data = tar_bytes(info("images/a.png", data=b"png"), info("dev/thing", kind))
    message = refused(place, data, UnsafeArchiveError)
    assert "dev/thing" in message and word in message


def test_setuid_setgid_sticky_and_shared_write_bits_are_dropped(tmp_path: Path) -> None:
    data = tar_bytes(
        info("bin/tool", data=b"#!/bin/sh\n", mode=0o4755),
        info("bin/group", data=b"x", mode=0o2777),
        info("plain.txt", data=b"x", mode=0o400),
        info("shared", tarfile.DIRTYPE, mode=0o1777),
    )
    extract.extract([data], tmp_path / "dataset")
    tool = (tmp_path / "dataset" / "bin" / "tool").stat().st_mode
    assert not tool & (stat.S_ISUID | stat.S_ISGID | stat.S_ISVTX)
    assert tool & stat.S_IXUSR  # executables stay executable
    group = (tmp_path / "dataset" / "bin" / "group").stat().st_mode
    assert not group & (stat.S_ISGID | stat.S_IWGRP | stat.S_IWOTH)
    assert (tmp_path / "dataset" / "plain.txt").stat().st_mode & stat.S_IWUSR  # we can always clean up
    shared = (tmp_path / "dataset" / "shared").stat().st_mode
    assert not shared & (stat.S_ISVTX | stat.S_IWOTH)


def test_a_refused_member_late_in_the_archive_removes_everything_extracted_before(place: Path) -> None:
    good = [info(f"images/{index:03d}.png", data=os.urandom(3000)) for index in range(50)]
    data = tar_bytes(*good, info("../late.txt", data=b"x"))
    refused(place, data, UnsafeArchiveError, chunk=1000)
    assert not (place / "late.txt").exists()


@pytest.mark.parametrize(
    "second",
    [info("x", tarfile.DIRTYPE, mode=0o755), info("x/inside.txt", data=b"under a file")],
    ids=["folder", "file-under-it"],
)
def test_a_file_and_a_folder_of_the_same_name_are_refused(place: Path, second: Member) -> None:
    data = tar_bytes(info("x", data=b"file"), second)
    assert "both" in refused(place, data, UnsafeArchiveError)


# -- broken archives -----------------------------------------------------------------------------
def sample() -> bytes:
    return tar_bytes(*(info(f"labels/{index}.txt", data=os.urandom(2000)) for index in range(5)))


@pytest.mark.parametrize(
    "cut",
    [
        pytest.param(lambda data: data[:700], id="inside-a-file"),
        pytest.param(lambda data: data[: 512 * 5], id="at-a-header-without-end-marker"),
        pytest.param(lambda data: data[:100], id="inside-the-first-header"),
    ],
)
def test_truncated_tar_is_refused(place: Path, cut: Callable[[bytes], bytes]) -> None:
    message = refused(place, cut(sample()), CorruptArchiveError)
    assert "truncated" in message or "not a tar" in message


def test_damaged_header_in_the_middle_is_refused(place: Path) -> None:
    data = bytearray(sample())
    data[2560 : 2560 + 512] = b"\x13" * 512  # the third member's header: garbage, bad checksum
    assert "damaged" in refused(place, bytes(data), CorruptArchiveError)


def test_not_a_tar_is_refused(place: Path) -> None:
    assert "not a tar" in refused(place, os.urandom(4096), CorruptArchiveError)


def test_truncated_and_corrupt_gzip_are_refused(place: Path) -> None:
    packed = gzip.compress(sample())
    assert "truncated" in refused(place, packed[: len(packed) // 2], CorruptArchiveError)
    damaged = bytearray(packed)
    damaged[30:60] = bytes(30)
    refused(place, bytes(damaged), CorruptArchiveError)


def test_the_extracted_total_is_capped(place: Path) -> None:
    data = tar_bytes(*(info(f"f{index}", data=bytes(1000)) for index in range(10)))
    assert "GB" in refused(place, data, DiskSpaceError, max_bytes=5500)


MIB = 1 << 20


def peak_memory(run: Callable[[], object]) -> int:
    """The most Python memory (bytes objects included) that ``run`` held at once."""
    tracemalloc.start()
    try:
        run()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_a_gzip_bomb_stops_at_the_cap_without_filling_memory(place: Path) -> None:
    bomb = gzip.compress(tar_bytes(info("zeros", data=bytes(64 * MIB))), compresslevel=9)
    assert len(bomb) < 200_000
    peak = peak_memory(lambda: refused(place, bomb, DiskSpaceError, max_bytes=MIB))
    assert peak < 16 * MIB


def pax_bomb(size: int) -> bytes:
    """A .tgz of a few hundred KB whose one PAX header holds ``size`` bytes."""
    member = tarfile.TarInfo("a.txt")
    member.pax_headers = {"comment": "x" * size}
    return gzip.compress(tar_bytes((member, b"")), compresslevel=9)


def gnu_long_name_bomb(size: int) -> bytes:
    header = tarfile.TarInfo("././@LongLink")
    header.type, header.size = tarfile.GNUTYPE_LONGNAME, size
    raw = header.tobuf(tarfile.GNU_FORMAT) + bytes(size) + tar_bytes(info("a.txt"), fmt=tarfile.GNU_FORMAT)
    return gzip.compress(raw, compresslevel=9)


@pytest.mark.parametrize("build", [pax_bomb, gnu_long_name_bomb], ids=["pax", "gnu-long-name"])
def test_a_header_bomb_is_refused_before_it_sits_in_memory(place: Path, build: Callable[[int], bytes]) -> None:
    bomb = build(96 * MIB)
    assert len(bomb) < 400_000
    # No cap at all: the header limit alone keeps the memory small.
    peak = peak_memory(lambda: refused(place, bomb, UnsafeArchiveError))
    assert peak < 16 * MIB


def test_headers_and_padding_count_against_the_cap(place: Path) -> None:
    # 100 empty files: no content at all, but 100 headers of 512 bytes read from the archive.
    data = tar_bytes(*(info(f"f{index}") for index in range(100)), fmt=tarfile.USTAR_FORMAT)
    refused(place, data, DiskSpaceError, max_bytes=20_000)


def test_a_chain_of_extended_headers_is_refused(place: Path) -> None:
    member = tarfile.TarInfo("a.txt")
    member.pax_headers = {"comment": "c"}
    one = tar_bytes((member, b""))
    extended = one[:1024]  # the 'x' header and its records, announcing the next header
    assert extended[156:157] == tarfile.XHDTYPE
    refused(place, extended * 2000 + one, UnsafeArchiveError)


@pytest.mark.parametrize("field", ["path", "linkpath"])
def test_a_nul_in_a_pax_name_is_a_refused_member(place: Path, field: str) -> None:
    member = tarfile.TarInfo("a.txt")
    if field == "linkpath":
        member.type = tarfile.SYMTYPE
    member.pax_headers = {field: "a\x00b.txt"}
    with pytest.raises(UnsafeArchiveError, match="NUL") as caught:
        extract.extract([tar_bytes((member, None if field == "linkpath" else b""))], place / "dataset")
    assert caught.value.exit_code == 37
    assert not (place / "dataset").exists()


def test_the_same_data_yaml_twice_is_one_data_yaml(tmp_path: Path) -> None:
    data = tar_bytes(info("ds/data.yaml", data=b"old: 1\n"), info("ds/data.yaml", data=b"names: [a]\n"))
    report = extract.extract([data], tmp_path / "dataset")
    assert report.data_yamls == ["ds/data.yaml"]
    assert (tmp_path / "dataset" / "ds" / "data.yaml").read_bytes() == b"names: [a]\n"


# -- ordinary archives ---------------------------------------------------------------------------
def dataset_members() -> list[Member]:
    long_name = "images/train/" + "very_long_folder_name_" * 6 + "/img.png"
    return [
        info("./", tarfile.DIRTYPE, mode=0o755),
        info("./data.yaml", data=b"train: images/train\nval: images/val\nnames: [a]\n"),
        info("./images/train/0.png", data=os.urandom(70_000)),
        info(long_name, data=b"long names come through pax or GNU headers"),
        info("./images/val/0.png", data=os.urandom(1)),
        info("./images/val/empty.png"),
        info("./labels/train/0.txt", data=b"0 0.5 0.5 0.1 0.1\n"),
        info("./labels/same.txt", tarfile.LNKTYPE, link="./labels/train/0.txt"),
        info("./labels/alias", tarfile.SYMTYPE, link="train/0.txt"),
        info("./nested/dataset.yaml", data=b"x: 1\n"),
        info("./images/val/0.png", data=b"a later copy replaces the earlier one"),
    ]


@pytest.mark.parametrize("fmt", [tarfile.PAX_FORMAT, tarfile.GNU_FORMAT])
@pytest.mark.parametrize("chunk", [1, 511, 512, 513, 65536, 10**9])
def test_ordinary_archive_extracts_whatever_the_chunking(tmp_path: Path, fmt: int, chunk: int) -> None:
    members = dataset_members()
    data = tar_bytes(*members, fmt=fmt)
    if chunk == 1 and fmt == tarfile.GNU_FORMAT:
        data = data[: 200 * 1024]  # one-byte pieces are slow; the prefix still ends with the end marker
    report = extract.extract(pieces(data, chunk), tmp_path / "dataset")

    root = tmp_path / "dataset"
    with tarfile.open(fileobj=io.BytesIO(data)) as reference:
        for member in reference.getmembers():
            name = os.path.normpath(member.name)
            if member.isreg():
                wanted = reference.extractfile(member)
                assert wanted is not None
                content = wanted.read()
                if name == "images/val/0.png":
                    content = b"a later copy replaces the earlier one"
                assert (root / name).read_bytes() == content, name
    assert os.readlink(root / "labels" / "alias") == "train/0.txt"
    assert (root / "labels" / "same.txt").stat().st_ino == (root / "labels" / "train" / "0.txt").stat().st_ino
    assert report.files == 8 and report.links == 2
    assert sorted(report.data_yamls) == ["data.yaml", "nested/dataset.yaml"]


def test_gzip_and_concatenated_gzip_members(tmp_path: Path) -> None:
    data = tar_bytes(*dataset_members())
    half = len(data) // 2
    packed = gzip.compress(data[:half]) + gzip.compress(data[half:]) + bytes(512)  # multi-member, zero padding
    report = extract.extract(pieces(packed, 333), tmp_path / "dataset")
    assert report.files == 8
    assert (tmp_path / "dataset" / "labels" / "train" / "0.txt").read_bytes() == b"0 0.5 0.5 0.1 0.1\n"


def test_the_target_must_not_exist(tmp_path: Path) -> None:
    (tmp_path / "dataset").mkdir()
    with pytest.raises(FileExistsError):
        extract.extract([tar_bytes(info("a", data=b"x"))], tmp_path / "dataset")


def test_a_local_file_is_read_in_chunks(tmp_path: Path) -> None:
    path = tmp_path / "data.tar"
    path.write_bytes(tar_bytes(info("a.txt", data=b"hello")))
    extract.extract(extract.read_file(path, chunk_size=100), tmp_path / "dataset")
    assert (tmp_path / "dataset" / "a.txt").read_text() == "hello"


def test_reader_only_moves_forward() -> None:
    reader = extract.ChunkReader([b"abc", b"", b"defg"])
    assert reader.read(2) == b"ab" and reader.tell() == 2
    assert reader.read(3) == b"cde"
    reader.seek(6)
    assert reader.read(1) == b"g" and reader.read(5) == b""
    with pytest.raises(OSError, match="forward"):
        reader.seek(1)
    with pytest.raises(UnsafeArchiveError, match="headers of more than"):
        reader.read()  # tarfile never needs an unbounded read: refused before anything is held


def interrupted(data: bytes, error: BaseException) -> Iterator[bytes]:
    """The archive's first half, then ``error``: a download cut short."""
    yield data[: len(data) // 2]
    raise error


@pytest.mark.parametrize(
    "stop",
    [PreemptedError("SIGTERM"), UserInterruptError("Ctrl-C"), DeadlineError("MAX_RUNTIME"), CostLimitError("MAX_COST")],
    ids=lambda error: type(error).__name__,
)
def test_a_stop_request_leaves_the_half_extracted_folder_for_the_next_start(
    tmp_path: Path, stop: StopRequested
) -> None:
    # Preemption gives seconds: they go to uploads and the release, not to deleting files.
    data = tar_bytes(*(info(f"images/{index}.png", data=os.urandom(5000)) for index in range(20)))
    with pytest.raises(type(stop)):
        extract.extract(interrupted(data, stop), tmp_path / "dataset")
    assert (tmp_path / "dataset" / "images").is_dir()


def test_a_failed_download_removes_the_half_extracted_folder(tmp_path: Path) -> None:
    data = tar_bytes(*(info(f"images/{index}.png", data=os.urandom(5000)) for index in range(20)))
    with pytest.raises(ConnectionError):
        extract.extract(interrupted(data, ConnectionError("reset")), tmp_path / "dataset")
    assert not (tmp_path / "dataset").exists()


# -- tarfile's data filter, beside the extractor's own checks ----------------------------------------
def escape_through_a_link_then_a_file() -> bytes:
    # "a" -> "." is harmless, and "a/.." is lexically "." too; on disk it is the folder's parent.
    return tar_bytes(
        info("a", tarfile.SYMTYPE, link="."),
        info("b", tarfile.SYMTYPE, link="a/.."),
        info("late.txt", data=b"written only if the link above was let through"),
    )


def test_the_data_filter_refuses_a_link_the_moment_it_resolves_outside(place: Path) -> None:
    assert hasattr(tarfile, "data_filter"), "the image's Python (3.11.4+) has tarfile.data_filter"
    seen: list[int] = []
    before = tree(place)
    with pytest.raises(UnsafeArchiveError) as caught:
        extract.extract(
            [escape_through_a_link_then_a_file()], place / "dataset", on_member=lambda report: seen.append(report.files)
        )
    message = str(caught.value)
    assert "'b'" in message and "resolves outside" in message and "data filter" in message
    # refused at the member, before a byte of what follows it was written (not at the end of the archive)
    assert seen == [0] and tree(place) == before


def test_without_the_data_filter_the_own_checks_still_refuse_it(place: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(extract, "_DATA_FILTER", None)  # a Python older than 3.11.4
    message = refused(place, escape_through_a_link_then_a_file(), UnsafeArchiveError)
    assert "'b'" in message and "resolves outside" in message and "data filter" not in message


def test_the_data_filter_sees_every_member_and_keeps_the_contents(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    judged: list[str] = []

    def recording(member: tarfile.TarInfo, root: str) -> tarfile.TarInfo:
        judged.append(member.name)
        return tarfile.data_filter(member, root)

    monkeypatch.setattr(extract, "_DATA_FILTER", recording)
    members = dataset_members()
    extract.extract(pieces(tar_bytes(*members), 777), tmp_path / "dataset")
    assert judged == [member.name for member, _ in members if member.name.strip("./")]
    written = {member.name: data for member, data in members if data is not None}  # the last copy of a name wins
    for name, data in written.items():
        assert (tmp_path / "dataset" / name).read_bytes() == data
