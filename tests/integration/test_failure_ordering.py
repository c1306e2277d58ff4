"""Whatever fails first, nothing is lost and nothing keeps billing.

Real ``trainbox run`` processes against the local Hub and provider fakes, with a stand-in (tests/fakes/libreyolo.py)
``libreyolo`` that writes real (tiny) checkpoints epoch by epoch, like libreyolo: the weights,
then ``status.json`` renamed last. Faults arrive in each phase: SIGTERM (extraction included),
SIGKILL then a restart (same volume, new volume), a revoked token, a Hub that rate-limits for an
hour, Hub errors and dropped connections, a disk that really fills up (a small tmpfs; skipped
where mounting is not permitted), a child that ignores signals. After each, the invariants:

* no epoch that was on the volume is lost: on the volume, or on the Hub;
* the Hub never goes back to an older state;
* the machine is destroyed only when the Hub holds the run (else stopped);
* the process exits within its bound after SIGTERM, with the code trainbox.json states;
* no secret anywhere.
"""

from __future__ import annotations

import contextlib
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
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from entrypoint import pipeline, settings
from entrypoint.dataset import PreparedDataset
from entrypoint.errors import AccessError, ConfigError, DiskSpaceError, LeaseRefusedError, PreemptedError, SyncError
from entrypoint.release.clock import PREEMPT_BUDGET
from entrypoint.state import Phase
from entrypoint.sync.bucket import Manifest
from entrypoint.sync.checkpoint import inspect
from entrypoint.training import process as training
from tests.fakes import libreyolo as fake_libreyolo
from tests.fakes.hub import HubServer
from tests.fakes.providers import FakeVast
from tests.hubfixtures import HubContext
from tests.integration.test_sync_faults import assert_no_duplicate_commit
from tests.support import held_after, make_dataset

# every test here runs `trainbox run` (the stand-in libreyolo trains for seconds) and breaks it
pytestmark = pytest.mark.slow

VAST_KEY = "vast-canary-key-0rd3r1ng5"
AGENT_TIMEOUT = 120
# SIGTERM → exit: the agent's budget plus the start-up of a loaded machine's Python; a step that
# ignores the deadline (a 30 s retry, a 60 s publish, a 5 s join) overshoots it by far.
EXIT_BOUND = PREEMPT_BUDGET + 4.0
# A rate limit from the run's start spares the lease's take (the first commit): a lease refused that long ends
# the start (74; tests/integration/test_protocol_orderings.py), and these test what comes after.
LEASE_TAKE = 1


@dataclass
class Agent:
    """``trainbox run`` with the demo dataset on the CPU, the stand-in libreyolo, a volume
    (WORKDIR) of this test, and OUTPUT_REPO on the local Hub."""

    tmp_path: Path
    hub_ctx: HubContext
    repo: str
    volume: Path

    def env(self, provider: FakeVast | None = None, **extra: str) -> dict[str, str]:
        drop = {"CONTAINER_ID", "CONTAINER_API_KEY", "RUNPOD_POD_ID", "RUNPOD_API_KEY"}
        env = {key: value for key, value in self.hub_ctx.env().items() if key not in drop}
        for key in ("RUN_ARGS", "MAX_RUNTIME", "STALL_TIMEOUT", "ON_EXIT", "ON_FAILURE", "DATASET_REPO"):
            env.pop(key, None)
        env.update(
            WORKDIR=str(self.volume),
            GPUS="cpu",
            OUTPUT_REPO=self.repo,
            RUN_NAME="order",
            RUN_ARGS="epochs=4",
            FAKE_EPOCH_SECONDS="0.3",
            TRAINBOX_LIBREYOLO=str(self.tmp_path / "bin" / "libreyolo"),
            PROVIDER=provider.kind if provider else "none",
        )
        return {**env, **(provider.env() if provider else {}), **extra}

    def start(self, env: dict[str, str]) -> subprocess.Popen[str]:
        return subprocess.Popen(
            [sys.executable, "-m", "entrypoint", "run"],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,  # SIGKILL of the test's choosing reaches the whole tree
        )

    def run(self, env: dict[str, str]) -> tuple[int, str]:
        process = self.start(env)
        try:
            output, _ = process.communicate(timeout=AGENT_TIMEOUT)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)  # never leave an agent behind
            output, _ = process.communicate()
            pytest.fail(f"no exit within {AGENT_TIMEOUT} s\n{output[-3000:]}")
        return process.returncode, output

    @property
    def run_dir(self) -> Path:
        return self.volume / "runs" / "order"

    def state(self) -> dict[str, Any]:
        return json.loads((self.run_dir / "trainbox.json").read_text())

    def hub_state(self) -> dict[str, Any]:
        return json.loads(self.hub_ctx.hub.file_bytes(self.repo, "trainbox.json"))

    def hub_files(self) -> dict[str, Any]:
        hub = self.hub_ctx.hub
        return hub.files(self.repo) if hub.repo_exists(self.repo) else {}


@pytest.fixture
def agent(tmp_path: Path, hub_ctx: HubContext) -> Agent:
    fake_libreyolo.install(tmp_path / "bin")
    return Agent(tmp_path, hub_ctx, hub_ctx.repo_id("order"), tmp_path / "volume")


@pytest.fixture
def vast() -> Iterator[FakeVast]:
    with FakeVast("4242", VAST_KEY) as server:
        yield server


def wait_for(condition: Callable[[], bool], what: str, process: subprocess.Popen[str] | None = None) -> None:
    end = time.monotonic() + AGENT_TIMEOUT
    while not condition():
        if process is not None and process.poll() is not None:
            pytest.fail(f"the agent exited ({process.returncode}) before: {what}\n{process.stdout.read()[-3000:]}")
        assert time.monotonic() < end, f"never happened: {what}"
        time.sleep(0.02)


def local_phase(agent: Agent) -> str | None:
    try:
        return agent.state().get("phase")
    except (OSError, ValueError):
        return None


