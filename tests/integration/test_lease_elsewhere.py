"""A relaunch on another instance asks the lease holder's provider whether that instance still runs
(entrypoint/release/elsewhere.py, handed to sync/lease.py by sync/job.py): the real provider classes against the
local provider APIs (tests/fakes/provider_accounts.py) over real sockets, the lease against the test Hub.

Only the provider's record of the named instance saying its container no longer runs takes the run over at once;
a running instance, a stop only asked for, a frozen one, a 404 (a key scoped to its own instance may not see
another), an error, a 429, a 5xx, a slow or unclear answer, no provider access, another provider: the lease is
watched as before."""

from __future__ import annotations

import logging
import time
from typing import Any

import pytest

from entrypoint.hub import Hub
from entrypoint.parsing import Provider, Secret
from entrypoint.release import elsewhere
from entrypoint.settings import ProviderAccess
from entrypoint.sync.lease import RunLease
from tests.fakes.provider_accounts import RunPodAccount, VastAccount
from tests.hubfixtures import HubContext

pytestmark = pytest.mark.protocol  # the protocol lane: fast, real tests of the store protocol's code

OLD, NEW = "101", "202"  # the holder's instance, the relaunch's own
KEY = "provider-key-0123456789"


def vast_record(actual: str, intended: str = "running", contract: str = "running") -> dict[str, Any]:
    return {"actual_status": actual, "intended_status": intended, "cur_state": contract}


def access(account: VastAccount | RunPodAccount, provider: Provider | None = None) -> ProviderAccess:
    kind = provider or (Provider.VAST if isinstance(account, VastAccount) else Provider.RUNPOD)
    return ProviderAccess(provider=kind, instance_id=NEW, api_key=Secret(KEY), api_url=account.url)


def asked(account: VastAccount | RunPodAccount, instance: str = OLD) -> int:
    return sum(1 for call in account.calls if call.method == "GET" and f"/{instance}" in call.path)


# -- what the provider's answer proves --------------------------------------------------------------------
@pytest.mark.parametrize(
    ("record", "gone"),
    [
        (vast_record("exited"), True),  # the container's process exited (a kill -9 of the agent's container)
        (vast_record("stopped", "stopped", "stopped"), True),  # halted: a start runs a new agent, a new attempt
        (vast_record("running", "running", "unloaded"), True),  # destroyed: the machine contract released
        (vast_record("running"), False),
        (vast_record("running", "stopped"), False),  # a stop only asked for: the container still runs
        (vast_record("frozen", "frozen"), False),  # paused with its memory: the holder's process comes back
        (vast_record("offline"), False),
        (None, False),  # 404: a key scoped to its own instance may not see another
    ],
)
def test_vast_says_gone_only_when_its_record_says_the_container_no_longer_runs(
    record: dict[str, Any] | None, gone: bool
) -> None:
    with VastAccount(NEW, KEY) as vast:
        vast.others[OLD] = record
        words = elsewhere.ended(access(vast), "vast", OLD)
    assert (words is not None) is gone, words
    assert asked(vast) == 1
    if words is not None:
        assert words.startswith(f"Vast.ai instance {OLD}, which no longer runs") and KEY not in words


@pytest.mark.parametrize(
    ("status", "gone"),
    [("TERMINATED", True), ("EXITED", True), ("RUNNING", False), ("ERROR", False), ("STARTING", False), (None, False)],
)
def test_runpod_says_gone_only_when_the_pod_is_terminated_or_exited(status: str | None, gone: bool) -> None:
    with RunPodAccount(NEW, KEY) as runpod:
        runpod.others[OLD] = status
        words = elsewhere.ended(access(runpod), "runpod", OLD)
    assert (words is not None) is gone, words
    assert asked(runpod) == 1
    if words is not None:
        assert f"RunPod pod {OLD}, which no longer runs (status={status})" == words


@pytest.mark.parametrize(
    "fault",
    [
        {"status": 429, "retry_after": 30},  # the provider's wait is longer than the relaunch asks: no answer
        {"status": 503},  # for ever: retried until the time given is over
        {"status": 500, "body": b"<html>oops</html>"},
        {"status": 401},  # a key refused
        {"status": 403},
    ],
)
def test_an_error_proves_nothing(fault: dict[str, Any]) -> None:
    with RunPodAccount(NEW, KEY) as runpod:
        runpod.others[OLD] = "TERMINATED"
        runpod.fail(**fault)
        began = time.monotonic()
        assert elsewhere.ended(access(runpod), "runpod", OLD, within=2.0) is None
        assert time.monotonic() - began < 10.0, "asked for longer than it was given (a bound, not a timing)"


