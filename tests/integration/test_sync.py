"""Checkpoint sync to the model repo (CHECKPOINT_BUCKET=off) against the local Hub with the real client:
every epoch there, never torn. The agent runs the stand-in trainer (tests/fakes/libreyolo.py); the
uploader tests run it in-process."""

from __future__ import annotations

import io
import json
import os
import pickle
import shutil
import signal
import subprocess
import sys
import threading
import time
import zipfile
from pathlib import Path

import pytest

from entrypoint import errors
from entrypoint.hub import Hub
from entrypoint.sync.checkpoint import inspect, is_valid
from entrypoint.sync.uploader import Uploader
from tests.fakes import libreyolo as fake_libreyolo
from tests.fakes.hub import HubServer
from tests.hubfixtures import HubContext
from tests.integration.test_sync_command import write_epoch
from tests.integration.test_sync_faults import assert_no_duplicate_commit
from tests.support import held_after, open_gate, run_trainbox, start_trainbox, trainbox_env

pytestmark = pytest.mark.slow  # the agent tests run `trainbox run`; the others race real threads


def hub_json(hub: HubServer, repo: str, path: str, revision: str = "main") -> dict:
    return json.loads(hub.file_bytes(repo, path, revision=revision))


def _hub_epoch(hub: HubServer, repo: str) -> int:
    """The completed epochs of the repo's status.json, 0 while it has none."""
    try:
        return int(hub_json(hub, repo, "status.json").get("completed_epochs") or 0)
    except Exception:  # no repo, no file yet
        return 0


def assert_every_checkpoint_valid(hub: HubServer, repo: str) -> int:
    """Every .pt in every commit of ``repo`` is complete and safe; returns how many were checked."""
    checked: set[str] = set()
    for commit in hub.commits(repo):
        for entry in commit.files.values():
            if entry.path.endswith(".pt") and entry.sha256 not in checked:
                blob = hub.blob_path(repo, entry.path, revision=commit.oid)
                assert is_valid(blob), f"{entry.path} at {commit.oid[:8]} is not a complete checkpoint"
                checked.add(entry.sha256)
    return len(checked)


def agent_env(ctx: HubContext, workdir: Path, repo: str, **extra: str) -> dict[str, str]:
    """``trainbox run`` with the stand-in trainer (an epoch every ``FAKE_EPOCH_SECONDS``) on the demo data."""
    stand_in = fake_libreyolo.install(workdir.parent / "bin")
    return trainbox_env(
        workdir,
        HF_TOKEN=ctx.token,
        HF_HUB_CACHE=str(ctx.cache_dir),
        OUTPUT_REPO=repo,
        GPUS="cpu",
        TRAINBOX_LIBREYOLO=str(stand_in),
        **({"FAKE_EPOCH_SECONDS": "0.6"} | extra),
    )


