"""The store protocol's fences, each against a single transient fault that used to lose work or money: the real
agent (`trainbox run`) and the stand-in trainer against the test Hub, which injects the fault.

1. one 404 (EntryNotFound) on a listing of the run's folder just after a new volume's resume: a failed read,
   never an empty folder (the snapshots earlier attempts made stay named and in the bucket);
2. the newest ``last.pt``'s download failing at resume: retried to the listing's deadline, then exit 73 writing
   nothing; never a fresh start that trains every epoch again;
3. a container started again on the volume of a holder killed -9 takes the run over at once (the lease names
   the volume, whose lock the kernel dropped), not after a whole lease period of billing; and one on a new
   volume does too when the holder's provider says the instance the lease names no longer runs;
4. a 429 on the lease's commit is waited out (the Hub's RateLimit reset): the lease lands before anything of
   the run is written, never an unleased run;
5. a holder frozen with a commit in flight past a lease period: its late commit is refused (412, its
   ``parent_commit`` moved) once the taker wrote, and it stops (71).
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from entrypoint.errors import CostLimitError, LeaseRefusedError, StoreUnreadableError, TakenOverError
from entrypoint.sync.lease import LEASE_FILE
from tests.fakes.provider_accounts import VastAccount
from tests.hubfixtures import HubContext
from tests.integration import test_run_cost as cost_test
from tests.integration.test_bucket_run import RUN, Run, finish, kill_9, wait_for
from tests.integration.test_lease import PERIOD, leases
from tests.support import held_after, run_trainbox, start_trainbox

pytestmark = pytest.mark.slow  # each test runs `trainbox run` (the stand-in trains for seconds) and breaks it

# The run's folder itself (huggingface_hub quotes the prefix whole), not its manifests/ nor heartbeat/.
RUN_FOLDER = rf"^/api/buckets/[^/]+/[^/]+/tree/{RUN}%2F[0-9a-f]+$"


@pytest.fixture
def run(tmp_path: Path, hub_ctx: HubContext) -> Iterator[Run]:
    bucket_run = Run(tmp_path, hub_ctx, epochs=6, PUBLISH_EVERY="off")
    yield bucket_run
    bucket_run.end()
    hub_ctx.hub.clear_faults()


def killed_at(run: Run, epoch: int, volume: str = "m1", **env: str) -> int:
    """A first container on ``volume`` trains ``epoch`` epochs into the bucket, then its machine is lost."""
    first = run.start(volume, **held_after(run.tmp_path, epoch), **env)
    wait_for(lambda: run.bucket_epoch() >= epoch, f"epoch {epoch} in the bucket", first)
    kill_9(first)
    return run.bucket_epoch()


def test_1_a_404_on_the_run_folders_listing_after_the_resume_deletes_no_snapshot(run: Run) -> None:
    at_kill = killed_at(run, 4)
    before = max(run.whole(), key=lambda m: m.epoch)
    snapshots = {rel: entry["key"] for rel, entry in before.files.items() if "epoch_" in rel}
    assert set(snapshots) == {f"weights/epoch_{n}.pt" for n in range(1, at_kill + 1)}
    fault = run.hub.inject("404", code="EntryNotFound", method="GET", path=RUN_FOLDER, times=1)

    code, output = run.run("m2")  # a new volume takes the run over

    assert code == 0, output[-3000:]
    assert fault.fired == 1, "the fault never hit the run folder's listing"
    assert run.state("m2")["resume"] == {"from": "bucket", "epochs_done": at_kill}
    files = run.hub.bucket_files(run.bucket_id)
    assert all(key in files for key in snapshots.values()), "a snapshot an earlier attempt made was deleted"
    newest = max(run.whole(), key=lambda m: m.epoch)
    assert {rel: newest.files[rel]["key"] for rel in snapshots} == snapshots, "dropped from the newest manifest"


@pytest.mark.parametrize("outage", ["short", "past-the-deadline"])
def test_2_a_download_failing_at_resume_is_retried_then_73_never_a_fresh_start(run: Run, outage: str) -> None:
    # A short outage is waited out within the resume's deadline (half a lease period): a longer period here.
    period = {"LEASE_PERIOD": "30s"} if outage == "short" else {}
    at_kill = killed_at(run, 3, **period)
    keys = set(run.hub.bucket_files(run.bucket_id))
    newest = max(run.whole(), key=lambda m: m.epoch)
    last = run.hub.bucket_files(run.bucket_id)[newest.files["weights/last.pt"]["key"]]
    # The CAS answers 503 for last.pt's bytes: every try of a whole download call (the short outage), or until
    # the test ends (past the deadline). The manifests read fine.
    fault = run.hub.inject(
        "503", method="GET", path=rf"/reconstructions/{last.xet_hash}$", times=9 if outage == "short" else None
    )

    code, output = run.run("m2", **period)  # a new volume takes the run over

    assert fault.fired >= 3, output[-3000:]
    assert "using the volume and the repo" not in output, output[-3000:]
    if outage == "short":
        assert code == 0, output[-3000:]
        assert run.state("m2")["resume"] == {"from": "bucket", "epochs_done": at_kill}
        return
    assert code == StoreUnreadableError.exit_code, output[-3000:]
    assert run.state("m2")["exit"]["reason"] == "store_unreadable"
    assert set(run.hub.bucket_files(run.bucket_id)) == keys, "the bucket changed"
    assert not (run.tmp_path / "m2" / "runs" / RUN / "weights" / "last.pt").exists()


def test_3_a_container_started_again_on_the_killed_holders_volume_takes_the_run_at_once(run: Run) -> None:
    # A lease period far longer than the test's patience: only a take at once can finish in time.
    at_kill = killed_at(run, 2, LEASE_PERIOD="30m")

    code, output = finish(run.start("m1", LEASE_PERIOD="30m"))

    assert code == 0, output[-3000:]
    assert "ran on this volume, whose lock it no longer holds: taking the run over" in output
    assert run.state("m1")["resume"]["epochs_done"] >= at_kill


def test_3_a_new_volume_still_waits_out_the_holder(run: Run) -> None:
    """The fast take is only for the holder's own volume: another one cannot prove the holder gone."""
    killed_at(run, 2)
    code, output = run.run("m2")
    assert code == 0, output[-3000:]
    assert "was quiet a whole lease period" in output and "ran on this volume" not in output


