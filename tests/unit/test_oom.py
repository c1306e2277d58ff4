"""Out of GPU memory: how it is recognised, how the batch shrinks, and what the crash-loop breaker makes of it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from entrypoint.errors import CrashLoopError
from entrypoint.run_args import parse
from entrypoint.training import oom, resume


@pytest.mark.parametrize(
    ("batch", "workers", "expected"),
    [(16, 1, 8), (16, 4, 8), (24, 8, 8), (12, 8, None), (48, 16, 16), (1, 1, None), (3, 1, 1), (64, 3, 30)],
)
def test_half_the_batch_stays_a_multiple_of_every_worker(batch: int, workers: int, expected: int | None) -> None:
    assert oom.smaller_batch(batch, workers) == expected


def write_status(run_dir: Path, status: dict[str, object]) -> None:
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "status.json").write_text(json.dumps(status))


def test_libreyolo_out_of_memory_is_recognised_from_status_json_or_its_last_line(tmp_path: Path) -> None:
    write_status(tmp_path, {"state": "failed", "error": {"type": "OutOfMemoryError", "message": "CUDA out of memory"}})
    assert oom.ran_out(tmp_path, "")
    write_status(tmp_path, {"state": "failed", "error": {"type": "ValueError", "message": "loss is nan"}})
    assert not oom.ran_out(tmp_path, "Error [io_error]: Training failed: loss is nan")
    assert oom.ran_out(tmp_path, "Error [cuda_oom]: Training failed: CUDA out of memory. Tried to allocate 2 GiB")
    write_status(tmp_path, {"state": "running", "completed_epochs": 3})
    assert not oom.ran_out(tmp_path, "")


def test_the_batch_in_use_is_autobatchs_choice_when_libreyolo_recorded_one(tmp_path: Path) -> None:
    assert oom.batch_in_use(tmp_path, parse("batch=-1")) is None
    assert oom.batch_in_use(tmp_path, parse("batch=32")) == 32
    (tmp_path / "train_config.yaml").write_text("epochs: 10\nbatch: 48\nimgsz: 640\n")
    assert oom.batch_in_use(tmp_path, parse("batch=-1")) == 48


def test_the_healing_so_far_is_read_from_the_attempts() -> None:
    attempts = [
        {"reason": "preempted"},
        {"reason": "out_of_memory", "batch": 16, "next_batch": 8},
        {"reason": "out_of_memory", "batch": 8, "next_batch": 4},
        {"reason": "out_of_memory", "batch": 4},  # gave up: no next batch
    ]
    assert oom.OomTry.healing(attempts) == oom.Healing(batch=4, retries=2)
    assert oom.OomTry.healing([]) == oom.Healing(batch=None, retries=0)


def test_a_shrinking_batch_is_not_a_crash_loop_but_the_same_batch_three_times_is() -> None:
    shrinking = [
        {"exit_code": 65, "reason": "out_of_memory", "epochs_done": 3, "batch": b, "next_batch": b // 2}
        for b in (32, 16, 8)
    ]
    resume.check_crash_loop(shrinking)
    same = [{"exit_code": 65, "reason": "out_of_memory", "epochs_done": 3, "batch": 4} for _ in range(3)]
    with pytest.raises(CrashLoopError):
        resume.check_crash_loop(same)


def test_the_errors_name_the_fix() -> None:
    assert "set batch=8 in RUN_ARGS" in str(oom.first_step_error(16, 1))
    assert "set batch=16 in RUN_ARGS" in str(oom.first_step_error(32, 8))
    assert "smaller imgsz" in str(oom.first_step_error(8, 8))
    message = str(oom.exhausted_error(4, 5, 2, 2))
    assert "at epoch 6 with batch=4 after 2 smaller batches" in message and "OOM_RETRIES=2" in message
