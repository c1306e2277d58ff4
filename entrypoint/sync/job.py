"""The job's side of the sync: the run's bucket, the uploader started where resume left the run, the final
upload, whether the Hub holds everything before a destroy, and what trainbox.json says of it."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from ..errors import AgentError, LeaseRefusedError, StopRequested, StoreUnreadableError, SyncError, TakenOverError
from ..foreign import Area, Where
from ..foreign import agent_error as classify
from ..hub import Hub, with_retries
from ..libreyolo import WEIGHTS_DIR
from ..log import logger
from ..parsing import Provider
from ..release import elsewhere
from ..retry import describe
from ..settings import Settings
from ..state import Phase, RunState
from . import clock, volume_lock
from .bucket import Bucket, BucketUnavailable, RunFolder, default_bucket_id
from .bucket_store import BucketStore
from .lease import RunLease
from .read import bucket_state, newest_local, remote_state
from .uploader import Uploader

# A new run's id is on the repo (its trainbox.json) before training, within this.
RUN_ID_TIMEOUT = 60.0


def open_run(
    settings: Settings,
    state: RunState,
    hub: Hub | None,
    scratch: Path,
    before_lease: Callable[[], None] | None = None,
) -> tuple[RunFolder | None, bool, RunLease | None]:
    """The run's identity, its lease and its bucket folder: the run id (the volume's, else the repo's, adopted
    with its history, else a new one: then True, and the caller puts it on the repo before training; a node
    other than 0 takes node 0's), the run's lease taken by node 0 (``LeaseHeldError``, exit 72, when another
    container holds it: nothing written), the folder (written by node 0, read by the others), and the bucket's
    trainbox.json adopted, the newest of all: the guards count its attempts too. ``before_lease``: called once the
    history the volume, the repo and the bucket hold is adopted, before any wait for the lease (MAX_COST counts
    the earlier attempts' spend from there)."""
    if not settings.topology.leader and hub is not None and settings.output_repo is not None:
        state.identity.follow_run_id(remote_state(hub, settings.output_repo, scratch))
    new_run = state.identity.ensure_run_id()
    run_id = state.identity.run_id
    assert run_id is not None
    lease = None
    if settings.topology.leader and hub is not None and settings.output_repo is not None:
        bucket = Bucket(hub, settings.checkpoint_bucket) if settings.checkpoint_bucket is not None else None
        if bucket is not None and not new_run:  # only read: the spend an attempt killed on another volume recorded
            state.history.adopt(bucket_state(RunFolder(bucket, settings.run_name, run_id), scratch, quiet=True))
        if before_lease is not None:
            before_lease()
        lock = volume_lock.lock_path(settings.workdir, settings.run_name)
        lease = RunLease(
            hub,
            settings.output_repo,
            settings.run_name,
            settings.lease_period,
            bucket,
            machine=volume_lock.volume_id(settings.workdir),
            volume_locked=lambda: volume_lock.is_held(lock),
            instance=_instance(settings),
            holder_ended=lambda held, within: elsewhere.ended(
                settings.provider, held.provider, held.instance, min(within, elsewhere.ASK_WITHIN)
            ),
        )
        held = lease.acquire(run_id, run_known=not new_run)
        # A holder taken over may land one last licensed write a quarter period after the take: the run's state
        # is read from then on, this attempt still holding it.
        confirm_held(lease, None, read_for=settings.lease_period / 2)
        if held != run_id:  # another container of this new run took the lease first, then went: its id is the run's
            logger.info("resume: run %s was started by another container; continuing it", held)
            state.identity.follow_run_id({"run_id": held})
            run_id = held
        state.update(lease=lease.describe())
    if new_run:
        logger.info("resume: a new run: its id is %s", run_id)
    folder, where = open_bucket(
        settings, hub, run_id, write=settings.topology.leader, bucket=lease.bucket if lease is not None else None
    )
    if folder is not None and lease is not None and lease.took_from is not None:
        folder = replace(folder, holder=lease.took_from)  # read: the manifests of the holder's chain alone
    if settings.topology.leader:
        state.update(storage=where)
    if folder is not None:
        state.history.adopt(bucket_state(folder, scratch), authoritative=not settings.topology.leader)
    return folder, new_run, lease


def _instance(settings: Settings) -> tuple[str, str] | None:
    """This instance at its provider, for the lease (the kind and the id: never the key)."""
    access = settings.provider
    return (
        (access.provider.value, access.instance_id)
        if access.provider is not Provider.NONE and access.instance_id
        else None
    )


def _storage_changed(state: RunState, change: dict[str, Any], tell: Callable[[str], None] | None) -> None:
    """The bucket failed over to the repo, or came back: trainbox.json says so, and so does ``tell``."""
    state.update(storage=change)
    if tell is not None:
        why = f" ({change['why']})" if change.get("why") else ""
        tell(
            f"working state now goes to the repo as commits{why}"
            if change.get("fallback")
            else "the bucket answers again"
        )


def open_bucket(
    settings: Settings, hub: Hub | None, run_id: str, *, write: bool, bucket: Bucket | None = None
) -> tuple[RunFolder | None, dict[str, Any]]:
    """The run's folder in its bucket (``write``: created if missing and proven writable, on the node
    that writes), or None (off, or unavailable: said in one line, recorded in trainbox.json)."""
    if hub is None or settings.output_repo is None or settings.checkpoint_bucket is None:
        return None, {"mode": "repo"}
    # The lease's bucket when there is one: what its watch saw there is known to the resume's reads.
    bucket = bucket if bucket is not None else Bucket(hub, settings.checkpoint_bucket)
    folder = RunFolder(bucket, settings.run_name, run_id)
    try:
        folder.bucket.open(write=write)
    except BucketUnavailable as error:
        if write:
            logger.warning("bucket: %s", error.line())
        else:  # a node that only reads: node 0 says it
            logger.info("bucket: not read (%s)", error)
        return None, {"mode": "repo", "bucket": folder.bucket.bucket_id, "unavailable": str(error), "fix": error.fix}
    if write:
        created = (
            " (created private if it was missing)"
            if settings.checkpoint_bucket == default_bucket_id(settings.output_repo)
            else ""
        )
        logger.info("bucket: working state goes to %s/%s", folder.label, created)
    return folder, {"mode": "bucket", "bucket": folder.bucket.bucket_id, "prefix": folder.prefix}


def start(
    settings: Settings,
    hub: Hub,
    folder: RunFolder | None,
    state: RunState,
    *,
    newer: frozenset[str],
    before_snapshot: Callable[[], None],
    on_commit: Callable[[str, list[str]], None],
    stop: Callable[[AgentError], None],
    on_fallback: Callable[[str], None] | None = None,
    lease: RunLease | None = None,
) -> Uploader:
    """Mirror the run folder to OUTPUT_REPO (and its bucket folder, when there is one). ``newer``: what
    the Hub holds newer than this volume, never overwritten by the older copy; ``stop``: how the job is
    told that a newer attempt took the run over; ``on_fallback``: told in a line when the working state
    leaves the bucket for the repo, or comes back."""
    assert settings.output_repo is not None
    store = None
    if folder is not None and lease is not None:  # what its boundaries carry forward: read now, beside the resume
        store = begin_store(folder, lease.attempt, read_for=settings.lease_period / 2)
    elif folder is not None:
        try:
            store = BucketStore.begin(folder)
        except StopRequested:
            raise
        except Exception as error:  # listing the folder failed: the repo holds the working state instead
            logger.warning("bucket: cannot read %s (%s); every epoch goes to the repo", folder.label, describe(error))
            state.update(storage={"mode": "repo", "unavailable": describe(error)})

    def taken_over(error: TakenOverError) -> None:  # from a committer thread: recorded, never raised there
        with contextlib.suppress(AgentError):  # raised before training: the training loop raises it again
            stop(error)

    work_dir = settings.agent_dir
    uploader = Uploader(
        hub,
        settings.output_repo,
        settings.run_dir,
        work_dir / "sync",
        before_snapshot=before_snapshot,
        superseded=newer.__contains__ if newer else None,
        on_commit=on_commit,
        on_card=lambda refused: state.update(card={"refused": refused}),  # why, until a card lands
        bucket=store,
        publish_every=settings.publish_every,
        on_storage=lambda change: _storage_changed(state, change, on_fallback),
        on_taken_over=taken_over,
        lease=lease,
        fallback_after=settings.lease_period / 2,
    )
    try:
        uploader.start()  # held only once it runs: the end never waits for threads that never started
    except OSError as error:
        where = Where(Area.DISK, doing=f"preparing the upload in {work_dir}", disk_hint="free space in WORKDIR")
        raise classify(error, where) or AgentError(
            f"cannot prepare the upload in {work_dir}: {error.strerror or error}",
            "give WORKDIR a writable volume",
        ) from None
    if lease is not None:  # the heartbeat when no write came for half a lease period (long epochs)
        lease.may_commit = lambda: uploader.repo.budget.hold() <= 0 and not uploader.repo.denied_at
        lease.keep(lambda: uploader.bucket is not None and uploader.fallback is None, uploader.committers.lost_run)
    if store is None:  # else open_bucket said where the working state goes
        logger.info("sync: every epoch of this run goes to %s", settings.output_repo)
    return uploader


def confirm_held(lease: RunLease | None, uploader: Uploader | None, *, read_for: float) -> None:
    """Before the run's state is read, and right before training starts: this attempt still holds the run, so what
    resume read is the run's newest (only the holder writes it). After a take, ``lease.check`` first waits the
    quarter period in which the holder taken over may land the last write it had licensed. A lease read licenses
    for a quarter period (``protocol.lease_read_fresh``): a process frozen or slowed past it since (between its
    resume read and now) reads the lease again, and one that names another attempt (it took the run while this
    one was frozen, and wrote on) ends this one with 71, nothing trained or written. Within the licence, no read."""
    if lease is None:
        return
    try:
        _to_deadline(lease.check, "the run's lease", read_for)
    except TakenOverError as error:
        if uploader is not None:  # nothing more written anywhere
            uploader.committers.lost_run(error)
        raise


def begin_store(folder: RunFolder, attempt: str | None, *, read_for: float) -> BucketStore:
    """This attempt's writes to the run's folder, with what they carry forward read now, beside the resume (after
    a take's quarter period: the last write the holder taken over had licensed is in it), not at the first
    boundary: a batch that holder sent before it froze and that lands later is never carried forward."""
    store = BucketStore.begin(folder, attempt=attempt)
    _to_deadline(store.learn, folder.label, read_for)
    return store


def _to_deadline(read: Callable[[float], None], what: str, read_for: float) -> None:
    """``read`` (given its deadline) tried again for ``read_for`` seconds, as resume's reads are, then 73."""
    began = clock.monotonic()
    while True:
        try:
            read(began + read_for)
            return
        except (StopRequested, TakenOverError):
            raise
        except Exception as error:
            waited = clock.monotonic() - began
            if waited >= read_for:
                raise StoreUnreadableError(
                    f"cannot read {what} for {waited:.0f} s at the start ({describe(error)}): not training from a"
                    " state this attempt cannot confirm; nothing trained, nothing written",
                    "start it again once the Hub answers (a retryable exit)",
                ) from None
            logger.warning("resume: cannot read %s (%s); reading it again", what, describe(error))
            clock.sleep(min(5.0, max(0.5, read_for / 10)))


def publish_run_id(uploader: Uploader, state: RunState, settings: Settings) -> None:
    """A new run: its trainbox.json (the run id) on the repo now, before training, so that a new volume
    learns it. With a bucket the repo gets trainbox.json only with a milestone; without one, at once anyway. Missed
    now, it is retried beside training until it lands, whatever PUBLISH_EVERY says."""
    if uploader.bucket is not None and not uploader.flush(RUN_ID_TIMEOUT, final=False, everywhere=True):
        uploader.owes_run_id = True
        logger.warning(
            "sync: run id %s is not on %s yet (%s); until it is, a new volume cannot tell this run's bucket"
            " state from another run's and starts over",
            state.identity.run_id,
            settings.output_repo,
            uploader.last_error or "out of time",
        )


def final(
    uploader: Uploader, state: RunState, settings: Settings, hub: Hub | None, phase: Phase, code: int, timeout: float
) -> int:
    """Upload what is left; a failed final upload turns a success into a sync failure, and
    trainbox.json says so (it was written for the upload, before its outcome was known). A run taken
    over by a newer attempt writes nothing more."""
    synced = uploader.flush(timeout) if uploader.taken_over is None else False
    if uploader.taken_over is not None:
        state.update(sync=report(uploader))
        taken = uploader.taken_over
        if code != taken.exit_code:
            state.history.amend_exit(taken.exit_code, taken.reason, str(taken))
        return taken.exit_code
    if uploader.bucket is not None:  # the repo's final publish: whether it made it
        state.update(sync=report(uploader))
    if synced and settings.squash_history and phase is Phase.DONE and hub is not None:
        state.update(sync={"squashed": squash_history(hub, uploader.repo_id)})
    if synced:
        return code
    error = sync_error(uploader)
    logger.error("%s", error)
    state.update(sync=report(uploader) | {"error": str(error)})
    if code == 0:
        state.history.amend_exit(error.exit_code, error.reason, str(error))
        return error.exit_code
    return code


def report(uploader: Uploader) -> dict[str, Any]:
    """trainbox.json's ``sync``: the repo's commits, and with a bucket its boundaries and the final publish."""
    record: dict[str, Any] = {
        "repo": uploader.repo_id,
        "commits": len(uploader.commits),
        "last_commit": uploader.commits[-1] if uploader.commits else None,
        "pending": uploader.pending,
        "last_error": uploader.last_error,
    }
    if uploader.bucket is not None:
        record |= {
            "bucket": uploader.bucket.name,
            "bucket_boundaries": len(uploader.bucket.commits),
            "bucket_pending": sorted(uploader.bucket.pending),
            **({"fallback": uploader.fallback} if uploader.fallback else {}),
            **({"final_publish": uploader.final_publish} if uploader.final_publish is not None else {}),
        }
    if uploader.taken_over is not None:
        record["taken_over"] = str(uploader.taken_over)
    return record


def sync_error(uploader: Uploader, why: str = "") -> SyncError:
    """Exit 70, naming what the Hub lacks (``why``: e.g. that a signal cut the upload short)."""
    left = uploader.pending
    names = ", ".join(left[:5]) + (f" and {len(left) - 5} more" if len(left) > 5 else "")
    # Nothing staged is waiting, yet the flush did not end: the last snapshot (the card, trainbox.json, the
    # newest files) was never staged, so its files are not named.
    what = (
        f"{len(left)} file(s) are not on {uploader.repo_id}{why}: {names}"
        if left
        else (f"the run's last snapshot is not on {uploader.repo_id}{why}")
    )
    return SyncError(
        f"{what} ({uploader.last_error or 'out of time'})",
        "they are still in the run folder; rerun `trainbox sync <run folder>` once the Hub is reachable",
    )


def hub_holds_everything(
    uploader: Uploader | None, settings: Settings, hub_copy: tuple[int, int] | None, timeout: float
) -> bool:
    """Put the current trainbox.json on the Hub; True only when the Hub is known to hold every
    completed epoch of this run on this volume (a destroy is downgraded to a stop otherwise):
    the bucket holding every boundary (whole, never overwritten: no copy there can be torn), or the
    repo holding everything. ``hub_copy``: size and mtime of the checkpoint resume copied from the Hub."""
    if uploader is None:
        # The job ended before the uploader ran (preflight, access, resume): the Hub was never
        # shown this volume. Only a volume without a checkpoint has nothing to lose.
        weights = settings.run_dir / WEIGHTS_DIR
        found = weights.glob("*.pt") if weights.is_dir() else []
        at_risk = sorted(p.name for p in found if hub_copy is None or signature(p) != hub_copy)
        if at_risk and settings.output_repo is not None:  # without one, no Hub was ever promised
            logger.warning("the Hub is not known to hold this volume's checkpoints (%s)", ", ".join(at_risk[:3]))
        return not at_risk
    if uploader.taken_over is not None:
        # The other container resumed from the Hub: epochs this volume made since its last landing are here alone.
        weights = settings.run_dir / WEIGHTS_DIR
        names = sorted(path.name for path in weights.glob("*.pt")) if weights.is_dir() else []
        newest = newest_local(settings.run_dir)
        epochs = f" (epoch {newest[1].completed_epochs})" if newest is not None else ""
        why = (
            "the run's lease was refused"
            if isinstance(uploader.taken_over, LeaseRefusedError)
            else "another container holds this run now"
        )
        logger.warning(
            "%s; this volume's checkpoints%s are kept, not destroyed: %s",
            why,
            epochs,
            ", ".join(names[:6]) or "none",
        )
        return False
    synced = uploader.flush(timeout)
    if uploader.bucket_complete:
        synced = True  # every epoch is in the bucket: the repo's final publish is reported, not required
    refused, torn = uploader.refusals()
    if refused:  # a whole checkpoint the sync would not upload (a secret inside) exists only on this volume
        logger.warning(
            "the Hub lacks checkpoints the sync refused: %s",
            "; ".join(f"{name} ({why})" for name, why in sorted(refused.items())[:3]),
        )
    if torn:  # cut short while written (a trainer stopped mid-save): no copy anywhere would hold more
        logger.info(
            "torn on this volume, nothing in them to keep: %s",
            "; ".join(f"{name} ({why})" for name, why in sorted(torn.items())[:3]),
        )
    return synced and not refused


def signature(path: Path) -> tuple[int, int] | None:
    """Size and mtime of a file: whether a checkpoint is still the copy resume took from the Hub."""
    try:
        stat = path.stat()
    except OSError:
        return None
    return stat.st_size, stat.st_mtime_ns


def squash_history(hub: Hub, repo_id: str) -> bool:
    """SQUASH_HISTORY=1 (CHECKPOINT_BUCKET=off): one commit holds the finished run, and the storage
    of every earlier epoch's version is freed. A failure is reported, never fatal: nothing is lost."""
    try:
        with_retries(
            lambda: hub.api.super_squash_history(
                repo_id, repo_type="model", commit_message="Squash the run's history (SQUASH_HISTORY=1)"
            ),
            f"squashing {repo_id}",
        )
    except StopRequested:
        raise
    except Exception as error:
        logger.warning("SQUASH_HISTORY: %s keeps its history (%s)", repo_id, describe(error))
        return False
    logger.info("SQUASH_HISTORY: %s's history is one commit now", repo_id)
    return True
