"""The store protocol's simulation (tests/protocol_sim): the agent's own lease, bucket, read and committer code
against an in-memory Hub in virtual time. Generated histories keep every invariant; each ordering of issue 53 is
a named history; each invariant is shown to fail with the product rule that guards it switched off.
bench/protocol_sim.py runs the long lane (100 000 histories)."""

from __future__ import annotations

import hashlib
import logging
import os
import random
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from huggingface_hub.errors import HfHubHTTPError

from entrypoint.errors import StoreUnreadableError, TakenOverError
from entrypoint.sync import clock, read
from entrypoint.sync.bucket import Bucket, RunFolder
from entrypoint.sync.bucket_store import BucketStore
from entrypoint.sync.protocol import Manifest
from entrypoint.sync.staging import StagedFile
from tests.protocol_sim.clock import Scheduler
from tests.protocol_sim.container import BUCKET, PERIOD, RUN, checkpoint_bytes
from tests.protocol_sim.faults import Faults
from tests.protocol_sim.histories import ALONE, FENCED, ORDERINGS, SWITCHED_OFF
from tests.protocol_sim.hub import Server, SimApi, SimHub
from tests.protocol_sim.world import Options, Violation, _seam, run

pytestmark = pytest.mark.protocol

# The protocol lane's generated histories (the mutation run, bench/mutation.py, plays fewer per mutant), in slices
# that pytest-xdist spreads over its workers: some 30 CPU-seconds, so `slow` (the fast lane plays a sample).
HISTORIES = int(os.environ.get("PROTOCOL_SIM_HISTORIES", "2000"))
SHARDS = 8
# The fast lane's sample: other seeds than the protocol lane's, so the whole suite plays both.
SAMPLE_SEEDS = range(1_000_000, 1_000_000 + min(HISTORIES, 300))


@pytest.mark.slow
@pytest.mark.parametrize("shard", range(SHARDS))
def test_generated_histories_keep_every_invariant(shard: int) -> None:
    for seed in range(shard, HISTORIES, SHARDS):
        run(seed)  # a Violation names the seed and prints the last events


@pytest.mark.parametrize("half", range(2))
def test_a_sample_of_generated_histories_keeps_every_invariant(half: int) -> None:
    for seed in SAMPLE_SEEDS[half::2]:
        run(seed)


def _ordering(name: str) -> object:
    if name in FENCED:
        return pytest.param(
            name, marks=pytest.mark.xfail(strict=True, raises=Violation, reason=f"fence: {FENCED[name]}")
        )
    return name


@pytest.mark.parametrize("name", [_ordering(name) for name in ORDERINGS])
def test_each_ordering_keeps_every_invariant(name: str) -> None:
    result = run(1, ORDERINGS[name])
    assert result.epochs == 8, f"the run did not finish: {result.exits}\n" + "\n".join(result.log[-20:])


@pytest.mark.parametrize("name", list(SWITCHED_OFF))
def test_each_invariant_fails_with_its_rule_switched_off(name: str) -> None:
    said, options, switched_off = SWITCHED_OFF[name]
    with pytest.raises(Violation, match=said):
        run(1, options, rules=switched_off, only=ALONE.get(name))


def test_each_invariant_holds_in_its_history_with_the_rule_on() -> None:
    for _, options, _ in SWITCHED_OFF.values():
        run(1, options)


def test_a_history_replays_exactly_from_its_seed() -> None:
    first, again = run(1234), run(1234)
    assert first.log == again.log and first.steps == again.steps and first.exits == again.exits


def test_a_violation_names_its_seed_and_replays_the_last_events() -> None:
    with pytest.raises(Violation) as raised:
        run(7, SWITCHED_OFF["nothing-durable-lost"][1], rules=SWITCHED_OFF["nothing-durable-lost"][2])
    text = str(raised.value)
    assert text.startswith("seed 7: ") and "replay (last events):" in text and " launched " in text


def test_a_container_started_after_the_holder_ended_takes_the_run_at_once() -> None:
    # c1 trains the run to its end and releases the lease; c2, started after, finds it released: no period's wait.
    result = run(1, Options(containers=2, starts=[0.0, 600.0], skews={"c1": 0.0, "c2": 0.0}))
    started = [line.split() for line in result.log if " c2 (" in line and " starts run " in line]
    assert result.exits["c1"] == 0 and started, "\n".join(result.log)
    at = float(started[0][1])  # "t=  612.3 c2 (<attempt>) starts run …"
    assert at - 600.0 < PERIOD / 4, f"c2 started {at - 600.0:.0f} s after its launch: it waited for a released lease"


