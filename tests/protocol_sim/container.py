"""One simulated container: the agent's own store code, driven one step at a time.

What runs is the product's: ``RunLease`` (read, acquire with its compare-and-swap, check, the heartbeat's
``tick``, release), the job's ``confirm_held`` (the lease checked before the run's state is read and right
before training) and ``begin_store``, ``read.find_newest`` over the volume and ``bucket.RunFolder`` (whole
manifests, the downloads, ``bucket_sources``' retries and exit 73), the ``Uploader``'s lanes and routing with
``BucketStore`` (learn, commit, landed, tidy) under ``committer.step`` (the lease's check before every write,
the landing as a heartbeat, ``lost_run``). What stands in: training (an epoch is virtual time, then
``last.pt`` — a real tiny checkpoint —, ``metrics.jsonl`` and every ``SAVE_PERIOD`` an ``epoch_N.pt`` are
written to the volume and staged as the snapshotter stages them) and the threads (the committer's and the
heartbeat's turns are taken in this actor's thread, in the order their own threads would take them).
"""

from __future__ import annotations

import hashlib
import io
import json
import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from entrypoint.errors import LeaseHeldError, StoreUnreadableError, TakenOverError
from entrypoint.sync import clock, committer, read
from entrypoint.sync import job as job_sync
from entrypoint.sync.bucket import Bucket, RunFolder
from entrypoint.sync.bucket_store import BucketStore
from entrypoint.sync.lease import RunLease
from entrypoint.sync.staging import StagedFile
from entrypoint.sync.uploader import Uploader

from .hub import SimApi, SimHub
from .instances import Instances

REPO = "org/run"
BUCKET = "org/run-checkpoints"
RUN = "run"
PERIOD = 120.0
TARGET = 8  # epochs of the run
SAVE_PERIOD = 3  # an epoch_N.pt every this many epochs
EPOCH_SECONDS = 45.0  # true seconds an epoch trains
FLUSH_SECONDS = 600.0  # how long the end waits for its last boundary


def checkpoint_bytes(epochs: int) -> bytes:
    """A real (tiny) torch checkpoint of ``epochs`` completed epochs, as libreyolo saves one."""
    return _CHECKPOINTS.setdefault(epochs, _save(epochs))


_CHECKPOINTS: dict[int, bytes] = {}


def _save(epochs: int) -> bytes:
    import torch

    buffer = io.BytesIO()
    torch.save({"epoch": epochs - 1, "config": {"epochs": TARGET}}, buffer)
    return buffer.getvalue()


@dataclass
class Report:
    """What a container tells the world (the oracle compares it with the Hub's ground truth)."""

    durable: Callable[[str, int, list[str]], None]  # run id, epochs, snapshots: the agent says they are on the Hub
    trained: Callable[[str, int], None]  # run id, epoch: an epoch trained
    started: Callable[[str, str, int], None]  # attempt, run id, epochs resumed from
    token_hex: Callable[[], str] = field(default=lambda: "000000")


def volume_state(volume: Path) -> tuple[str | None, int]:
    """The volume's run id and its recorded epochs."""
    try:
        state = json.loads((volume / "trainbox.json").read_text())
        rows = (volume / "run" / "metrics.jsonl").read_text().splitlines()
        return str(state["run_id"]), json.loads(rows[-1])["epoch"] if rows else 0
    except (OSError, ValueError, KeyError, IndexError):
        return None, 0


def repo_run_id(api: SimApi) -> str | None:
    """The run id the repo's trainbox.json names (what sync/run_identity.py reads at the start)."""
    head = api.repo_info(REPO).sha
    response = api.resolve(f"{api.endpoint}/{REPO}/resolve/{head}/trainbox.json")
    if response.status_code == 404:
        return None
    response.raise_for_status()
    return str(json.loads(response.content)["run_id"])


def commit_run_id(up: Uploader, run_id: str) -> bool:
    """trainbox.json with the run id committed to the repo (the job's first commit of a new run)."""
    from huggingface_hub import CommitOperationAdd

    data = json.dumps({"run_id": run_id}).encode()
    try:
        up.repo.store.hub.api.create_commit(  # type: ignore[attr-defined]
            REPO, [CommitOperationAdd("trainbox.json", data)], commit_message="The run's id"
        )
    except Exception:
        return False
    return True


