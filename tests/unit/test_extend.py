"""Extending a run: ``epochs`` does not define it, OUTPUT_REPO refuses any other change naming what differs, and
an extension is noticed from the checkpoint, recorded once in trainbox.json and on the card."""

from __future__ import annotations

from pathlib import Path

import pytest

from entrypoint import run_args
from entrypoint.errors import ConfigError
from entrypoint.report.card_facts import card_info
from entrypoint.settings import from_env
from entrypoint.state import RunState
from entrypoint.sync import run_identity
from entrypoint.training import extend, resume
from tests.fakes.libreyolo import _checkpoint

OPTIONS = {"model": "str", "epochs": "int", "imgsz": "int", "lr0": "float", "batch": "int"}


def record(**env: str) -> dict:
    base = {"WORKDIR": "/srv/work", "PROVIDER": "none", "DATASET_REPO": "acme/cones", "OUTPUT_REPO": "acme/yolo"}
    settings = from_env(base | env, options=OPTIONS)
    return {"run_name": settings.run_name, "settings": settings.record()}


def refusal(ours: dict, theirs: dict) -> str:
    with pytest.raises(ConfigError) as refused:
        resume.check_same_run(theirs, ours["run_name"], "acme/yolo", {"trainbox.json"}, ours["settings"])
    return str(refused.value)


def test_more_epochs_is_the_same_run_on_the_hub() -> None:
    finished = record(RUN_ARGS="model=LibreYOLO9s.pt epochs=3 imgsz=640")
    longer = record(RUN_ARGS="model=LibreYOLO9s.pt epochs=5 imgsz=640")
    assert longer["run_name"] == finished["run_name"]
    resume.check_same_run(finished, longer["run_name"], "acme/yolo", {"trainbox.json"}, longer["settings"])


@pytest.mark.parametrize(
    ("env", "named"),
    [
        ({"RUN_ARGS": "model=LibreYOLO9s.pt epochs=5 imgsz=320"}, "RUN_ARGS imgsz is 320 here, 640 in that run"),
        ({"RUN_ARGS": "model=LibreYOLO9m.pt epochs=3 imgsz=640"}, "RUN_ARGS model is LibreYOLO9m.pt here"),
        ({"RUN_ARGS": "model=LibreYOLO9s.pt imgsz=640 lr0=0.02"}, "RUN_ARGS lr0 is 0.02 here, unset in that run"),
        (
            {"DATASET_REPO": "acme/cones-v2", "RUN_ARGS": "model=LibreYOLO9s.pt epochs=3 imgsz=640"},
            "DATASET_REPO is acme/cones-v2 here, acme/cones in that run",
        ),
        (
            {"DATA_YAML": "other.yaml", "RUN_ARGS": "model=LibreYOLO9s.pt epochs=3 imgsz=640"},
            "DATA_YAML is other.yaml here, unset in that run",
        ),
    ],
)
def test_anything_else_that_defines_the_run_is_refused_in_one_line_naming_it(env: dict, named: str) -> None:
    theirs = record(RUN_ARGS="model=LibreYOLO9s.pt epochs=3 imgsz=640")
    message = refusal(record(**env), theirs)
    assert named in message and "\n" not in message
    assert "epochs" not in message.split(":", 1)[1].split("—")[0]  # the epochs difference is not one


def test_a_run_recorded_by_an_older_trainbox_is_compared_by_what_it_recorded() -> None:
    ours = record(RUN_ARGS="epochs=5 imgsz=320")
    older = {"run_name": "cones-3b51bee1", "settings": {"dataset": "acme/cones", "output_repo": "acme/yolo",
                                                        "run_args": "epochs=3 imgsz=640 batch=-1"}}  # fmt: skip
    assert "RUN_ARGS imgsz is 320 here, 640 in that run" in refusal(ours, older)
    # the same settings under the name 0.1.0 derived (epochs included): the fix is that name
    same = record(RUN_ARGS="epochs=5 imgsz=640")
    older["settings"]["run_args"] = "epochs=3 imgsz=640 batch=-1"
    message = refusal(same, older)
    assert "with these settings" in message and "set RUN_NAME=cones-3b51bee1" in message


def test_run_args_differences_ignore_epochs_and_order() -> None:
    ours = {"identity": {"RUN_ARGS": "imgsz=640 model=a.pt", "DATASET_REPO": "x/y"}}
    theirs = {"identity": {"RUN_ARGS": "model=a.pt imgsz=640", "DATASET_REPO": "x/y"}}
    assert run_identity.setting_mismatches(ours, theirs) == []
    assert frozenset({"epochs"}) == run_args.EXTENDS_THE_RUN


def write_checkpoint(path: Path, epoch: int, total: int) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(_checkpoint(epoch, total))
    return path


def test_an_extension_is_noticed_from_the_checkpoint_and_recorded_once(tmp_path: Path) -> None:
    last = write_checkpoint(tmp_path / "run" / "weights" / "last.pt", 3, 3)
    assert extend.saved_total(last) == 3
    assert extend.detect(last, 3, 3) is None  # the same total: a plain resume (or nothing left)
    assert extend.detect(last, 3, 2) is None
    found = extend.detect(last, 3, 5)
    assert found == {"from_epochs": 3, "to_epochs": 5, "after_epoch": 3, "how": "resume"}

    state = RunState(tmp_path / "run", "cones")
    extend.note(state, last, 3, 5)
    assert state.snapshot()["extensions"] == [found]
    # a restart after epoch 4: the checkpoint now says 5; the earlier extension is carried, not repeated
    write_checkpoint(last, 4, 5)
    again = RunState(tmp_path / "run", "cones", state.snapshot())
    extend.note(again, last, 4, 5)
    assert again.snapshot()["extensions"] == [found]
    # and extended again later, to 8
    extend.note(again, write_checkpoint(last, 5, 5), 5, 8)
    assert [entry["to_epochs"] for entry in again.snapshot()["extensions"]] == [5, 8]


def test_a_damaged_history_or_checkpoint_is_no_extension(tmp_path: Path) -> None:
    assert extend.history({"extensions": [{"from_epochs": "3"}, 7, None]}) == []
    assert extend.history({"extensions": "nope"}) == []
    broken = tmp_path / "last.pt"
    broken.write_bytes(b"PK\x03\x04 torn")
    assert extend.detect(broken, 3, 5) is None


def test_the_card_says_the_run_was_extended() -> None:
    snapshot = {
        "run_name": "cones-1a2b3c4d",
        "phase": "training",
        "extensions": [{"from_epochs": 3, "to_epochs": 5, "after_epoch": 3, "how": "resume"}],
    }
    info = card_info(snapshot, [], repo_id="acme/yolo", receipt=None, plot=False, total=5)
    assert (
        "Extended from 3 to 5 epochs after epoch 3, through libreyolo's resume with the new total"
        " (weights, optimizer and EMA carry on)."
    ) in info.notes