def test_a_relaunch_after_a_kill_waits_one_lease_period_at_most() -> None:
    # Ordering 3: c1 killed at 300 s (its 5th boundary landed), c2 relaunched at 310 s on a new volume watches
    # c1's heartbeat for one period, takes the run, waits a quarter period (the last write c1 may have had licensed
    # lands in it), then reads what it resumes from and carries forward, and resumes where the bucket is: at the
    # epochs c1 was told had landed. Its Hub calls take up to 4 s each (there and back): 15 at most, 60 s: the run
    # id and the lease, the watch's first look, the take; after the quarter period the lease, the manifests, last.pt,
    # and the listing and manifests its boundaries carry forward.
    # MAX_COST's count of the spend before the wait is the cost wing's: not simulated here.
    result = run(1, ORDERINGS["3-relaunch-waits-one-period"])
    told = [line.split() for line in result.log if " c1 told: " in line]
    started = [line.split() for line in result.log if " c2 (" in line and " starts run " in line]
    assert told and started and started[0][-1] == told[-1][4], "\n".join(result.log)
    assert int(started[0][-1]) >= 5, "\n".join(result.log)
    waited = float(started[0][1]) - 310.0
    said = f"the relaunch started {waited:.0f} s after its launch"
    assert PERIOD + PERIOD / 4 <= waited <= PERIOD + PERIOD / 4 + 60.0, said


def test_a_taker_frozen_inside_its_lease_commit_finds_the_head_moved_and_ends_held() -> None:
    # 5g: c2's take, frozen before the Hub applied it, names a head c3's take moved: 412, never a second holder.
    result = run(1, ORDERINGS["5g-a-taker-frozen-inside-its-lease-commit"])
    assert result.exits == {"c1": None, "c2": 72, "c3": 0}, "\n".join(result.log)
    assert not any(" c2 (" in line and " starts run " in line for line in result.log), "c2 never trained"


# -- the seam alone: one container's bucket store against the in-memory Hub -----------------------------------------
@contextmanager
def bucket_folder(**script: list[str]) -> Iterator[tuple[Server, RunFolder]]:
    """The run's folder in the in-memory Hub's bucket, its calls meeting ``script``'s outcomes in turn (per call)."""
    rng = random.Random(0)
    scheduler = Scheduler(rng)
    server = Server(scheduler, Faults(rng, slow=0.0, script=dict(script)))
    api = SimApi(server)
    with _seam(scheduler, api, rng):
        yield server, RunFolder(Bucket(SimHub(token="hf_sim", sim_api=api), BUCKET), RUN, "run-id")


def staged(tmp_path: Path, relative: str, data: bytes, epochs: int | None = None) -> StagedFile:
    copy = tmp_path / "staging" / f"{relative.replace('/', '_')}-{hashlib.sha256(data).hexdigest()[:8]}"
    copy.parent.mkdir(parents=True, exist_ok=True)
    copy.write_bytes(data)
    return StagedFile(relative, copy, hashlib.sha256(data).hexdigest(), None, len(data), epochs=epochs, seen_at=0.0)


