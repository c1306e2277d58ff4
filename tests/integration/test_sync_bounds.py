"""Every step after a stop runs under the shutdown clock: `trainbox sync` stopped while the Hub answers 503
ends within the bound and names what is not on the Hub; after SIGTERM the repo's final last.pt (bucket mode)
is staged again only with time left, else skipped and said in trainbox.json; past the cutoff nothing is
staged at all. The real agent and `trainbox sync` against the test Hub, or the uploader on a run folder."""

from __future__ import annotations

import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from entrypoint.errors import PreemptedError, SyncError
from tests.hubfixtures import HubContext
from tests.integration.test_bucket_run import EXIT_BOUND, Run, finish, wait_for
from tests.integration.test_bucket_sync import WAIT, boundary, folder_of, uploader
from tests.integration.test_sync_command import env_for, write_epoch
from tests.support import start_trainbox


def ended(process: subprocess.Popen[str], bound: float) -> tuple[int, str]:
    """The exit code and output of a `trainbox sync` that must end within ``bound``."""
    try:
        output, _ = process.communicate(timeout=bound)
    except subprocess.TimeoutExpired:
        process.kill()
        output, _ = process.communicate()
        pytest.fail(f"still running {bound:.0f} s after the signal\n{output[-3000:]}")
    return process.returncode, output


@pytest.fixture
def run(tmp_path: Path, hub_ctx: HubContext) -> Iterator[Run]:
    bucket_run = Run(tmp_path, hub_ctx)
    yield bucket_run
    bucket_run.end()


@pytest.mark.slow  # a real `trainbox sync` process, stopped while its commits fail
@pytest.mark.parametrize("stop", [signal.SIGTERM, signal.SIGINT], ids=["sigterm", "ctrl-c"])
def test_sync_stopped_while_the_hub_refuses_commits_ends_within_the_bound_naming_what_is_not_there(
    hub_ctx: HubContext, tmp_path: Path, stop: signal.Signals
) -> None:
    run_dir = tmp_path / "runs" / "finished"
    write_epoch(run_dir, 3, state="completed")  # a finished run: the sync flushes at once, for up to --timeout
    repo = hub_ctx.repo_id("refusing")
    refused = hub_ctx.hub.inject("503", method="POST", path=r"/commit/")
    process = start_trainbox("sync", str(run_dir), env=env_for(hub_ctx, tmp_path, repo))
    try:
        wait_for(lambda: refused.fired >= 2, "the Hub refusing the sync's commits", process)
        sent = time.monotonic()
        process.send_signal(stop)
        code, output = ended(process, EXIT_BOUND)
        took = time.monotonic() - sent
    finally:
        refused.remove()
        if process.poll() is None:
            process.kill()
            process.communicate()
    assert code == SyncError.exit_code and took <= EXIT_BOUND, output[-3000:]
    (said,) = [line for line in output.splitlines() if "ERROR:" in line and "are not on" in line]
    assert f"are not on {repo} (stopped by a signal)" in said and "weights/last.pt" in said, said
    assert "rerun `trainbox sync" in output
    assert not hub_ctx.hub.repo_exists(repo) or "weights/last.pt" not in hub_ctx.hub.files(repo)


@pytest.mark.slow  # a real `trainbox sync` process, stopped while its first calls are retried
def test_sync_stopped_before_its_upload_began_says_nothing_was_uploaded(hub_ctx: HubContext, tmp_path: Path) -> None:
    run_dir = tmp_path / "runs" / "unsent"
    write_epoch(run_dir, 1, state="completed")
    down = hub_ctx.hub.inject("503", path=r"^/api/")  # not even the repo can be made: retried, then stopped
    process = start_trainbox("sync", str(run_dir), env=env_for(hub_ctx, tmp_path, hub_ctx.repo_id("down")))
    try:
        wait_for(lambda: down.fired >= 2, "the Hub answering 503", process)
        process.send_signal(signal.SIGTERM)
        code, output = ended(process, EXIT_BOUND)
    finally:
        down.remove()
        if process.poll() is None:
            process.kill()
            process.communicate()
    assert code == SyncError.exit_code, output[-3000:]
    assert "stopped by SIGTERM before its upload began: nothing of unsent was uploaded" in output


