"""`trainbox status --repo`: the run as the Hub holds it, read from a machine without the run's volume.

Against the local test Hub: a repo's trainbox.json (repo mode), a Storage Bucket laid out as the agent
lays it out (``<bucket>/<run>/<run id>/``, a boundary written by the agent's own ``BucketStore``), a token
that cannot read. The agent-running tests train with the stand-in libreyolo and look from another WORKDIR
while the run trains: the epoch shown is within one boundary of the volume's, then the outcome.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from entrypoint.errors import RemoteReadError, RemoteUnreachableError
from entrypoint.hub import Hub
from entrypoint.report import remote, status
from entrypoint.sync.bucket import Bucket, RunFolder
from entrypoint.sync.bucket_store import BucketStore
from entrypoint.sync.staging import StagedFile, sha256_of
from tests.fakes import libreyolo as fake_libreyolo
from tests.hubfixtures import HubContext
from tests.support import held_after, open_gate

AGENT_TIMEOUT = 120


def state(run: str = "cones", phase: str = "training", updated: str = "2026-03-01T11:00:00Z", **extra: Any) -> dict:
    return {"run_name": run, "phase": phase, "updated_at": updated, "progress": {"epochs_done": 3}, **extra}


def put_repo_state(hub_ctx: HubContext, repo: str, data: dict[str, Any]) -> None:
    api = hub_ctx.api()
    api.create_repo(repo, private=True, exist_ok=True)
    api.upload_file(path_or_fileobj=json.dumps(data).encode(), path_in_repo="trainbox.json", repo_id=repo)


def put_bucket_state(hub_ctx: HubContext, bucket: str, data: dict[str, Any], tmp_path: Path) -> None:
    """trainbox.json as one boundary of ``<bucket>/<run>/<run id>/``, written by the agent's own bucket writer."""
    hub = Hub(token=hub_ctx.token)
    Bucket(hub, bucket).open(write=True)
    folder = RunFolder(Bucket(hub, bucket), data["run_name"], data.get("run_id") or "0123456789abcdef")
    local = tmp_path / f"{data['run_name']}-{time.monotonic_ns()}.json"
    local.write_text(json.dumps(data))
    staged = StagedFile("trainbox.json", local, sha256_of(local), None, local.stat().st_size)
    BucketStore.begin(folder).commit([staged], "a boundary", deadline=None, commit_id=uuid.uuid4().hex)


def trainbox(*args: str, env: dict[str, str], timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "entrypoint", *args], env=env, capture_output=True, text=True, timeout=timeout
    )


def laptop(hub_ctx: HubContext, tmp_path: Path, token: str | None = None, **extra: str) -> dict[str, str]:
    """Another machine: its own empty WORKDIR, a token that can read (the read-only one by default)."""
    env = hub_ctx.env(HF_TOKEN=token or hub_ctx.read_token, WORKDIR=str(tmp_path / "laptop"), **extra)
    env.pop("RUN_NAME", None)
    return env


# -- reading what the Hub holds -----------------------------------------------------------------
def test_repo_mode_reads_the_repos_trainbox_json(hub_ctx: HubContext, tmp_path: Path) -> None:
    repo = hub_ctx.repo_id("yolo")
    data = state(storage={"mode": "repo"}, settings={"output_repo": repo})
    put_repo_state(hub_ctx, repo, data)
    hub = Hub(token=hub_ctx.read_token)
    assert remote.fetch_remote_state(hub, repo, bucket=f"{repo}-checkpoints") == data
    assert remote.fetch_remote_state(hub, repo, "another-run", bucket=None) is None

    shown = trainbox("status", "--repo", repo, "--json", env=laptop(hub_ctx, tmp_path))
    assert shown.returncode == 0, shown.stderr
    assert json.loads(shown.stdout) == data
    human = trainbox("status", "--repo", repo, env=laptop(hub_ctx, tmp_path))
    assert human.returncode == 0 and "epoch     3/?" in human.stdout and f"working   repo {repo}" in human.stdout


def test_bucket_mode_reads_the_newer_boundary_through_the_manifest(hub_ctx: HubContext, tmp_path: Path) -> None:
    repo = hub_ctx.repo_id("yolo")
    bucket = f"{repo}-checkpoints"
    where = {"mode": "bucket", "bucket": bucket, "prefix": "cones"}
    put_repo_state(hub_ctx, repo, state(storage=where, progress={"epochs_done": 2}))  # a milestone, older
    put_bucket_state(hub_ctx, bucket, state(storage=where, updated="2026-03-01T11:05:00Z"), tmp_path)
    hub = Hub(token=hub_ctx.read_token)
    found = remote.fetch_remote_state(hub, repo)
    assert found is not None and found["updated_at"] == "2026-03-01T11:05:00Z" and found["progress"]["epochs_done"] == 3
    # The repo's copy wins when it is the newer one (the run's final trainbox.json, say).
    put_repo_state(hub_ctx, repo, state(phase="done", storage=where, updated="2026-03-01T11:09:00Z"))
    assert remote.fetch_remote_state(hub, repo)["phase"] == "done"  # type: ignore[index]


