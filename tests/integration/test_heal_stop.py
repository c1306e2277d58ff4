"""A stop during a heal (out of GPU memory, then resume with half the batch) ends the job at once: the
heal's lookup is abandoned and no new trainer starts. The stand-in libreyolo (tests/fakes/libreyolo.py)
runs out of memory at epoch 2; SIGTERM arrives at each step of the heal."""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from entrypoint import pipeline, settings
from entrypoint.dataset import PreparedDataset
from entrypoint.errors import PreemptedError
from entrypoint.job import loop
from entrypoint.training import resume
from tests.fakes import libreyolo as fake_libreyolo

pytestmark = pytest.mark.slow  # real trainer children (the stand-in)


def sigterm(job: pipeline.Job) -> None:
    """What the signal handler does in the main thread when SIGTERM arrives."""
    job.on_signal(signal.SIGTERM, None)


def heal_steps(job: pipeline.Job) -> dict[str, tuple[Any, str, Callable[..., Any]]]:
    """Where each step of a heal can be reached: (owner, attribute, original)."""
    return {
        "judging": (loop.OomTry, "judge", loop.OomTry.judge),
        "looking up": (resume, "find", resume.find),
        "recording": (job.state.history, "next_attempt", job.state.history.next_attempt),
    }


@pytest.mark.parametrize("step", ["judging", "looking up", "recording"])
def test_a_sigterm_during_a_heal_ends_the_job_before_a_new_trainer(
    step: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    libreyolo = fake_libreyolo.install(tmp_path / "bin")
    env = {
        "WORKDIR": str(tmp_path / "work"),
        "GPUS": "cpu",
        "PROVIDER": "none",
        "RUN_NAME": "heal",
        "RUN_ARGS": "epochs=4 batch=16",
        "TRAINBOX_LIBREYOLO": str(libreyolo),
        "FAKE_OOM_ABOVE": "8",  # out of memory at epoch 2 with batch 16
        "FAKE_EPOCH_SECONDS": "0.1",
    }
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    job = pipeline.Job(settings.from_env(env, options={"epochs": "int", "batch": "int"}))
    job.settings.run_dir.mkdir(parents=True, exist_ok=True)
    trainers: list[int] = []
    real_trainer = loop.TrainingProcess

    def counted(*args: Any, **kwargs: Any) -> Any:
        trainer = real_trainer(*args, **kwargs)
        trainers.append(trainer.pid)
        return trainer

    monkeypatch.setattr(loop, "TrainingProcess", counted)
    owner, name, original = heal_steps(job)[step]
    reached: list[str] = []

    def signalled(*args: Any, **kwargs: Any) -> Any:
        reached.append(step)
        sigterm(job)
        return original(*args, **kwargs)

    monkeypatch.setattr(owner, name, signalled)
    data_yaml = tmp_path / "data.yaml"
    data_yaml.write_text("path: .\n")
    try:
        with pytest.raises(PreemptedError):
            job.training.train(PreparedDataset(data_yaml=data_yaml, root=tmp_path, description="test"), None, None)
    finally:
        for pid in trainers:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)

    assert reached == [step]
    assert len(trainers) == 1, "a new trainer started after the stop"
    attempts = job.state.history.attempts
    assert [attempt.get("next_batch") for attempt in attempts] in ([], [None]), attempts