def sigterm(process: subprocess.Popen[str]) -> tuple[int, str]:
    """SIGTERM, then the exit must come within the bound."""
    process.send_signal(signal.SIGTERM)
    try:
        output, _ = process.communicate(timeout=EXIT_BOUND)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        output, _ = process.communicate()
        pytest.fail(f"no exit within {EXIT_BOUND:.0f} s of SIGTERM\n{output[-3000:]}")
    return process.returncode, output


# -- the invariants --------------------------------------------------------------------------
def epochs_on_volume(run_dir: Path) -> dict[str, bytes]:
    weights = run_dir / "weights"
    return {f"weights/{p.name}": p.read_bytes() for p in weights.glob("epoch_*.pt")} if weights.is_dir() else {}


def hub_epochs(hub: HubServer, repo: str) -> set[str]:
    return {name for name in hub.files(repo) if name.startswith("weights/epoch_")} if hub.repo_exists(repo) else set()


def assert_never_older(hub: HubServer, repo: str) -> None:
    """From commit to commit, the Hub's last.pt and status.json never go back in epochs."""
    if not hub.repo_exists(repo):
        return
    newest = {"weights/last.pt": 0, "status.json": 0}
    for commit in reversed(hub.commits(repo)):  # oldest first
        for name in newest:
            if name not in commit.files:
                continue
            blob = hub.blob_path(repo, name, revision=commit.oid)
            if name.endswith(".pt"):
                epoch = inspect(blob).completed_epochs or 0
            else:
                epoch = json.loads(blob.read_bytes()).get("completed_epochs") or 0
            assert epoch >= newest[name], f"{name} went back from epoch {newest[name]} to {epoch} at {commit.oid[:8]}"
            newest[name] = epoch


def assert_invariants(
    agent: Agent, code: int, output: str, before: dict[str, bytes], vast: FakeVast | None = None
) -> None:
    hub = agent.hub_ctx.hub
    state = agent.state()
    assert state["exit"]["code"] == code, f"trainbox.json says {state['exit']}, the process exited {code}"
    # Every epoch that was on the volume is still there, or on the Hub.
    now = epochs_on_volume(agent.run_dir)
    on_hub = hub_epochs(hub, agent.repo)
    for name, data in before.items():
        assert now.get(name) == data or name in on_hub, f"{name} was lost"
    assert_never_older(hub, agent.repo)
    if hub.repo_exists(agent.repo):
        assert_no_duplicate_commit(hub, agent.repo)
    if vast is not None and any(action.method == "DELETE" for action in vast.actions()):
        for name, data in now.items():
            assert name in on_hub and hub.file_bytes(agent.repo, name) == data, f"destroyed without {name} on the Hub"
    secrets = (agent.hub_ctx.token, VAST_KEY)
    texts = [output, json.dumps(state)]
    if hub.repo_exists(agent.repo):
        texts += [hub.file_bytes(agent.repo, name).decode(errors="replace") for name in hub.files(agent.repo)]
    for text in texts:
        for secret in secrets:
            assert secret not in text


# -- SIGTERM in each phase -------------------------------------------------------------------
PHASES = ["preflight", "resume", "dataset", "first-epoch", "commit"]


@pytest.mark.parametrize("moment", PHASES)
def test_sigterm_at_any_moment(agent: Agent, moment: str) -> None:
    hub = agent.hub_ctx.hub
    extra: dict[str, str] = {}
    if moment in {"preflight", "resume"}:
        # Hold the phase open: a slow answer from the Hub while the agent checks access / lists the repo.
        path = r"/whoami" if moment == "preflight" else r"/tree/"
        fault = hub.inject("slow", path=path, rate=40, times=1)
    elif moment == "commit":
        # A commit in flight: applied by the Hub, its answer trickling back for many seconds.
        fault = hub.inject("slow", method="POST", path=r"/commit/", rate=10, times=1)
    else:
        fault = None
    if moment in {"first-epoch", "commit"}:
        extra["FAKE_EPOCH_SECONDS"] = "1.0"
    process = agent.start(agent.env(**extra))
    target = {"preflight": "preflight", "resume": "resume", "dataset": "dataset", "first-epoch": "training"}
    if moment in target:
        wait_for(lambda: local_phase(agent) == target[moment], f"phase {target[moment]}", process)
        if fault is not None:
            wait_for(lambda: fault.fired >= 1, "the slow request", process)
    else:
        wait_for(lambda: fault.fired >= 1, "a commit in flight", process)
    before = epochs_on_volume(agent.run_dir)

    code, output = sigterm(process)

    assert code == PreemptedError.exit_code, output[-3000:]
    assert agent.state()["phase"] == Phase.PREEMPTED
    hub.clear_faults()
    assert_invariants(agent, code, output, before)


def test_sigterm_during_a_long_final_upload_exits_in_time(agent: Agent) -> None:
    hub = agent.hub_ctx.hub
    # The Hub holds commits for 100 s: the final upload (600 s allowed) waits for it...
    hub.inject("429", method="POST", path=r"/commit/", skip=LEASE_TAKE, retry_after=100)
    process = agent.start(agent.env(RUN_ARGS="epochs=2"))
    wait_for(lambda: local_phase(agent) == Phase.DONE, "the final upload", process)
    before = epochs_on_volume(agent.run_dir)

    code, output = sigterm(process)  # ...until the machine is taken back

    assert code == SyncError.exit_code, output[-3000:]  # the job had trained; its upload is what failed
    hub.clear_faults()
    assert_invariants(agent, code, output, before)


def test_a_child_that_ignores_signals_is_killed_within_the_bound(agent: Agent) -> None:
    process = agent.start(agent.env(FAKE_TRAIN_MODE="deaf", FAKE_EPOCH_SECONDS="0.5", RUN_ARGS="epochs=100"))
    wait_for(lambda: "weights/epoch_1.pt" in agent.hub_files(), "epoch 1 on the Hub", process)
    code, output = sigterm(process)
    assert code == PreemptedError.exit_code, output[-3000:]
    child = int((agent.run_dir / "fake-pid").read_text())
    with pytest.raises(ProcessLookupError):
        os.kill(child, 0)
    assert_invariants(agent, code, output, {})
    assert "weights/epoch_1.pt" in agent.hub_files()