def test_without_a_run_name_the_buckets_newest_run(hub_ctx: HubContext, tmp_path: Path) -> None:
    repo = hub_ctx.repo_id("yolo")
    bucket = f"{repo}-checkpoints"
    Hub(token=hub_ctx.token).api.create_repo(repo, private=True)  # the repo holds no trainbox.json yet
    put_bucket_state(hub_ctx, bucket, state("older"), tmp_path)
    time.sleep(1.1)  # the bucket's upload times are in seconds
    put_bucket_state(hub_ctx, bucket, state("newer"), tmp_path)
    hub = Hub(token=hub_ctx.read_token)
    assert remote.fetch_remote_state(hub, repo, bucket=bucket)["run_name"] == "newer"  # type: ignore[index]
    assert remote.fetch_remote_state(hub, repo, "older", bucket=bucket)["run_name"] == "older"  # type: ignore[index]
    assert remote.fetch_remote_state(hub, repo, bucket=None) is None  # CHECKPOINT_BUCKET=off: the repo alone
    derived = laptop(hub_ctx, tmp_path, CHECKPOINT_BUCKET="")  # unset: <repo>-checkpoints, as the agent derives it
    shown = trainbox("status", "--repo", repo, "--run", "older", "--json", env=derived)
    assert shown.returncode == 0, shown.stderr
    assert json.loads(shown.stdout)["run_name"] == "older"
    off = trainbox("status", "--repo", repo, env=laptop(hub_ctx, tmp_path, CHECKPOINT_BUCKET="off"))
    assert off.returncode == 10  # the repo alone holds no run


def test_a_token_that_cannot_read_is_one_line_and_its_own_code(hub_ctx: HubContext, tmp_path: Path) -> None:
    repo = hub_ctx.repo_id("yolo")
    put_repo_state(hub_ctx, repo, state())
    _, stranger = hub_ctx.new_user()
    with pytest.raises(RemoteReadError):
        remote.fetch_remote_state(Hub(token=stranger), repo)
    for token in (stranger, "hf_not_a_token_at_all_0123456789"):
        shown = trainbox("status", "--repo", repo, env=laptop(hub_ctx, tmp_path, token))
        assert shown.returncode == RemoteReadError.exit_code == 21, shown.stderr
        (line,) = shown.stderr.strip().splitlines()
        assert f"cannot read {repo}" in line and token not in line and shown.stdout == ""


def test_a_repo_without_a_run_and_bad_arguments(hub_ctx: HubContext, tmp_path: Path) -> None:
    repo = hub_ctx.repo_id("empty")
    hub_ctx.api().create_repo(repo, private=True)
    env = laptop(hub_ctx, tmp_path, CHECKPOINT_BUCKET="off")
    shown = trainbox("status", "--repo", repo, env=env)
    assert shown.returncode == 10 and f"{repo} holds no run yet" in shown.stderr
    assert trainbox("status", "--repo", "not a repo", env=env).returncode == 10
    assert trainbox("status", "--run", "x", env=env).returncode == 10


def test_watch_exits_with_the_runs_own_code(hub_ctx: HubContext, tmp_path: Path) -> None:
    repo = hub_ctx.repo_id("yolo")
    ended = state(phase="preempted", exit={"code": 143, "reason": "preempted", "message": "received SIGTERM"})
    put_repo_state(hub_ctx, repo, ended)
    shown = trainbox("status", "--repo", repo, "--watch", "--interval", "0.2", env=laptop(hub_ctx, tmp_path))
    assert shown.returncode == 143 and "outcome   preempted" in shown.stdout


# -- a Hub that does not answer, and files that are not what they should be ----------------------------
def closed_port() -> str:
    """An address where nothing listens: the connection is refused, as with no network."""
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{probe.getsockname()[1]}"


def test_no_network_is_one_line_and_its_own_code_within_30_s(hub_ctx: HubContext, tmp_path: Path) -> None:
    env = laptop(hub_ctx, tmp_path, HF_ENDPOINT=closed_port())
    started = time.monotonic()
    shown = trainbox("status", "--repo", "acme/yolo", env=env)
    assert time.monotonic() - started < 30
    assert shown.returncode == RemoteUnreachableError.exit_code == 22, shown.stderr
    (line,) = shown.stderr.strip().splitlines()  # no line of huggingface_hub's, no retry lines
    assert "ERROR: cannot reach the Hub at http://127.0.0.1:" in line and "check the network" in line
    assert shown.stdout == ""


