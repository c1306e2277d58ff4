"""One agent per run on a volume (sync/volume_lock.py): the lock refuses a second holder in one line naming the
first, is free again once released, and a volume where it cannot be made does not stop the job."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from entrypoint.errors import LeaseHeldError
from entrypoint.sync import volume_lock


def test_a_second_holder_is_refused_naming_the_first_and_the_lock_frees_with_it(tmp_path: Path) -> None:
    path = volume_lock.lock_path(tmp_path, "shapes-1")
    with volume_lock.held(path, "shapes-1"):
        with pytest.raises(LeaseHeldError) as refused, volume_lock.held(path, "shapes-1"):
            pass
        assert refused.value.exit_code == 72
        assert f"another trainbox agent is running shapes-1 on this volume (pid {os.getpid()} on " in str(refused.value)
    with volume_lock.held(path, "shapes-1"):  # released with its holder
        pass
    with volume_lock.held(path, "shapes-1"), volume_lock.held(volume_lock.lock_path(tmp_path, "other"), "other"):
        pass  # another run on the same volume is another lock


def test_a_volume_where_the_lock_cannot_be_made_does_not_stop_the_job(tmp_path: Path) -> None:
    (tmp_path / ".trainbox").write_text("a file where the agent's folder would be")  # mkdir fails, as on a full disk
    ran = []
    with volume_lock.held(volume_lock.lock_path(tmp_path, "shapes-1"), "shapes-1"):
        ran.append(True)
    assert ran == [True]
