"""The places a run's files go, as the uploader sees them: the ``Store`` protocol, and the model repo as one.

A store takes a batch of staged files as one unit (a commit of the model repo, a boundary of the bucket:
``bucket_store.BucketStore``), can tell later whether a batch whose answer was lost landed, and what it
holds. Every call honours the deadline it is given (a ``time.monotonic()`` value): the final upload after
a SIGTERM has seconds, not minutes.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol

from ..hub import Hub, ParentMovedError
from .staging import StagedFile


class Store(Protocol):
    """What the uploader needs of a place it writes to."""

    @property
    def name(self) -> str:
        """For logs and reports: ``org/name`` of a repo, ``hf://buckets/...`` of a bucket folder."""
        ...

    def commit(self, files: Sequence[StagedFile], message: str, *, deadline: float | None, commit_id: str) -> str:
        """Put ``files`` there as one unit, marked ``commit_id``; return what names it now (a sha)."""
        ...

    def landed(self, commit_id: str, *, deadline: float | None) -> str | None:
        """What names the unit marked ``commit_id`` if it landed, else None; raise when unknown."""
        ...

    def head(self) -> str | None:
        """What names the store's state now (None: nothing of ours yet); the ledger is trusted only
        while it is what the ledger last saw."""
        ...

    def remote_ids(self) -> dict[str, str]:
        """``relative path → sha256 (or git blob id)`` of what the store holds."""
        ...

    def tidy(self, *, deadline: float | None) -> None:
        """After a landing: whatever the store does once a unit is safe (the bucket deletes what no
        manifest names any more). Never undoes what landed."""
        ...


class RepoStore:
    """The model repo (OUTPUT_REPO): each unit is one commit, with ``parent_commit`` the head this writer last
    knew (its own last commit, else the head read just before): a commit that lands late (a writer frozen while
    it was in flight) after another's is refused (412), never laid over it. On a 412 ``moved`` is called (the
    run's lease read again: ``TakenOverError`` when another holds it), then the head is read again."""

    def __init__(self, hub: Hub, repo_id: str, moved: Callable[[float | None], None] | None = None) -> None:
        self.hub = hub
        self.repo_id = repo_id
        self.moved = moved
        self._parent: str | None = None  # the head as this writer last knew it

    @property
    def name(self) -> str:
        return self.repo_id

    def commit(self, files: Sequence[StagedFile], message: str, *, deadline: float | None, commit_id: str) -> str:
        pairs = [(item.relative, item.path) for item in files]
        parent = self._parent or self.hub.head(self.repo_id, deadline=deadline)
        self._parent = None  # known again only from this commit's answer
        try:
            sha = self.hub.commit(self.repo_id, pairs, message, deadline=deadline, commit_id=commit_id, parent=parent)
        except ParentMovedError:
            if self.moved is not None:
                self.moved(deadline)  # the lease another's: TakenOverError, nothing more written
            parent = self.hub.head(self.repo_id, deadline=deadline)  # a commit of this writer's moved it
            sha = self.hub.commit(self.repo_id, pairs, message, deadline=deadline, commit_id=commit_id, parent=parent)
        self._parent = sha
        return sha

    def landed(self, commit_id: str, *, deadline: float | None) -> str | None:
        sha = self.hub.landed(self.repo_id, commit_id, deadline=deadline)
        self._parent = sha if sha is not None else self._parent
        return sha

    def head(self) -> str | None:
        return self.hub.head(self.repo_id)

    def remote_ids(self) -> dict[str, str]:
        return self.hub.remote_ids(self.repo_id)

    def tidy(self, *, deadline: float | None) -> None:
        """A repo keeps its history: nothing to tidy."""
