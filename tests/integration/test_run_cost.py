"""Money across the whole run, end to end: real ``trainbox`` processes, the stand-in trainer, the test Hub and a
provider stand-in. MAX_COST counts every attempt (a killed one from its last record on the Hub), and an instance
above MAX_PRICE_PER_HOUR is refused before any dataset byte, then released."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from entrypoint import state
from entrypoint.errors import CostLimitError, PriceCeilingError
from entrypoint.state import Phase
from tests.fakes import libreyolo as fake_libreyolo
from tests.fakes.providers import FakeVast
from tests.hubfixtures import HubContext
from tests.support import run_trainbox, start_trainbox, trainbox_env

PRICE = "3600"  # $1 a second: a few seconds of a run are a few dollars
MAX_COST = 20.0


def stand_in(tmp_path: Path, workdir: Path, **env: str) -> dict[str, str]:
    trainer = fake_libreyolo.install(tmp_path / "bin")
    return trainbox_env(workdir, GPUS="cpu", TRAINBOX_LIBREYOLO=str(trainer)) | env


def local_state(workdir: Path) -> dict[str, Any]:
    (path,) = (workdir / "runs").glob("*/trainbox.json")
    return json.loads(path.read_text())


def hub_state(hub_ctx: HubContext, repo: str, revision: str | None = None) -> dict[str, Any] | None:
    hub = hub_ctx.hub
    at = {"revision": revision} if revision else {}
    if not hub.repo_exists(repo) or "trainbox.json" not in hub.files(repo, **at):
        return None
    found: dict[str, Any] = json.loads(hub.file_bytes(repo, "trainbox.json", **at))
    return found


def wait_for(predicate: Any, what: str, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


@pytest.mark.slow  # two `trainbox run`s with the stand-in trainer
def test_a_killed_attempts_spend_counts_towards_the_runs_cap_on_a_new_volume(
    hub_ctx: HubContext, tmp_path: Path
) -> None:
    repo = hub_ctx.repo_id("capped")
    base = dict(
        HF_TOKEN=hub_ctx.token,
        OUTPUT_REPO=repo,
        PRICE_PER_HOUR=PRICE,
        MAX_COST=f"{MAX_COST:g}",
        FAKE_TRAIN_MODE="forever",
        FAKE_EPOCH_SECONDS="1",
        # the killed holder's lease expires in seconds: the second bills its wait too, at $3600/h a whole cap
        LEASE_PERIOD="6s",
    )
    first = tmp_path / "machine1"
    process = start_trainbox("run", env=stand_in(tmp_path, first, **base))

    def spent_on_hub() -> float:
        found = hub_state(hub_ctx, repo) or {}
        return float((found.get("cost") or {}).get("dollars") or 0.0)

    # Killed once the Hub holds a record of about a third of the cap: well short of its own.
    wait_for(lambda: spent_on_hub() >= MAX_COST / 3 or process.poll() is not None, "a spend record on the Hub")
    assert process.poll() is None, process.communicate()[0][-3000:]
    trainer = local_state(first).get("training", {}).get("pid")
    process.kill()  # SIGKILL: no handler runs, no end is written
    process.communicate(timeout=30)
    if isinstance(trainer, int):  # the stand-in trainer it left behind would go on writing
        with contextlib.suppress(ProcessLookupError):
            os.kill(trainer, signal.SIGKILL)
    assert local_state(first)["phase"] == Phase.TRAINING  # killed mid-training: no end on record

    second = tmp_path / "machine2"  # a new machine: empty disk, same env
    started = time.time()
    result = run_trainbox("run", env=stand_in(tmp_path, second, **base), timeout=120)

    assert result.returncode == CostLimitError.exit_code, result.output[-3000:]
    # What the first attempt left on the Hub when the second began: its last record of its spend.
    last = next(commit for commit in hub_ctx.hub.commits(repo) if commit.timestamp < started)
    recorded = hub_state(hub_ctx, repo, revision=last.oid)
    assert recorded is not None and recorded["phase"] == Phase.TRAINING
    expected = state.lost_spend(recorded)
    assert expected is not None and expected["dollars"] > recorded["cost"]["dollars"]  # plus one interval

    final = local_state(second)
    lost, own = final["attempts"]
    assert lost["reason"] == "lost" and lost["cost"] == expected and "upper estimate" in lost["cost"]["estimate"]
    assert own["reason"] == CostLimitError.reason and final["phase"] == Phase.TIMED_OUT
    earlier = final["cost"]["run"]["earlier_dollars"]
    assert earlier == expected["dollars"]
    assert f"cost: ${earlier:.2f} spent by 1 earlier attempt (1 killed: an upper estimate)" in result.stderr
    assert f"${MAX_COST - earlier:.2f} left of MAX_COST ${MAX_COST:g}" in result.stderr
    # The second stopped when the two together reached the cap, long before its own spend did.
    spent = own["cost"]["dollars"]
    assert earlier + spent >= MAX_COST
    assert spent < MAX_COST - earlier + 5  # the wrap-up after the alarm (stopping the trainer, the final upload)
    assert spent < MAX_COST * 0.9
    assert "reached" in final["exit"]["message"] and "1 earlier attempt" in final["exit"]["message"]
    published = hub_state(hub_ctx, repo)
    assert published is not None and published["exit"]["code"] == CostLimitError.exit_code
    assert "the run: #1 $" in result.stderr  # the receipt lists each attempt and the total


@pytest.fixture
def vast() -> Iterator[FakeVast]:
    with FakeVast("31337", "vast-canary-key-5f1c0a9e77d2") as server:
        yield server


@pytest.mark.slow  # `trainbox run` against a provider stand-in
def test_an_instance_above_the_price_ceiling_is_refused_before_any_dataset_byte_and_released(
    hub_ctx: HubContext, tmp_path: Path, vast: FakeVast
) -> None:
    from tests.integration.test_dataset_hub import dataset_tar, publish

    dataset = publish(hub_ctx, {"cones.tar": dataset_tar(tmp_path)})
    hub_ctx.hub.reset_log()
    vast.price = 3.2  # what the marketplace bills for this instance now
    env = stand_in(
        tmp_path,
        tmp_path / "work",
        HF_TOKEN=hub_ctx.token,
        OUTPUT_REPO=hub_ctx.repo_id("ceiling"),
        DATASET_REPO=dataset,
        PROVIDER=vast.kind,
        ON_FAILURE="destroy",
        MAX_PRICE_PER_HOUR="2.5",
        **vast.env(),
    )

    result = run_trainbox("run", env=env, timeout=120)

    assert result.returncode == PriceCeilingError.exit_code, result.output[-3000:]
    (line,) = [line for line in result.stderr.splitlines() if "MAX_PRICE_PER_HOUR" in line and "ERROR" in line]
    assert "$3.2/h (vast:dph_total), above MAX_PRICE_PER_HOUR=$2.5/h" in line
    assert not hub_ctx.hub.find_requests(path=r"/datasets/"), "the dataset repo was read"
    state = local_state(tmp_path / "work")
    assert state["phase"] == Phase.FAILED and state["exit"]["reason"] == PriceCeilingError.reason
    assert "dataset" not in state["phases"]
    (destroy,) = vast.actions()  # ON_FAILURE=destroy: nothing on it to keep
    assert (destroy.method, destroy.path) == ("DELETE", "/api/v0/instances/31337/")
    assert state["release"]["status"] == "confirmed"