# -- SIGKILL, then a restart -----------------------------------------------------------------
@pytest.mark.parametrize("volume", ["same", "new"])
def test_sigkill_then_restart_loses_no_epoch(agent: Agent, volume: str) -> None:
    env = agent.env(FAKE_EPOCH_SECONDS="0.6", RUN_ARGS="epochs=5")
    process = agent.start(env)
    wait_for(lambda: "weights/epoch_2.pt" in agent.hub_files(), "epoch 2 on the Hub", process)
    os.killpg(process.pid, signal.SIGKILL)  # the agent and its child, without a word
    process.communicate()
    before = epochs_on_volume(agent.run_dir)
    if volume == "new":
        agent.volume = agent.tmp_path / "volume2"
        env = agent.env(FAKE_EPOCH_SECONDS="0.1", RUN_ARGS="epochs=5")

    code, output = agent.run(env | {"FAKE_EPOCH_SECONDS": "0.1"})

    assert code == 0, output[-3000:]
    state = agent.state()
    assert state["phase"] == Phase.DONE
    assert state["attempts"][-2]["reason"] == "lost"
    assert state["resume"]["from"] == ("volume" if volume == "same" else "hub")
    assert {f"weights/epoch_{n}.pt" for n in range(1, 6)} <= hub_epochs(agent.hub_ctx.hub, agent.repo)
    assert_invariants(agent, code, output, before if volume == "same" else {})


def test_an_old_volume_never_overwrites_a_newer_hub(agent: Agent) -> None:
    """Volume A trained 2 epochs; a new machine went on to 4 from the Hub; then A comes back."""
    env = agent.env(RUN_ARGS="epochs=2")
    assert agent.run(env)[0] == 0
    old_volume = agent.tmp_path / "old-volume"
    shutil.copytree(agent.volume, old_volume, symlinks=True)
    agent.volume = agent.tmp_path / "volume2"
    code, output = agent.run(agent.env(RUN_ARGS="epochs=4", RUN_NAME="order"))
    assert code == 0, output[-3000:]
    assert inspect(agent.hub_ctx.hub.blob_path(agent.repo, "weights/last.pt")).completed_epochs == 4

    agent.volume = old_volume  # the old disk is back, 2 epochs behind the Hub
    code, output = agent.run(agent.env(RUN_ARGS="epochs=6", RUN_NAME="order"))

    assert code == 0, output[-3000:]
    assert agent.state()["resume"] == {"from": "hub", "epochs_done": 4}
    assert_never_older(agent.hub_ctx.hub, agent.repo)
    assert inspect(agent.hub_ctx.hub.blob_path(agent.repo, "weights/last.pt")).completed_epochs == 6


# -- the token, the Hub, the release ---------------------------------------------------------
def test_a_revoked_token_mid_run_is_an_honest_74_and_no_destroy(agent: Agent, vast: FakeVast) -> None:
    env = agent.env(vast, FAKE_EPOCH_SECONDS="1.0", RUN_ARGS="epochs=3", ON_EXIT="destroy", ON_FAILURE="destroy")
    process = agent.start(env)
    wait_for(lambda: "weights/epoch_1.pt" in agent.hub_files(), "epoch 1 on the Hub", process)
    agent.hub_ctx.hub.remove_token(agent.hub_ctx.token)
    output, _ = process.communicate(timeout=AGENT_TIMEOUT)
    code = process.returncode

    # The run's lease can no longer be read (401): never a licence to write on, the attempt stops, naming the token.
    assert code == LeaseRefusedError.exit_code, output[-3000:]
    assert "give HF_TOKEN write access to OUTPUT_REPO" in output
    state = agent.state()
    assert state["exit"]["code"] == LeaseRefusedError.exit_code
    # The Hub lacks the last epochs: the disk is kept (stopped), never destroyed.
    assert [action.method for action in vast.actions()] == ["PUT"]
    assert state["release"]["action"] == "stop" and state["release"]["downgraded_from"] == "destroy"
    assert_invariants(agent, code, output, epochs_on_volume(agent.run_dir), vast)


def test_a_failure_before_the_upload_never_destroys_the_only_copy(agent: Agent, vast: FakeVast) -> None:
    # An earlier attempt trained 2 epochs while the Hub refused every commit after its lease: on this disk only.
    refusing = agent.hub_ctx.hub.inject("403", method="POST", path=r"/commit/", skip=LEASE_TAKE)
    code, output = agent.run(agent.env(RUN_ARGS="epochs=2"))
    assert code == SyncError.exit_code, output[-3000:]
    refusing.remove()
    before = epochs_on_volume(agent.run_dir)
    assert len(before) == 2 and not hub_epochs(agent.hub_ctx.hub, agent.repo)

    # The restart fails at once (the token expired meanwhile), with ON_FAILURE=destroy.
    agent.hub_ctx.hub.remove_token(agent.hub_ctx.token)
    code, output = agent.run(agent.env(vast, RUN_ARGS="epochs=2", ON_FAILURE="destroy"))

    assert code == AccessError.exit_code, output[-3000:]
    assert "the Hub is not known to hold this volume's checkpoints" in output  # OUTPUT_REPO was asked for
    assert "next: " not in output  # no next steps after a failure
    assert [action.method for action in vast.actions()] == ["PUT"], "the disk with the only copy was destroyed"
    assert agent.state()["release"]["downgraded_from"] == "destroy"
    assert_invariants(agent, code, output, before, vast)


def test_a_failure_with_nothing_on_the_volume_still_destroys(agent: Agent, vast: FakeVast) -> None:
    agent.hub_ctx.hub.remove_token(agent.hub_ctx.token)
    code, output = agent.run(agent.env(vast, ON_FAILURE="destroy"))
    assert code == AccessError.exit_code, output[-3000:]
    assert [action.method for action in vast.actions()] == ["DELETE"]