@pytest.mark.slow  # a real `trainbox sync` process
def test_sync_stopped_after_everything_landed_exits_143(hub_ctx: HubContext, tmp_path: Path) -> None:
    run_dir = tmp_path / "runs" / "running"
    write_epoch(run_dir, 2)  # still training: the sync mirrors until stopped
    repo = hub_ctx.repo_id("mirrored")
    process = start_trainbox("sync", str(run_dir), env=env_for(hub_ctx, tmp_path, repo))
    try:
        wait_for(
            lambda: hub_ctx.hub.repo_exists(repo) and "weights/last.pt" in hub_ctx.hub.files(repo),
            "epoch 2 on the repo",
            process,
        )
        process.send_signal(signal.SIGTERM)
        code, output = ended(process, EXIT_BOUND)
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()
    assert code == PreemptedError.exit_code, output[-3000:]


@pytest.mark.slow  # runs the agent (the stand-in trainer) and stops it
def test_after_sigterm_the_repos_final_staging_waits_for_the_working_state_and_is_skipped_without_time(
    run: Run,
) -> None:
    """The bucket's final boundary holds the whole bound (its batch's answer trickles in): the repo's final
    last.pt is never staged, and trainbox.json says so; the exit still comes within the bound."""
    process = run.start("m1")
    wait_for(lambda: run.bucket_epoch() >= 2, "epoch 2 in the bucket", process)
    stuck = run.hub.inject("slow", method="POST", path=r"^/api/buckets/.*/batch$", rate=2)
    try:
        wait_for(lambda: stuck.fired >= 1, "a bucket boundary under way", process)
        time.sleep(0.3)
        sent = time.monotonic()
        process.send_signal(signal.SIGTERM)
        code, output = finish(process, EXIT_BOUND)
        took = time.monotonic() - sent
    finally:
        stuck.remove()
    assert code == PreemptedError.exit_code and took <= EXIT_BOUND, output[-3000:]
    final = run.state("m1")["sync"]["final_publish"]
    assert final["done"] is False and "no time left" in final["skipped"]["weights/last.pt"], final
    assert "weights/last.pt" not in run.hub.files(run.repo), "the repo got a final last.pt the bound had no room for"
    (said,) = [line for line in output.splitlines() if "the final publish to" in line]
    assert "weights/last.pt: no time left" in said


def test_past_the_cutoff_nothing_is_staged_and_the_repos_final_last_pt_is_said_skipped(
    hub_ctx: HubContext, tmp_path: Path
) -> None:
    folder = folder_of(hub_ctx)
    run_dir, work = tmp_path / "run", tmp_path / "work"
    up = uploader(hub_ctx, folder, run_dir, work)
    up.start()
    try:
        boundary(run_dir, 1)
        assert up.flush(WAIT, final=False), up.last_error
        (run_dir / "notes.txt").write_text("written as the stop came")
        up.cut_short(time.monotonic())  # SIGTERM, its time spent
        assert not up.flush(WAIT)
        end = time.monotonic() + WAIT
        while "notes.txt" not in up.pending and time.monotonic() < end:  # the snapshot the flush asked for
            time.sleep(0.05)
        time.sleep(0.5)  # room for a copy, were one made
        staged = sorted(path.name for path in (work / "staging").iterdir())
    finally:
        up.stop()
    assert "notes.txt" in up.pending and "no time left" in (up.last_error or ""), up.pending
    assert not [name for name in staged if name.endswith(("notes.txt", "last.pt"))], staged
    assert up.final_publish is not None and up.final_publish["done"] is False
    assert "weights/last.pt" in up.final_publish["skipped"]
    assert "notes.txt" not in {key.rsplit("/", 1)[-1] for key in hub_ctx.hub.bucket_files(folder.bucket.bucket_id)}
    assert not up.bucket_complete  # a destroy would lose notes.txt: the bucket is not said to hold everything
