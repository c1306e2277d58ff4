"""Two places for a run: its working state in a Storage Bucket, its milestones in the model repo.

The bucket gets every epoch boundary (overwritten in place, see bucket.py). The model repo gets a
few commits per run instead of one per epoch: ``best.pt``, ``metrics.jsonl``, ``trainbox.json``,
the card and the plot at most once per PUBLISH_EVERY (the newest state wins), and at the end the
final ``last.pt`` and ``best.pt``. ``TwoPlaces`` looks like one ``Uploader`` to the pipeline.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .. import libreyolo
from ..errors import StopRequested
from ..hub import Hub, with_retries
from ..log import logger
from ..retry import describe
from ..settings import Settings
from .bucket import BucketTarget, BucketUnavailable, Store, default_bucket_id
from .ledger import COMMITS_PER_HOUR, CommitBudget
from .uploader import Uploader

__all__ = ["Store", "TwoPlaces", "open_store"]

# The bucket has no commit limit: every boundary goes at once.
_UNLIMITED = 10**9


def working_state_only(relative: str) -> bool:
    """Files that live in the bucket during the run: the repo gets them at the end, or never."""
    return relative == libreyolo.LAST_CHECKPOINT or libreyolo.EPOCH_CHECKPOINT.match(relative) is not None


def milestone(relative: str) -> bool:
    return not working_state_only(relative)


def final_milestone(relative: str) -> bool:
    """At the end the repo also gets the final last.pt; the epoch_N.pt snapshots stay in the bucket."""
    return libreyolo.EPOCH_CHECKPOINT.match(relative) is None


def open_store(settings: Settings, hub: Hub | None) -> tuple[Store | None, dict[str, Any]]:
    """The run's bucket, ready to write, or None (off, or unavailable: said in one line, recorded)."""
    if hub is None or settings.output_repo is None or settings.checkpoint_bucket is None:
        return None, {"mode": "repo"}
    if settings.topology.multi:  # every node resumes from the repo at node 0's commit: it must hold each epoch
        logger.info("bucket: several machines resume from the repo alone; every epoch goes there as a commit")
        return None, {"mode": "repo", "why": "several machines"}
    store = Store(hub, settings.checkpoint_bucket, settings.run_name)
    try:
        store.open()
    except BucketUnavailable as error:
        logger.warning("bucket: %s", error.line())
        return None, {"mode": "repo", "bucket": store.bucket_id, "unavailable": str(error), "fix": error.fix}
    created = (
        " (created private if it was missing)"
        if settings.checkpoint_bucket == default_bucket_id(settings.output_repo)
        else ""
    )
    logger.info("bucket: working state goes to hf://buckets/%s/%s%s", store.bucket_id, store.prefix, created)
    return store, {"mode": "bucket", "bucket": store.bucket_id, "prefix": store.prefix}


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


class TwoPlaces:
    """A bucket uploader for the working state beside a repo uploader for the milestones."""

    def __init__(
        self,
        store: Store,
        hub: Hub,
        repo_id: str,
        run_dir: Path,
        work_dir: Path,
        *,
        publish_every: float,
        before_snapshot: Callable[[], None] | None = None,
        superseded: Callable[[str], bool] | None = None,
        on_commit: Callable[[str, list[str]], None] | None = None,
        on_card: Callable[[str | None], None] | None = None,
    ) -> None:
        self.store = store
        self.bucket = Uploader(
            BucketTarget(store),
            store.bucket_id,
            run_dir,
            work_dir / "bucket",
            budget=CommitBudget(per_hour=_UNLIMITED, burst=_UNLIMITED),
            before_snapshot=before_snapshot,
            on_commit=on_commit,  # "on the Hub N s ago": the bucket is on the Hub too
        )
        per_hour = 3600.0 / publish_every if publish_every > 0 else COMMITS_PER_HOUR
        self.repo = Uploader(
            hub,
            repo_id,
            run_dir,
            work_dir,
            budget=CommitBudget(per_hour=int(max(1, per_hour)) if per_hour >= 1 else 1, burst=1),
            before_snapshot=before_snapshot,
            superseded=superseded,
            on_commit=on_commit,
            on_card=on_card,
            select=milestone,
        )
        if publish_every > 0 and per_hour < 1:  # slower than one an hour: the rate itself, not rounded up
            self.repo.budget.rate = 1.0 / publish_every
        self.final_publish: dict[str, Any] | None = None
        self.bucket_complete = False  # the last flush left every boundary in the bucket (with its manifest)

    # -- what the pipeline reads ---------------------------------------------------------
    @property
    def repo_id(self) -> str:
        return self.repo.repo_id

    @property
    def commits(self) -> list[str]:
        return self.repo.commits

    @property
    def pending(self) -> list[str]:
        return sorted(set(self.bucket.pending) | set(self.repo.pending))

    @property
    def last_error(self) -> str | None:
        return self.bucket.last_error or self.repo.last_error

    @property
    def refused_missing(self) -> dict[str, str]:
        return self.bucket.refused_missing

    @property
    def refused(self) -> list[str]:
        return self.bucket.refused

    @property
    def latencies(self) -> Any:
        return self.bucket.latencies

    def report(self) -> dict[str, Any]:
        return {
            "bucket": self.store.bucket_id,
            "bucket_boundaries": len(self.bucket.commits),
            "bucket_pending": self.bucket.pending,
            **({"final_publish": self.final_publish} if self.final_publish is not None else {}),
        }

    # -- lifecycle -------------------------------------------------------------------------
    def start(self) -> None:
        self.bucket.start()
        try:
            self.repo.start()
        except BaseException:  # not held by the job then: nothing else would stop the bucket's threads
            self.bucket.stop()
            raise

    def notify(self) -> None:
        self.bucket.notify()
        self.repo.notify()

    def cut_short(self, deadline: float) -> None:
        self.bucket.cut_short(deadline)
        self.repo.cut_short(deadline)

    def stop(self, timeout: float = 5.0) -> None:
        deadline = time.monotonic() + timeout
        self.bucket.stop(timeout)
        self.repo.stop(max(0.0, deadline - time.monotonic()))

    def flush(self, timeout: float) -> bool:
        """The bucket first (the last epoch, within a preemption's bound), then the repo's final
        publish (last.pt and best.pt) with the time left; True when both hold everything."""
        deadline = time.monotonic() + timeout
        in_bucket = self.bucket.flush(timeout)
        self.bucket_complete = in_bucket
        if self.repo.select is not final_milestone:
            self.repo.select = final_milestone
            self.repo.snapshot()  # staged now, so the final last.pt rides in the same commit as the rest
        published = self.repo.flush(max(0.0, deadline - time.monotonic()))
        self.final_publish = {"done": published, "commit": self.repo.commits[-1] if self.repo.commits else None}
        if not published:
            logger.warning(
                "bucket: the final publish to %s did not finish (%s); the bucket %s holds the run",
                self.repo.repo_id,
                self.repo.last_error or "out of time",
                self.store.bucket_id,
            )
        return in_bucket and published