def test_a_checkpoint_the_sync_refused_never_lets_the_disk_be_destroyed(agent: Agent, vast: FakeVast) -> None:
    # epoch_1.pt is whole but holds the token: the sync refuses it, so only this disk holds that epoch.
    code, output = agent.run(agent.env(vast, RUN_ARGS="epochs=2", ON_EXIT="destroy", FAKE_SECRET="epoch_1.pt@1"))

    assert code == 0, output[-3000:]
    assert agent.hub_ctx.token.encode() in (agent.run_dir / "weights" / "epoch_1.pt").read_bytes()
    assert "weights/epoch_1.pt" not in agent.hub_files()
    assert [action.method for action in vast.actions()] == ["PUT"], "destroyed while the Hub lacks epoch_1.pt"
    assert agent.state()["release"]["downgraded_from"] == "destroy"
    assert "the Hub lacks checkpoints the sync refused: weights/epoch_1.pt (it contains a secret value)" in output
    assert agent.hub_ctx.token not in output


def test_a_torn_checkpoint_holds_nothing_to_keep_and_the_disk_is_destroyed(agent: Agent, vast: FakeVast) -> None:
    # epoch_1.pt is left 0 bytes (a trainer stopped mid-save): no copy anywhere could hold more.
    code, output = agent.run(agent.env(vast, RUN_ARGS="epochs=2", ON_EXIT="destroy", FAKE_TORN="epoch_1.pt@1"))

    assert code == 0, output[-3000:]
    assert (agent.run_dir / "weights" / "epoch_1.pt").stat().st_size == 0
    assert "torn on this volume, nothing in them to keep: weights/epoch_1.pt" in output
    assert [action.method for action in vast.actions()] == ["DELETE"], "a worthless file kept a machine billing"
    assert "downgraded_from" not in agent.state()["release"]
    assert agent.hub_ctx.hub.file_bytes(agent.repo, "weights/epoch_2.pt")  # the run itself is on the Hub


def test_an_hour_long_rate_limit_ends_the_final_upload_honestly(agent: Agent, vast: FakeVast) -> None:
    hub = agent.hub_ctx.hub
    limited = hub.inject("429", method="POST", path=r"/commit/", skip=LEASE_TAKE, retry_after=3600)
    code, output = agent.run(agent.env(vast, RUN_ARGS="epochs=2", ON_EXIT="destroy"))

    assert code == SyncError.exit_code, output[-3000:]
    assert limited.fired == 1, "commits went on while the Hub asked for an hour of quiet"
    assert agent.state()["exit"]["code"] == SyncError.exit_code
    assert [action.method for action in vast.actions()] == ["PUT"]
    hub.clear_faults()
    assert_invariants(agent, code, output, epochs_on_volume(agent.run_dir), vast)


def test_with_every_epoch_in_the_bucket_a_failed_final_publish_still_destroys(agent: Agent, vast: FakeVast) -> None:
    """Destroy when bucket + repo hold every epoch; the repo's final publish is reported, not required."""
    hub = agent.hub_ctx.hub
    limited = hub.inject("429", method="POST", path=r"/commit/", skip=LEASE_TAKE, retry_after=3600)
    code, output = agent.run(agent.env(vast, RUN_ARGS="epochs=2", ON_EXIT="destroy", CHECKPOINT_BUCKET=""))

    assert code == SyncError.exit_code, output[-3000:]  # the model repo lacks the final publish: said so
    assert limited.fired >= 1
    state = agent.state()
    assert state["sync"]["final_publish"]["done"] is False
    bucket_id = agent.repo + "-checkpoints"
    bucket = hub.bucket_files(bucket_id)
    manifests = [Manifest.parse(key, hub.bucket_bytes(bucket_id, key)) for key in bucket if "/manifests/" in key]
    (whole,) = [m for m in manifests if m is not None and m.whole({k: e.size for k, e in bucket.items()})]
    assert whole.key.startswith(f"order/{state['run_id']}/") and whole.epoch == 2
    assert {"weights/last.pt", "weights/epoch_2.pt"} <= set(whole.files)
    assert [action.method for action in vast.actions()] == ["DELETE"], "the bucket holds every epoch"
    assert "downgraded_from" not in state["release"]
    hub.clear_faults()


def test_a_repo_without_proof_of_this_run_is_refused(agent: Agent) -> None:
    hub = agent.hub_ctx.hub
    # Another run, mirrored with `trainbox sync` from a plain libreyolo folder: no trainbox.json.
    hub.create_repo(agent.repo, private=True)
    checkpoint = agent.tmp_path / "foreign.pt"
    with zipfile.ZipFile(checkpoint, "w") as archive:
        archive.writestr("ckpt/data.pkl", pickle.dumps({"epoch": 9, "config": {"epochs": 10}}, protocol=2))
    hub.upload_file(agent.repo, "weights/last.pt", checkpoint)
    commits = len(hub.commits(agent.repo))

    code, output = agent.run(agent.env(RUN_ARGS="epochs=10"))

    assert code == ConfigError.exit_code, output[-3000:]
    assert "trainbox.json" in output and agent.repo in output
    assert len(hub.commits(agent.repo)) == commits  # nothing of it was resumed, judged or overwritten
    assert not (agent.run_dir / "weights").exists()