@pytest.mark.parametrize("answer", [{}, {"instances": {}}, {"instances": []}, b"not json"])
def test_an_unclear_answer_proves_nothing(answer: Any) -> None:
    with VastAccount(NEW, KEY) as vast:
        vast.others[OLD] = vast_record("exited")
        vast.fail(200, body=answer)
        assert elsewhere.ended(access(vast), "vast", OLD, within=1.5) is None


def test_a_provider_slower_than_the_time_given_proves_nothing() -> None:
    with VastAccount(NEW, KEY) as vast:
        vast.others[OLD] = vast_record("exited")
        vast.delay = 3.0
        assert elsewhere.ended(access(vast), "vast", OLD, within=0.5) is None


def test_a_rate_limit_shorter_than_the_time_given_is_waited_out() -> None:
    with RunPodAccount(NEW, KEY) as runpod:
        runpod.others[OLD] = "TERMINATED"
        runpod.fail(429, times=1, retry_after=0.2)
        assert elsewhere.ended(access(runpod), "runpod", OLD, within=5.0) is not None
        assert asked(runpod) == 2


def test_nothing_is_asked_without_access_of_the_holders_provider_or_about_this_instance() -> None:
    with VastAccount(NEW, KEY) as vast:
        vast.others[OLD] = vast_record("exited")
        assert elsewhere.ended(access(vast), "runpod", OLD) is None  # another provider's instance
        assert elsewhere.ended(ProviderAccess(provider=Provider.NONE), "vast", OLD) is None
        assert elsewhere.ended(access(vast), "vast", NEW) is None  # this very instance: it runs
        assert elsewhere.ended(access(vast), "vast", None) is None  # a lease that names no instance
        assert vast.calls == []


# -- the lease: taken at once on a "gone", watched on anything else -----------------------------------------
class Watched(Exception):
    """The relaunch began to watch the holder's heartbeat (it would wait a period): the test ends it there."""


def relaunch(hub_ctx: HubContext, account: VastAccount, given: ProviderAccess) -> tuple[RunLease, RunLease]:
    """A holder on instance OLD that took run "a…", and a relaunch on NEW with ``given`` access, both with a
    lease period far longer than the test's patience."""
    hub = Hub(token=hub_ctx.token, endpoint=hub_ctx.url)
    repo = hub_ctx.repo_id("elsewhere")
    hub.api.create_repo(repo, private=True)
    holder = RunLease(hub, repo, "run", 600.0, None, instance=("vast", OLD))
    holder.acquire("a" * 16)
    taker = RunLease(
        hub,
        repo,
        "run",
        600.0,
        None,
        instance=(given.provider.value, NEW),
        holder_ended=lambda lease, within: elsewhere.ended(given, lease.provider, lease.instance, min(within, 3.0)),
    )
    return holder, taker


def watch(_: float) -> None:
    raise Watched


def test_a_holder_whose_instance_is_gone_is_taken_over_at_once(
    hub_ctx: HubContext, caplog: pytest.LogCaptureFixture
) -> None:
    with VastAccount(NEW, KEY) as vast:
        holder, taker = relaunch(hub_ctx, vast, access(vast))
        vast.others[OLD] = vast_record("exited")
        with caplog.at_level(logging.INFO, logger="trainbox"):
            assert taker.acquire("b" * 16, sleep=watch) == "a" * 16, "the run keeps its id"
    lease, _, _ = taker.read()
    assert lease is not None and lease.holder == taker.attempt and taker.took_from == holder.attempt
    assert (lease.provider, lease.instance) == ("vast", NEW) and KEY.encode() not in lease.to_bytes()
    said = [r.getMessage() for r in caplog.records if "taken over at once" in r.getMessage()]
    words = (
        f"Vast.ai instance {OLD}, which no longer runs (actual_status=exited intended_status=running cur_state=running)"
    )
    assert said == [f"lease: attempt {holder.attempt} held run run on {words}: taken over at once"]
    # The provider's record may lead the host: the taker's first write still waits out the holder's licence.
    assert taker._writes_from > time.monotonic()


@pytest.mark.parametrize("case", ["running", "404", "429", "no-access", "another-provider"])
def test_a_holder_not_proven_gone_is_watched_as_before(hub_ctx: HubContext, case: str) -> None:
    with VastAccount(NEW, KEY) as vast:
        given = {
            "no-access": ProviderAccess(provider=Provider.NONE),
            "another-provider": access(vast, Provider.RUNPOD),
        }.get(case, access(vast))
        holder, taker = relaunch(hub_ctx, vast, given)
        vast.others[OLD] = None if case == "404" else vast_record("running" if case == "running" else "exited")
        if case == "429":
            vast.fail(429, retry_after=60)
        with pytest.raises(Watched):
            taker.acquire("b" * 16, sleep=watch)
    lease, _, _ = taker.read()
    assert lease is not None and lease.holder == holder.attempt, "taken from a holder not proven gone"
    assert asked(vast) == (0 if case in ("no-access", "another-provider") else 1)
