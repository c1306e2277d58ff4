"""Markers and reports that are valid JSON but not an object are treated like unreadable ones."""

from __future__ import annotations

from pathlib import Path

import pytest

from entrypoint.dataset.cache import READY_MARKER, read_ready_marker
from entrypoint.dataset.checks import _DOCTOR_MARKER, _doctor_verdict
from entrypoint.errors import DatasetInvalidError


def test_a_ready_marker_that_is_a_list_is_no_marker(tmp_path: Path) -> None:
    (tmp_path / "tree").mkdir()
    (tmp_path / READY_MARKER).write_text("[1, 2]")
    assert read_ready_marker(tmp_path, {"sha256": "x"}) is None


def test_doctor_output_that_is_not_an_object_is_told_as_a_failed_check(tmp_path: Path) -> None:
    with pytest.raises(DatasetInvalidError, match="libreyolo doctor failed"):
        _doctor_verdict(0, "[]", "boom", tmp_path / _DOCTOR_MARKER, "fp")