# -- SIGTERM mid-extraction ------------------------------------------------------------------
@pytest.mark.transfer("lfs")  # a plain HTTP stream, which the Hub can slow down
def test_sigterm_mid_extraction_keeps_no_half_dataset_and_the_restart_finishes(agent: Agent, tmp_path: Path) -> None:
    from tests.integration.test_dataset_hub import dataset_tar, publish

    hub = agent.hub_ctx.hub
    blob = os.urandom(4 * 1024 * 1024)
    tar = dataset_tar(tmp_path, extra={"cones/extras/blob.bin": blob})
    repo = publish(agent.hub_ctx, {"cones.tar": tar})
    env = agent.env(DATASET_REPO=repo, RUN_ARGS="epochs=2")
    # The tar trickles in; the extraction, overlapped with the download, is held half-way through.
    slow = hub.inject("slow", method="GET", path=r"/datasets/.*/resolve/", rate=512 * 1024)
    store = agent.volume / "data" / "hub" / repo.replace("/", "--")
    process = agent.start(env)
    wait_for(lambda: any(store.glob(".*.staging/tree/cones/images/train/*.png")), "files extracted", process)

    code, output = sigterm(process)

    assert code == PreemptedError.exit_code, output[-3000:]
    assert agent.state()["phase"] == Phase.PREEMPTED
    assert not list(store.glob("*--cones.tar")), "a half-extracted dataset looks ready"
    (partial,) = (store.parent / ".downloads").glob("*.part")
    kept = partial.stat().st_size
    assert 0 < kept < tar.stat().st_size
    assert_invariants(agent, code, output, {})

    slow.remove()
    hub.reset_log()
    code, output = agent.run(env)  # the same env, after the machine came back

    assert code == 0, output[-3000:]
    assert agent.state()["phase"] == Phase.DONE
    (entry,) = store.glob("*--cones.tar")
    assert (entry / "tree" / "cones" / "extras" / "blob.bin").read_bytes() == blob
    assert (entry / "tree" / "cones" / "images" / "train" / "000.png").is_file()
    (get,) = hub.find_requests(method="GET", path=r"/datasets/.*/resolve/")
    assert get.range == f"bytes={kept}-"  # the download went on from the bytes kept, the extraction anew
    assert not list(store.glob(".*.staging")) and not partial.exists()
    assert {"weights/epoch_1.pt", "weights/epoch_2.pt"} <= hub_epochs(hub, agent.repo)
    assert_invariants(agent, code, output, {})


# -- a full disk -----------------------------------------------------------------------------
@pytest.fixture
def small_disk() -> Iterator[Callable[[Path, str], Path]]:
    """``mount(folder, size)``: a tmpfs of ``size`` (mount's syntax: 64k, 8m) at ``folder``, a disk
    that really fills up; skips where mounting is not permitted (needs root or CAP_SYS_ADMIN, or a
    password-less sudo as on CI runners: the tmpfs is then owned by the test's user)."""
    mounted: list[Path] = []
    sudo = [] if os.geteuid() == 0 else ["sudo", "-n"]

    def mount(folder: Path, size: str) -> Path:
        folder.mkdir(parents=True, exist_ok=True)
        options = f"size={size},uid={os.getuid()},gid={os.getgid()}"
        try:
            done = subprocess.run(
                [*sudo, "mount", "-t", "tmpfs", "-o", options, "tmpfs", str(folder)], capture_output=True, text=True
            )
        except FileNotFoundError:
            pytest.skip("a small real disk needs the mount command")
        if done.returncode != 0:
            pytest.skip(f"a small real disk needs `mount -t tmpfs` (root or CAP_SYS_ADMIN): {done.stderr.strip()}")
        mounted.append(folder)
        return folder

    yield mount
    for folder in reversed(mounted):
        subprocess.run([*sudo, "umount", "--lazy", str(folder)], check=False)