def test_a_boundary_whose_answer_was_lost_but_that_landed_is_taken_as_landed(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with bucket_folder(batch=["lost", "lost"]) as (server, folder):  # applied, its answer lost, twice
        store = BucketStore.begin(folder)
        assert store.remote_ids() == {} and store.head() is None
        last = staged(tmp_path, "weights/last.pt", b"epoch 3", epochs=3)
        with pytest.raises(TimeoutError):
            store.commit([last], "Epoch boundary", deadline=None, commit_id="c-1")
        assert store.head() is None, "no answer: not known to have landed"

        with caplog.at_level(logging.INFO, logger="trainbox"):
            key = store.landed("c-1", deadline=None)
        assert [r.getMessage() for r in caplog.records] == [
            f"bucket: boundary {key.rsplit('/', 1)[-1] if key else ''} had landed before its answer was lost"
        ]

        assert key is not None and key in server.bucket and store.head() == key
        assert store.remote_ids() == {"weights/last.pt": last.sha256}
        assert store.landed("c-1", deadline=None) is None, "settled: never confirmed twice"
        before = len(server.journal)
        assert store.commit([last], "Epoch boundary", deadline=None, commit_id="c-2").endswith("000002.json")
        sent = [entry[2] for entry in server.journal[before:] if entry[2].startswith("put ")]
        assert sent == [f"put {folder.prefix}/manifests/{store.attempt}-000002.json"], "its object is not sent again"


def test_a_boundary_that_never_reached_the_bucket_is_not_taken_as_landed(tmp_path: Path) -> None:
    with bucket_folder(batch=["503", "503"]) as (server, folder):
        store = BucketStore.begin(folder)
        with pytest.raises(HfHubHTTPError):
            store.commit([staged(tmp_path, "weights/last.pt", b"x", epochs=1)], "b", deadline=None, commit_id="c-1")
        assert store.landed("c-1", deadline=None) is None and store.head() is None and server.bucket == {}
        assert store.landed("never-sent", deadline=None) is None


def manifest_at(server: Server, key: str) -> Manifest:
    manifest = Manifest.parse(key, server.bucket[key])
    assert manifest is not None, f"{key} is not a manifest"
    return manifest


def test_a_boundary_is_its_objects_then_its_manifest_carrying_what_the_folder_held_at_the_start(
    tmp_path: Path,
) -> None:
    with bucket_folder() as (server, folder):
        earlier = BucketStore.begin(folder)  # an earlier attempt left a snapshot the volume no longer holds
        snap = staged(tmp_path, "weights/epoch_3.pt", b"e3", epochs=3)
        earlier.commit([snap], "m", deadline=None, commit_id="c-0")

        store = BucketStore.begin(folder)
        assert store.attempt > earlier.attempt, "later than every attempt already there"
        fences: list[float | None] = []
        store.before_write = fences.append
        metrics = staged(tmp_path, "metrics.jsonl", b'{"epoch": 4}\n{"epoch": 5}\n')
        last = staged(tmp_path, "weights/last.pt", b"e5", epochs=5)
        before = len(server.journal)

        key = store.commit([metrics, last], "Epoch boundary", deadline=1e12, commit_id="c-1")

        writes = [entry[2] for entry in server.journal[before:]]
        assert writes[-1] == f"put {key}" and len(writes) == 3, "the objects, then the manifest naming them"
        assert fences == [1e12], "the lease checked before the batch, with its deadline"
        manifest = manifest_at(server, key)
        assert (manifest.run_id, manifest.run_name, manifest.attempt, manifest.seq, manifest.commit) == (
            "run-id",
            RUN,
            store.attempt,
            1,
            "c-1",
        )
        assert manifest.epoch == 5, "the metrics' last row"
        assert manifest.files["weights/last.pt"]["key"] == folder.object_key(store.attempt, last.sha256, last.relative)
        assert manifest.files["weights/last.pt"]["epoch"] == 5 and manifest.files["metrics.jsonl"]["size"] == 26
        assert manifest.files["metrics.jsonl"]["epoch"] == 5, "a file of no epoch of its own: the boundary's"
        assert manifest.files["weights/epoch_3.pt"] == manifest_at(server, earlier.head() or "").files[snap.relative]

        second = store.commit([last], "Epoch boundary", deadline=None, commit_id="c-2")
        kept = manifest_at(server, second)
        assert kept.seq == 2 and kept.epoch == 5, "no metrics this time: the folder's newest epoch"
        assert set(kept.files) == {"weights/epoch_3.pt", "metrics.jsonl", "weights/last.pt"}

    with bucket_folder() as (server, folder):
        first = BucketStore.begin(folder).commit(
            [staged(tmp_path, "args.yaml", b"epochs: 8\n")], "b", deadline=None, commit_id="c-0"
        )
        assert manifest_at(server, first).epoch == 0, "a first boundary without metrics records no epoch"


def test_the_tidy_deletes_what_no_newer_manifest_names_and_stops_at_a_newer_attempt(tmp_path: Path) -> None:
    with bucket_folder() as (server, folder):
        store = BucketStore.begin(folder)
        store.tidy(deadline=None)  # nothing landed yet: nothing to tidy
        first = store.commit([staged(tmp_path, "weights/last.pt", b"e1", epochs=1)], "b", deadline=None, commit_id="1")
        old_object = manifest_at(server, first).files["weights/last.pt"]["key"]
        second = store.commit([staged(tmp_path, "weights/last.pt", b"e2", epochs=2)], "b", deadline=None, commit_id="2")
        fences: list[float | None] = []
        store.before_write = fences.append
        server.faults.script = {"batch": ["503"]}  # the delete's first try fails: its retry checks the lease again

        store.tidy(deadline=5e12)

        assert first not in server.bucket and old_object not in server.bucket, "the superseded boundary went"
        assert second in server.bucket and set(manifest_at(server, second).keys()) <= set(server.bucket)
        assert fences == [5e12, 5e12]
        assert first not in store._known, "a manifest deleted is forgotten: the next tidy judges by what is there"

        again = store.commit([staged(tmp_path, "weights/last.pt", b"e1", epochs=1)], "b", deadline=None, commit_id="4")
        assert old_object in server.bucket, "an object the tidy deleted is uploaded again when its bytes come back"
        assert set(manifest_at(server, again).keys()) <= set(server.bucket)

        newer = BucketStore.begin(folder)
        newer.commit([staged(tmp_path, "weights/last.pt", b"e3", epochs=3)], "b", deadline=None, commit_id="3")
        with pytest.raises(TakenOverError, match=f"another agent \\(attempt {newer.attempt}\\) writes"):
            store.tidy(deadline=None)
        assert newer.head() in server.bucket and second in server.bucket, "nothing deleted"


def test_a_bucket_that_cannot_be_read_is_no_state_for_a_reader_that_only_looks_said_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with bucket_folder(list=["403"]) as (_, folder), caplog.at_level(logging.INFO, logger="trainbox"):
        assert read.bucket_state(folder, tmp_path) is None
    assert [r.getMessage() for r in caplog.records] == [
        f"resume: cannot read {folder.label} (HTTP 403); using the volume and the repo"
    ]


def test_a_resumes_deadline_on_the_bucket_counts_from_its_first_read_not_from_each_look(tmp_path: Path) -> None:
    with bucket_folder(list=["403"] * 50) as (_, folder):
        began = clock.monotonic() - 100.0  # the resume's first read of the bucket failed 100 s ago
        with pytest.raises(StoreUnreadableError, match=r"for 100 s \(HTTP 403\)"):
            read.bucket_sources(folder, run_known=True, read_for=60.0, began=began)


def test_another_runs_state_under_the_same_run_name_is_named_once_and_left_alone(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with bucket_folder() as (server, folder):
        for other_id in ("other-a", "other-b", "other-c", "other-d"):
            other = BucketStore.begin(RunFolder(folder.bucket, RUN, other_id))
            other.commit([staged(tmp_path, "weights/last.pt", b"e2", epochs=2)], "b", deadline=None, commit_id="1")
        held = dict(server.bucket)
        with caplog.at_level(logging.INFO, logger="trainbox"):
            assert read.bucket_sources(folder) == []
            assert read.bucket_sources(folder, say_others=False) == []
        assert server.bucket == held
    assert [r.getMessage() for r in caplog.records] == [
        f"resume: hf://buckets/{BUCKET}/{RUN}/ holds another run's state (other-a, other-b, other-c), not run"
        " run-id's: not resumed, left as it is"
    ]


def downloads_of(folder: RunFolder) -> list[str]:
    """The name of each object (not a manifest) the bucket sends from now on, as the in-memory Hub is asked."""
    sent: list[str] = []
    api = folder.bucket.hub.api
    real = api.download_bucket_files

    def recorded(bucket_id: str, files: list[tuple[str, Any]], **kw: Any) -> None:
        sent.extend(key.rsplit("/", 1)[-1] for key, _ in files if "/manifests/" not in key)
        real(bucket_id, files, **kw)

    api.download_bucket_files = recorded
    return sent


def boundary_of(store: BucketStore, tmp_path: Path, epochs: int) -> None:
    files = [
        staged(tmp_path, "weights/last.pt", checkpoint_bytes(epochs), epochs=epochs),
        staged(tmp_path, "metrics.jsonl", "".join(f'{{"epoch": {n}}}\n' for n in range(1, epochs + 1)).encode()),
    ]
    store.commit(files, "Epoch boundary", deadline=None, commit_id=f"c-{epochs}")


def on_volume(run_dir: Path, epochs: int) -> None:
    (run_dir / "weights").mkdir(parents=True, exist_ok=True)
    (run_dir / "weights" / "last.pt").write_bytes(checkpoint_bytes(epochs))
    (run_dir / "metrics.jsonl").write_text("".join(f'{{"epoch": {n}}}\n' for n in range(1, epochs + 1)))


def resuming(tmp_path: Path, folder: RunFolder, *, in_bucket: int, on_the_volume: int) -> tuple[Path, Path, list[str]]:
    """A boundary of ``in_bucket`` epochs in the bucket, a volume of ``on_the_volume``: the run folder, the work
    folder and the names the bucket's downloads will fetch."""
    boundary_of(BucketStore.begin(folder), tmp_path, in_bucket)
    run_dir, work = tmp_path / "run", tmp_path / "work"
    on_volume(run_dir, on_the_volume)
    work.mkdir()
    return run_dir, work, downloads_of(folder)


def test_a_resume_downloads_the_buckets_newer_last_pt_with_its_history_once(tmp_path: Path) -> None:
    with bucket_folder() as (_, folder):
        run_dir, work, sent = resuming(tmp_path, folder, in_bucket=5, on_the_volume=3)

        found = read.find_newest(run_dir, work, folder=folder, run_known=True, read_for=60.0)

        assert found is not None and (found.source, found.epochs) == ("bucket", 5)
        assert sorted(sent) == ["last.pt", "metrics.jsonl"], "in one call, each once"
        assert (run_dir / "metrics.jsonl").read_text().count("epoch") == 5, "its history came along"


@pytest.mark.parametrize("volume", [True, False], ids=["volume", "stores-alone"])
def test_a_bucket_boundary_no_newer_than_the_volume_is_never_downloaded(tmp_path: Path, volume: bool) -> None:
    """The volume's last.pt is the bucket's newest: nothing is downloaded, whether the volume counts (one machine)
    or only the stores do (several machines: the volume's bytes stand in for the bucket's download)."""
    with bucket_folder() as (_, folder):
        run_dir, work, sent = resuming(tmp_path, folder, in_bucket=4, on_the_volume=4)

        found = read.find_newest(run_dir, work, volume=volume, folder=folder, run_known=True, read_for=60.0)

        assert found is not None and found.epochs == 4 and found.source == ("volume" if volume else "bucket")
        assert sent == ([] if volume else ["metrics.jsonl"]), "at most the stores' history, once"


def test_a_boundary_whose_last_pt_is_torn_resumes_from_its_snapshot(tmp_path: Path) -> None:
    with bucket_folder() as (server, folder):
        store = BucketStore.begin(folder)
        snapshot = staged(tmp_path, "weights/epoch_3.pt", checkpoint_bytes(3), epochs=3)
        last = staged(tmp_path, "weights/last.pt", checkpoint_bytes(4), epochs=4)
        key = store.commit([snapshot, last], "Epoch boundary", deadline=None, commit_id="c-1")
        torn = manifest_at(server, key).files["weights/last.pt"]["key"]
        server.bucket[torn] = bytes(len(server.bucket[torn]))  # its size, other bytes
        work = tmp_path / "work"
        work.mkdir()

        found = read.find_newest(tmp_path / "run", work, folder=folder, run_known=True, read_for=60.0)

        assert found is not None and (found.source, found.epochs) == ("bucket", 3)


def test_a_resumes_deadline_on_the_bucket_holds_across_a_failed_download_and_a_failed_listing(tmp_path: Path) -> None:
    with bucket_folder() as (server, folder):
        boundary_of(BucketStore.begin(folder), tmp_path, 5)
        # The manifests read, then the checkpoint's download refused; a pause, then every listing refused.
        server.faults.script = {"list": ["ok", *["403"] * 200], "download": ["ok", "403"]}
        work = tmp_path / "work"
        work.mkdir()
        began = clock.monotonic()
        with pytest.raises(StoreUnreadableError, match=r"for 6\d s \(HTTP 403\)"):
            read.find_newest(tmp_path / "run", work, folder=folder, run_known=True, read_for=60.0)
        assert clock.monotonic() - began <= 61.0, "the deadline counts from the resume's first read, not each look's"


def test_a_lost_boundary_missing_one_of_its_objects_did_not_land(tmp_path: Path) -> None:
    with bucket_folder(batch=["lost", "lost"]) as (server, folder):
        store = BucketStore.begin(folder)
        last = staged(tmp_path, "weights/last.pt", b"epoch 3", epochs=3)
        with pytest.raises(TimeoutError):
            store.commit([last], "Epoch boundary", deadline=None, commit_id="c-1")
        del server.bucket[folder.object_key(store.attempt, last.sha256, last.relative)]  # a batch cut short
        assert store.landed("c-1", deadline=None) is None and store.head() is None


@pytest.mark.parametrize(
    "call", ["begin", "learn-listing", "learn-manifests", "landed", "commit", "tidy", "tidy-manifests", "tidy-batch"]
)
def test_every_bucket_call_of_the_store_keeps_to_the_deadline_it_is_given(tmp_path: Path, call: str) -> None:
    """A retry that would start past the deadline (a flush's, a resume's) is not started: the failure is raised."""
    with bucket_folder() as (server, folder):
        BucketStore.begin(folder).commit(
            [staged(tmp_path, "weights/last.pt", b"e1", epochs=1)], "b", deadline=None, commit_id="c-0"
        )
        store = BucketStore.begin(folder)
        if call == "landed":
            with pytest.raises(TimeoutError):
                server.faults.script = {"batch": ["lost", "lost"]}
                store.commit([staged(tmp_path, "weights/last.pt", b"e2", epochs=2)], "b", deadline=None, commit_id="c")
        if call.startswith("tidy"):
            store.commit([staged(tmp_path, "weights/last.pt", b"e4", epochs=4)], "b", deadline=None, commit_id="t")
            store.commit([staged(tmp_path, "weights/last.pt", b"e5", epochs=5)], "b", deadline=None, commit_id="u")
        if call == "tidy-manifests":  # an older attempt's boundary written since this one began: read by the tidy
            older = BucketStore(folder, "0000000000001-aaaaaa")
            older.commit([staged(tmp_path, "weights/last.pt", b"o", epochs=1)], "b", deadline=None, commit_id="o")
        fault = {
            "begin": "list",
            "learn-listing": "list_all",
            "learn-manifests": "download",
            "landed": "read",
            "tidy": "list_all",
            "tidy-manifests": "download",
        }
        server.faults.script = {fault.get(call, "batch"): ["503"]}
        soon = clock.monotonic() + 0.5
        with pytest.raises(HfHubHTTPError):
            if call == "begin":
                BucketStore.begin(folder, deadline=soon)
            elif call == "landed":
                store.landed("c", deadline=soon)
            elif call.startswith("tidy"):
                store.tidy(deadline=soon)
            elif call == "commit":
                store.learn()
                store.commit([staged(tmp_path, "weights/last.pt", b"e3", epochs=3)], "b", deadline=soon, commit_id="d")
            else:
                store.learn(soon)


def test_a_taker_carries_forward_the_holders_chain_never_a_later_unleased_attempts_boundary(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with bucket_folder() as (server, folder):
        holder = BucketStore.begin(folder)
        holder.commit([staged(tmp_path, "weights/epoch_3.pt", b"e3", epochs=3)], "b", deadline=None, commit_id="1")
        unleased = BucketStore.begin(folder)  # wrote without the lease
        unleased.commit([staged(tmp_path, "weights/epoch_6.pt", b"e6", epochs=6)], "b", deadline=None, commit_id="2")

        taker = BucketStore.begin(RunFolder(folder.bucket, RUN, "run-id", holder=holder.attempt))
        with caplog.at_level(logging.INFO, logger="trainbox"):
            key = taker.commit([staged(tmp_path, "metrics.jsonl", b"{}\n")], "b", deadline=None, commit_id="3")

        assert set(manifest_at(server, key).files) == {"weights/epoch_3.pt", "metrics.jsonl"}
        assert [r.getMessage() for r in caplog.records] == [
            "bucket: this attempt's boundaries keep naming weights/epoch_3.pt"
        ]
