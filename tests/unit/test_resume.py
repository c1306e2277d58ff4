"""Resuming: the crash-loop guard over earlier attempts, and metrics.jsonl cut back to the checkpoint."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import pytest

from entrypoint.errors import CrashLoopError
from entrypoint.libreyolo import trim_metrics
from entrypoint.training.resume import CRASH_LOOP_LENGTH, check_crash_loop, newest_local


def attempt(reason: str = "training_failed", exit_code: int = 60, epochs_done: int | None = 4) -> dict[str, Any]:
    return {"reason": reason, "exit_code": exit_code, "epochs_done": epochs_done}


# -- check_crash_loop ------------------------------------------------------------------------------
def test_the_same_failure_at_the_same_epoch_every_time_stops_the_retries() -> None:
    attempts = [attempt(reason="oom", exit_code=60)] * CRASH_LOOP_LENGTH

    with pytest.raises(CrashLoopError) as raised:
        check_crash_loop(attempts)

    assert f"the last {CRASH_LOOP_LENGTH} attempts all failed the same way (oom, exit 60)" in raised.value.message
    assert "RUN_NAME" in raised.value.hint


def test_fewer_failures_than_the_loop_length_still_retry() -> None:
    check_crash_loop([attempt()] * (CRASH_LOOP_LENGTH - 1))
    check_crash_loop([])


@pytest.mark.parametrize(
    "attempts",
    [
        [attempt(epochs_done=n) for n in range(CRASH_LOOP_LENGTH)],  # later each time: still progressing
        [attempt(reason="oom")] + [attempt()] * (CRASH_LOOP_LENGTH - 1),  # not the same cause
        [attempt(exit_code=61)] + [attempt()] * (CRASH_LOOP_LENGTH - 1),
        [attempt()] * CRASH_LOOP_LENGTH + [attempt(reason="preempted", exit_code=143)] * CRASH_LOOP_LENGTH,
        [attempt(reason=reason, exit_code=143) for reason in ("preempted", "interrupted", "lost")] * 2,
        [attempt(reason="success", exit_code=0)] * CRASH_LOOP_LENGTH,
        [attempt(reason="odd", exit_code=0)] * CRASH_LOOP_LENGTH,  # exit 0 is never a crash
        # only the upload failed, Hub outage after Hub outage: the next start must get to upload
        [attempt(reason="sync_failed", exit_code=70)] * (CRASH_LOOP_LENGTH + 2),
    ],
    ids=["progressing", "other-reason", "other-code", "preempted-last", "not-failures", "ok", "exit-0", "sync"],
)
def test_what_is_not_a_loop_is_retried(attempts: list[dict[str, Any]]) -> None:
    check_crash_loop(attempts)


def test_a_refusal_for_a_crash_loop_does_not_count_as_an_attempt() -> None:
    # A restart refused as a crash loop must not make the loop look broken (other reason) next time.
    attempts = [attempt(), attempt(), attempt(reason="crash_loop", exit_code=11), attempt()]

    with pytest.raises(CrashLoopError):
        check_crash_loop(attempts)


def test_only_the_last_attempts_count() -> None:
    check_crash_loop([attempt()] * CRASH_LOOP_LENGTH + [attempt(reason="oom")])  # broken by the newest
    with pytest.raises(CrashLoopError):
        check_crash_loop([attempt(reason="oom")] + [attempt()] * CRASH_LOOP_LENGTH)


# -- trim_metrics ----------------------------------------------------------------------------------
def rows(*epochs: int) -> list[str]:
    return [json.dumps({"epoch": epoch, "loss": 1.0 / epoch}) for epoch in epochs]


def test_rows_after_the_checkpoint_and_torn_rows_are_dropped(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    path.write_text("\n".join([*rows(1, 2, 3, 4, 5), '{"epoch": 6, "lo']) + "\n")

    trim_metrics(tmp_path, completed_epochs=3)

    assert path.read_text() == "".join(f"{row}\n" for row in rows(1, 2, 3))
    assert [p.name for p in tmp_path.iterdir()] == ["metrics.jsonl"]  # no temporary file left


def test_rows_without_an_integer_epoch_are_dropped(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    path.write_text("\n".join([*rows(1), '{"epoch": "2"}', '{"loss": 0.3}', *rows(2)]) + "\n")

    trim_metrics(tmp_path, completed_epochs=5)

    assert path.read_text().splitlines() == rows(1, 2)


def test_a_file_that_needs_no_trim_is_left_alone(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    path.write_text("\n".join(rows(1, 2)) + "\n")
    before = path.stat()

    trim_metrics(tmp_path, completed_epochs=2)

    after = path.stat()
    assert (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns)


def test_no_metrics_yet_is_fine(tmp_path: Path) -> None:
    trim_metrics(tmp_path, completed_epochs=0)

    assert not (tmp_path / "metrics.jsonl").exists()


def test_a_checkpoint_before_any_epoch_empties_the_file(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    path.write_text("\n".join(rows(1, 2)) + "\n")

    trim_metrics(tmp_path, completed_epochs=0)

    assert path.read_text() == ""


# -- newest_local: an epoch saved but never recorded is the epoch in progress ------------------------
def saved(run_dir: Path, name: str, completed: int) -> Path:
    from tests.unit.test_checkpoint import save

    path = run_dir / "weights" / name
    path.parent.mkdir(parents=True, exist_ok=True)
    return save(path, epoch=completed - 1)  # libreyolo's checkpoint epoch is 0-based


def recorded(run_dir: Path, epochs: int) -> None:
    (run_dir / "status.json").write_text("{}")
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps({"epoch": n}) + "\n" for n in range(1, epochs + 1)))


@pytest.mark.protocol  # the protocol lane: which of the volume's checkpoints a resume takes (sync/read.py)
def test_a_checkpoint_whose_row_was_cut_off_is_redone_from_the_recorded_epoch(tmp_path: Path) -> None:
    saved(tmp_path, "last.pt", 4)
    saved(tmp_path, "epoch_3.pt", 3)
    saved(tmp_path, "epoch_4.pt", 4)
    recorded(tmp_path, 3)  # killed after the weights of epoch 4, before its metrics.jsonl row
    found = newest_local(tmp_path)
    assert found is not None and found[0].name == "epoch_3.pt" and found[1].completed_epochs == 3


@pytest.mark.protocol  # the protocol lane: which of the volume's checkpoints a resume takes (sync/read.py)
def test_the_first_epoch_cut_off_before_its_row_starts_again(tmp_path: Path) -> None:
    saved(tmp_path, "last.pt", 1)
    (tmp_path / "status.json").write_text("{}")  # libreyolo started the run, recorded no epoch
    assert newest_local(tmp_path) is None


@pytest.mark.protocol  # the protocol lane: which of the volume's checkpoints a resume takes (sync/read.py)
def test_a_recorded_epoch_resumes_from_its_checkpoint(tmp_path: Path) -> None:
    saved(tmp_path, "last.pt", 4)
    saved(tmp_path, "epoch_3.pt", 3)
    recorded(tmp_path, 4)
    found = newest_local(tmp_path)
    assert found is not None and found[0].name == "last.pt" and found[1].completed_epochs == 4


@pytest.mark.protocol  # the protocol lane: which of the volume's checkpoints a resume takes (sync/read.py)
def test_redoing_more_than_the_cut_off_epoch_is_not_worth_a_row(tmp_path: Path) -> None:
    saved(tmp_path, "last.pt", 10)  # save_period=5: no checkpoint at the recorded epoch 9
    saved(tmp_path, "epoch_5.pt", 5)
    recorded(tmp_path, 9)
    found = newest_local(tmp_path)
    assert found is not None and found[0].name == "last.pt"


@pytest.mark.protocol  # the protocol lane: which of the volume's checkpoints a resume takes (sync/read.py)
def test_a_checkpoint_that_records_no_epoch_is_never_resumed_from(tmp_path: Path) -> None:
    from tests.unit.test_checkpoint import save

    saved(tmp_path, "epoch_3.pt", 3)
    save(tmp_path / "weights" / "last.pt", epoch=None)  # type: ignore[arg-type]  # weights alone, no epoch
    recorded(tmp_path, 3)
    found = newest_local(tmp_path)
    assert found is not None and found[0].name == "epoch_3.pt" and found[1].completed_epochs == 3
    (tmp_path / "weights" / "epoch_3.pt").unlink()
    assert newest_local(tmp_path) is None, "weights alone are nothing to resume from"


@pytest.mark.protocol  # the protocol lane: which of the volume's checkpoints a resume takes (sync/read.py)
def test_a_folder_with_no_run_record_keeps_its_newest_checkpoint(tmp_path: Path) -> None:
    saved(tmp_path, "last.pt", 2)  # a checkpoint placed by hand: nothing to judge it by
    found = newest_local(tmp_path)
    assert found is not None and found[1].completed_epochs == 2


@pytest.mark.protocol  # the protocol lane: which of the volume's checkpoints a resume takes (sync/read.py)
def test_the_checkpoint_of_the_most_epochs_wins_whatever_its_name_sorts_as(tmp_path: Path) -> None:
    saved(tmp_path, "epoch_9.pt", 9)
    saved(tmp_path, "epoch_10.pt", 10)  # "epoch_9" sorts after "epoch_10" as a name
    recorded(tmp_path, 10)
    found = newest_local(tmp_path)
    assert found is not None and found[0].name == "epoch_10.pt"

    saved(tmp_path, "last.pt", 3)  # a last.pt older than the snapshots (copied back by hand)
    found = newest_local(tmp_path)
    assert found is not None and found[0].name == "epoch_10.pt"


@pytest.mark.protocol  # the protocol lane: which of the volume's checkpoints a resume takes (sync/read.py)
def test_a_checkpoint_of_the_recorded_epoch_is_taken_without_a_word(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    saved(tmp_path, "last.pt", 4)
    recorded(tmp_path, 4)
    with caplog.at_level(logging.INFO, logger="trainbox"):
        found = newest_local(tmp_path)
    assert found is not None and found[1].completed_epochs == 4 and caplog.records == []


@pytest.mark.protocol  # the protocol lane: which of the volume's checkpoints a resume takes (sync/read.py)
def test_a_run_that_recorded_no_epoch_keeps_a_checkpoint_of_several_and_says_why(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    saved(tmp_path, "last.pt", 3)  # metrics.jsonl lost or emptied: only epoch 1 would be cut off
    recorded(tmp_path, 0)
    with caplog.at_level(logging.INFO, logger="trainbox"):
        found = newest_local(tmp_path)
    assert found is not None and found[1].completed_epochs == 3
    assert [r.getMessage() for r in caplog.records] == [
        "resume: epoch 3 has no row in metrics.jsonl (cut off before libreyolo wrote it)"
    ]


@pytest.mark.protocol  # the protocol lane: which of the volume's checkpoints a resume takes (sync/read.py)
def test_the_cut_off_epoch_is_said_when_it_is_redone(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    saved(tmp_path, "last.pt", 4)
    saved(tmp_path, "epoch_3.pt", 3)
    recorded(tmp_path, 3)
    with caplog.at_level(logging.INFO, logger="trainbox"):
        newest_local(tmp_path)
    assert [r.getMessage() for r in caplog.records] == [
        "resume: epoch 4 was saved but never recorded (cut off): redoing it"
    ]
    caplog.clear()
    for path in (tmp_path / "weights").iterdir():
        path.unlink()
    saved(tmp_path, "last.pt", 1)
    recorded(tmp_path, 0)
    with caplog.at_level(logging.INFO, logger="trainbox"):
        assert newest_local(tmp_path) is None
    assert [r.getMessage() for r in caplog.records] == [
        "resume: epoch 1 was saved but never recorded (cut off): starting it again"
    ]


def test_an_orphaned_trainer_of_several_nodes_is_stopped_by_its_recorded_argv() -> None:
    # torchrun's command line names no libreyolo: the trainer is known by the argv trainbox.json recorded.
    import subprocess
    import sys
    import time

    from entrypoint.training.resume import stop_orphan

    argv = ["-c", "import time; time.sleep(600)", "-m", "entrypoint.training.ddp_worker", "train", "name=orphan"]
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)", "name=else"])
    orphan = subprocess.Popen([sys.executable, *argv], start_new_session=True)
    # A process still inside execve shows an empty cmdline for an instant; a real orphan has run for a while.
    deadline = time.monotonic() + 10
    while b"name=orphan" not in Path(f"/proc/{orphan.pid}/cmdline").read_bytes() and time.monotonic() < deadline:
        time.sleep(0.01)
    try:
        stop_orphan({"training": {"pid": other.pid, "argv": argv}})  # a pid reused by something else
        assert other.poll() is None, "a process that is not the trainer was killed"
        stop_orphan({"training": {"pid": orphan.pid, "argv": argv}})
        try:  # this test is its parent, so it reaps it (a real orphan's parent is init)
            orphan.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pytest.fail("the orphaned trainer still runs")
    finally:
        for process in (other, orphan):
            process.kill()
            process.wait()