def fill_up(folder: Path, leave: int) -> None:
    """Fill the disk of ``folder`` until ``leave`` bytes are free (another process's files, say)."""
    free = shutil.disk_usage(folder).free
    with open(folder / "filler", "wb") as filler:
        filler.truncate(0)
        for _ in range(max(0, free - leave) // 65536):
            filler.write(b"\0" * 65536)


def test_a_disk_full_during_the_dataset_is_38_and_loses_nothing(
    agent: Agent, vast: FakeVast, small_disk: Callable[[Path, str], Path]
) -> None:
    small_disk(agent.volume, "24m")  # the demo dataset is 9 MB
    env = agent.env(vast, FAKE_EPOCH_SECONDS="0.6", RUN_ARGS="epochs=6", ON_FAILURE="destroy")
    process = agent.start(env)
    wait_for(lambda: "weights/epoch_2.pt" in agent.hub_files(), "epoch 2 on the Hub", process)
    os.killpg(process.pid, signal.SIGKILL)
    process.communicate()
    before = epochs_on_volume(agent.run_dir)
    # The dataset has to be written again on a disk that meanwhile filled up.
    shutil.rmtree(agent.volume / "data")
    fill_up(agent.volume, leave=256 * 1024)

    code, output = agent.run(env)

    assert code == DiskSpaceError.exit_code, output[-3000:]
    assert "no space left" in output.lower() or "disk" in output.lower()
    assert "Traceback" not in output
    assert agent.state()["phase"] == Phase.FAILED
    assert not (agent.volume / "data" / "demo").exists(), "the half-written dataset was left on the full disk"
    assert vast.actions(), "the machine was not released"
    assert_invariants(agent, code, output, before, vast)


def test_a_disk_full_while_staging_is_an_honest_70_and_no_destroy(
    agent: Agent, vast: FakeVast, small_disk: Callable[[Path, str], Path]
) -> None:
    # The upload's staging copies land on a disk with one page free: no checkpoint fits.
    small_disk(agent.volume / ".trainbox" / "order" / "sync", "4k")
    env = agent.env(vast, RUN_ARGS="epochs=2", ON_EXIT="destroy", ON_FAILURE="destroy")

    code, output = agent.run(env)

    assert code == SyncError.exit_code, output[-3000:]
    state = agent.state()
    assert state["exit"]["code"] == SyncError.exit_code and state["exit"]["job"]["code"] == 0
    assert state["sync"]["pending"] and "No space left" in (state["sync"]["last_error"] or ""), state["sync"]
    assert not hub_epochs(agent.hub_ctx.hub, agent.repo)
    assert [action.method for action in vast.actions()] == ["PUT"], "destroyed without the epochs on the Hub"
    assert state["release"]["downgraded_from"] == "destroy"
    assert len(epochs_on_volume(agent.run_dir)) == 2
    assert_invariants(agent, code, output, epochs_on_volume(agent.run_dir), vast)


def test_a_disk_full_during_training_still_releases_and_the_restart_finishes(
    agent: Agent, vast: FakeVast, small_disk: Callable[[Path, str], Path]
) -> None:
    small_disk(agent.volume, "24m")  # the demo dataset is 9 MB
    env = agent.env(vast, FAKE_EPOCH_SECONDS="0.3", RUN_ARGS="epochs=6", ON_FAILURE="destroy")
    process = agent.start(env | {"FAKE_EPOCH_SECONDS": "2"})  # the disk fills mid-epoch
    wait_for(lambda: "weights/epoch_1.pt" in agent.hub_files(), "epoch 1 on the Hub", process)
    # Another writer keeps the disk full (room the agent frees is taken again): the next checkpoint,
    # trainbox.json, the staging copies: nothing fits.
    stop = threading.Event()

    def keep_full() -> None:
        fd = os.open(agent.volume / "filler", os.O_WRONLY | os.O_CREAT | os.O_APPEND)
        try:
            while not stop.is_set():
                try:
                    os.write(fd, b"\0" * 4096)
                except OSError:
                    time.sleep(0.01)
        finally:
            os.close(fd)

    writer = threading.Thread(target=keep_full, daemon=True)
    writer.start()
    try:
        output, _ = process.communicate(timeout=AGENT_TIMEOUT)
    finally:
        stop.set()
        writer.join()

    assert process.returncode == DiskSpaceError.exit_code, output[-3000:]  # the disk, not the training
    assert "Traceback" not in output.split("libreyolo", 1)[0]
    assert "cannot write" in output and "trainbox.json" in output
    assert [action.method for action in vast.actions()] == ["PUT"], "the disk was not stopped, or destroyed"
    (agent.volume / "filler").unlink()  # room again: the same job on the same volume goes on

    code, output = agent.run(env)

    assert code == 0, output[-3000:]
    assert {f"weights/epoch_{n}.pt" for n in range(1, 7)} <= hub_epochs(agent.hub_ctx.hub, agent.repo)
    assert_invariants(agent, code, output, {}, vast)


def test_a_trainer_failing_with_no_space_left_is_the_disk_error_38(agent: Agent, vast: FakeVast) -> None:
    # The trainer dies writing epoch 2 with ENOSPC (libreyolo's torch.save on a full disk).
    code, output = agent.run(agent.env(vast, RUN_ARGS="epochs=3", ON_FAILURE="destroy", FAKE_TRAIN_MODE="enospc"))

    assert code == DiskSpaceError.exit_code, output[-3000:]
    state = agent.state()
    assert state["exit"]["code"] == DiskSpaceError.exit_code and state["exit"]["reason"] == "disk_too_small"
    assert "rent a bigger disk" in state["exit"]["message"]
    assert "weights/epoch_1.pt" in hub_epochs(agent.hub_ctx.hub, agent.repo)
    assert_invariants(agent, code, output, epochs_on_volume(agent.run_dir), vast)


def test_a_sigterm_while_the_trainer_starts_still_stops_it(
    agent: Agent, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    env = agent.env(FAKE_EPOCH_SECONDS="60")
    monkeypatch.setenv("TRAINBOX_LIBREYOLO", env["TRAINBOX_LIBREYOLO"])
    monkeypatch.setenv("FAKE_EPOCH_SECONDS", "60")
    job = pipeline.Job(settings.from_env(env))
    started: list[int] = []
    real_liveness = training.Liveness

    def sigterm_after_popen(pid: int, *rest: Any) -> Any:  # the child exists; the job does not hold it yet
        started.append(pid)
        job.on_signal(signal.SIGTERM, None)
        return real_liveness(pid, *rest)

    monkeypatch.setattr(training, "Liveness", sigterm_after_popen)
    data_yaml = tmp_path / "data.yaml"
    data_yaml.write_text("path: .\n")
    try:
        with pytest.raises(PreemptedError):
            job.training.train(PreparedDataset(data_yaml=data_yaml, root=tmp_path, description="test"), None, None)
        [pid] = started
        assert job.trainer is not None and job.trainer.pid == pid, "the started trainer is not tracked"
        assert not Path(f"/proc/{pid}").exists(), "the trainer outlived the SIGTERM"
    finally:
        for pid in started:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


# -- SIGKILL in each phase, then a restart on the same or a new volume -------------------------
KILL_PHASES = ["preflight", "resume", "dataset", "training", "sync", "finishing", "release"]


def hold_phase(agent: Agent, vast: FakeVast, phase: str) -> tuple[dict[str, str], Callable[[], bool]]:
    """Extra env and a condition: the next start of the job is held in ``phase`` once it is true."""
    hub = agent.hub_ctx.hub
    if phase == "preflight":  # a slow answer while the agent checks access
        fault = hub.inject("slow", path=r"/whoami", rate=40, times=1)
        return {}, lambda: local_phase(agent) == phase and fault.fired >= 1
    if phase == "resume":  # a slow listing of the repo while resume reads it (the first listing is preflight's)
        fault = hub.inject("slow", path=r"/tree/", rate=40, skip=1, times=1)
        return {}, lambda: local_phase(agent) == phase and fault.fired >= 1
    if phase == "dataset":  # the dataset check (libreyolo doctor) runs long beside the training's start
        return {"FAKE_DOCTOR_SECONDS": "60"}, lambda: local_phase(agent) == "dataset"
    if phase == "training":
        return {}, lambda: local_phase(agent) == "training" and (agent.run_dir / "fake-pid").exists()
    if phase == "sync":  # a commit applied by the Hub, its answer trickling back
        fault = hub.inject("slow", method="POST", path=r"/commit/", rate=10, times=1)
        return {}, lambda: fault.fired >= 1
    if phase == "finishing":  # the final upload waits out a rate limit
        fault = hub.inject("429", method="POST", path=r"/commit/", skip=LEASE_TAKE, retry_after=100)
        return {}, lambda: local_phase(agent) == Phase.DONE and fault.fired >= 1
    assert phase == "release"  # the provider answers 503, come back in a minute
    refusal = vast.fail(503, method="PUT", times=3, retry_after=60)
    return {}, lambda: refusal.times is not None and refusal.times < 3


def clear_faults(agent: Agent, vast: FakeVast) -> None:
    agent.hub_ctx.hub.clear_faults()
    for fault in vast._faults:
        fault.times = 0


@pytest.mark.parametrize("volume", ["same", "new"])
@pytest.mark.parametrize("phase", KILL_PHASES)
def test_sigkill_in_any_phase_then_a_restart_loses_no_epoch(
    agent: Agent, vast: FakeVast, phase: str, volume: str
) -> None:
    env = agent.env(vast, FAKE_EPOCH_SECONDS="0.3", RUN_ARGS="epochs=6", ON_EXIT="stop")
    # 6 epochs: the first attempt stops far from the end even when the Hub lags behind the volume.
    doctor: dict[str, str] = {}
    if phase == "dataset":  # a dataset folder: libreyolo doctor checks it beside the training's start
        env["DATASET_REPO"] = str(make_dataset(agent.tmp_path / "cones").parent)
        # Its verdict is kept on the volume: the first attempt must not reach it either.
        doctor = {"FAKE_DOCTOR_SECONDS": "60"}
    # Held after epoch 3 until killed: on a loaded machine the Hub can lag the trainer by a whole run.
    first = agent.start(env | {"FAKE_EPOCH_SECONDS": "0.6"} | doctor | held_after(agent.tmp_path, 3))
    wait_for(lambda: "weights/epoch_2.pt" in agent.hub_files(), "epoch 2 on the Hub", first)
    os.killpg(first.pid, signal.SIGKILL)
    first.communicate()
    extra, held = hold_phase(agent, vast, phase)
    if phase not in {"finishing", "release"}:  # training still runs when the kill comes
        extra["FAKE_EPOCH_SECONDS"] = "3"
    second = agent.start(env | extra)
    wait_for(held, f"the restart held in {phase}", second)
    os.killpg(second.pid, signal.SIGKILL)  # the machine goes away, mid-phase
    second.communicate()
    clear_faults(agent, vast)
    before = epochs_on_volume(agent.run_dir)
    if volume == "new":
        agent.volume = agent.tmp_path / "volume2"
        env = env | {"WORKDIR": str(agent.volume)}

    code, output = agent.run(env)

    assert code == 0, output[-3000:]
    state = agent.state()
    assert state["phase"] == Phase.DONE and state["exit"]["code"] == 0
    # Killed after its final upload returned (in the release): its outcome stands. Killed during
    # that upload: the outcome was only provisional (exit.final false), so the attempt was lost.
    written = phase == "release"
    assert state["attempts"][-2]["reason"] == ("success" if written else "lost")
    assert {f"weights/epoch_{n}.pt" for n in range(1, 7)} <= hub_epochs(agent.hub_ctx.hub, agent.repo)
    if volume == "new":
        assert state.get("resume", {}).get("from") == "hub"
    assert vast.actions() and vast.actions()[-1].method == "PUT"
    assert_invariants(agent, code, output, before if volume == "same" else {}, vast)


# -- Hub errors and dropped connections while resuming and finishing ---------------------------
HUB_TROUBLE = [("503", {}), ("500", {}), ("reset", {})]


@pytest.mark.parametrize("phase", ["resume", "finishing"])
def test_hub_errors_while_resuming_or_finishing_lose_nothing(agent: Agent, phase: str) -> None:
    hub = agent.hub_ctx.hub
    env = agent.env(FAKE_EPOCH_SECONDS="0.6", RUN_ARGS="epochs=4")
    if phase == "resume":  # an attempt was lost after 2 epochs; the restart reads the Hub through errors
        first = agent.start(env)
        wait_for(lambda: "weights/epoch_2.pt" in agent.hub_files(), "epoch 2 on the Hub", first)
        os.killpg(first.pid, signal.SIGKILL)
        first.communicate()
        faults = [
            hub.inject(kind, method="GET", path=r"/(tree|resolve)/", times=1, **extra) for kind, extra in HUB_TROUBLE
        ]
        process = agent.start(env)
    else:  # from the last epoch on, the Hub fails commits, and loses the answer of one it applied
        process = agent.start(env)
        wait_for(lambda: (agent.run_dir / "weights" / "epoch_4.pt").exists(), "the last epoch", process)
        faults = [hub.inject(kind, path=r"/(commit|preupload)/", times=1, **extra) for kind, extra in HUB_TROUBLE]
        faults.append(hub.inject("apply-then-reset", method="POST", path=r"/commit/", times=1))
    before = epochs_on_volume(agent.run_dir)
    output, _ = process.communicate(timeout=AGENT_TIMEOUT)
    code = process.returncode

    assert sum(fault.fired for fault in faults) > 0, "no fault was injected"
    hub.clear_faults()
    assert code == 0, output[-3000:]
    assert agent.state()["phase"] == Phase.DONE
    assert {f"weights/epoch_{n}.pt" for n in range(1, 5)} <= hub_epochs(hub, agent.repo)
    assert hub.file_bytes(agent.repo, "weights/last.pt") == (agent.run_dir / "weights" / "last.pt").read_bytes()
    assert_invariants(agent, code, output, before)


# -- the job cannot even start -----------------------------------------------------------------
def test_a_run_folder_that_cannot_be_made_still_releases(agent: Agent, vast: FakeVast) -> None:
    (agent.volume / "runs").mkdir(parents=True)
    agent.run_dir.write_text("a file where the run folder goes")  # as a read-only volume: no folder there

    code, output = agent.run(agent.env(vast, ON_FAILURE="destroy"))

    assert code == 1, output[-3000:]
    assert "cannot create the run folder" in output and "Traceback" not in output
    assert [action.method for action in vast.actions()] == ["DELETE"], "the machine was not released"


def test_a_full_disk_at_the_start_is_38_and_still_releases(
    agent: Agent, vast: FakeVast, small_disk: Callable[[Path, str], Path]
) -> None:
    small_disk(agent.volume, "1m,nr_inodes=64")
    for n in range(200):  # every inode taken: not even a folder can be made
        try:
            (agent.volume / f"f{n}").touch()
        except OSError:
            break

    code, output = agent.run(agent.env(vast, ON_FAILURE="stop"))

    assert code == DiskSpaceError.exit_code, output[-3000:]
    assert "Traceback" not in output
    assert [action.method for action in vast.actions()] == ["PUT"], "the machine was not released"


def test_an_uploader_that_cannot_start_does_not_hold_the_end(agent: Agent, vast: FakeVast) -> None:
    staging = agent.volume / ".trainbox" / "order" / "sync"
    staging.parent.mkdir(parents=True)
    staging.write_text("a file where the upload's staging folder goes")  # its mkdir fails, as on a full disk
    started = time.monotonic()

    code, output = agent.run(agent.env(vast, ON_FAILURE="destroy"))

    assert time.monotonic() - started < 60, "the end waited for upload threads that never ran"
    assert code != 0 and "Traceback" not in output, output[-3000:]
    assert agent.state()["exit"]["code"] == code
    assert [action.method for action in vast.actions()] == ["DELETE"], "the machine was not released"


def test_a_sigterm_during_a_max_runtime_wrap_up_is_bounded(agent: Agent) -> None:
    # MAX_RUNTIME gives a trainer that ignores SIGINT 15 s to stop; the machine is taken back meanwhile.
    env = agent.env(FAKE_TRAIN_MODE="deaf", FAKE_EPOCH_SECONDS="0.5", RUN_ARGS="epochs=100", MAX_RUNTIME="4")
    process = agent.start(env)
    wait_for(lambda: "weights/epoch_1.pt" in agent.hub_files(), "epoch 1 on the Hub", process)
    with process.stdout as stream:  # type: ignore[union-attr]
        for line in stream:
            if "MAX_RUNTIME" in line:
                break
    code, output = sigterm(process)
    assert code == PreemptedError.exit_code, output[-3000:]
    assert agent.state()["phase"] == Phase.PREEMPTED
    assert_invariants(agent, code, output, {})


@pytest.mark.transfer("lfs")  # huggingface_hub uploads two or more LFS files in a thread pool
def test_a_sigterm_while_lfs_files_upload_ends_the_process_in_time(agent: Agent) -> None:
    # Each LFS object's verify answer trickles back for a minute: the commit's pool threads are in flight.
    fault = agent.hub_ctx.hub.inject("slow", method="POST", path=r"/info/lfs/objects/verify", rate=1)
    process = agent.start(agent.env(RUN_ARGS="epochs=20", FAKE_EPOCH_SECONDS="1.0"))
    wait_for(lambda: fault.fired >= 2, "two LFS uploads in flight", process)

    code, output = sigterm(process)  # the process itself must be gone, not only its last log line

    assert code == PreemptedError.exit_code, output[-3000:]
    agent.hub_ctx.hub.clear_faults()
    assert agent.state()["phase"] == Phase.PREEMPTED


# The full-disk matrix, phase by phase: the start (test_a_full_disk_at_the_start_is_38_and_still_releases),
# the dataset (test_a_disk_full_during_the_dataset_is_38_and_loses_nothing), the training's output (below),
# the staging copies and the final upload (test_a_disk_full_while_staging_is_an_honest_70_and_no_destroy),
# checkpoints and trainbox.json (test_a_disk_full_during_training_still_releases_and_the_restart_finishes).
def test_a_console_log_on_a_full_disk_never_stalls_the_training(
    agent: Agent, vast: FakeVast, small_disk: Callable[[Path, str], Path]
) -> None:
    # console.log lives on a disk with no room (the rest of the run folder has room): every write of it fails
    # while the trainer prints 200 KB an epoch, far past what a pipe holds when nobody reads it.
    full = small_disk(agent.tmp_path / "full", "64k")
    fill_up(full, leave=0)
    agent.run_dir.mkdir(parents=True)
    (agent.run_dir / training.CONSOLE_LOG).symlink_to(full / "console.log")
    env = agent.env(vast, RUN_ARGS="epochs=3", FAKE_OUTPUT_BYTES="200000", STALL_TIMEOUT="20", ON_EXIT="destroy")

    code, output = agent.run(env)

    assert code == 0, output[-3000:]  # trained to the end: not stalled (81), the disk not blamed for a success
    assert "cannot write console.log" in output
    assert {f"weights/epoch_{n}.pt" for n in range(1, 4)} <= hub_epochs(agent.hub_ctx.hub, agent.repo)
    assert [action.method for action in vast.actions()] == ["DELETE"]


def test_a_sigterm_while_the_uploader_reads_a_failing_hub_stops_the_job(agent: Agent) -> None:
    hub = agent.hub_ctx.hub
    # Resume lists the repo slowly (the first listing, at preflight, goes through).
    held = hub.inject("slow", path=r"/tree/", rate=40, times=1, skip=1)
    process = agent.start(agent.env())
    wait_for(lambda: held.fired >= 1 and local_phase(agent) == "resume", "resume listing the repo", process)
    # From now on the Hub answers 503 to "where is main?": the uploader's ledger check retries it.
    failing = hub.inject("503", method="GET", path=r"/api/models/[^/]+/[^/]+(/revision/[^/]+)?$")
    wait_for(lambda: failing.fired >= 1, "the ledger check against a failing Hub", process)

    code, output = sigterm(process)

    assert code == PreemptedError.exit_code, output[-3000:]
    state = agent.state()
    assert state["phase"] == Phase.PREEMPTED
    assert "dataset" not in state["phases"], "the stop was swallowed: the job went on to the dataset"
    hub.clear_faults()
