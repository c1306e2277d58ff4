"""Which store gets which file of the run folder, and how often.

With a bucket, the bucket takes every file at every boundary (the working state), and the model repo
milestones: ``best.pt``, ``metrics.jsonl``, ``trainbox.json``, the card and the plot, at most once per
PUBLISH_EVERY (the newest state wins), and at the end the final ``last.pt`` and ``best.pt``
(``final_milestone``). When the bucket fails ``FALLBACK_AFTER`` boundaries in a row, or refuses the
token, the repo takes everything at every boundary until the bucket answers again (uploader.py).
Without a bucket, the repo takes everything at every boundary.
"""

from __future__ import annotations

from .. import libreyolo
from .lane import Lane
from .ledger import COMMITS_PER_HOUR, CommitBudget
from .staging import StagedFile

# Failed bucket boundaries in a row before the working state goes to the repo as commits.
FALLBACK_AFTER = 3
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


def unlimited_budget() -> CommitBudget:
    return CommitBudget(per_hour=UNLIMITED, burst=UNLIMITED)


def publish_budget(publish_every: float, recent: list[float]) -> CommitBudget:
    """At most one milestone commit per ``publish_every`` seconds (0: the Hub's own budget)."""
    if publish_every <= 0:
        return CommitBudget(recent=recent)
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

    def __init__(self, repo: Lane, bucket: Lane | None, publish_every: float) -> None:
        self.repo = repo
        self.bucket = bucket
        self.publish_every = publish_every
        self.fallback: str | None = None  # why the repo holds the working state instead of the bucket
        self.final = False  # the end: the repo takes the final last.pt too
        self.everywhere = False  # a flush waits for the repo's milestones too
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
        if self.bucket is None or self.fallback is not None:
            return [self.repo]
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
        """Bucket mode, at the end: the repo takes the final last.pt too. True when this changed it."""
        if self.bucket is None or self.final:
            return False
        self.final = True
        if self.fallback is None:
            self.repo.takes = final_milestone
        return True

    def fall_back(self, why: str) -> bool:
        """The bucket keeps failing: the repo takes everything at every boundary. True when this changed it."""
        if self.bucket is None or self.fallback is not None:
            return False
        self.fallback = why
        self.repo.takes = everything
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