def test_a_hub_that_accepts_and_never_answers_is_unreachable_within_the_bound(
    hub_ctx: HubContext, monkeypatch: pytest.MonkeyPatch
) -> None:
    import socket

    with socket.socket() as silent:  # connections queue in the backlog: accepted by the kernel, never answered
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        monkeypatch.setattr(remote, "LOOK_BOUND", 1.0)
        hub = Hub(token=hub_ctx.read_token, endpoint=f"http://127.0.0.1:{silent.getsockname()[1]}")
        started = time.monotonic()
        with pytest.raises(RemoteUnreachableError, match="no answer within 1 s"):
            remote.fetch_remote_state(hub, "acme/yolo")
        assert time.monotonic() - started < 5


def test_watch_keeps_the_last_view_through_a_blip(
    hub_ctx: HubContext, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    repo = hub_ctx.repo_id("yolo")
    put_repo_state(hub_ctx, repo, state(storage={"mode": "repo"}, progress={"epochs_done": 3, "epochs_total": 9}))
    reachable, unreachable = Hub(token=hub_ctx.read_token), Hub(token=hub_ctx.read_token, endpoint=closed_port())
    looks: list[str] = []

    def fetch() -> dict[str, Any] | None:
        looks.append("look")
        if len(looks) == 3:  # the blip over: the run ended meanwhile
            put_repo_state(hub_ctx, repo, state(phase="done", storage={"mode": "repo"}, exit={"code": 0}))
        return remote.fetch_remote_state(unreachable if len(looks) == 2 else reachable, repo, bucket=None)

    code = status.show_remote(fetch, repo, as_json=False, watch=True, interval=0.01)
    out = capsys.readouterr().out
    assert code == 0 and len(looks) == 3
    blip = out.split("stale     ", 1)
    assert len(blip) == 2 and "epoch     3/9" in blip[0].rsplit("run       ", 1)[1]  # the last view, kept
    said = "the Hub has not answered for \\d+ s: the view above is that old; giving up after 10m00 without an answer"
    assert re.match(said, blip[1]), blip[1]
    assert "outcome   done" in blip[1]


def test_watch_gives_up_after_its_bound(hub_ctx: HubContext, tmp_path: Path) -> None:
    unreachable = Hub(token=hub_ctx.read_token, endpoint=closed_port())
    with pytest.raises(RemoteUnreachableError, match="no answer for"):
        status.show_remote(
            lambda: remote.fetch_remote_state(unreachable, "acme/yolo"),
            "acme/yolo",
            as_json=False,
            watch=True,
            interval=0.01,
            give_up=0.5,
        )


def test_a_hostile_trainbox_json_is_read_defensively(
    hub_ctx: HubContext, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    repo = hub_ctx.repo_id("yolo")
    hostile = {
        "run_name": ["not", "text"],
        "phase": "done",
        "updated_at": 12,
        "progress": [3, 9],
        "metrics": {"best": "great", "mAP50": "high", "seconds_per_epoch": "slow"},
        "gpus": {"gpus": ["H100", {"name": 7}]},
        "storage": "bucket",
        "settings": "acme/yolo",
        "timeline": {"agent_started_at": "yesterday", "marks": []},
        "cost": {"hours": "many"},
        "phases": {"training": "long"},
        "exit": "boom",
    }
    put_repo_state(hub_ctx, repo, hostile)
    env = laptop(hub_ctx, tmp_path, CHECKPOINT_BUCKET="off")
    shown = trainbox("status", "--repo", repo, env=env)
    assert shown.returncode == 0, shown.stderr
    assert "run       ['not', 'text'] · " in shown.stdout and "epoch     0/?" in shown.stdout
    assert "GPU       1 × 7" in shown.stdout
    watched = trainbox("status", "--repo", repo, "--watch", "--interval", "0.1", env=env)
    assert watched.returncode == 1, watched.stderr  # an ended run without a readable exit code
    # a file far larger than a trainbox.json is not downloaded
    monkeypatch.setattr(remote, "STATE_MAX_BYTES", 100)
    assert remote.fetch_remote_state(Hub(token=hub_ctx.read_token), repo, bucket=None) is None


# -- while an agent trains ----------------------------------------------------------------------
def start_agent(hub_ctx: HubContext, tmp_path: Path, repo: str, **extra: str) -> subprocess.Popen[str]:
    fake_libreyolo.install(tmp_path / "bin")
    env = hub_ctx.env(
        WORKDIR=str(tmp_path / "box"),
        GPUS="cpu",
        OUTPUT_REPO=repo,
        RUN_NAME="follow",
        RUN_ARGS="epochs=6",
        FAKE_EPOCH_SECONDS="0.5",
        **held_after(tmp_path, 1),  # each epoch waits for a look at the one before (follow_while_training)
        TRAINBOX_LIBREYOLO=str(tmp_path / "bin" / "libreyolo"),
        PROVIDER="none",
        PRICE_PER_HOUR="1.5",
        **extra,
    )
    for key in ("DATASET_REPO", "MAX_RUNTIME", "STALL_TIMEOUT", "ON_EXIT", "ON_FAILURE"):
        env.pop(key, None)
    return subprocess.Popen(
        [sys.executable, "-m", "entrypoint", "run"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )


def volume_epochs(tmp_path: Path) -> int:
    try:
        return int(
            json.loads((tmp_path / "box" / "runs" / "follow" / "trainbox.json").read_text())["progress"]["epochs_done"]
        )
    except (OSError, ValueError, KeyError, TypeError):
        return 0


def follow_while_training(hub_ctx: HubContext, tmp_path: Path, repo: str, process: subprocess.Popen[str]) -> list[int]:
    """Look from the laptop while the box trains: the Hub's epoch never more than one boundary behind. The
    trainer goes past an epoch only once a look showed it, so a slow look (a loaded machine) misses none."""
    seen = []
    end = time.monotonic() + AGENT_TIMEOUT
    try:
        while process.poll() is None and time.monotonic() < end:
            before = volume_epochs(tmp_path)
            shown = trainbox("status", "--repo", repo, "--json", env=laptop(hub_ctx, tmp_path))
            if shown.returncode == 0:
                remote = json.loads(shown.stdout)
                if remote.get("phase") == "training":
                    epochs = int((remote.get("progress") or {}).get("epochs_done") or 0)
                    assert epochs >= before - 1, (
                        f"the Hub shows epoch {epochs}, the volume had {before} before the look"
                    )
                    seen.append(epochs)
                    open_gate(tmp_path, *range(1, epochs + 1))
            time.sleep(0.5)
        output, _ = process.communicate(timeout=AGENT_TIMEOUT)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.communicate()
    assert process.returncode == 0, output[-3000:]
    return seen


@pytest.mark.slow
def test_repo_mode_follows_the_run_then_shows_how_it_ended(hub_ctx: HubContext, tmp_path: Path) -> None:
    repo = hub_ctx.repo_id("follow")
    seen = follow_while_training(hub_ctx, tmp_path, repo, start_agent(hub_ctx, tmp_path, repo))
    assert len(set(seen)) >= 3, seen  # it moved, epoch by epoch
    shown = trainbox("status", "--repo", repo, env=laptop(hub_ctx, tmp_path))
    assert shown.returncode == 0, shown.stderr
    assert (
        "epoch     6/6" in shown.stdout and "outcome   done" in shown.stdout and "exit      0 (success)" in shown.stdout
    )
    assert f"working   repo {repo}" in shown.stdout and "cost      " in shown.stdout and "GPU       CPU" in shown.stdout
    watched = trainbox("status", "--repo", repo, "--watch", env=laptop(hub_ctx, tmp_path))
    assert watched.returncode == 0


@pytest.mark.slow
def test_bucket_mode_follows_the_bucket_not_the_milestones(hub_ctx: HubContext, tmp_path: Path) -> None:
    repo = hub_ctx.repo_id("follow")
    # The repo gets a milestone at most once an hour: only the bucket can keep the remote view current.
    process = start_agent(hub_ctx, tmp_path, repo, CHECKPOINT_BUCKET="", PUBLISH_EVERY="1h")
    seen = follow_while_training(hub_ctx, tmp_path, repo, process)
    assert len(set(seen)) >= 3, seen
    final = json.loads(trainbox("status", "--repo", repo, "--json", env=laptop(hub_ctx, tmp_path)).stdout)
    assert final["phase"] == "done" and final["progress"]["epochs_done"] == 6
    prefix = f"follow/{final['run_id']}"  # <RUN_NAME>/<run id>
    assert final["storage"] == {"mode": "bucket", "bucket": f"{repo}-checkpoints", "prefix": prefix}
    shown = trainbox("status", "--repo", repo, env=laptop(hub_ctx, tmp_path))
    assert f"working   bucket hf://buckets/{repo}-checkpoints/{prefix}" in shown.stdout
