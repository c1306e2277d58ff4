"""The last lines of a local-only run work as printed: `trainbox sync` puts the run on the (local) Hub.

The stand-in libreyolo (tests/fakes/libreyolo.py) trains the demo in a second; the sync runs against the
local Hub with the real huggingface_hub client.
"""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest

from tests.fakes import libreyolo as fake_libreyolo
from tests.hubfixtures import HubContext
from tests.support import run_trainbox, trainbox_env

pytestmark = pytest.mark.slow  # real agent processes, twice


def test_the_printed_sync_line_puts_a_local_run_on_the_hub(tmp_path: Path, hub_ctx: HubContext) -> None:
    fake_libreyolo.install(tmp_path / "bin")
    workdir = tmp_path / "work"
    stand_in = {"TRAINBOX_LIBREYOLO": str(tmp_path / "bin" / "libreyolo"), "FAKE_EPOCH_SECONDS": "0.1"}
    trained = run_trainbox("run", env=trainbox_env(workdir, GPUS="cpu", RUN_ARGS="epochs=2", **stand_in))
    assert trained.returncode == 0, trained.output[-3000:]
    assert "the Hub is not known" not in trained.output  # no Hub was asked for

    (line,) = [line for line in trained.stderr.splitlines() if "next: put this run on the Hub: " in line]
    words = shlex.split(line.split("next: put this run on the Hub: ", 1)[1])
    assert words[:2] == ["HF_TOKEN=YOUR_TOKEN", "OUTPUT_REPO=YOUR_ORG/my-model"]
    assert words[2:5] == ["trainbox", "sync", "--once"]
    run_dir = Path(words[5])
    assert (run_dir / "weights" / "best.pt").is_file()

    # Filled in as a person would: their token, their repo.
    repo = hub_ctx.repo_id("my-model")
    env = trainbox_env(workdir, HF_TOKEN=hub_ctx.token, HF_HUB_CACHE=str(hub_ctx.cache_dir), OUTPUT_REPO=repo)
    synced = run_trainbox(*words[3:], env=env, timeout=120)  # as printed: a finished run is sent once
    assert synced.returncode == 0, synced.output[-3000:]
    on_hub = hub_ctx.hub.files(repo)
    assert {"weights/best.pt", "weights/last.pt", "metrics.jsonl"} <= set(on_hub)
    assert hub_ctx.hub.file_bytes(repo, "weights/best.pt") == (run_dir / "weights" / "best.pt").read_bytes()
