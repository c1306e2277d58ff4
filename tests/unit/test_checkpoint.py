"""A checkpoint is accepted only when complete and loadable without running code."""

from __future__ import annotations

import os
import pickle
from pathlib import Path

import pytest

from entrypoint.sync.checkpoint import InvalidCheckpoint, TornCheckpoint, inspect, is_valid


def save(path: Path, epoch: int = 4) -> Path:
    import torch  # here, not at collection: only the worker that runs this file pays for it (tests/conftest.py)

    torch.save(
        {
            "model": {"w": torch.randn(64, 64), "b": torch.zeros(64, dtype=torch.float16)},
            "optimizer": {"state": {}, "param_groups": [{"lr": 0.01}]},
            "epoch": epoch,
            "config": {"epochs": 10, "imgsz": 128},
            "names": {0: "red", 1: "blue"},
        },
        path,
    )
    return path


def test_complete_checkpoint_gives_its_epoch(tmp_path: Path) -> None:
    info = inspect(save(tmp_path / "last.pt", epoch=4))
    assert info.epoch == 4 and info.completed_epochs == 5 and info.total_epochs == 10
    assert info.metadata["names"] == {0: "red", 1: "blue"}
    # the same file loads in torch's own safe loader
    import torch

    assert torch.load(tmp_path / "last.pt", weights_only=True)["epoch"] == 4


@pytest.mark.parametrize("keep", [0.0, 0.1, 0.5, 0.99])
def test_truncated_file_is_refused(tmp_path: Path, keep: float) -> None:
    data = save(tmp_path / "full.pt").read_bytes()
    torn = tmp_path / "torn.pt"
    torn.write_bytes(data[: int(len(data) * keep)])
    assert not is_valid(torn)
    with pytest.raises(TornCheckpoint):  # cut short: nothing in it worth keeping
        inspect(torn)


def test_bytes_changed_in_place_are_refused(tmp_path: Path) -> None:
    """torch.save rewrites in place: a copy taken mid-write mixes old and new bytes."""
    data = bytearray(save(tmp_path / "full.pt").read_bytes())
    data[len(data) // 3] ^= 0xFF
    mixed = tmp_path / "mixed.pt"
    mixed.write_bytes(bytes(data))
    with pytest.raises(TornCheckpoint, match="CRC"):
        inspect(mixed)


class _Payload:
    def __reduce__(self):
        return (os.system, ("touch pwned-by-checkpoint",))


def test_code_in_the_pickle_is_refused_and_never_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    evil = tmp_path / "evil.pt"
    import torch

    torch.save({"epoch": 1, "x": _Payload()}, evil, pickle_protocol=2)
    with pytest.raises(InvalidCheckpoint, match="refuses") as refused:
        inspect(evil)
    assert not isinstance(refused.value, TornCheckpoint)  # whole: only its volume holds it
    assert not (tmp_path / "pwned-by-checkpoint").exists()


def test_missing_tensor_storage_is_refused(tmp_path: Path) -> None:
    import zipfile

    source = save(tmp_path / "full.pt")
    broken = tmp_path / "broken.pt"
    with zipfile.ZipFile(source) as old, zipfile.ZipFile(broken, "w", zipfile.ZIP_STORED) as new:
        for item in old.infolist():
            if not item.filename.endswith("/data/0"):
                new.writestr(item, old.read(item.filename))
    with pytest.raises(InvalidCheckpoint, match="missing"):
        inspect(broken)


def test_plain_pickle_is_not_a_checkpoint(tmp_path: Path) -> None:
    path = tmp_path / "plain.pt"
    path.write_bytes(pickle.dumps({"epoch": 1}))
    assert not is_valid(path)
    with pytest.raises(InvalidCheckpoint, match="not a zip archive") as refused:
        inspect(path)
    assert not isinstance(refused.value, TornCheckpoint)


def test_a_legacy_torch_file_is_refused_whole_not_torn(tmp_path: Path) -> None:
    """torch.save's pre-1.6 format is whole, only not what a safe loader takes: never treated as worthless."""
    path = tmp_path / "legacy.pt"
    import torch

    torch.save({"epoch": 1}, path, _use_new_zipfile_serialization=False)
    with pytest.raises(InvalidCheckpoint) as refused:
        inspect(path)
    assert not isinstance(refused.value, TornCheckpoint)
