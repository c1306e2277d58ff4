"""The in-memory Hub: the one seam of the protocol's simulation.

Only the Hub calls the agent's store code makes are faked: the bucket (tree listing, batch upload/delete,
paths-info, downloads) and the model repo (``repo_info``, ``create_commit`` honouring ``parent_commit`` with a
412 when the head moved, the raw ``resolve`` read of the lease). Each call is a yield point of the calling
container (a call takes time; another container may run meanwhile) and may meet a fault (``faults.Faults``)
raised as the real client raises it: ``HfHubHTTPError`` with the status and headers, ``EntryNotFoundError``,
``TimeoutError``. What the server holds is the ground truth the oracle reads.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import httpx2
from huggingface_hub import CommitOperationAdd, CommitOperationDelete
from huggingface_hub.errors import HfHubHTTPError, RemoteEntryNotFoundError

from entrypoint.hub import Hub

from .clock import Scheduler
from .faults import Faults

ENDPOINT = "https://hub.sim"


def http_error(status: int, what: str, headers: dict[str, str] | None = None) -> HfHubHTTPError:
    request = httpx2.Request("POST", f"{ENDPOINT}/{what}")
    response = httpx2.Response(status, headers=headers or {}, request=request)
    if status == 404:
        return RemoteEntryNotFoundError(f"404: {what}", response=response)
    return HfHubHTTPError(f"{status}: {what}", response=response)


@dataclass
class Commit:
    sha: str
    files: dict[str, bytes]
    at: float  # true time
    message: str


@dataclass
class Server:
    """What the Hub holds: the bucket's objects and the repo's commits, plus a journal of every write."""

    scheduler: Scheduler
    faults: Faults
    bucket: dict[str, bytes] = field(default_factory=dict)
    commits: list[Commit] = field(default_factory=list)
    journal: list[tuple[float, str, str]] = field(default_factory=list)  # (true time, who, what)
    sent: dict[int, float] = field(default_factory=dict)  # a bucket write's journal index → when its call began
    freezes: list[tuple[str, str, int, float]] = field(default_factory=list)  # who, call, nth, seconds
    calls: dict[tuple[str, str], int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.commits.append(Commit("0" * 40, {".gitattributes": b"*.pt filter=lfs\n"}, self.scheduler.now, "init"))

    @property
    def head(self) -> Commit:
        return self.commits[-1]

    def who(self) -> str:
        actor = self.scheduler.current()
        return actor.name if actor is not None else "person"

    def commit(self, files: dict[str, bytes | None], message: str) -> Commit:
        tree = dict(self.head.files)
        for path, data in files.items():
            if data is None:
                tree.pop(path, None)
            else:
                tree[path] = data
        sha = hashlib.sha1(f"{len(self.commits)}{message}".encode() + repr(sorted(files)).encode()).hexdigest()
        commit = Commit(sha, tree, self.scheduler.now, message)
        self.commits.append(commit)
        self.journal.append((self.scheduler.now, self.who(), f"commit {message}"))
        return commit


def _data(source: Any) -> bytes:
    if isinstance(source, bytes):
        return source
    return Path(source).read_bytes()


class SimApi:
    """The ``HfApi`` methods the store code calls, on the in-memory ``Server``."""

    endpoint = ENDPOINT

    def __init__(self, server: Server) -> None:
        self.server = server

    def _call(self, call: str) -> str:
        """The call's way there: a yield point, then the fault it meets (raised, or returned to apply). A freeze
        scripted for this call (``Server.freezes``: who, call, nth) holds the caller here, its call not applied."""
        server = self.server
        server.scheduler.pause(server.faults.latency())
        self._frozen(call)
        return server.faults.before(call, who=server.who())

    def _after(self, outcome: str, call: str) -> None:
        """The answer's way back. A freeze scripted for ``<call>:answered`` holds the caller here, the call
        applied and answered (what it read is stale by its thaw)."""
        self.server.scheduler.pause(self.server.faults.latency())
        self._frozen(f"{call}:answered")
        self.server.faults.after(outcome, call)

    def _frozen(self, call: str) -> None:
        server = self.server
        if not server.freezes:
            return
        who = server.who()
        server.calls[(who, call)] = server.calls.get((who, call), 0) + 1
        for name, what, nth, seconds in server.freezes:
            if (name, what, nth) == (who, call, server.calls[(who, call)]):
                server.journal.append((server.scheduler.now, who, f"frozen in {call} for {seconds:.0f} s"))
                server.scheduler.pause(seconds)

    # -- the repo ------------------------------------------------------------------------------
    def repo_info(self, repo_id: str, **_: Any) -> Any:
        outcome = self._call("repo_read")
        head = self.server.head
        self._after(outcome, "repo_read")
        return SimpleNamespace(sha=head.sha, last_modified=datetime.fromtimestamp(head.at, UTC))

    def create_commit(self, repo_id: str, operations: list[Any], *, commit_message: str, **kw: Any) -> Any:
        outcome = self._call("commit")
        parent = kw.get("parent_commit")
        if parent is not None and parent != self.server.head.sha:
            raise http_error(412, "the head moved")
        changes: dict[str, bytes | None] = {}
        for op in operations:
            if isinstance(op, CommitOperationAdd):
                changes[op.path_in_repo] = _data(op.path_or_fileobj)
            elif isinstance(op, CommitOperationDelete):
                changes[op.path_in_repo] = None
        commit = self.server.commit(changes, commit_message)
        self._after(outcome, "commit")
        return SimpleNamespace(oid=commit.sha, commit_url="", pr_url=None)

    def resolve(self, url: str) -> httpx2.Response:
        """The raw GET of ``{endpoint}/{repo}/resolve/{revision}/{path}`` (the lease's read)."""
        outcome = self._call("repo_read")
        rest = url.removeprefix(f"{ENDPOINT}/")
        _, _, tail = rest.partition("/resolve/")
        revision, _, path = tail.partition("/")
        commit = next((c for c in self.server.commits if c.sha == revision), None)
        request = httpx2.Request("GET", url)
        data = commit.files.get(path) if commit is not None else None
        self._after(outcome, "repo_read")
        if data is None:
            return httpx2.Response(404, headers={"x-error-code": "EntryNotFound"}, request=request)
        return httpx2.Response(200, content=data, request=request)

    # -- the bucket ------------------------------------------------------------------------------
    def list_bucket_tree(self, bucket_id: str, *, prefix: str, recursive: bool = True) -> Any:
        call = "list_all" if recursive else "list"
        outcome = self._call(call)
        base = prefix.rstrip("/") + "/"
        keys = sorted(k for k in self.server.bucket if k.startswith(base))
        if not keys or outcome == "missing":  # the Hub's 404 on a prefix it does not know (or, a fault, one it does)
            self._after("ok", call)
            raise http_error(404, f"tree {prefix}")
        items: dict[str, Any] = {}
        for key in keys:
            rest = key[len(base) :]
            if recursive or "/" not in rest:
                items[key] = SimpleNamespace(path=key, size=len(self.server.bucket[key]), type="file")
            else:
                folder = base + rest.split("/", 1)[0]
                items[folder] = SimpleNamespace(path=folder, size=None, type="directory")
        found = [items[k] for k in sorted(items)]
        cut = self.server.faults.cut(len(found)) if outcome == "cut" else None
        self._after("ok", call)
        return _pages(found, cut)

    def batch_bucket_files(self, bucket_id: str, *, add: Any = None, delete: Any = None) -> None:
        sent = self.server.scheduler.now  # what the writer knew then licensed it; it may land much later
        outcome = self._call("batch")
        ops: list[tuple[str, bytes | None]] = [(key, _data(src)) for src, key in add or []]
        ops += [(key, None) for key in delete or []]
        if outcome == "some":
            ops = [op for op in ops if self.server.faults.rng.random() < 0.5]
        for key, data in ops:
            if data is None:
                self.server.bucket.pop(key, None)
            else:
                self.server.bucket[key] = data
            self.server.sent[len(self.server.journal)] = sent
            self.server.journal.append(
                (self.server.scheduler.now, self.server.who(), f"{'put' if data else 'del'} {key}")
            )
        self._after(outcome, "batch")

    def get_bucket_paths_info(self, bucket_id: str, paths: list[str]) -> list[Any]:
        outcome = self._call("read")
        found = [SimpleNamespace(path=p, size=len(self.server.bucket[p])) for p in paths if p in self.server.bucket]
        self._after(outcome, "read")
        return found

    def download_bucket_files(self, bucket_id: str, files: list[tuple[str, Any]], **_: Any) -> None:
        outcome = self._call("download")
        wanted = list(files)
        missing = [key for key, _ in wanted if key not in self.server.bucket]
        if missing:
            self._after("ok", "download")
            raise http_error(404, f"bucket file {missing[0]}")
        for n, (key, local) in enumerate(wanted):
            data = self.server.bucket[key]
            if outcome == "partway" and n == len(wanted) - 1:
                Path(local).write_bytes(data[: len(data) // 2])
                self._after(outcome, "download")
            Path(local).write_bytes(data)
        self._after(outcome, "download")


def _pages(found: list[Any], cut: int | None) -> Any:
    """The listing as the client yields it, page by page; ``cut``: the connection drops after that many."""
    for n, item in enumerate(found):
        if cut is not None and n == cut:
            raise TimeoutError("the listing was cut short")
        yield item


class Session:
    """``huggingface_hub.utils.get_session()``'s stand-in: the lease's raw read goes to the in-memory Hub."""

    def __init__(self, api: SimApi) -> None:
        self.api = api

    def get(self, url: str, **_: Any) -> httpx2.Response:
        return self.api.resolve(url)


@dataclass(frozen=True)
class SimHub(Hub):
    """``entrypoint.hub.Hub`` whose ``api`` is the in-memory Hub."""

    sim_api: SimApi | None = None

    @property
    def api(self) -> Any:
        return self.sim_api
