"""What a run is, as the pure comparison ``run_identity.refusal`` judges it (a run's trainbox.json against this
start), the refusal's one line, and how trainbox.json keeps the run's facts: a refused start changes none, the
dataset commit of the first start is kept and learned from a store."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from entrypoint.errors import ConfigError, NotThisRunError
from entrypoint.settings import from_env
from entrypoint.state import RunState, recorded_dataset_revision
from entrypoint.sync import run_identity
from entrypoint.sync.run_identity import Mismatch, refusal
from entrypoint.training import resume

OPTIONS = {"model": "str", "epochs": "int", "imgsz": "int", "lr0": "float"}
COMMIT_A, COMMIT_B = "a" * 40, "b" * 40


def settings(**env: str) -> dict[str, Any]:
    base = {"WORKDIR": "/srv/work", "PROVIDER": "none", "RUN_NAME": "cones", "DATASET_REPO": "acme/cones"}
    return from_env(base | {"OUTPUT_REPO": "acme/yolo"} | env, options=OPTIONS).record()


def recorded(run_id: str = "0123456789abcdef", **env: str) -> dict[str, Any]:
    return {"run_name": "cones", "run_id": run_id, "dataset_revision": COMMIT_A, "settings": settings(**env)}


FIRST = "model=LibreYOLO9s.pt imgsz=640 epochs=3"


def test_the_same_settings_in_another_order_and_more_epochs_are_the_run() -> None:
    assert refusal(recorded(RUN_ARGS=FIRST), settings(RUN_ARGS="epochs=8 imgsz=640 model=LibreYOLO9s.pt")) is None
    assert refusal(None, settings(RUN_ARGS=FIRST)) is None  # nothing recorded: a new run


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({"RUN_ARGS": "model=LibreYOLO9s.pt imgsz=320"}, Mismatch("RUN_ARGS imgsz", "320", "640")),
        (
            {"RUN_ARGS": "model=LibreYOLO9m.pt imgsz=640"},
            Mismatch("RUN_ARGS model", "LibreYOLO9m.pt", "LibreYOLO9s.pt"),
        ),
        ({"RUN_ARGS": FIRST + " lr0=0.02"}, Mismatch("RUN_ARGS lr0", "0.02", None)),
        ({"RUN_ARGS": FIRST, "DATASET_REPO": "acme/other"}, Mismatch("DATASET_REPO", "acme/other", "acme/cones")),
        ({"RUN_ARGS": FIRST, "OUTPUT_REPO": "acme/v2"}, Mismatch("OUTPUT_REPO", "acme/v2", "acme/yolo")),
        ({"RUN_ARGS": FIRST, "DATA_YAML": "b/data.yaml"}, Mismatch("DATA_YAML", "b/data.yaml", None)),
    ],
)
def test_an_explicit_run_name_with_another_defining_setting_is_another_run(
    env: dict[str, str], expected: Mismatch
) -> None:
    assert refusal(recorded(RUN_ARGS=FIRST), settings(**env)) == expected


def test_another_run_id_comes_first_and_a_start_that_knows_none_takes_the_records() -> None:
    other = settings(RUN_ARGS="model=LibreYOLO9s.pt imgsz=320")
    assert refusal(recorded(RUN_ARGS=FIRST), other, run_id="fedcba9876543210") == Mismatch(
        "run id", "fedcba9876543210", "0123456789abcdef"
    )
    assert refusal(recorded(RUN_ARGS=FIRST), settings(RUN_ARGS=FIRST), run_id=None) is None
    assert refusal(recorded(RUN_ARGS=FIRST), settings(RUN_ARGS=FIRST), run_id="0123456789abcdef") is None


def test_an_explicit_dataset_revision_is_compared_by_the_commit_it_names() -> None:
    run, ours = recorded(RUN_ARGS=FIRST), settings(RUN_ARGS=FIRST)
    assert refusal(run, ours, dataset_commit=COMMIT_B) == Mismatch("DATASET_REVISION", COMMIT_B, COMMIT_A)
    assert refusal(run, ours, dataset_commit=COMMIT_A) is None
    assert refusal(run, ours, dataset_commit=None) is None  # not given: the run's own commit is taken
    assert refusal({"run_name": "cones"}, ours, dataset_commit=COMMIT_B) is None  # nothing recorded to differ from


def test_the_recorded_commit_is_the_kept_one_else_an_older_files_last_dataset_stage() -> None:
    assert recorded_dataset_revision({"dataset_revision": COMMIT_A, "dataset": {"revision": COMMIT_B}}) == COMMIT_A
    assert recorded_dataset_revision({"dataset": {"revision": COMMIT_B}}) == COMMIT_B
    assert recorded_dataset_revision({"dataset": {"revision": None, "source": "bundled demo"}}) is None
    assert recorded_dataset_revision({"dataset_revision": "main"}) is None  # never a branch: only a commit pins
    assert recorded_dataset_revision(None) is None


@pytest.mark.parametrize(
    ("mismatch", "named"),
    [
        (Mismatch("RUN_ARGS imgsz", "96", "128"), ["RUN_ARGS imgsz is 96 here, 128 in that run", "RUN_NAME"]),
        (Mismatch("DATASET_REVISION", COMMIT_B, COMMIT_A), [COMMIT_A, COMMIT_B, "a new RUN_NAME for a new dataset"]),
        (Mismatch("run id", "1111111111111111", "2222222222222222"), ["1111111111111111", "2222222222222222"]),
    ],
)
def test_a_refusal_is_one_line_naming_both_values_and_the_fix(mismatch: Mismatch, named: list[str]) -> None:
    error = run_identity.refuse(mismatch, "cones", "OUTPUT_REPO acme/yolo")
    assert isinstance(error, ConfigError) and error.exit_code == 10 and "\n" not in str(error)
    assert all(part in str(error) for part in named), str(error)


def test_the_repo_side_refuses_another_run_id_and_other_settings_under_the_same_name() -> None:
    run = recorded(RUN_ARGS=FIRST)
    with pytest.raises(NotThisRunError, match="run id 0123456789abcdef, not this volume's fedcba9876543210"):
        resume.check_same_run(
            run, "cones", "acme/yolo", {"trainbox.json"}, settings(RUN_ARGS=FIRST), "fedcba9876543210"
        )
    with pytest.raises(NotThisRunError, match="RUN_ARGS imgsz is 320 here, 640 in that run"):
        resume.check_same_run(run, "cones", "acme/yolo", {"trainbox.json"}, settings(RUN_ARGS="imgsz=320"))
    resume.check_same_run(run, "cones", "acme/yolo", {"trainbox.json"}, settings(RUN_ARGS=FIRST), "0123456789abcdef")


def test_refused_starts_are_no_crash_loop() -> None:
    refused = {"exit_code": 10, "reason": NotThisRunError.reason, "epochs_done": 3}
    resume.check_crash_loop([refused] * 4)  # the run itself never failed: its own settings still start it


def test_trainbox_json_keeps_the_runs_settings_and_dataset_commit_across_starts(tmp_path: Path) -> None:
    first = RunState(tmp_path, "cones")
    first.update(settings=settings(RUN_ARGS=FIRST))
    first.identity.pin_dataset(COMMIT_A)
    first.identity.pin_dataset(COMMIT_B)  # only the first start's commit counts
    assert first.identity.dataset_revision == COMMIT_A

    refused = RunState.load(tmp_path, "cones")  # a start refused before its settings are recorded
    refused.save()
    again = RunState.load(tmp_path, "cones")
    assert again.identity.dataset_revision == COMMIT_A
    assert again.snapshot()["settings"]["identity"]["RUN_ARGS"] == "model=LibreYOLO9s.pt imgsz=640"


def test_a_new_volume_learns_the_dataset_commit_from_a_store(tmp_path: Path) -> None:
    state = RunState(tmp_path, "cones")
    state.history.adopt({"run_id": "0123456789abcdef", "dataset": {"revision": COMMIT_B}})
    assert (state.identity.run_id, state.identity.dataset_revision) == ("0123456789abcdef", COMMIT_B)
    state.history.adopt({"run_id": "0123456789abcdef", "dataset_revision": COMMIT_A})  # known now: kept
    assert state.identity.dataset_revision == COMMIT_B
    assert RunState.load(tmp_path, "cones").identity.dataset_revision == COMMIT_B  # saved
