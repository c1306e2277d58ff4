"""The agent's Hugging Face state is on the volume: HF_HOME and HF_XET_CACHE are set before huggingface_hub
(or hf_xet) is imported, which read them once, at import."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support import trainbox_env

# Runs a `trainbox` command and, the moment huggingface_hub is first imported, prints what it would read
# from the environment, then exits: nothing of the job itself runs.
_FETCH = "HF_XET_RECONSTRUCTION_MIN_RECONSTRUCTION_FETCH_SIZE"
_BUFFER = (
    "HF_XET_RECONSTRUCTION_DOWNLOAD_BUFFER_SIZE",
    "HF_XET_RECONSTRUCTION_DOWNLOAD_BUFFER_PERFILE_SIZE",
    "HF_XET_RECONSTRUCTION_MAX_RECONSTRUCTION_FETCH_SIZE",
)
_WATCH = """
import json, os, runpy, sys

class Watch:
    def find_spec(self, name, path=None, target=None):
        if name == "huggingface_hub":
            keys = ("HF_HOME", "HF_XET_CACHE", "HF_HUB_DISABLE_PROGRESS_BARS",
                    "HF_XET_RECONSTRUCTION_MIN_RECONSTRUCTION_FETCH_SIZE",
                    "HF_XET_RECONSTRUCTION_DOWNLOAD_BUFFER_SIZE", "HF_XET_RECONSTRUCTION_DOWNLOAD_BUFFER_PERFILE_SIZE",
                    "HF_XET_RECONSTRUCTION_MAX_RECONSTRUCTION_FETCH_SIZE")
            print(json.dumps({key: os.environ.get(key) for key in keys}), flush=True)
            os._exit(0)

sys.meta_path.insert(0, Watch())
sys.argv = ["trainbox", *sys.argv[1:]]
runpy.run_module("entrypoint", run_name="__main__")
"""


@pytest.mark.parametrize("command", ["run", "fetch"])
def test_hf_home_is_on_the_volume_before_huggingface_hub_is_imported(command: str, tmp_path: Path) -> None:
    workdir = tmp_path / "work"
    env = trainbox_env(workdir, GPUS="cpu", DATASET_REPO="acme/data", HOME=str(tmp_path / "home"))
    for name in ("HF_HOME", "HF_XET_CACHE", "HF_HUB_DISABLE_PROGRESS_BARS", "XDG_CACHE_HOME", _FETCH, *_BUFFER):
        env.pop(name, None)
    done = subprocess.run([sys.executable, "-c", _WATCH, command], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and done.stdout.strip(), done.stderr[-2000:]
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    hf_home = workdir / ".cache" / "huggingface"
    assert seen["HF_HOME"] == str(hf_home) and seen["HF_XET_CACHE"] == str(hf_home / "xet")
    # a streamed Xet dataset's first bytes come after one small reconstruction step, not 256 MB
    assert seen["HF_XET_RECONSTRUCTION_MIN_RECONSTRUCTION_FETCH_SIZE"] == "16mb"
    # hf_xet's download buffer and steps, bounded for the agent's own process: its memory stays flat as tars grow
    assert [seen[name] for name in _BUFFER] == ["32mb", "32mb", "16mb"]
    if command == "run":
        assert seen["HF_HUB_DISABLE_PROGRESS_BARS"] == "1"  # no bars interleaved with the training log
