"""Nodes other than 0 upload nothing: the checkpoint resume copied from the Hub is no reason to keep their disk."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from entrypoint import pipeline, settings
from entrypoint.training import resume
from tests.fakes import libreyolo as fake_libreyolo


def test_the_hubs_copy_of_last_pt_never_downgrades_a_destroy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    job = pipeline.Job(settings.from_env({"WORKDIR": str(tmp_path), "GPUS": "cpu", "RUN_NAME": "n1"}))
    last = job.settings.run_dir / "weights" / "last.pt"
    last.parent.mkdir(parents=True)
    last.write_bytes(fake_libreyolo._checkpoint(3, 10))
    point = resume.ResumePoint(
        checkpoint=last, completed_epochs=3, total_epochs=10, source="hub", hub_files=frozenset({"weights/last.pt"})
    )
    monkeypatch.setattr(resume, "find", lambda *_, **__: point)
    monkeypatch.setattr(resume, "stop_orphan", lambda _: None)
    job._find_resume_point()

    assert job._wrap_up().publish_state() is True, "the Hub's own checkpoint counted as at risk"

    # Written again here (a node that saves its own): now only this volume has it.
    last.write_bytes(fake_libreyolo._checkpoint(4, 10))
    os.utime(last, ns=(0, 1))
    assert job._wrap_up().publish_state() is False
