"""A lane: one store's side of the uploader, its queue and the record of its commits.

The uploader runs one committer thread per lane, so a slow commit to the model repo never holds back a
bucket boundary. A lane holds the newest staged copy of each file its store still needs (``pending``),
the ledger of what the store holds, its commit budget and how its last commits went. Its fields are read
and written under the uploader's condition, except ``ledger``, ``commits`` and ``latencies``, which only
the lane's own committer writes.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable
from pathlib import Path

from ..errors import StopRequested
from ..log import logger
from .ledger import CommitBudget, Ledger
from .staging import StagedFile
from .stores import Store


class Lane:
    def __init__(
        self, store: Store, work_dir: Path, *, takes: Callable[[str], bool], budget: CommitBudget | None
    ) -> None:
        self.store = store
        self.ledger = Ledger(work_dir / "ledger.json")
        self.budget = budget or CommitBudget(recent=self.ledger.commit_times)
        self.takes = takes  # which files of the run folder this store gets now
        self.pending: dict[str, StagedFile] = {}
        self.in_flight: list[StagedFile] = []  # what the commit under way reads
        self.busy = False  # a commit (and the store's tidying after it) is under way
        # The last commit that failed without a clear "no": it may have landed.
        self.unconfirmed: tuple[str, list[StagedFile]] | None = None
        self.failures = 0  # commits failed in a row
        self.failing_since: float | None = None  # monotonic: when the first of them failed
        self.retry_at = 0.0
        self.denied_at = 0.0  # when the store last refused the token
        self.commits: list[str] = []
        self.latencies: deque[float] = deque(maxlen=1000)
        self.last_error: str | None = None
        self.work = threading.Event()  # something to commit, or someone waits

    @property
    def name(self) -> str:
        return self.store.name

    def wants(self, item: StagedFile) -> bool:
        """This store takes the file and does not hold this version yet."""
        return self.takes(item.relative) and not self.ledger.has(item.relative, item.ids)

    def holds(self, item: StagedFile) -> bool:
        """``item``'s copy is still needed here (pending, or read by the commit under way)."""
        return self.pending.get(item.relative) is item or any(held is item for held in self.in_flight)

    def check_ledger(self) -> None:
        """Trust the ledger only if the store is still where we left it; else relearn it from the store."""
        try:
            head = self.store.head()
            if head == self.ledger.head:
                return
            remote = {} if head is None else self.store.remote_ids()
        except StopRequested:  # raised by the signal handler in this (main) thread: the job must stop
            raise
        except Exception as error:
            logger.warning("sync: cannot read %s (%s); every file will be checked again", self.name, error)
            remote, head = {}, None
        if self.ledger.head is not None and head is not None:
            logger.info("sync: %s changed since the last upload; relearning what it holds", self.name)
        try:
            self.ledger.rebuild(remote, head)
        except OSError as error:
            logger.warning("sync: cannot save the upload ledger (%s)", error)
