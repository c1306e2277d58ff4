"""The run's lease (entrypoint/sync/lease.py) against the test Hub with the real huggingface_hub client: taking it
is a compare-and-swap (a commit with ``parent_commit``, 412 when the repo moved), a live holder's heartbeat ends
a second container (72), a quiet one is taken over after one lease period and then stops at its next check (71)."""

from __future__ import annotations

import time

import pytest

from entrypoint.errors import LeaseHeldError, TakenOverError
from entrypoint.hub import Hub
from entrypoint.sync.bucket import new_attempt
from entrypoint.sync.lease import RunLease
from tests.hubfixtures import HubContext

pytestmark = pytest.mark.protocol  # the protocol lane: fast, real tests of the store protocol's code

PERIOD = 2.0
RUN_A, RUN_B = "a" * 16, "b" * 16


def leases(hub_ctx: HubContext, count: int) -> list[RunLease]:
    hub = Hub(token=hub_ctx.token, endpoint=hub_ctx.url)
    repo = hub_ctx.repo_id("lease")
    hub.api.create_repo(repo, private=True)
    return [RunLease(hub, repo, "run", PERIOD, None) for _ in range(count)]


def test_taking_the_lease_is_a_compare_and_swap_one_of_two_wins(hub_ctx: HubContext) -> None:
    first, second = leases(hub_ctx, 2)
    _, seen, _ = second.read()  # both read the repo without a lease...
    assert first.acquire(RUN_A) == RUN_A  # ...the first commits it
    second.attempt = new_attempt()
    assert not second._take(RUN_B, seen, None), "a commit whose parent moved must be refused (412)"
    lease, _, _ = second.read()
    assert lease is not None and lease.holder == first.attempt and lease.run_id == RUN_A, "one run id"


def test_a_live_holder_ends_a_second_container_and_a_quiet_one_is_taken_over(hub_ctx: HubContext) -> None:
    holder, second, third = leases(hub_ctx, 3)
    holder.acquire(RUN_A)
    with pytest.raises(LeaseHeldError):  # the holder's heartbeat (a lease commit here) moves while watched
        second.acquire(RUN_B, sleep=lambda _: holder.renew(in_bucket=False))
    began = time.monotonic()
    assert third.acquire(RUN_B, sleep=time.sleep) == RUN_A, "the run keeps its id"
    assert time.monotonic() - began >= PERIOD, "taken over before a whole lease period of silence"
    time.sleep(PERIOD / 4)
    with pytest.raises(TakenOverError):
        holder.check()
    third.check()  # the new holder still holds it
    third.release()
    lease, _, _ = third.read()
    assert lease is not None and lease.released and lease.holder == third.attempt
