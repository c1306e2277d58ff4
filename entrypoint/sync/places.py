"""Which store gets which file of the run folder, and how often.

With a bucket, the bucket takes every file at every boundary (the working state), and the model repo
milestones: ``best.pt``, ``metrics.jsonl``, ``trainbox.json``, the card and the plot, at most once per
PUBLISH_EVERY (the newest state wins; off: none until the end), and at the end the final ``last.pt`` and
``best.pt`` (``final_milestone``). The final ``last.pt`` is staged again for the repo (the bucket's copy is
gone by then): at once at a normal end, after SIGTERM only once the working state is in (``restage_due``).
When the bucket fails ``FALLBACK_AFTER`` boundaries in a row and for half a lease period (sync/protocol.py), or
refuses the token, the repo takes the working state at every boundary (``last.pt`` and the small files, never the
``epoch_N.pt`` snapshots: they wait for the bucket) until the bucket answers again (uploader.py).
Without a bucket, the repo takes everything at every boundary.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .. import libreyolo
from . import protocol
from .lane import Lane
from .ledger import COMMITS_PER_HOUR, CommitBudget
from .staging import StagedFile

# Failed bucket boundaries in a row (and half a lease period) before the working state goes to the repo.
FALLBACK_AFTER = protocol.FALLBACK_BOUNDARIES
# The bucket has no commit limit: every boundary goes at once.
UNLIMITED = 10**9


def everything(_relative: str) -> bool:
    return True


def working_state_only(relative: str) -> bool:
    """Files that live in the bucket during the run: the repo gets them at the end, or never."""
    return relative == libreyolo.LAST_CHECKPOINT or libreyolo.EPOCH_CHECKPOINT.match(relative) is not None


def milestone(relative: str) -> bool:
    return not working_state_only(relative)


def final_milestone(relative: str) -> bool:
    """At the end the repo also gets the final last.pt; the epoch_N.pt snapshots stay in the bucket."""
    return libreyolo.EPOCH_CHECKPOINT.match(relative) is None


def final_restaged(relative: str) -> bool:
    """Staged again for the repo at the end: the final last.pt (the bucket's staged copy is gone by then)."""
    return relative == libreyolo.LAST_CHECKPOINT


def unlimited_budget() -> CommitBudget:
    return CommitBudget(per_hour=UNLIMITED, burst=UNLIMITED)


def publish_budget(publish_every: float | None, recent: list[float]) -> CommitBudget:
    """At most one milestone commit per ``publish_every`` seconds; None (or 0): none of its own, only the
    commits a flush asks for (the run id before training, the end)."""
    if publish_every is None or publish_every <= 0:
        return CommitBudget(per_hour=0, burst=0)
    per_hour = 3600.0 / publish_every
    budget = CommitBudget(per_hour=max(1, int(per_hour)), burst=1)
    if per_hour < 1:  # slower than one an hour: the rate itself, not rounded up
        budget.rate = 1.0 / publish_every
    return budget


def every_boundary_budget(recent: list[float]) -> CommitBudget:
    """The repo holding the working state: a commit per boundary, within the Hub's hourly limit."""
    return CommitBudget(per_hour=COMMITS_PER_HOUR, recent=recent)


class Routing:
    """Which lane holds the working state and what the repo takes: bucket mode, its fallback to the repo,
    the end's final publish. Read and changed under the uploader's condition."""

    def __init__(self, repo: Lane, bucket: Lane | None, publish_every: float | None) -> None:
        self.repo = repo
        self.bucket = bucket
        self.publish_every = publish_every
        self.fallback: str | None = None  # why the repo holds the working state instead of the bucket
        self.final = False  # the end: the repo takes the final last.pt too
        self.everywhere = False  # a flush waits for the repo's milestones too
        self.restage_waiting = False  # the end: the final last.pt is still to be staged again for the repo
        # The end's snapshot ticket the repo's milestones wait for: what it holds from earlier boundaries is
        # older than what the end stages, and one commit of the newest state is the repo's end (0: none).
        self.final_ticket = 0
        if bucket is not None:
            repo.takes = milestone
            repo.budget = publish_budget(publish_every, repo.ledger.commit_times)

    @property
    def lanes(self) -> list[Lane]:
        return [lane for lane in (self.bucket, self.repo) if lane is not None]

    @property
    def working(self) -> Lane:
        """The lane that holds the working state now: the bucket, or the repo (no bucket, or fallback)."""
        return self.bucket if self.bucket is not None and self.fallback is None else self.repo

    def required(self) -> list[Lane]:
        """The lanes a flush waits for: the working state's, and the repo's at the end or without a bucket."""
        if self.bucket is None:
            return [self.repo]
        if self.fallback is not None:  # the snapshots wait for the bucket: the end's flush waits for them too
            snapshots = self.final and any(protocol.is_snapshot(relative) for relative in self.bucket.pending)
            return [self.repo, self.bucket] if snapshots else [self.repo]
        return [self.bucket, self.repo] if self.final or self.everywhere else [self.bucket]

    def deliver(self, staged: list[StagedFile]) -> list[StagedFile]:
        """Each lane that wants a staged copy holds it, replacing an older one; the copies none holds now."""
        unused = []
        for item in staged:
            takers = [lane for lane in self.lanes if lane.wants(item)]
            for lane in takers:
                replaced = lane.pending.get(item.relative)
                if replaced is not None and replaced is not item:
                    unused.append(replaced)
                lane.pending[item.relative] = item
                lane.work.set()
            if not takers:
                unused.append(item)
        return unused

    def to_final(self) -> bool:
        """Bucket mode, at the end: the repo takes the final last.pt too, staged again for it (the bucket's
        copy is gone; with the fallback the repo holds it already). True when this changed it."""
        if self.bucket is None or self.final:
            return False
        self.final = True
        if self.fallback is None:
            self.repo.takes = final_milestone
            self.restage_waiting = True
        return True

    def repo_holds(self, answered: bool) -> bool:
        """Bucket mode, the end: whether the repo's committer waits for the end's snapshot (``answered``: it
        has run). The working state never waits: with the fallback the repo holds it, and it goes at once."""
        return self.final_ticket > 0 and self.fallback is None and not answered

    def restage_due(self, *, pressed: bool, boundary_staged: bool) -> bool:
        """Whether the final last.pt is to be staged again for the repo now: at once, or under a stop that
        presses (SIGTERM), once the working state's final boundary is staged and committed: it comes first,
        and what time it leaves goes to the repo. True once; the caller asks the snapshot."""
        working = self.working
        if not self.restage_waiting or (pressed and (not boundary_staged or working.pending or working.busy)):
            return False
        self.restage_waiting = False
        return True

    def final_left(self, skipped: dict[str, str], last: Path) -> dict[str, str]:
        """What the repo's final publish lacks that no commit will carry: the files not staged again for it
        (``skipped``), and the final last.pt (``last``) while its staging waits for the working state."""
        if self.bucket is None or not self.final:
            return {}
        left = dict(skipped)
        if self.restage_waiting and last.is_file():
            left[libreyolo.LAST_CHECKPOINT] = "no time left before the exit: the working state went first"
        return left

    def final_outcome(self, seen: bool, failed: dict[str, str], skipped: dict[str, str]) -> tuple[bool, dict[str, Any]]:
        """Bucket mode, after the end's flush: whether the bucket holds every file, and trainbox.json's
        ``sync.final_publish``. ``seen``: a snapshot read the volume to its end (else what it holds is not
        known); ``failed``: not staged; ``skipped``: not staged for the repo, no time being left."""
        assert self.bucket is not None
        complete = seen and self.fallback is None and not self.bucket.pending and not failed
        published = seen and not self.repo.pending and not failed and not skipped
        record = {"done": published, "commit": self.repo.commits[-1] if self.repo.commits else None}
        return complete, record | ({"skipped": skipped} if skipped else {})

    def fall_back(self, why: str) -> bool:
        """The bucket keeps failing: the repo takes the working state at every boundary, never a snapshot. True
        when this changed it."""
        if self.bucket is None or self.fallback is not None:
            return False
        self.fallback = why
        self.repo.takes = protocol.repo_takes_in_fallback
        self.repo.budget = every_boundary_budget(self.repo.ledger.commit_times)
        return True

    def back(self) -> list[StagedFile] | None:
        """The bucket answers again: the repo takes milestones again; the copies it no longer needs
        (None when nothing changed)."""
        if self.bucket is None or self.fallback is None:
            return None
        self.fallback = None
        self.repo.takes = final_milestone if self.final else milestone
        self.repo.budget = publish_budget(self.publish_every, self.repo.ledger.commit_times)
        return [self.repo.pending.pop(r) for r in [r for r in self.repo.pending if not self.repo.takes(r)]]
