"""DataLoader workers from the CPUs per GPU, ``cache=ram`` when the decoded dataset fits and lasts
(training/sizing.py), what the job records of them and what the command gets."""

from __future__ import annotations

from pathlib import Path

import pytest

from entrypoint.host.grant import CpuGrant
from entrypoint.run_args import parse
from entrypoint.settings import DEMO_CPU_BATCH, from_env
from entrypoint.training import sizing
from tests.support import make_dataset

GB = 10**9


@pytest.mark.parametrize(
    ("cpus", "gpus", "workers"),
    [
        (16, 1, 15),  # one GPU on 16 CPUs: all but the agent's
        (64, 1, sizing.MAX_WORKERS),  # more feed no faster, and are forked again every epoch
        (32, 8, 3),  # 8 GPUs on 32 CPUs: 8 × 8 workers (libreyolo's YOLO9 default) would oversubscribe
        (2, 1, 1),
        (4, 8, 1),
    ],
)
def test_workers_on_gpus_are_the_cpus_per_gpu_one_left_for_the_agent(cpus: int, gpus: int, workers: int) -> None:
    assert sizing.workers(CpuGrant(cpus), gpus, on_gpu=True) == workers


def test_no_workers_on_the_cpu() -> None:
    assert sizing.workers(CpuGrant(32), 1, on_gpu=False) == 0


def test_cache_ram_only_when_loading_stays_in_the_training_process_and_it_fits() -> None:
    choice, why = sizing.cache(0, 1, (1000, 2 * GB), 10 * GB)
    assert choice == "ram" and "2000 MB decoded (1000 images) fit in 50% of 10000 MB free" in why
    assert sizing.cache(0, 1, (1000, 6 * GB), 10 * GB)[0] is None  # past the margin
    assert sizing.cache(0, 4, (1000, 2 * GB), 10 * GB)[0] is None  # each training process caches its own copy
    choice, why = sizing.cache(8, 1, (1000, 1), 10 * GB)
    assert choice is None and "restarted every epoch" in why
    assert sizing.cache(0, 1, None, 10 * GB)[0] is None and sizing.cache(0, 1, (1, 1), None)[0] is None


def test_the_decoded_size_is_measured_from_the_images(tmp_path: Path) -> None:
    data_yaml = make_dataset(tmp_path / "set", train=8, val=4)  # 128 × 128 PNGs
    assert sizing.decoded_size(data_yaml, 64) == (12, 12 * 64 * 64 * 3)  # resized as libreyolo caches them
    assert sizing.decoded_size(data_yaml, 256) == (12, 12 * 256 * 256 * 3)
    assert sizing.decoded_size(tmp_path / "missing.yaml", 64) is None


def test_images_are_found_in_folders_lists_and_txt_files(tmp_path: Path) -> None:
    root = tmp_path / "set"
    make_dataset(root, train=3, val=2)
    (root / "extra").mkdir()
    (root / "extra" / "x.JPG").write_bytes(b"")
    (root / "extra" / "notes.txt").write_text("not an image")
    (root / "val.txt").write_text("images/val/000.png\nimages/val/001.png\n\n")
    data_yaml = root / "custom.yaml"
    data_yaml.write_text(f"path: {root}\ntrain: [images/train, extra]\nval: val.txt\nnames: [a]\n")
    found = sizing.dataset_images(data_yaml)
    assert [path.relative_to(root).as_posix() for path in found] == [
        "extra/x.JPG",
        "images/train/000.png",
        "images/train/001.png",
        "images/train/002.png",
        "images/val/000.png",
        "images/val/001.png",
    ]


def plan(tmp_path: Path, run_args: str = "", *, on_gpu: bool, processes: int = 1, **kw: object) -> sizing.Feed:
    args = parse(run_args)
    data_yaml = make_dataset(tmp_path / "set", train=8, val=4)
    return sizing.plan(
        args,
        args,
        {},
        processes=processes,
        on_gpu=on_gpu,
        data_yaml=data_yaml,
        cpus=CpuGrant(16, 9.0, "cpu.max"),
        available=kw.get("available", 10 * GB),  # type: ignore[arg-type]
    )


def test_plan_on_gpus_adds_workers_and_leaves_the_cache_to_libreyolo(tmp_path: Path) -> None:
    feed = plan(tmp_path, on_gpu=True, processes=2)
    assert feed.args.argv() == ["workers=4"]  # (9 - 1) // 2
    assert feed.env["OMP_NUM_THREADS"] == "4" and feed.env["OPENCV_FOR_THREADS_NUM"] == "1"  # a CPU per worker
    assert feed.record["workers"] == {"value": 4, "source": "sized", "why": "the CPUs per GPU, one left for the agent"}
    assert feed.record["cache"]["value"] is None and "restarted every epoch" in feed.record["cache"]["why"]
    assert feed.record["cpus"] == {"cpus": 9, "affinity": 16, "quota": 9.0, "quota_at": "cpu.max"}


def test_plan_on_the_cpu_caches_a_dataset_that_fits(tmp_path: Path) -> None:
    feed = plan(tmp_path, "imgsz=64", on_gpu=False)
    assert feed.args.argv() == ["workers=0", "cache=ram"]
    assert feed.env["OMP_NUM_THREADS"] == feed.env["OPENCV_FOR_THREADS_NUM"] == "9"  # it resizes its own images
    cache = feed.record["cache"]
    assert (cache["value"], cache["images"], cache["decoded_mb"], cache["available_mb"]) == ("ram", 12, 0.1, 10000)
    assert plan(tmp_path / "b", on_gpu=False, available=100_000).args.argv() == ["workers=0"]  # too little room


def test_what_run_args_set_is_theirs(tmp_path: Path) -> None:
    feed = plan(tmp_path, "workers=3 cache=disk", on_gpu=True)
    assert feed.args.argv() == []
    assert feed.record["workers"] == {"value": 3, "source": "RUN_ARGS"}
    assert feed.record["cache"] == {"value": "disk", "source": "RUN_ARGS"}
    # workers=0 chosen by the user on a GPU: the cache is weighed for them
    assert plan(tmp_path / "b", "workers=0", on_gpu=True).args.argv() == ["cache=ram"]


def test_the_demo_keeps_its_own_workers_and_gets_its_cpu_batch(tmp_path: Path) -> None:
    settings = from_env({"WORKDIR": str(tmp_path), "PROVIDER": "none", "GPUS": "cpu"})
    feed = sizing.for_job(settings, settings.run_args, None, None)
    assert feed.record["workers"] == {"value": 0, "source": "demo default"}
    assert feed.args.get("batch") == str(DEMO_CPU_BATCH) and "workers" not in feed.args
    assert sizing.for_job(settings, settings.run_args, (0, 1), None).record["processes"] == 2


def test_the_phrase_on_the_receipt(tmp_path: Path) -> None:
    record = plan(tmp_path, "imgsz=64", on_gpu=False).record
    assert sizing.describe(record) == "9 CPUs, quota 9: 9 threads per process, workers 0, cache ram"
    record = plan(tmp_path / "b", on_gpu=True).record
    assert sizing.describe(record) == "9 CPUs, quota 9: 9 threads per process, workers 8, cache off"