def test_three_epochs_every_boundary_on_the_hub(hub_ctx: HubContext, tmp_path: Path) -> None:
    repo = hub_ctx.repo_id("yolo")
    workdir = tmp_path / "work"
    # Epochs slower than a commit, as real ones are: the next epoch starts once the boundary is on the Hub (a
    # timed pause loses that race on a loaded machine), so each boundary gets a commit of its own.
    env = agent_env(hub_ctx, workdir, repo, RUN_ARGS="epochs=3", **held_after(tmp_path, 1))
    hub = hub_ctx.hub
    log = tmp_path / "agent.log"  # a file, not a pipe nobody reads while the test waits on the Hub
    with log.open("w") as out:
        process = subprocess.Popen([sys.executable, "-m", "entrypoint", "run"], env=env, stdout=out, stderr=out)
        try:
            for epoch in (1, 2):
                deadline = time.monotonic() + 120
                while _hub_epoch(hub, repo) < epoch:
                    alive = process.poll() is None and time.monotonic() < deadline
                    assert alive, f"epoch {epoch} never on the Hub: {log.read_text()[-3000:]}"
                    time.sleep(0.1)
                open_gate(tmp_path, epoch)
            process.wait(timeout=180)
        finally:
            if process.poll() is None:
                process.kill()
    assert process.returncode == 0, log.read_text()[-3000:]

    files = hub.files(repo)
    run_dir = next((workdir / "runs").iterdir())
    for name in (
        "weights/last.pt",
        "weights/best.pt",
        "weights/epoch_1.pt",
        "weights/epoch_2.pt",
        "weights/epoch_3.pt",
        "status.json",
        "metrics.jsonl",
        "console.log",
        "trainbox.json",
    ):
        assert name in files, f"{name} missing on the Hub"
    # the repo mirrors the run folder, and its last.pt is the final local one
    assert hub.file_bytes(repo, "weights/last.pt") == (run_dir / "weights" / "last.pt").read_bytes()
    assert inspect(run_dir / "weights" / "last.pt").completed_epochs == 3
    assert hub_json(hub, repo, "trainbox.json")["phase"] == "done"
    local_state = json.loads((run_dir / "trainbox.json").read_text())
    assert hub_json(hub, repo, "trainbox.json")["run_id"] == local_state["run_id"]
    assert not hub.files(repo).keys() & {"data.yaml", ".trainbox"}

    # a commit per epoch boundary: each epoch's status.json was on the Hub at some commit
    epochs_seen = set()
    for commit in hub.commits(repo):
        if "status.json" in commit.files:
            status = hub_json(hub, repo, "status.json", revision=commit.oid)
            epochs_seen.add(status.get("completed_epochs"))
    assert {1, 2, 3} <= epochs_seen
    assert assert_every_checkpoint_valid(hub, repo) >= 3
    # the private repo was created for us
    assert hub_ctx.api(token=False).repo_exists(repo) is False