def test_3_a_new_volume_takes_the_run_at_once_when_the_provider_says_the_holders_instance_is_gone(run: Run) -> None:
    """The lease names the holder's instance; a relaunch on another instance of the same provider account asks
    the provider, which says (truthfully: the container was killed) that instance no longer runs. MAX_COST
    counts the killed attempt's spend."""
    with VastAccount("202") as vast:
        vast.others["101"] = {"actual_status": "running", "intended_status": "running", "cur_state": "running"}
        # The holder's licence (a quarter period) is still waited out before the first write: the provider's
        # record may say "ended" before its host stopped the container. A whole period is never waited.
        on = dict(PROVIDER="vast", LEASE_PERIOD="60s", PRICE_PER_HOUR="3600", MAX_COST="100000")
        at_kill = killed_at(run, 2, **on, **(vast.env() | {"CONTAINER_ID": "101"}))
        vast.others["101"] = {"actual_status": "exited", "intended_status": "running", "cur_state": "running"}

        code, output = finish(run.start("m2", **on, **vast.env()))

    assert code == 0, output[-3000:]
    assert "on Vast.ai instance 101, which no longer runs (actual_status=exited" in output, output[-3000:]
    assert "taken over at once" in output and "was quiet a whole lease period" not in output
    assert run.state("m2")["resume"]["epochs_done"] >= at_kill
    assert run.state("m2")["cost"]["run"]["earlier_dollars"] > 0, "the killed attempt's spend was not counted"


def test_4_a_rate_limited_lease_commit_is_waited_out_before_anything_is_written(run: Run) -> None:
    run.hub.reset_log()
    fault = run.hub.inject("429", reset=2, method="POST", path=r"/commit/", times=1)

    code, output = run.run("m1")

    assert code == 0, output[-3000:]
    assert fault.fired == 1
    summaries = [commit.summary for commit in reversed(run.hub.commits(run.repo))]
    assert "Take the run's lease" in summaries, f"never leased: {summaries}"
    requests = run.hub.requests
    leased = next(n for n, r in enumerate(requests) if r.method == "POST" and "/commit/" in r.path and r.status == 200)
    first_write = next(n for n, r in enumerate(requests) if r.method == "POST" and r.path.endswith("/batch"))
    assert leased < first_write, "the bucket was written before the run's lease landed"


