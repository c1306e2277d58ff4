"""Named histories: the orderings of issue 53 (1-8), and one per invariant with the product rule that guards it
switched off (``SWITCHED_OFF``), so each invariant is shown able to fail."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, ExitStack, contextmanager
from typing import Any
from unittest import mock

from entrypoint.sync import bucket_store, protocol, read
from entrypoint.sync import job as job_sync
from entrypoint.sync.bucket import RunFolder

from .container import PERIOD
from .faults import Outage
from .lease_file import absurd_lease, garbage_lease
from .world import Options

# -- the orderings ------------------------------------------------------------------------------------
# c1 trains alone; killed at 300 s (5 epochs in the bucket, the snapshot epoch_3 among them);
# c2 is relaunched on a new volume 10 s later and takes the run over after one lease period.
_TAKEOVER = dict(containers=1, kills=[(300.0, "c1")], relaunch_after=10.0, skews={"c1": 0.0, "c2": 0.0})

# c1 takes a new run alone and freezes once the last listing of its resume read answered (its 4th: two while it
# took the lease, two of the resume read); c2 starts a minute later and takes the run after a period of silence.
_FROZEN_AFTER_THE_RESUME_READ = Options(
    containers=2, starts=[0.0, 60.0], freezes=[("c1", "list:answered", 4, 2.5 * PERIOD)], skews={"c1": 0.0, "c2": 0.0}
)

# c1 trains; c2 starts 20 s later and watches its heartbeat; c2 freezes for a period and a half once its second
# look's listing of c1's manifests answered (its 4th listing): on thaw that look shows no write of c1 since the
# first, a period and more ago.
_WATCHER_FROZEN_MID_LOOK = Options(
    containers=2, starts=[0.0, 20.0], freezes=[("c2", "list:answered", 4, 1.5 * PERIOD)], skews={"c1": 0.0, "c2": 0.0}
)

# 7b's freeze, then one 404 on each listing of the watcher's first look after its thaw (the holder's heartbeat
# folder, then its manifests): that look shows no write of the holder, as its first look (before the holder's
# first boundary) did; it was not watching meanwhile, so its watch starts again there.
_WATCHER_FROZEN_THEN_ONE_404 = Options(
    containers=2,
    starts=[0.0, 20.0],
    freezes=[("c2", "list:answered", 4, 1.5 * PERIOD)],
    outages=[Outage("list", 100.0, 1e9, "missing", "c2", 2)],
    skews={"c1": 0.0, "c2": 0.0},
)

ORDERINGS: dict[str, Options] = {
    # (1) one 404 on the taker's listing of the run folder (it exists): the taker learns nothing, so its manifests
    # carry no snapshot forward, and its tidy deletes the earlier attempt's snapshots.
    "1-one-404-on-a-listing-at-takeover": Options(
        **_TAKEOVER, outages=[Outage("list_all", 0, 1e9, "missing", "c2", 1)]
    ),
    # (2) the bucket's downloads answer 503 for 40 s when the relaunch resumes: it must not start over.
    "2-download-503-for-40s-at-resume": Options(**_TAKEOVER, outages=[Outage("download", 466, 506, "503", "c2")]),
    # (3) a relaunch after a preemption waits one lease period at most, then resumes where the bucket is.
    "3-relaunch-waits-one-period": Options(**_TAKEOVER),
    # (3b) c2 starts watching right after c1's third boundary; c1's fourth boundary's batch is torn (its objects
    # land, its manifest does not) and c1 is killed before it tries again: c2 takes the run a period after its
    # watch began, less than one after those objects landed (no heartbeat: a watcher never sees them).
    "3b-a-torn-batch-then-a-kill-while-watched": Options(
        containers=2,
        starts=[0.0, 170.0],
        kills=[(214.0, "c1")],
        outages=[Outage("batch", 200.0, 1e9, "some", "c1", 1)],
        skews={"c1": 0.0, "c2": 0.0},
    ),
    # (4) the lease commit meets 429: the run goes on unleased; a second container started later takes the lease,
    # and the first, which never reads the lease again, writes on beside it.
    "4-429-on-the-lease-commit": Options(
        containers=2, starts=[0.0, 150.0], script={"commit": ["429"]}, skews={"c1": 0.0, "c2": 0.0}
    ),
    # (5) the holder freezes inside its 8th bucket batch for three periods (after its lease check); the taker's
    # first boundaries land; the holder thaws and its batch lands after the taker's.
    "5-frozen-holder-lands-after-the-taker": Options(
        containers=2, starts=[0.0, 200.0], freezes=[("c1", "batch", 6, 3 * PERIOD)], skews={"c1": 0.0, "c2": 0.0}
    ),
    # (5b) the holder freezes for three periods between reading its lease's head and the lease at that head: on
    # thaw it reads the lease as it was, still its own, and writes a boundary after the taker's.
    "5b-frozen-between-the-lease-read-and-the-write": Options(
        containers=2, starts=[0.0, 200.0], freezes=[("c1", "repo_read", 12, 3 * PERIOD)], skews={"c1": 0.0, "c2": 0.0}
    ),
    # (5c) the holder freezes for two and a half periods once its resume read answered, before it trains: the
    # taker trains and lands epochs meanwhile; on thaw the holder reads its lease before training and ends (71).
    "5c-frozen-between-the-resume-read-and-training": _FROZEN_AFTER_THE_RESUME_READ,
    # (5d) the holder freezes inside its first bucket batch for 110 s; the taker (started 10 s later, watching) takes
    # the run at 173 s, and the batch lands at 186 s, inside the taker's quarter period: the taker reads the run's
    # state after it, and resumes from that epoch.
    "5d-a-batch-frozen-in-its-call-lands-in-the-takers-quarter-period": Options(
        containers=2, starts=[0.0, 10.0], freezes=[("c1", "batch", 1, 110.0)], skews={"c1": 0.0, "c2": 0.0}
    ),
    # (5e) the holder freezes inside its second bucket batch (its second boundary) for 137 s; the taker, started
    # after the holder's first boundary, takes the run a period later and reads its state after the quarter
    # period; the batch lands just after that read, well inside a period of the take: the taker resumes from the
    # first boundary, the state it read (the late batch is inert; its epoch is trained again).
    "5e-a-batch-frozen-in-its-call-lands-after-the-takers-read": Options(
        containers=2, starts=[0.0, 80.0], freezes=[("c1", "batch", 2, 137.0)], skews={"c1": 0.0, "c2": 0.0}
    ),
    # (5f) the holder's first bucket batch is applied and its answer lost, and the holder freezes three periods
    # before it hears so; the taker (started at 150 s, watching) takes the run meanwhile. On thaw the holder's
    # retry would send the batch again a period after the take: it checks its lease first and stops.
    "5f-frozen-before-a-lost-batch-is-sent-again": Options(
        containers=2,
        starts=[0.0, 150.0],
        outages=[Outage("batch", 0.0, 1e9, "lost", "c1", 1)],
        freezes=[("c1", "batch:answered", 1, 3 * PERIOD)],
        skews={"c1": 0.0, "c2": 0.0},
    ),
    # (5g) the holder is killed; of two watchers, c2 takes the run first and freezes inside its lease commit, before
    # the Hub applies it, for a period and a half; c3 takes the run meanwhile. On thaw c2's commit names a head that
    # moved: 412, it looks again, finds c3's heartbeat moving and ends 72.
    "5g-a-taker-frozen-inside-its-lease-commit": Options(
        containers=3,
        starts=[0.0, 150.0, 160.0],
        kills=[(100.0, "c1")],
        freezes=[("c2", "commit", 1, 1.5 * PERIOD)],
        skews={"c1": 0.0, "c2": 0.0, "c3": 0.0},
    ),
    # (6) a person deletes the lease file mid-run (then another container starts), and one rewrites it with
    # garbage.
    "6-lease-deleted-by-a-person": Options(
        containers=2, starts=[0.0, 200.0], person=[(150.0, None)], skews={"c1": 0.0, "c2": 0.0}
    ),
    "6-lease-rewritten-by-a-person": Options(
        containers=2, starts=[0.0, 200.0], person=[(150.0, garbage_lease())], skews={"c1": 0.0, "c2": 0.0}
    ),
    # (6c) a person rewrites it by hand with a period in milliseconds (33 hours): the holder, no longer named,
    # stops; the container started after watches the run's writes one period of its own, not 33 hours, and takes.
    "6c-lease-rewritten-with-a-period-no-run-may-set": Options(
        containers=2, starts=[0.0, 200.0], person=[(150.0, absurd_lease())], skews={"c1": 0.0, "c2": 0.0}
    ),
    # (7) the second container's clock is 10 minutes fast (far beyond CLOCK_SKEW) while the holder lives.
    "7-a-clock-fast-beyond-the-skew": Options(containers=2, starts=[0.0, 20.0], skews={"c1": 0.0, "c2": 600.0}),
    # (7b) a watcher frozen mid-look judges nothing on it: it looks again, sees the holder's heartbeat moved, ends 72.
    "7b-a-watcher-frozen-mid-look": _WATCHER_FROZEN_MID_LOOK,
    # (7c) a watcher frozen a period and a half, whose first look after the thaw meets a 404 on the holder's
    # manifests (the Hub's, for a folder that exists): its silence counts only from that look, the holder's next
    # boundary moves its heartbeat, and it ends 72.
    "7c-a-watcher-frozen-then-one-404-on-the-holders-manifests": _WATCHER_FROZEN_THEN_ONE_404,
    # (8) the holder's token loses the repo (401) mid-run: it can no longer read its lease; a second container
    # started then watches the holder's heartbeat.
    "8-401-on-the-lease-mid-run": Options(
        containers=2,
        starts=[0.0, 150.0],
        outages=[Outage("repo_read", 100, 1e9, "401", "c1"), Outage("commit", 100, 1e9, "401", "c1")],
        skews={"c1": 0.0, "c2": 0.0},
    ),
}

# Orderings no fence of the product closes: they fail (xfail strict) until one does. None: a bucket batch frozen
# inside its call past a period (ordering 5) lands when it thaws, but inert (docs/stores.md "Fences").
FENCED: dict[str, str] = {}


# -- each invariant, with the rule that guards it switched off -------------------------------------------
@contextmanager
def _patched(*patches: AbstractContextManager[Any]) -> Iterator[None]:
    with ExitStack() as stack:
        for patch in patches:
            stack.enter_context(patch)
        yield


def _keep_only_the_manifest(
    listing: Any, newest: Any, known: Any, me: str, attempt_of: Any, *, holder: bool
) -> set[str]:
    """``protocol.deletable`` without "keep what the newest manifest names"."""
    return {k for k in listing.sizes if k != newest.key} if listing.complete and holder else set()


_CONFIRM_HELD = job_sync.confirm_held


def _confirmed_only_before_training(lease: Any, uploader: Any, **kw: Any) -> None:
    """``job.confirm_held`` without its first call (before the run's state is read: no uploader yet)."""
    if uploader is not None:
        _CONFIRM_HELD(lease, uploader, **kw)


def _everything_writes(*_: Any, **__: Any) -> bool:
    return True


SWITCHED_OFF: dict[str, tuple[str, Options, Callable[[], AbstractContextManager[Any]]]] = {
    # name: (what the oracle says, the history, the rule switched off). The oracle judges only that invariant
    # (``ALONE``) where switching the rule off breaks an earlier one first.
    "nothing-durable-lost": (
        "a container was told",
        Options(containers=1),
        lambda: mock.patch.object(protocol, "deletable", _keep_only_the_manifest),
    ),
    "snapshots-kept": (
        "said to be on the Hub is in no whole state",
        Options(**_TAKEOVER),
        lambda: mock.patch.object(protocol, "next_files", lambda base, previous, written: {**previous, **written}),
    ),
    "one-writer-after-a-period": (
        "took the lease",
        # the holder freezes for three periods between two Hub calls: on thaw it reads the lease, finds the
        # taker's attempt and stops.
        Options(containers=2, starts=[0.0, 200.0], pauses=[(150.0, "c1", 3 * PERIOD)]),
        lambda: _patched(
            mock.patch.object(protocol, "may_write", _everything_writes),
            mock.patch.object(bucket_store, "newest_attempt", lambda keys, folder: None),
        ),
    ),
    "a-late-write-is-inert": (
        # ordering 5 with one key space for every attempt's objects: the batch landing on thaw writes keys the
        # taker's manifests may name.
        "not a key of its own attempt",
        ORDERINGS["5-frozen-holder-lands-after-the-taker"],
        lambda: mock.patch.object(
            RunFolder, "object_key", lambda self, attempt, sha, relative: f"{self.prefix}/objects/{sha[:16]}/{relative}"
        ),
    ),
    "a-late-tidy-deletes-nothing-the-run-keeps": (
        # with "keep what the newest manifest names" switched off, the holder's 6th batch is a tidy: it freezes inside
        # it for three periods, the taker's manifests carry its epoch_3.pt forward meanwhile, and the tidy lands.
        "which run/.*/manifests/.* names",
        Options(
            containers=2, starts=[0.0, 200.0], freezes=[("c1", "batch", 6, 3 * PERIOD)], skews={"c1": 0.0, "c2": 0.0}
        ),
        lambda: mock.patch.object(protocol, "deletable", _keep_only_the_manifest),
    ),
    "taken-over-only-after-a-period-of-silence": (
        "whose last write landed",
        Options(containers=2, starts=[0.0, 100.0], skews={"c1": 0.0, "c2": 0.0}),
        lambda: mock.patch.object(
            protocol, "judge_lease", lambda lease, me, beat, now, watch, **_: (protocol.Verdict.TAKE, None)
        ),
    ),
    "taken-over-only-after-a-period-of-silence-seen-fresh": (
        "whose last write landed",
        _WATCHER_FROZEN_MID_LOOK,
        lambda: mock.patch.object(protocol, "lease_read_fresh", lambda *a, **k: True),
    ),
    "taken-over-only-after-a-period-of-silence-watched-unbroken": (
        "whose last write landed",
        _WATCHER_FROZEN_THEN_ONE_404,
        lambda: mock.patch.object(protocol, "watch_unbroken", lambda *a, **k: True),
    ),
    "never-a-start-from-less": (
        "while the Hub holds a state",
        Options(**_TAKEOVER, outages=[Outage("list", 455, 530, "503", "c2")]),
        lambda: mock.patch.object(protocol, "bucket_read", lambda *a, **k: protocol.BucketRead.WITHOUT),
    ),
    "never-a-start-from-less-after-a-freeze": (
        "while the Hub holds a state",
        _FROZEN_AFTER_THE_RESUME_READ,
        lambda: mock.patch.object(job_sync, "confirm_held", lambda *a, **k: None),
    ),
    "never-a-start-from-less-than-the-last-licensed-write": (
        "while the Hub holds a state",
        ORDERINGS["5d-a-batch-frozen-in-its-call-lands-in-the-takers-quarter-period"],
        lambda: mock.patch.object(job_sync, "confirm_held", _confirmed_only_before_training),
    ),
    "two-trainers-never-both-end-0": (
        "two containers that trained ended 0",
        Options(containers=2, starts=[0.0, 100.0], skews={"c1": 0.0, "c2": 0.0}),
        lambda: _patched(
            mock.patch.object(
                protocol, "judge_lease", lambda lease, me, beat, now, watch, **_: (protocol.Verdict.TAKE, None)
            ),
            mock.patch.object(protocol, "may_write", _everything_writes),
            mock.patch.object(bucket_store, "newest_attempt", lambda keys, folder: None),
        ),
    ),
    "each-epoch-trained-at-most-twice": (
        "trained a third time",
        Options(containers=1, kills=[(300.0, "c1"), (620.0, "c2")], relaunch_after=10.0, disruptions=0),
        lambda: mock.patch.object(read, "bucket_sources", lambda *a, **k: []),
    ),
}

# The invariants judged alone in those histories (the oracle's names), where another would fail first.
ALONE = {
    "a-late-tidy-deletes-nothing-the-run-keeps": {"one-writer"},
    "two-trainers-never-both-end-0": {"two-end-0"},
    "each-epoch-trained-at-most-twice": {"trained-twice"},
}
