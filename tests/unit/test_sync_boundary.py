"""A snapshot is one epoch boundary: a checkpoint ahead of its metrics.jsonl row waits for the row."""

from __future__ import annotations

import json
import pickle
import threading
from pathlib import Path

import pytest

from entrypoint.sync.checkpoint import inspect
from entrypoint.sync.snapshot import Snapshotter
from entrypoint.sync.staging import Signature, StagedFile
from tests.fakes import libreyolo as fake_libreyolo


def save_checkpoint(path: Path, completed_epochs: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(fake_libreyolo._checkpoint(completed_epochs, 10))  # a zip holding libreyolo's 0-based epoch


def record(run_dir: Path, *epochs: int) -> None:
    """Append metrics.jsonl rows, as libreyolo does once an epoch's weights are written."""
    with (run_dir / "metrics.jsonl").open("a") as handle:
        for epoch in epochs:
            handle.write(json.dumps({"epoch": epoch, "mAP50": 0.1 * epoch}) + "\n")


class Delivered(Snapshotter):
    """The snapshotter with what it hands over kept, newest per path, as a lane keeps it."""

    def __init__(self, run_dir: Path, staging: Path) -> None:
        self.pending: dict[str, StagedFile] = {}
        super().__init__(run_dir, staging, changed=threading.Condition(), deliver=self._keep, poll_interval=1.0)

    def _keep(self, staged: list[StagedFile]) -> None:
        self.pending.update((item.relative, item) for item in staged)


@pytest.fixture
def snapshotter(tmp_path: Path) -> Delivered:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    snap = Delivered(run_dir, tmp_path / "sync" / "staging")
    snap.prepare()
    return snap


def pending(snap: Delivered) -> dict[str, StagedFile]:
    return dict(snap.pending)


def test_a_checkpoint_ahead_of_its_row_waits_then_goes_with_it(snapshotter: Delivered) -> None:
    run_dir = snapshotter.run_dir
    record(run_dir, 1, 2)
    save_checkpoint(run_dir / "weights" / "last.pt", 3)  # epoch 3's weights, its row not yet written

    assert sorted(snapshotter.snapshot()) == ["metrics.jsonl"]
    assert "weights/last.pt" not in pending(snapshotter)
    assert list(snapshotter.staging.iterdir()) == [pending(snapshotter)["metrics.jsonl"].path]  # no copy left

    record(run_dir, 3)
    assert sorted(snapshotter.snapshot()) == ["metrics.jsonl", "weights/last.pt"]
    staged = pending(snapshotter)["weights/last.pt"]
    assert staged.epochs == 3 and inspect(staged.path).completed_epochs == 3


def test_the_row_written_during_the_snapshot_is_taken_in_the_same_one(
    snapshotter: Delivered, monkeypatch: pytest.MonkeyPatch
) -> None:
    run_dir = snapshotter.run_dir
    record(run_dir, 1)
    save_checkpoint(run_dir / "weights" / "last.pt", 2)
    stage = snapshotter.stager.stage

    def row_lands_after_the_weights(
        path: Path, relative: str, signature: Signature, seen_at: float
    ) -> StagedFile | None:
        staged = stage(path, relative, signature, seen_at)
        if relative == "weights/last.pt" and "2" not in (run_dir / "metrics.jsonl").read_text():
            record(run_dir, 2)  # libreyolo appends the row while the weights are being copied
        return staged

    monkeypatch.setattr(snapshotter.stager, "stage", row_lands_after_the_weights)
    assert sorted(snapshotter.snapshot()) == ["metrics.jsonl", "weights/last.pt"]
    metrics = pending(snapshotter)["metrics.jsonl"]
    assert metrics.path.read_text().splitlines()[-1] == json.dumps({"epoch": 2, "mAP50": 0.2})


def test_a_row_that_never_comes_keeps_the_checkpoint_off_the_hub(snapshotter: Delivered) -> None:
    """Training cut off between the weights and the row: the Hub keeps the last recorded epoch's copy."""
    run_dir = snapshotter.run_dir
    record(run_dir, 1)
    save_checkpoint(run_dir / "weights" / "last.pt", 1)
    assert "weights/last.pt" in snapshotter.snapshot()
    save_checkpoint(run_dir / "weights" / "last.pt", 2)
    save_checkpoint(run_dir / "weights" / "best.pt", 2)
    save_checkpoint(run_dir / "weights" / "epoch_1.pt", 1)  # recorded: it goes
    assert snapshotter.snapshot() == ["weights/epoch_1.pt"]
    assert snapshotter.snapshot() == []  # the final snapshot: still nothing of epoch 2
    assert pending(snapshotter)["weights/last.pt"].epochs == 1
    assert "weights/best.pt" not in pending(snapshotter)
    assert snapshotter.stager.refused_missing == {}  # not refused: it was never a recorded epoch


def test_without_metrics_every_valid_checkpoint_goes(snapshotter: Delivered) -> None:
    """A run folder libreyolo did not write (no metrics.jsonl) has no rows to wait for."""
    save_checkpoint(snapshotter.run_dir / "weights" / "last.pt", 7)
    assert snapshotter.snapshot() == ["weights/last.pt"]
    assert pending(snapshotter)["weights/last.pt"].epochs == 7


def test_a_refused_checkpoint_is_whole_or_torn_and_forgotten_once_valid_or_gone(snapshotter: Delivered) -> None:
    """Only a whole refused file keeps the disk (``refused_missing``); a torn one holds nothing (``torn``). A
    file rewritten changes list, and one made valid or deleted leaves both."""
    weights = snapshotter.run_dir / "weights"
    weights.mkdir()
    (weights / "epoch_1.pt").write_bytes(b"")  # cut short mid-save
    (weights / "epoch_2.pt").write_bytes(pickle.dumps({"epoch": 1}))  # whole, but no zip a safe loader takes
    assert snapshotter.snapshot() == []
    assert list(snapshotter.stager.torn) == ["weights/epoch_1.pt"]
    assert list(snapshotter.stager.refused_missing) == ["weights/epoch_2.pt"]

    (weights / "epoch_1.pt").write_bytes(pickle.dumps({"epoch": 0}))  # rewritten whole, still refused
    assert snapshotter.snapshot() == []
    assert snapshotter.stager.torn == {}
    assert sorted(snapshotter.stager.refused_missing) == ["weights/epoch_1.pt", "weights/epoch_2.pt"]

    save_checkpoint(weights / "epoch_1.pt", 1)  # valid now: it goes
    (weights / "epoch_2.pt").unlink()  # gone from the volume: nothing left here to keep
    assert snapshotter.snapshot() == ["weights/epoch_1.pt"]
    assert snapshotter.stager.refused_missing == {} and snapshotter.stager.torn == {}