def _checkpoint_bytes(epoch: int, size: int) -> bytes:
    """A checkpoint of ``size`` bytes or so, as checkpoint.inspect reads one (a zip holding a pickle)."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        archive.writestr("ckpt/data.pkl", pickle.dumps({"epoch": epoch, "pad": os.urandom(size)}, protocol=4))
    return buffer.getvalue()


def _write_slowly(path: Path, data: bytes, stop: threading.Event) -> None:
    """Rewrite ``path`` in place, like torch.save: truncate, then write in small pieces."""
    while not stop.is_set():
        with path.open("wb") as handle:
            for start in range(0, len(data), 256 * 1024):
                handle.write(data[start : start + 256 * 1024])
                handle.flush()
                time.sleep(0.002)


@pytest.mark.transfer("xet")  # what it checks happens before the transfer: once is enough
def test_a_checkpoint_being_written_is_never_uploaded(hub_ctx: HubContext, tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    (run_dir / "weights").mkdir(parents=True)
    versions = [_checkpoint_bytes(epoch, 1024 * 1024) for epoch in range(3)]
    repo = hub_ctx.repo_id("torn")
    hub = Hub(token=hub_ctx.token)
    hub.ensure_writable_repo(repo)
    uploader = Uploader(hub, repo, run_dir, tmp_path / "sync", poll_interval=0.05)
    uploader.start()
    try:
        for epoch, data in enumerate(versions):
            stop = threading.Event()
            writer = threading.Thread(target=_write_slowly, args=(run_dir / "weights" / "last.pt", data, stop))
            writer.start()
            # boundaries fire while last.pt is being rewritten
            for tick in range(15):
                (run_dir / "status.tmp").write_text(json.dumps({"completed_epochs": epoch, "tick": tick}))
                os.replace(run_dir / "status.tmp", run_dir / "status.json")
                time.sleep(0.07)
            stop.set()
            writer.join()
        assert uploader.flush(60)
    finally:
        uploader.stop()
    assert uploader.snapshots.stager.refused, "the test never caught a file mid-write"
    assert assert_every_checkpoint_valid(hub_ctx.hub, repo) >= 1
    assert hub_ctx.hub.file_bytes(repo, "weights/last.pt") == versions[-1]


def test_faults_lose_nothing_and_tear_nothing(hub_ctx: HubContext, tmp_path: Path) -> None:
    hub = hub_ctx.hub
    api_paths = r"^/(api|[^_].*\.git/info/lfs|_lfs)/"
    for kind, extra in (("500", {}), ("503", {}), ("429", {"retry_after": 1}), ("reset", {})):
        hub.inject(kind, path=api_paths, share=0.05, seed=len(kind), **extra)
    # The first commits land but their answers are lost: the agent must not make them twice.
    lost = hub.inject("apply-then-reset", path=r"/commit/", times=2)
    repo = hub_ctx.repo_id("faulty")
    workdir = tmp_path / "work"
    result = run_trainbox("run", env=agent_env(hub_ctx, workdir, repo, RUN_ARGS="epochs=4"))
    assert sum(fault.fired for fault in hub.faults) > 0, "no fault was injected"
    hub.clear_faults()
    assert result.returncode == 0, result.output[-3000:]
    run_dir = next((workdir / "runs").iterdir())
    for name in ("weights/epoch_1.pt", "weights/epoch_2.pt", "weights/epoch_4.pt", "weights/best.pt"):
        assert hub.file_bytes(repo, name) == (run_dir / name).read_bytes()
    assert hub.file_bytes(repo, "weights/last.pt") == (run_dir / "weights" / "last.pt").read_bytes()
    assert hub_json(hub, repo, "trainbox.json")["phase"] == "done"
    assert assert_every_checkpoint_valid(hub, repo) >= 4
    # a commit whose answer was lost was not made twice (and the faults did lose some answers)
    assert lost.fired == 2
    assert_no_duplicate_commit(hub, repo)


def test_restart_does_not_upload_unchanged_files_again(hub_ctx: HubContext, tmp_path: Path) -> None:
    run_dir = tmp_path / "runs" / "ledger"
    write_epoch(run_dir, 1, state="completed")
    (run_dir / "metrics.jsonl").write_text(json.dumps({"epoch": 1, "loss": 1.0}) + "\n")  # libreyolo's row
    repo = hub_ctx.repo_id("ledger")
    env = trainbox_env(tmp_path / "work", HF_TOKEN=hub_ctx.token, HF_HUB_CACHE=str(hub_ctx.cache_dir), OUTPUT_REPO=repo)

    first = run_trainbox("sync", str(run_dir), "--once", env=env, timeout=300)
    assert first.returncode == 0, first.output[-2000:]
    assert hub_ctx.hub.file_bytes(repo, "weights/last.pt") == (run_dir / "weights" / "last.pt").read_bytes()
    commits_before = len(hub_ctx.hub.commits(repo))
    hub_ctx.hub.reset_log()

    again = run_trainbox("sync", str(run_dir), "--once", env=env, timeout=300)
    assert again.returncode == 0, again.output[-2000:]
    assert hub_ctx.hub.find_requests(method="PUT", path=r"^/_lfs/") == []  # no LFS upload
    assert hub_ctx.hub.find_requests(path=r"/xet-write-token/") == []  # no Xet upload either
    assert hub_ctx.hub.find_requests(method="POST", path=r"/commit/") == []
    assert len(hub_ctx.hub.commits(repo)) == commits_before

    # the ledger is not trusted blindly: a file changed on the Hub by someone else is put back
    hub_ctx.hub.upload_bytes(repo, "weights/last.pt", b"overwritten by hand")
    third = run_trainbox("sync", str(run_dir), "--once", env=env, timeout=300)
    assert third.returncode == 0
    assert hub_ctx.hub.file_bytes(repo, "weights/last.pt") == (run_dir / "weights" / "last.pt").read_bytes()


@pytest.mark.transfer("xet")  # what it checks happens before the transfer: once is enough
def test_sigterm_mid_epoch(hub_ctx: HubContext, tmp_path: Path) -> None:
    repo = hub_ctx.repo_id("preempt")
    workdir = tmp_path / "work"
    process = start_trainbox("run", env=agent_env(hub_ctx, workdir, repo, RUN_ARGS="epochs=60"))
    hub = hub_ctx.hub
    try:
        deadline = time.monotonic() + 300
        completed = 0
        while time.monotonic() < deadline and process.poll() is None:
            if hub.repo_exists(repo) and "status.json" in hub.files(repo):
                completed = hub_json(hub, repo, "status.json").get("completed_epochs") or 0
                if completed >= 2:
                    break
            time.sleep(0.2)
        assert completed >= 2, "training never reached epoch 2"
        process.send_signal(signal.SIGTERM)
        output, _ = process.communicate(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode == errors.PreemptedError.exit_code, output[-3000:]
    run_dir = next((workdir / "runs").iterdir())
    done_locally = json.loads((run_dir / "status.json").read_text()).get("completed_epochs")
    state = hub_json(hub, repo, "trainbox.json")
    assert state["phase"] == "preempted"
    assert state["exit"]["code"] == 143
    last = inspect(hub.blob_path(repo, "weights/last.pt"))
    assert last.completed_epochs is not None and last.completed_epochs >= done_locally
    assert f"weights/epoch_{done_locally}.pt" in hub.files(repo)
    assert assert_every_checkpoint_valid(hub, repo) >= 2


@pytest.mark.transfer("xet")  # what it checks happens before the transfer: once is enough
def test_secret_canary_appears_nowhere(hub_ctx: HubContext, tmp_path: Path) -> None:
    canary = hub_ctx.token  # the real token of this run: it must never leave the agent
    repo = hub_ctx.repo_id("canary")
    workdir = tmp_path / "work"
    run_name = "canary-run"
    run_dir = workdir / "runs" / run_name
    run_dir.mkdir(parents=True)
    # something in the run folder echoes the token (a misbehaving logger, a URL with credentials)
    (run_dir / "notes.txt").write_text(f"download https://user:{canary}@example.com/x failed\n")
    env = agent_env(hub_ctx, workdir, repo, RUN_NAME=run_name, RUN_ARGS=f"epochs=1 name2={canary}")
    result = run_trainbox("run", env=env)
    assert canary not in result.output
    # name2 is not a libreyolo option: the one-line error must not echo the token either
    assert result.returncode == errors.ConfigError.exit_code

    result = run_trainbox("run", env=agent_env(hub_ctx, workdir, repo, RUN_NAME=run_name, RUN_ARGS="epochs=1"))
    assert result.returncode == 0, result.output[-2000:]
    assert canary not in result.output
    hub = hub_ctx.hub
    assert "notes.txt" in hub.files(repo)
    for commit in hub.commits(repo):
        for entry in commit.files.values():
            assert canary.encode() not in hub.blob_path(repo, entry.path, revision=commit.oid).read_bytes()
    for path in workdir.rglob("*"):
        if path.is_file() and path != run_dir / "notes.txt":
            assert canary.encode() not in path.read_bytes(), f"the token leaked into {path}"
    shutil.rmtree(workdir)


class _SlowHub(Hub):
    """The real client, with time for the run folder to change while a commit is in flight."""

    def commit(self, *args, **kwargs):
        time.sleep(0.8)
        return super().commit(*args, **kwargs)


def test_a_file_changing_during_a_commit_does_not_break_it(hub_ctx: HubContext, tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    repo = hub_ctx.repo_id("inflight")
    hub = _SlowHub(token=hub_ctx.token)
    hub.ensure_writable_repo(repo)
    uploader = Uploader(hub, repo, run_dir, tmp_path / "sync", poll_interval=0.05)
    uploader.start()
    failures: list[str] = []
    try:
        for version in range(6):
            (run_dir / "console.log").write_text(f"line {version}\n" * (version + 1))
            uploader.snapshot()  # stages a newer copy while the previous commit still reads the old one
            time.sleep(0.3)
            if uploader.last_error:
                failures.append(uploader.last_error)
        assert uploader.flush(60)
    finally:
        uploader.stop()
    assert failures == []
    assert hub_ctx.hub.file_bytes(repo, "console.log") == b"line 5\n" * 6
