"""The demo's batch: 8 on a CPU (twice the updates of batch=-1's 16 there), batch=-1 on GPUs, RUN_ARGS first."""

from __future__ import annotations

from pathlib import Path

from entrypoint import dryrun
from entrypoint.settings import DEMO_CPU_BATCH, from_env
from entrypoint.training.sizing import demo_cpu_batch


def make(**env: str):
    return from_env({"WORKDIR": "/srv/work", "PROVIDER": "none"} | env)


def test_the_demo_on_a_cpu_trains_at_its_own_batch() -> None:
    extra = demo_cpu_batch(make(), None)
    assert extra is not None and extra.get("batch") == str(DEMO_CPU_BATCH)


def test_gpus_a_batch_in_run_args_or_another_dataset_keep_their_batch() -> None:
    assert demo_cpu_batch(make(), (0,)) is None  # batch=-1 sizes it on the card
    assert demo_cpu_batch(make(RUN_ARGS="batch=-1"), None) is None
    assert demo_cpu_batch(make(RUN_ARGS="batch=4"), None) is None
    assert demo_cpu_batch(make(DATASET_REPO="acme/cones"), None) is None


def test_the_dry_run_shows_the_batch_the_cpu_gets(tmp_path: Path) -> None:
    settings = from_env({"WORKDIR": str(tmp_path), "PROVIDER": "none", "GPUS": "cpu"})
    shown = "\n".join(dryrun.report(settings, {}))
    assert f"batch={DEMO_CPU_BATCH}" in shown and "batch=-1" not in shown
