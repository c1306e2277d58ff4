"""The job's side of the sync: start it where resume left the run, the final upload, whether the Hub
holds everything before a destroy, and what trainbox.json says of it."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..errors import AgentError
from ..foreign import Area, Where
from ..foreign import agent_error as classify
from ..hub import Hub
from ..libreyolo import WEIGHTS_DIR
from ..log import logger
from ..settings import Settings
from ..state import Phase, RunState
from .places import Store, TwoPlaces, squash_history
from .uploader import Uploader, sync_error

Sync = Uploader | TwoPlaces


def start(
    settings: Settings,
    hub: Hub,
    bucket: Store | None,
    work_dir: Path,
    *,
    newer: frozenset[str],
    before_snapshot: Callable[[], None],
    on_commit: Callable[[str, list[str]], None],
    on_card: Callable[[str | None], None],
) -> Sync:
    """Mirror the run folder to OUTPUT_REPO (and the bucket, when there is one). ``newer``: what the Hub
    holds newer than this volume, never overwritten by the older copy."""
    assert settings.output_repo is not None
    uploader: Sync
    if bucket is not None:
        uploader = TwoPlaces(
            bucket,
            hub,
            settings.output_repo,
            settings.run_dir,
            work_dir / "sync",
            publish_every=settings.publish_every,
            before_snapshot=before_snapshot,
            superseded=newer.__contains__ if newer else None,
            on_commit=on_commit,
            on_card=on_card,
        )
    else:
        uploader = Uploader(
            hub,
            settings.output_repo,
            settings.run_dir,
            work_dir / "sync",
            before_snapshot=before_snapshot,
            superseded=newer.__contains__ if newer else None,
            on_commit=on_commit,
            on_card=on_card,
        )
    try:
        uploader.start()  # held only once it runs: the end never waits for threads that never started
    except OSError as error:
        where = Where(Area.DISK, doing=f"preparing the upload in {work_dir}", disk_hint="free space in WORKDIR")
        raise classify(error, where) or AgentError(
            f"cannot prepare the upload in {work_dir}: {error.strerror or error}",
            "give WORKDIR a writable volume",
        ) from None
    if bucket is None:  # else open_store said where the working state goes
        logger.info("sync: every epoch of this run goes to %s", settings.output_repo)
    return uploader


def final(
    uploader: Sync, state: RunState, settings: Settings, hub: Hub | None, phase: Phase, code: int, timeout: float
) -> int:
    """Upload what is left; a failed final upload turns a success into a sync failure, and
    trainbox.json says so (it was written for the upload, before its outcome was known)."""
    synced = uploader.flush(timeout)
    if isinstance(uploader, TwoPlaces):  # the repo's final publish: whether it made it
        state.update(sync=report(uploader))
    if synced and settings.squash_history and phase is Phase.DONE and hub is not None:
        state.update(sync={"squashed": squash_history(hub, uploader.repo_id)})
    if synced:
        return code
    error = sync_error(uploader)
    logger.error("%s", error)
    state.update(sync=report(uploader) | {"error": str(error)})
    if code == 0:
        state.amend_exit(error.exit_code, error.reason, str(error))
        return error.exit_code
    return code


def report(uploader: Sync) -> dict[str, Any]:
    return {
        "repo": uploader.repo_id,
        "commits": len(uploader.commits),
        "last_commit": uploader.commits[-1] if uploader.commits else None,
        "pending": uploader.pending,
        "last_error": uploader.last_error,
        **(uploader.report() if isinstance(uploader, TwoPlaces) else {}),
    }


def hub_holds_everything(
    uploader: Sync | None, settings: Settings, hub_copy: tuple[int, int] | None, timeout: float
) -> bool:
    """Put the current trainbox.json on the Hub; True only when the Hub is known to hold every
    completed epoch of this run on this volume (a destroy is downgraded to a stop otherwise).
    ``hub_copy``: size and mtime of the checkpoint resume copied from the Hub, if it did."""
    if uploader is None:
        # The job ended before the uploader ran (preflight, access, resume): the Hub was never
        # shown this volume. Only a volume without a checkpoint has nothing to lose.
        weights = settings.run_dir / WEIGHTS_DIR
        found = weights.glob("*.pt") if weights.is_dir() else []
        at_risk = sorted(p.name for p in found if hub_copy is None or signature(p) != hub_copy)
        if at_risk and settings.output_repo is not None:  # without one, no Hub was ever promised
            logger.warning("the Hub is not known to hold this volume's checkpoints (%s)", ", ".join(at_risk[:3]))
        return not at_risk
    synced = uploader.flush(timeout)
    if isinstance(uploader, TwoPlaces) and uploader.bucket_complete:
        synced = True  # every epoch is in the bucket: the repo's final publish is reported, not required
    refused = dict(uploader.refused_missing)
    if refused:  # a checkpoint the sync would not upload (torn, 0 bytes) exists only on this volume
        logger.warning(
            "the Hub lacks checkpoints the sync refused: %s",
            "; ".join(f"{name} ({why})" for name, why in sorted(refused.items())[:3]),
        )
    return synced and not refused


def signature(path: Path) -> tuple[int, int] | None:
    """Size and mtime of a file: whether a checkpoint is still the copy resume took from the Hub."""
    try:
        stat = path.stat()
    except OSError:
        return None
    return stat.st_size, stat.st_mtime_ns