def test_5_a_frozen_holders_late_commit_never_lands_over_the_takers(run: Run) -> None:
    """In repo mode every boundary is a commit: one sent just before its writer froze past a lease period is
    refused (412: its parent moved) once the taker wrote, and its writer stops (71), never alternating."""
    holder = run.start("m1", CHECKPOINT_BUCKET="off")
    wait_for(lambda: run.repo_epoch() >= 2, "epoch 2 in the repo", holder)
    held = run.hub.inject("hold", method="POST", path=r"/commit/", times=1)
    wait_for(lambda: held.fired == 1, "a boundary's commit in flight", holder)
    os.killpg(holder.pid, signal.SIGSTOP)  # frozen with its commit in flight
    try:
        code, output = run.run("m2", CHECKPOINT_BUCKET="off")  # a new volume takes the quiet run over
        assert code == 0, output[-3000:]
        assert run.repo_epoch() == 6
        taker_head = run.hub.head(run.repo)
        held.remove()  # the Hub gets to the frozen holder's commit only now
        (late,) = [r for r in run.hub.requests if r.fault == "hold"]
        wait_for(lambda: late.status != 0, "the late commit answered")
    finally:
        os.killpg(holder.pid, signal.SIGCONT)
    code, output = finish(holder)

    assert late.status == 412, f"the late commit was answered {late.status}"
    assert run.hub.head(run.repo) == taker_head, "the frozen holder wrote over the taker"
    assert run.repo_epoch() == 6
    assert code == TakenOverError.exit_code, output[-3000:]


# -- the lease's fences with the real client, without an agent (orderings 6 and 8) ------------------------------
def test_8_a_lease_read_refused_mid_run_stops_the_holder_never_passes(hub_ctx: HubContext) -> None:
    (holder,) = leases(hub_ctx, 1)
    holder.acquire("a" * 16)
    time.sleep(PERIOD / 4)  # the last read is stale: the next check reads the lease again
    with hub_ctx.hub.inject("401", method="GET", path=r"/resolve/.*lease\.json$"), pytest.raises(LeaseRefusedError):
        holder.check()
    with pytest.raises(LeaseRefusedError):
        holder.check()  # and it stays stopped


@pytest.mark.parametrize("status", ["401", "403"])
def test_8_a_lease_commit_refused_ends_the_start_naming_the_token(hub_ctx: HubContext, status: str) -> None:
    (taker,) = leases(hub_ctx, 1)
    with hub_ctx.hub.inject(status, method="POST", path=r"/commit/"), pytest.raises(LeaseRefusedError) as refused:
        taker.acquire("a" * 16)
    assert refused.value.exit_code == 74 and "give HF_TOKEN write access" in str(refused.value)


def test_6_a_lease_deleted_by_hand_stops_its_holder(hub_ctx: HubContext) -> None:
    (holder,) = leases(hub_ctx, 1)
    holder.acquire("a" * 16)
    hub_ctx.hub.delete_file(holder.repo_id, LEASE_FILE)
    time.sleep(PERIOD / 4)
    with pytest.raises(TakenOverError):
        holder.check()


def test_3_a_relaunch_counts_the_runs_earlier_spend_before_it_waits_for_the_lease(
    hub_ctx: HubContext, tmp_path: Path
) -> None:
    """A new volume watching a killed holder's lease bills while it waits: MAX_COST counts the earlier attempts'
    spend from before that wait, and stops it there (82), not a lease period later."""
    repo = hub_ctx.repo_id("capwait")
    base = dict(
        HF_TOKEN=hub_ctx.token, OUTPUT_REPO=repo, PRICE_PER_HOUR=cost_test.PRICE, MAX_COST="20",
        FAKE_TRAIN_MODE="forever", FAKE_EPOCH_SECONDS="1", LEASE_PERIOD="30m",
    )  # fmt: skip
    first = tmp_path / "machine1"
    process = start_trainbox("run", env=cost_test.stand_in(tmp_path, first, **base))

    def spent_on_hub() -> float:
        found = cost_test.hub_state(hub_ctx, repo) or {}
        return float((found.get("cost") or {}).get("dollars") or 0.0)

    wait_for(lambda: spent_on_hub() >= 10 or process.poll() is not None, "a spend record of half the cap")
    assert process.poll() is None, process.communicate()[0][-3000:]
    process.kill()  # SIGKILL: no end written
    process.communicate(timeout=30)
    trainer = cost_test.local_state(first).get("training", {}).get("pid")
    if isinstance(trainer, int):
        with contextlib.suppress(ProcessLookupError):
            os.kill(trainer, signal.SIGKILL)

    result = run_trainbox("run", env=cost_test.stand_in(tmp_path, tmp_path / "machine2", **base), timeout=120)

    assert result.returncode == CostLimitError.exit_code, result.output[-3000:]
    assert "watching its heartbeat" in result.output, "stopped before it waited for the lease: not this ordering"
    final = cost_test.local_state(tmp_path / "machine2")
    assert "run" in final["cost"], "the earlier attempts' spend was never counted"
    earlier, own = final["cost"]["run"]["earlier_dollars"], final["attempts"][-1]["cost"]["dollars"]
    assert earlier >= 10
    assert own < 20 * 0.9, f"it spent ${own:.2f} of its own beside ${earlier:.2f} before: the cap was its own"
    assert "training" not in final or not final["training"].get("pid"), "it trained without the lease"
