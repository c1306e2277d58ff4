"""The dataset stage's own decisions: which data.yaml, and when an extraction is not tried again."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from entrypoint import settings
from entrypoint.dataset import cache, checks
from entrypoint.errors import CorruptArchiveError, CrashLoopError

IDENTITY = {"source": "acme/data", "revision": "abc123", "file": "data.tgz"}

# One agent start that is killed by the kernel in the middle of extracting (an OOM kill: no
# exception, no finally), on the same volume every time.
KILLED_START = """
import json, os, signal, sys
from pathlib import Path
from entrypoint import settings
from entrypoint.dataset import cache
workdir = Path(sys.argv[1])
config = settings.from_env({"WORKDIR": str(workdir)})
def fill(folder):
    os.kill(os.getpid(), signal.SIGKILL)
cache.install_archive(config, workdir / "data" / "entry", json.loads(sys.argv[2]), fill, "acme/data")
"""


def killed_start(workdir: Path) -> int:
    return subprocess.run(
        [sys.executable, "-c", KILLED_START, str(workdir), json.dumps(IDENTITY)], env=dict(os.environ), timeout=120
    ).returncode


def test_the_same_data_yaml_listed_twice_is_one(tmp_path: Path) -> None:
    (tmp_path / "ds").mkdir()
    (tmp_path / "ds" / "data.yaml").write_text("names: [a]\n")
    assert checks.locate_data_yaml(tmp_path, None, ["ds/data.yaml", "ds/data.yaml"]) == tmp_path / "ds" / "data.yaml"


def test_an_extraction_killed_every_time_is_not_retried_forever(tmp_path: Path) -> None:
    workdir = tmp_path / "work"
    for _ in range(cache.EXTRACT_STARTS):
        assert killed_start(workdir) == -signal.SIGKILL
    config = settings.from_env({"WORKDIR": str(workdir)})
    calls: list[Path] = []
    with pytest.raises(CrashLoopError, match="out of memory") as caught:
        cache.install_archive(config, workdir / "data" / "entry", IDENTITY, calls.append, "acme/data")  # type: ignore[arg-type]
    assert calls == []  # refused before extracting again
    assert caught.value.exit_code == 11
    # Another archive (a fixed upload) is tried.
    with pytest.raises(CorruptArchiveError):
        cache.install_archive(config, workdir / "data" / "entry", {**IDENTITY, "revision": "def456"}, _corrupt, "x")


def _corrupt(folder: Path) -> object:
    raise CorruptArchiveError("the tar is damaged", "upload it again")


def test_an_extraction_that_ends_in_an_error_is_not_a_kill(tmp_path: Path) -> None:
    workdir = tmp_path / "work"
    config = settings.from_env({"WORKDIR": str(workdir)})
    for _ in range(cache.EXTRACT_STARTS + 1):  # an error the agent lived to report: the breaker decides
        with pytest.raises(CorruptArchiveError):
            cache.install_archive(config, workdir / "data" / "entry", IDENTITY, _corrupt, "acme/data")
