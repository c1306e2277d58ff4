"""The run's lease: one container writes a run at a time. sync/protocol.py decides; this module reads and writes.

The lease is a small file in the model repo (``LEASE_FILE``: the run id, the holding attempt, when it took the
run, the period), committed with ``parent_commit``: the Hub answers 412 when the repo moved since it was read, so
of two containers taking it at once one wins and the other reads again (on a new run, the lease carries the run
id: the loser adopts it instead of minting its own). The holder's heartbeat is what it writes anyway: its
manifests in the bucket, its commits to the repo; when neither came for half a period (long epochs), a small
heartbeat object in the bucket, or without one a lease commit to the repo. No commit per boundary, and one
read of the lease per quarter period at most.

A container that finds the lease held watches the holder's heartbeat on its own clock (clocks may be a minute
apart): if it moves within one period, the holder lives and this one ends (``LeaseHeldError``, exit 72, having
written nothing); if not, the lease has expired and is taken over (compare-and-swap), so a container relaunched
after a preemption waits at most one period, and none where the holder is provably gone: the lease names the
holder's volume and instance, and this container holds that volume's lock, or the holder's provider says that
instance no longer runs (release/elsewhere.py). The holder checks the lease before each write (a read at most
every quarter period: a taker needs a whole period of silence first); a lease that names another attempt stops
it (``TakenOverError``, exit 71).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from huggingface_hub import CommitOperationAdd, hf_hub_url
from huggingface_hub.errors import BucketNotFoundError, HfHubHTTPError
from huggingface_hub.utils import build_hf_headers, get_session, hf_raise_for_status

from ..errors import LeaseHeldError, LeaseRefusedError, StopRequested, StoreUnreadableError, TakenOverError
from ..hub import Hub, with_retries
from ..log import logger
from ..retry import RETRY_STATUS, describe, retry_after_of, status_of
from . import clock, protocol
from .bucket import Bucket, RunFolder, new_attempt

LEASE_FILE = ".trainbox/lease.json"
HEARTBEAT = "heartbeat"
_SAID_EVERY = 30.0


class RunLease:
    """This container's side of the run's lease: take it (``acquire``), keep it (``landed``, ``check``, the
    heartbeat thread), let it go at the end (``release``)."""

    def __init__(
        self,
        hub: Hub,
        repo_id: str,
        run_name: str,
        period: float,
        bucket: Bucket | None,
        *,
        machine: str | None = None,
        volume_locked: Callable[[], bool] = lambda: False,
        instance: tuple[str, str] | None = None,
        holder_ended: Callable[[protocol.Lease, float], str | None] = lambda lease, within: None,
    ) -> None:
        self.hub, self.repo_id, self.run_name, self.period, self.bucket = hub, repo_id, run_name, period, bucket
        # This volume's id, written into the lease; ``volume_locked``: this process holds the volume's lock, so
        # an earlier holder on this same volume is gone (the kernel dropped its lock with it).
        self.machine, self.volume_locked = machine, volume_locked
        # This instance at its provider (kind, id), written into the lease; ``holder_ended(lease, within)``: the
        # provider's words when the instance a lease names no longer runs, asked for ``within`` seconds at most.
        self.instance, self.holder_ended = instance, holder_ended
        self.attempt: str | None = None
        self.run_id: str | None = None
        self._beat_at = 0.0  # monotonic: when a write of this attempt last landed (a heartbeat)
        self._checked_at = 0.0  # monotonic: when a read of the lease last named this attempt
        self._writes_from = 0.0  # monotonic: no write before (a holder taken over may still be finishing one)
        self._took_at = 0.0  # monotonic: when this attempt took the run over from a holder
        self._beats = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.lost: TakenOverError | None = None
        self.took_from: str | None = None  # the attempt the lease named when this one took it (its chain is read)
        self.retry_after = 0.0  # seconds of quiet the Hub asked for while the lease was taken (429), waited out
        self._limited = 0.0  # seconds waited out on the lease's rate limits at this start
        self.may_commit: Callable[[], bool] = lambda: True  # False while the repo rate-limits this run's commits

    # -- reading --------------------------------------------------------------------------------
    def read(self, deadline: float | None = None) -> tuple[protocol.Lease | None, str, float | None]:
        """The lease as the repo's head holds it, the head's sha and its time (the Hub's clock)."""
        api = self.hub.api
        info = with_retries(lambda: api.repo_info(self.repo_id), f"reading {self.repo_id}", deadline=deadline)
        head = str(info.sha)
        modified = getattr(info, "last_modified", None)
        at = modified.timestamp() if modified is not None else None
        url = hf_hub_url(self.repo_id, LEASE_FILE, revision=head, endpoint=api.endpoint)
        headers = build_hf_headers(token=self.hub.token or False)

        def fetch() -> bytes | None:
            response = get_session().get(url, headers=headers, timeout=30)
            if response.status_code == 404:
                return None
            hf_raise_for_status(response)
            return bytes(response.content)

        data = with_retries(fetch, f"reading the run's lease in {self.repo_id}", deadline=deadline)
        return (protocol.Lease.parse(data) if data is not None else None), head, at

    def _beat(
        self, lease: protocol.Lease | None, head: str, head_at: float | None, run_id: str
    ) -> protocol.Beat | None:
        """The holder's heartbeat: the repo's head, and its manifests and heartbeats in the bucket (without a
        lease: any attempt's); None: the bucket could not be read now."""
        if self.bucket is None:
            return protocol.Beat(head, head_at)
        folder = RunFolder(self.bucket, self.run_name, lease.run_id if lease is not None else run_id)
        try:
            found = [
                key
                for part in (HEARTBEAT, "manifests")
                for key in self.bucket.listing(f"{folder.prefix}/{part}", recursive=False)
                if lease is None or f"/{lease.holder}-" in key
            ]
        except StopRequested:
            raise
        except BucketNotFoundError:  # no bucket yet: nothing of the run is in it
            return protocol.Beat(head, head_at)
        except Exception as error:
            logger.info("lease: cannot read %s now (%s); looking again", folder.label, describe(error))
            return None
        # Without any write of the holder in the bucket, the repo's head time tells when it last wrote.
        return protocol.Beat(f"{head}|{','.join(sorted(found))}", None if found else head_at, writes=bool(found))

    # -- taking ---------------------------------------------------------------------------------
    def acquire(self, run_id: str, *, sleep: Callable[[float], None] = clock.sleep, run_known: bool = True) -> str:
        """Take the run's lease; return the run id it names (another container's, on a new run both started).
        ``LeaseHeldError`` when a live container holds it; ``StoreUnreadableError`` when its heartbeat could
        not be read for three periods. ``run_known``: the repo knew the run before this start (without a lease,
        its bucket is watched first: the file may have been deleted by hand)."""
        watch: protocol.Watch | None = None
        watched_to: float | None = None  # when the last judged look ended
        began, said = clock.monotonic(), -_SAID_EVERY
        while True:
            looked = clock.monotonic()
            lease, head, head_at = self.read()
            if self.attempt is None:
                self.attempt = new_attempt(after=lease.holder if lease is not None else None)
            live = (lease is None and run_known) or (
                lease is not None and not lease.released and lease.holder != self.attempt
            )
            beat = self._beat(lease, head, head_at, run_id) if live else protocol.Beat(head, head_at)
            # A look frozen or slowed a quarter period is stale (the holder may have written since): never judged.
            if beat is None or not protocol.lease_read_fresh(looked, clock.monotonic(), self.period):
                if clock.monotonic() - began > 3 * self.period:
                    raise StoreUnreadableError(
                        f"cannot tell whether another container holds run {self.run_name}: its bucket does not answer",
                        "start it again once the bucket answers",
                    )
                sleep(min(10.0, self.period / 12))
                continue
            if not protocol.watch_unbroken(watched_to, looked, self.period):
                watch = None  # not watched meanwhile: the silence counts from this look
            # A lease absent while the bucket holds the run's writes is no free take (deleted by hand, lost).
            state_held = lease is None and beat.writes
            same_volume = lease is not None and _same_volume(self, lease)
            ended = _holder_ended(self, lease, watch) if live and lease is not None and not same_volume else None
            gone = same_volume or ended is not None
            verdict, watch = protocol.judge_lease(
                lease,
                self.attempt,
                beat,
                clock.monotonic(),
                watch,
                state_held=state_held,
                holder_gone=gone,
                period=self.period,
            )
            if verdict is protocol.Verdict.HELD:  # a lease deleted by hand while its holder writes: held too
                who = f"attempt {lease.holder}" if lease is not None else "no lease names it"
                raise LeaseHeldError(
                    f"another container holds run {self.run_name} ({who}; its heartbeat moved while this one"
                    " watched): this one writes nothing and ends",
                    "do not start it again while that one runs; it is not a failure of this run",
                )
            if verdict is protocol.Verdict.WATCH:
                assert watch is not None
                watched_to = clock.monotonic()
                if clock.monotonic() - said >= _SAID_EVERY:
                    said = clock.monotonic()
                    logger.info(
                        "lease: %s run %s; watching its heartbeat (taken over if quiet %.0f s more)",
                        f"attempt {lease.holder} holds" if lease is not None else "no lease names a holder of",
                        self.run_name,
                        max(0.0, (lease.period if lease else self.period) - (clock.monotonic() - watch.since)),
                    )
                sleep(min(10.0, self.period / 12))
                continue
            held_id = lease.run_id if lease is not None else run_id
            if verdict is protocol.Verdict.TAKE and lease is not None and self.attempt <= lease.holder:
                self.attempt = new_attempt(after=lease.holder)  # later than the one it takes over from
            if verdict is protocol.Verdict.TAKE and not self._take(held_id, head, lease, ended):
                watch = None
                continue
            self.run_id = held_id
            self.took_from = lease.holder if lease is not None and verdict is protocol.Verdict.TAKE else None
            self.landed()
            self._checked_at = clock.monotonic()
            if verdict is protocol.Verdict.TAKE and lease is not None and not lease.released and not same_volume:
                # The holder taken over may have read its lease just before: it writes for at most a quarter
                # period more (a provider's record may say "ended" before the host stopped its container, and a
                # stopped holder makes its final upload). This one writes, and reads what it carries forward,
                # only after that: a quarter of the holder's own period (its lease says it), if longer than ours.
                self._took_at = self._checked_at
                self._writes_from = self._took_at + max(self.period, lease.period) / 4
            return held_id

    def _take(self, run_id: str, head: str, previous: protocol.Lease | None, ended: str | None = None) -> bool:
        """Commit the lease with ``parent_commit`` ``head``; False when the repo moved (412), the answer was
        lost (the next read says whether it landed), or a rate limit was waited out (look again). A token that
        may not commit, or a rate limit longer than a start waits: ``LeaseRefusedError`` (never unleased).
        ``ended``: the provider's words on the instance of the holder (gone: taken over at once)."""
        lease = _lease_now(self, run_id)
        if previous is not None and not previous.released and ended is not None:
            logger.info(
                "lease: attempt %s held run %s on %s: taken over at once", previous.holder, self.run_name, ended
            )
        elif previous is not None and not previous.released:
            why = (
                "ran on this volume, whose lock it no longer holds"
                if _same_volume(self, previous)
                else f"was quiet a whole lease period ({previous.period:.0f} s)"
            )
            logger.warning("lease: attempt %s of run %s %s: taking the run over", previous.holder, self.run_name, why)
        try:
            self._commit(lease.to_bytes(), head, "Take the run's lease")
        except HfHubHTTPError as error:
            return self._refused(error)
        return True

    def _refused(self, error: HfHubHTTPError) -> bool:
        status, reset = status_of(error), retry_after_of(error)
        answer = protocol.lease_refused(status, reset, self._limited)
        if answer is protocol.LeaseAnswer.LOOK_AGAIN:
            logger.info("lease: the repo moved while the lease was taken; reading it again")
            return False
        if answer is protocol.LeaseAnswer.WAIT:
            wait = reset if reset is not None else 60.0
            logger.warning(
                "lease: %s rate-limits commits (HTTP 429): the run's lease is taken after the reset, in %.0f s;"
                " nothing is written before",
                self.repo_id,
                wait,
            )
            self._limited += wait
            self.retry_after = max(self.retry_after, wait)
            clock.sleep(wait)
            return False
        if status in (401, 403):
            raise LeaseRefusedError(
                f"HF_TOKEN may not commit the run's lease to {self.repo_id} (HTTP {status}): a run is never written"
                " without its lease; nothing written",
                "give HF_TOKEN write access to OUTPUT_REPO",
            ) from None
        if status == 429:
            raise LeaseRefusedError(
                f"{self.repo_id} rate-limits commits for {reset or 0:.0f} s more: the run's lease cannot be taken"
                " before; nothing written",
                "start it again after the Hub's rate limit resets (a retryable exit)",
            ) from None
        raise error

    def _commit(self, data: bytes, parent: str, message: str) -> None:
        api = self.hub.api
        with_retries(
            lambda: api.create_commit(
                self.repo_id,
                [CommitOperationAdd(path_in_repo=LEASE_FILE, path_or_fileobj=data)],
                commit_message=message,
                parent_commit=parent,
            ),
            f"committing the run's lease to {self.repo_id}",
            retry_status=RETRY_STATUS - {429},  # a rate limit is not waited out here (it may last an hour)
        )

    # -- keeping ----------------------------------------------------------------------------------
    def landed(self) -> None:
        """A write of this attempt landed (a boundary, a commit): that is a heartbeat."""
        with self._lock:
            self._beat_at = clock.monotonic()

    def quiet(self) -> float:
        with self._lock:
            return clock.monotonic() - self._beat_at

    def check(self, deadline: float | None = None, *, force: bool = False) -> None:
        """Before a write: this attempt still holds the run, else ``TakenOverError``. The lease is read again
        when the last read is a quarter period old (a read error: the write waits); a taker waits a whole
        period of silence, so a take-over is seen long before this attempt's writes could matter."""
        if self.lost is not None:
            raise self.lost
        wait = self._writes_from - clock.monotonic()
        if wait > 0:
            if deadline is not None and clock.monotonic() + wait > deadline:
                took = clock.monotonic() - self._took_at
                raise TimeoutError(f"the run was taken over {took:.0f} s ago: its first write waits {wait:.0f} s more")
            clock.sleep(wait)
        with self._lock:
            fresh = protocol.lease_read_fresh(self._checked_at, clock.monotonic(), self.period)
        if fresh and not force:  # ``force``: a commit refused (412), the repo moved
            return
        while True:
            began = clock.monotonic()
            try:
                lease, _, _ = self.read(deadline)
            except HfHubHTTPError as error:
                if status_of(error) in (401, 403):  # never a licence to write: this attempt stops
                    self.lost = LeaseRefusedError(
                        f"HF_TOKEN may no longer read the run's lease in {self.repo_id} (HTTP {status_of(error)}):"
                        " this one stops writing and training; this volume's epochs are kept",
                        "give HF_TOKEN write access to OUTPUT_REPO",
                    )
                    raise self.lost from None
                raise
            assert self.attempt is not None
            if not protocol.may_write(lease, self.attempt, None, leased=True):
                self.lost = TakenOverError(
                    f"another container (attempt {lease.holder}) took this run over after this one (attempt"
                    f" {self.attempt}) was quiet a whole lease period; this one stops writing and training"
                    if lease is not None
                    else f"the run's lease is gone from {self.repo_id} (deleted or rewritten by hand): this one"
                    f" (attempt {self.attempt}) cannot prove it holds the run, and stops writing and training",
                    "leave the other one running; this volume's epochs are kept",
                )
                raise self.lost
            # Read slowly or frozen mid-read, the head it read may have moved since: read again.
            if protocol.lease_read_fresh(began, clock.monotonic(), self.period):
                break
            logger.info("lease: its read took over a quarter period (%.0f s); reading it again", self.period / 4)
        with self._lock:
            self._checked_at = began  # a write's licence counts from when its read began

    def renew(self, *, in_bucket: bool) -> None:
        """The heartbeat when no write came for half a period: a small object in the bucket, or a lease commit."""
        assert self.attempt is not None and self.run_id is not None
        self.check()
        if in_bucket and self.bucket is not None:
            folder = RunFolder(self.bucket, self.run_name, self.run_id)
            self._beats += 1
            key = f"{folder.prefix}/{HEARTBEAT}/{self.attempt}-{self._beats:06d}"
            old = [f"{folder.prefix}/{HEARTBEAT}/{self.attempt}-{self._beats - 1:06d}"] if self._beats > 1 else []
            self.bucket.batch([(b"{}", key)], old, before_retry=self.check)
        else:
            if not self.may_commit():
                return
            lease, head, _ = self.read()
            if lease is None or lease.holder != self.attempt:
                self.check()
                return
            renewed = _lease_now(self, self.run_id)
            try:
                self._commit(renewed.to_bytes(), head, "Renew the run's lease")
            except HfHubHTTPError as error:
                if status_of(error) in (401, 403):  # never a licence to write on: this attempt stops
                    self.lost = LeaseRefusedError(
                        f"HF_TOKEN may no longer commit the run's lease to {self.repo_id} (HTTP {status_of(error)}):"
                        " this one stops writing and training; this volume's epochs are kept",
                        "give HF_TOKEN write access to OUTPUT_REPO",
                    )
                    raise self.lost from None
                if status_of(error) not in (412, 429):  # 412: the repo moved (a commit of ours); 429: later
                    raise
        self.landed()

    def keep(self, in_bucket: Callable[[], bool], on_lost: Callable[[TakenOverError], None]) -> None:
        """The heartbeat thread: renews when quiet for half a period; tells ``on_lost`` once if the run is lost."""

        def run() -> None:
            while not clock.wait(self._stop, self.period / 8):
                if not self.tick(in_bucket(), on_lost):
                    return

        self._thread = threading.Thread(target=run, name="sync-lease", daemon=True)
        self._thread.start()

    def tick(self, in_bucket: bool, on_lost: Callable[[TakenOverError], None]) -> bool:
        """One turn of the heartbeat (every eighth of a period): renew when quiet for half a period, else check;
        False once the run is lost (``on_lost`` told). The thread calls it; so does the protocol's simulation."""
        try:
            if self.quiet() < self.period / 2:
                self.check()  # a take-over is noticed between boundaries too (long epochs)
            else:
                self.renew(in_bucket=in_bucket)
        except TakenOverError as error:
            on_lost(error)
            return False
        except Exception as error:  # tried again at the next tick
            logger.warning("lease: renewing the lease failed (%s); trying again", describe(error))
        return True

    def release(self, deadline: float | None = None) -> None:
        """At the end: the lease let go, so the next container takes the run at once. Best effort: a lease not
        released expires after one period."""
        self._stop.set()
        if self.lost is not None or self.attempt is None or not self.may_commit():
            return
        try:
            lease, head, _ = self.read(deadline)
            if lease is None or lease.holder != self.attempt or lease.released:
                return
            self._commit(replace(lease, released=True).to_bytes(), head, "Release the run's lease")
        except StopRequested:
            raise
        except Exception as error:
            logger.info("lease: not released (%s); it expires after %.0f s", describe(error), self.period)

    def describe(self) -> dict[str, Any]:
        """trainbox.json's ``lease``."""
        return {"attempt": self.attempt, "period": self.period, "file": LEASE_FILE}


def _same_volume(mine: RunLease, lease: protocol.Lease) -> bool:
    """The lease names this volume and this process holds its lock: its holder is provably gone."""
    return mine.machine is not None and lease.machine == mine.machine and mine.volume_locked()


def _holder_ended(mine: RunLease, lease: protocol.Lease, watch: protocol.Watch | None) -> str | None:
    """The provider's words when the instance ``lease`` names no longer runs; asked for no longer than the
    watch has left (a provider that does not answer is waited out like a quiet holder)."""
    if lease.instance is None or lease.released or lease.holder == mine.attempt:
        return None
    left = lease.period - (clock.monotonic() - watch.since) if watch is not None else lease.period
    try:
        return mine.holder_ended(lease, left)
    except StopRequested:
        raise
    except Exception as error:
        logger.info("lease: cannot tell whether %s still runs (%s)", lease.instance, describe(error))
        return None


def _lease_now(mine: RunLease, run_id: str) -> protocol.Lease:
    """This attempt's lease as of now, naming where it runs too (its volume, its provider's instance)."""
    assert mine.attempt is not None
    provider, instance = mine.instance or (None, None)
    return protocol.Lease(
        run_id, mine.attempt, clock.time(), mine.period, machine=mine.machine, provider=provider, instance=instance
    )