def container(
    api: SimApi,
    volume: Path,
    report: Report,
    run_id_if_new: str,
    *,
    instance: str | None = None,
    instances: Instances | None = None,
) -> int:
    """The agent's start, training and end on ``volume``; its exit code. ``instance``, ``instances``: the
    simulated instance it runs on, named in its lease, and the provider it asks about the holder's."""
    hub = SimHub(token="hf_sim", sim_api=api)
    bucket = Bucket(hub, BUCKET)
    if instance is not None and instances is not None:
        lease = RunLease(
            hub, REPO, RUN, PERIOD, bucket, instance=instances.start(instance), holder_ended=instances.ended
        )
    else:
        lease = RunLease(hub, REPO, RUN, PERIOD, bucket)
    volume_id, _ = volume_state(volume)
    try:
        known_id = repo_run_id(api)
        before, _, _ = lease.read()
        run_id = lease.acquire(volume_id or known_id or run_id_if_new)
    except LeaseHeldError:
        return 72
    except StoreUnreadableError:
        return 73
    except Exception:  # the start failed (the Hub did not answer): nothing written
        return 1
    assert lease.attempt is not None
    run_dir, work = volume / "run", volume / "work"
    if volume_id != run_id:  # another run's volume: nothing of it is resumed
        shutil.rmtree(run_dir, ignore_errors=True)
    (volume / "trainbox.json").write_text(json.dumps({"run_id": run_id}))
    work.mkdir(parents=True, exist_ok=True)
    folder = RunFolder(bucket, RUN, run_id)
    try:
        job_sync.confirm_held(lease, None, read_for=PERIOD / 2)  # open_run's, before the run's state is read
        known = before is not None or known_id is not None
        copy = read.find_newest(run_dir, work, folder=folder, run_known=known, read_for=PERIOD / 2)
    except TakenOverError:
        return 71
    except StoreUnreadableError:
        return 73
    epoch = copy.epochs if copy is not None else 0
    _truncate_metrics(run_dir, epoch)
    try:
        store = job_sync.begin_store(folder, lease.attempt, read_for=PERIOD / 2)  # the job's, beside the resume
    except StoreUnreadableError:
        return 73
    up = Uploader(hub, REPO, run_dir, work, bucket=store, lease=lease, fallback_after=PERIOD / 2)
    assert up.bucket is not None
    lane = up.bucket
    lane.check_ledger()
    driver = _Driver(up, lane, lease, report, run_id)
    driver.owes_run_id = known_id != run_id
    try:
        job_sync.confirm_held(lease, up, read_for=PERIOD / 2)  # the job's check right before training starts
    except TakenOverError:
        return 71
    except StoreUnreadableError:
        return 73
    report.started(lease.attempt, run_id, epoch)
    staged = 0
    while epoch < TARGET:
        if not driver.run_for(EPOCH_SECONDS):
            return 71
        epoch += 1
        report.trained(run_id, epoch)
        staged = _write_epoch(run_dir, work, epoch, staged, up)
    if not driver.flush(FLUSH_SECONDS):
        return 71 if up.taken_over is not None else 70
    lease.release()
    return 0


class _Driver:
    """The committer's and the heartbeat's turns, in this actor's thread."""

    def __init__(self, up: Uploader, lane: object, lease: RunLease, report: Report, run_id: str) -> None:
        self.up, self.lane, self.lease, self.report, self.run_id = up, lane, lease, report, run_id
        self.next_tick = clock.monotonic() + PERIOD / 8
        self.owes_run_id = False

    def _turn(self) -> float | None:
        lane = self.up.bucket
        assert lane is not None
        if self.owes_run_id:  # the job's first commit of trainbox.json, tried again beside training until it lands
            self.owes_run_id = not commit_run_id(self.up, self.run_id)
        if clock.monotonic() >= self.next_tick:
            self.next_tick = clock.monotonic() + PERIOD / 8
            self.lease.tick(True, self.up.committers.lost_run)
        landed = len(lane.commits)
        wait = committer.step(self.up.committers, lane)
        if len(lane.commits) > landed:
            store = lane.store
            assert isinstance(store, BucketStore) and store.current is not None
            snapshots = sorted(rel for rel in store.current.files if "/epoch_" in rel)
            self.report.durable(self.run_id, store.current.epoch, snapshots)
        return wait

    def run_for(self, seconds: float) -> bool:
        """Training for ``seconds`` while the committer and heartbeat take their turns; False once taken over."""
        end = clock.monotonic() + seconds
        while clock.monotonic() < end:
            if self.up.taken_over is not None:
                return False
            wait = self._turn()
            pause = min(end - clock.monotonic(), self.next_tick - clock.monotonic(), wait if wait is not None else 0.0)
            clock.sleep(max(pause, 0.05))
        return self.up.taken_over is None

    def flush(self, seconds: float) -> bool:
        """The end: every boundary in the bucket within ``seconds``."""
        lane = self.up.bucket
        assert lane is not None
        end = clock.monotonic() + seconds
        with self.up.changed:
            self.up.flush_deadlines.append(end)
        while clock.monotonic() < end:
            if self.up.taken_over is not None:
                return False
            if not lane.pending and not lane.busy:
                return True
            wait = self._turn()
            clock.sleep(max(min(wait if wait is not None else 0.0, self.next_tick - clock.monotonic()), 0.05))
        return False


def _truncate_metrics(run_dir: Path, epoch: int) -> None:
    metrics = run_dir / "metrics.jsonl"
    rows = [json.dumps({"epoch": e}) for e in range(1, epoch + 1)]
    metrics.parent.mkdir(parents=True, exist_ok=True)
    metrics.write_text("".join(f"{row}\n" for row in rows))


def _write_epoch(run_dir: Path, work: Path, epoch: int, staged: int, up: Uploader) -> int:
    """libreyolo's epoch boundary on the volume, and the snapshotter's staging of it."""
    weights = run_dir / "weights"
    weights.mkdir(parents=True, exist_ok=True)
    data = checkpoint_bytes(epoch)
    (weights / "last.pt").write_bytes(data)
    files = {"weights/last.pt": (data, epoch)}
    if epoch % SAVE_PERIOD == 0:
        (weights / f"epoch_{epoch}.pt").write_bytes(data)
        files[f"weights/epoch_{epoch}.pt"] = (data, epoch)
    with (run_dir / "metrics.jsonl").open("a") as handle:
        handle.write(json.dumps({"epoch": epoch}) + "\n")
    files["metrics.jsonl"] = ((run_dir / "metrics.jsonl").read_bytes(), None)  # type: ignore[assignment]
    items = []
    for relative, (content, epochs) in files.items():
        staged += 1
        path = work / "staging" / f"{staged:06d}" / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(content)
        sha = hashlib.sha256(content).hexdigest()
        items.append(StagedFile(relative, path, sha, None, len(content), epochs, clock.monotonic()))
    with up.changed:
        up.committers.deliver(items)
        up.changed.notify_all()
    return staged
