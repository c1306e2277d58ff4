"""The staging copy of a checkpoint feeds its upload as it goes (entrypoint/xet/ahead.py): the upload is told
only of bytes already in the staged copy and cleared by the secret scan, never one byte of a secret, and
is told the copy's size and sha256 when it is whole."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Any

import pytest

from entrypoint import log
from entrypoint.sync import staging
from entrypoint.xet import ahead as xetahead

SECRET = "hf_staging_feed_secret_5f0c2b7e91d4a6"
CHUNK = 64 * 1024


class Recorder:
    """What the staging copy tells the upload, with the staged copy's size at each word."""

    def __init__(self, target: Path, size: int) -> None:
        self.target, self.size = target, size
        self.calls: list[tuple[str, Any, int]] = []

    def _on_disk(self) -> int:
        return self.target.stat().st_size

    def cleared(self, upto: int) -> None:
        self.calls.append(("cleared", upto, self._on_disk()))

    def done(self, size: int, sha256: str) -> None:
        self.calls.append(("done", (size, sha256), self._on_disk()))

    def drop(self) -> None:
        self.calls.append(("drop", None, self._on_disk()))


@pytest.fixture
def feeds(monkeypatch: pytest.MonkeyPatch) -> list[Recorder]:
    made: list[Recorder] = []

    def feed(target: Path, size: int) -> Recorder:
        made.append(Recorder(target, size))
        return made[-1]

    monkeypatch.setattr(xetahead, "feed", feed)
    monkeypatch.setattr(staging, "_COPY_CHUNK", CHUNK)
    return made


def _cleared(recorder: Recorder) -> list[int]:
    return [value for word, value, _ in recorder.calls if word == "cleared"]


@pytest.mark.parametrize("offset", [0, 3 * CHUNK - 10, 3 * CHUNK, 5 * CHUNK + 100])
def test_the_upload_never_reads_a_byte_of_a_secret(tmp_path: Path, feeds: list[Recorder], offset: int) -> None:
    log.register_secret(SECRET)
    data = bytearray(os.urandom(8 * CHUNK))
    data[offset : offset + len(SECRET)] = SECRET.encode()  # at the start, across a chunk boundary, at one
    source = tmp_path / "last.pt"
    source.write_bytes(bytes(data))

    _, _, holds_secret = staging.copy_checked(source, tmp_path / "copy.pt", is_checkpoint=True)

    assert holds_secret
    (recorder,) = feeds
    assert recorder.size == len(data)
    assert all(upto <= offset for upto in _cleared(recorder)), "no byte of the secret was cleared"
    words = [word for word, _, _ in recorder.calls]
    assert words[-1] == "drop" and words.count("drop") == 1, "dropped when found, and nothing told after"
    assert "done" not in words, "never offered whole"


def test_a_clean_checkpoint_is_cleared_as_it_is_written_then_offered_whole(
    tmp_path: Path, feeds: list[Recorder]
) -> None:
    log.register_secret(SECRET)
    data = os.urandom(10 * CHUNK + 123)
    source = tmp_path / "last.pt"
    source.write_bytes(data)

    sha256, git_oid, holds_secret = staging.copy_checked(source, tmp_path / "copy.pt", is_checkpoint=True)

    assert (sha256, git_oid, holds_secret) == (hashlib.sha256(data).hexdigest(), None, False)
    (recorder,) = feeds
    cleared = _cleared(recorder)
    assert len(cleared) >= 9, "told chunk by chunk, not once at the end"
    assert cleared == sorted(cleared)
    for word, value, on_disk in recorder.calls:
        if word == "cleared":
            assert value <= on_disk, "only what the staged copy already holds"
            assert value <= on_disk - (len(SECRET) - 1), "the scan's overlap is held back"
    assert recorder.calls[-1][:2] == ("done", (len(data), sha256))
    assert recorder.calls[-1][2] == len(data)


def test_text_is_never_fed(tmp_path: Path, feeds: list[Recorder]) -> None:
    source = tmp_path / "metrics.jsonl"
    source.write_bytes(b'{"epoch": 1}\n' * 50_000)
    staging.copy_checked(source, tmp_path / "copy", is_checkpoint=False)
    assert feeds == []
