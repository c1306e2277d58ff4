"""settings.from_env: every variable read once, bad values refused with the variable's name."""

from __future__ import annotations

import dataclasses
import hashlib
import json
from pathlib import Path

import pytest

from entrypoint.errors import ConfigError
from entrypoint.parsing import Declared, parse_duration
from entrypoint.settings import DatasetKind, ExitAction, Provider, Settings, from_env, parse_gpus
from entrypoint.variables import Vars, variables

TOKEN = "hf_settingsTestTokenValue1234567890"


def make(**env: str):
    base = {"WORKDIR": "/srv/work", "PROVIDER": "none"}
    return from_env(base | env)


def test_defaults_are_the_bundled_demo_on_all_gpus() -> None:
    settings = make()
    assert settings.dataset_kind is DatasetKind.DEMO
    assert settings.gpus.all and str(settings.gpus) == "all"
    assert settings.workdir == Path("/srv/work")
    assert settings.hf_home == Path("/srv/work/.cache/huggingface")
    assert settings.run_dir == Path("/srv/work/runs") / settings.run_name
    assert settings.on_exit is ExitAction.EXIT and settings.on_failure is ExitAction.EXIT
    assert settings.stall_timeout == 30 * 60 and settings.max_runtime is None
    # demo defaults train offline from scratch; batch=-1 is added
    assert settings.run_args.get("pretrained") == "false"
    assert settings.run_args.get("batch") == "-1"


def test_user_run_args_win_over_demo_defaults() -> None:
    settings = make(RUN_ARGS="epochs=3 imgsz=96")
    assert settings.run_args.get("epochs") == "3"
    assert settings.run_args.get("imgsz") == "96"
    assert settings.run_args.get("model") == "LibreYOLO9t.pt"


def test_real_run_gets_only_batch_added(tmp_path: Path) -> None:
    (tmp_path / "data.yaml").write_text("names: [a]\n")
    settings = make(DATASET_REPO=str(tmp_path), RUN_ARGS="model=LibreYOLO9s.pt epochs=100")
    assert settings.dataset_kind is DatasetKind.LOCAL_DIR
    assert settings.run_args.argv() == ["model=LibreYOLO9s.pt", "epochs=100", "batch=-1"]


def test_explicit_batch_is_kept() -> None:
    assert make(RUN_ARGS="batch=32").run_args.get("batch") == "32"


def test_hub_dataset_and_output_repo() -> None:
    settings = make(DATASET_REPO="acme/cones", OUTPUT_REPO="acme/cones-yolo", HF_TOKEN=TOKEN)
    assert settings.dataset_kind is DatasetKind.HUB
    assert settings.dataset_repo == "acme/cones"
    assert settings.dataset_revision == "main"
    assert settings.output_repo == "acme/cones-yolo"


@pytest.mark.parametrize(
    ("env", "variable"),
    [
        ({"DATASET_REPO": "not a repo"}, "DATASET_REPO"),
        ({"OUTPUT_REPO": "no-slash"}, "OUTPUT_REPO"),
        ({"GPUS": "gpu0"}, "GPUS"),
        ({"GPUS": "0,0"}, "GPUS"),
        ({"GPUS": "-1"}, "GPUS"),
        ({"MAX_RUNTIME": "6x"}, "MAX_RUNTIME"),
        ({"STALL_TIMEOUT": "soon"}, "STALL_TIMEOUT"),
        ({"ON_EXIT": "explode"}, "ON_EXIT"),
        ({"ON_FAILURE": "maybe"}, "ON_FAILURE"),
        ({"PROVIDER": "aws"}, "PROVIDER"),
        ({"PRICE_PER_HOUR": "cheap"}, "PRICE_PER_HOUR"),
        ({"PRICE_PER_HOUR": "-2"}, "PRICE_PER_HOUR"),
        ({"PRICE_PER_HOUR": "nan"}, "PRICE_PER_HOUR"),
        ({"PRICE_PER_HOUR": "inf"}, "PRICE_PER_HOUR"),
        ({"MAX_COST": "0", "PRICE_PER_HOUR": "1"}, "MAX_COST"),
        ({"MAX_COST": "nan", "PRICE_PER_HOUR": "1"}, "MAX_COST"),
        ({"MONITOR": "yes please"}, "MONITOR"),
        ({"RUN_NAME": "../escape"}, "RUN_NAME"),
        ({"HF_TOKEN": "hf_abc def"}, "HF_TOKEN"),
    ],
)
def test_bad_values_name_the_variable_and_an_example(env: dict[str, str], variable: str) -> None:
    with pytest.raises(ConfigError) as caught:
        make(**env)
    text = str(caught.value)
    assert variable in text
    assert "\n" not in text
    assert caught.value.hint  # names the fix
    assert caught.value.exit_code == 10


def test_destroy_without_a_provider_is_refused_at_start() -> None:
    with pytest.raises(ConfigError, match="no provider"):
        make(ON_EXIT="destroy", OUTPUT_REPO="acme/out")
    with pytest.raises(ConfigError, match="no provider"):
        make(ON_FAILURE="stop")


def test_destroy_without_an_output_repo_would_lose_the_weights() -> None:
    with pytest.raises(ConfigError, match="OUTPUT_REPO") as caught:
        from_env({"WORKDIR": "/w", "RUNPOD_POD_ID": "p", "RUNPOD_API_KEY": "rpa_secretkey_0123456789",
                  "ON_FAILURE": "destroy"})  # fmt: skip
    assert "ON_EXIT=stop" in caught.value.hint


def test_a_launchers_nodes_only_exit() -> None:
    skypilot_on_runpod = {
        "WORKDIR": "/w",
        "OUTPUT_REPO": "acme/out",
        "RUNPOD_POD_ID": "p",
        "RUNPOD_API_KEY": "rpa_secretkey_0123456789",
        "SKYPILOT_NUM_NODES": "2",
        "SKYPILOT_NODE_RANK": "0",
        "SKYPILOT_NODE_IPS": "10.0.0.1 10.0.0.2",
    }
    with pytest.raises(ConfigError, match="skypilot nodes: the launcher owns") as caught:
        from_env(skypilot_on_runpod | {"ON_EXIT": "destroy"})
    assert "ON_EXIT=exit" in caught.value.hint
    assert from_env(skypilot_on_runpod).on_exit is ExitAction.EXIT
    # nodes started by hand on marketplace hosts release their own machines as asked
    by_hand = {key: value for key, value in skypilot_on_runpod.items() if not key.startswith("SKYPILOT")}
    by_hand |= {"NNODES": "2", "NODE_RANK": "1", "MASTER_ADDR": "10.0.0.1", "ON_EXIT": "destroy"}
    assert from_env(by_hand).on_exit is ExitAction.DESTROY


def test_provider_detected_from_its_env() -> None:
    settings = from_env(
        {
            "WORKDIR": "/w",
            "RUNPOD_POD_ID": "pod123",
            "RUNPOD_API_KEY": "rpa_secretkey_0123456789",
            "ON_EXIT": "destroy",
            "OUTPUT_REPO": "acme/out",
        }
    )
    assert settings.provider.provider is Provider.RUNPOD
    assert settings.provider.instance_id == "pod123"
    assert "rpa_secretkey" not in repr(settings)
    assert "RUNPOD_API_KEY" not in settings.env  # provider keys never reach child processes


def test_empty_values_count_as_unset() -> None:
    settings = make(DATASET_REPO="", OUTPUT_REPO="", MAX_RUNTIME="")
    assert settings.dataset_kind is DatasetKind.DEMO and settings.output_repo is None
    assert settings.max_runtime is None


def test_token_never_in_repr_or_str() -> None:
    settings = make(HF_TOKEN=TOKEN)
    assert settings.hf_token is not None and settings.hf_token.reveal() == TOKEN
    for text in (repr(settings), str(settings), repr(settings.hf_token), f"{settings.hf_token}"):
        assert TOKEN not in text


def test_run_name_is_stable_and_tracks_the_job_but_not_its_length() -> None:
    first = make(DATASET_REPO="acme/cones", OUTPUT_REPO="acme/out", RUN_ARGS="epochs=10 imgsz=640")
    again = make(DATASET_REPO="acme/cones", OUTPUT_REPO="acme/out", RUN_ARGS="imgsz=640 epochs=10")
    longer = make(DATASET_REPO="acme/cones", OUTPUT_REPO="acme/out", RUN_ARGS="epochs=20 imgsz=640")
    other = make(DATASET_REPO="acme/cones", OUTPUT_REPO="acme/out", RUN_ARGS="epochs=10 imgsz=320")
    assert first.run_name == again.run_name == longer.run_name  # more epochs: the same run, extended
    assert first.run_name != other.run_name
    assert first.run_name != make(DATASET_REPO="acme/cones", OUTPUT_REPO="acme/other", RUN_ARGS="epochs=10").run_name
    assert first.run_name.startswith("cones-")
    assert make(RUN_NAME="exp1").run_name == "exp1"
    # a job without epochs keeps the name every earlier version derived for it
    assert make(DATASET_REPO="acme/cones", RUN_ARGS="imgsz=640").run_name == "cones-56929b30"
    assert first.identity() == {
        "DATASET_REPO": "acme/cones",
        "DATASET_FILE": None,
        "DATA_YAML": None,
        "OUTPUT_REPO": "acme/out",
        "RUN_ARGS": "imgsz=640",
    }


def test_a_volume_holding_the_run_under_its_older_name_keeps_it(tmp_path: Path) -> None:
    env = {"WORKDIR": str(tmp_path), "DATASET_REPO": "acme/cones", "RUN_ARGS": "epochs=3 imgsz=640"}
    derived = make(**env).run_name
    # the name Trainbox 0.1.0 derived: epochs hashed with the rest
    identity = {"dataset": "acme/cones", "file": None, "data_yaml": None, "output": None}
    text = json.dumps(identity | {"args": sorted([("epochs", "3"), ("imgsz", "640")])}, sort_keys=True)
    old = f"cones-{hashlib.sha256(text.encode()).hexdigest()[:8]}"
    assert old != derived
    (tmp_path / "runs" / old).mkdir(parents=True)
    (tmp_path / "runs" / old / "trainbox.json").write_text("{}")
    assert make(**env).run_name == old  # the run on this volume goes on under its own name
    (tmp_path / "runs" / derived).mkdir()
    assert make(**env).run_name == derived  # once the new name has a run, it is that one


@pytest.mark.parametrize(
    ("text", "seconds"), [("90m", 5400), ("6h", 21600), ("1h30m", 5400), ("45s", 45), ("3600", 3600), ("2d", 172800)]
)
def test_durations(text: str, seconds: float) -> None:
    assert parse_duration(text, "MAX_RUNTIME") == seconds


def test_the_lease_period_is_at_most_a_day_and_off_is_the_default() -> None:
    assert make(LEASE_PERIOD="24h").lease_period == 86400.0
    assert make(LEASE_PERIOD="off").lease_period == make().lease_period == 120.0


def test_stall_guard_can_be_switched_off() -> None:
    assert make(STALL_TIMEOUT="off").stall_timeout is None


def test_gpu_lists() -> None:
    assert parse_gpus("0,1, 3").indices == (0, 1, 3)
    assert parse_gpus("CPU").cpu


def test_checkpoint_bucket_is_derived_from_the_output_repo_and_can_be_off() -> None:
    settings = make(OUTPUT_REPO="acme/yolo")
    assert settings.checkpoint_bucket == "acme/yolo-checkpoints" and settings.publish_every == 600
    assert not settings.squash_history
    assert make().checkpoint_bucket is None  # no OUTPUT_REPO: no Hub at all
    assert make(OUTPUT_REPO="acme/yolo", CHECKPOINT_BUCKET="acme/ckpts").checkpoint_bucket == "acme/ckpts"
    off = make(OUTPUT_REPO="acme/yolo", CHECKPOINT_BUCKET="off", SQUASH_HISTORY="1")
    assert off.checkpoint_bucket is None and off.squash_history
    assert make(OUTPUT_REPO="acme/yolo", PUBLISH_EVERY="30m").publish_every == 1800


@pytest.mark.parametrize(
    ("env", "words"),
    [
        ({"OUTPUT_REPO": "acme/yolo", "CHECKPOINT_BUCKET": "not a bucket"}, "CHECKPOINT_BUCKET='not a bucket'"),
        ({"CHECKPOINT_BUCKET": "acme/ckpts"}, "CHECKPOINT_BUCKET without OUTPUT_REPO"),
        ({"OUTPUT_REPO": "acme/yolo", "SQUASH_HISTORY": "1"}, "set CHECKPOINT_BUCKET=off with SQUASH_HISTORY=1"),
        ({"OUTPUT_REPO": "acme/yolo", "PUBLISH_EVERY": "soon"}, "PUBLISH_EVERY='soon'"),
        ({"LEASE_PERIOD": "25h"}, "LEASE_PERIOD=25h is longer than a day"),
        ({"LEASE_PERIOD": "inf"}, "LEASE_PERIOD='inf' is not a duration"),
        ({"MAX_RUNTIME": "nan"}, "MAX_RUNTIME='nan' is not a duration"),
    ],
)
def test_bad_bucket_settings_name_the_fix(env: dict[str, str], words: str) -> None:
    with pytest.raises(ConfigError) as refused:
        make(**env)
    assert words in str(refused.value) and refused.value.exit_code == 10


# Settings fields that are not one variable's value, and where they come from.
NOT_ONE_ROW = {
    "env": "the whole environment, secrets removed, for the child processes",
    "hub_url": "HF_ENDPOINT, which huggingface_hub reads itself (its row has no parser)",
    "dataset_kind": "DATASET_REPO's row gives the kind with the repo",
    "run_args": "RUN_ARGS's row, with the demo defaults and batch=-1",
    "provider": "PROVIDER, CONTAINER_ID, CONTAINER_API_KEY, RUNPOD_POD_ID, RUNPOD_API_KEY and the two API URLs",
    "topology": "the nodes' rows (read by topology.py), DDP_TIMEOUT and RENDEZVOUS_TIMEOUT",
}
ROW_OF_FIELD = {
    "card_license": "LICENSE",
    "user_run_args": "RUN_ARGS",
    "libreyolo_command": "TRAINBOX_LIBREYOLO",
    "cache_dir": "TRAINBOX_CACHE_DIR",
    "gpu_probe": "TRAINBOX_GPU_PROBE",
    "raw_check": "TRAINBOX_RAW_CHECK",
    "proc_self": "TRAINBOX_PROC_SELF",
    "workdir_given": "WORKDIR",
    "dataset_revision_given": "DATASET_REVISION",
    "evaluate": "EVAL",
}  # else the field's name in capitals
# Rows with a parser that feed a grouped field above, or only the redaction list.
GROUPED = {"PROVIDER", "CONTAINER_ID", "CONTAINER_API_KEY", "RUNPOD_POD_ID", "RUNPOD_API_KEY"}
GROUPED |= {"VAST_API_URL", "RUNPOD_API_URL", "DDP_TIMEOUT", "RENDEZVOUS_TIMEOUT", "VAST_API_KEY"}


def test_every_settings_field_from_the_environment_has_exactly_one_row() -> None:
    names = [row.name for row in variables()]
    assert len(names) == len(set(names)), "a variable has two rows"
    assert all(getattr(Vars, row.name) is row for row in variables())
    fed: set[str] = set()
    for spec in dataclasses.fields(Settings):
        if spec.name in NOT_ONE_ROW:
            continue
        name = ROW_OF_FIELD.get(spec.name, spec.name.upper())
        assert names.count(name) == 1, f"Settings.{spec.name} has no row {name}"
        assert getattr(Vars, name).parse is not None, f"{name} feeds Settings.{spec.name} without a parser"
        fed.add(name)
    parsed = {row.name for row in variables() if row.parse is not None}
    assert parsed - fed == GROUPED, "a row with a parser feeds no field"


def test_each_rows_default_text_reads_as_its_unset_value() -> None:
    shown = [row for row in variables() if row.parse is not None and row.default not in (None, '""')]
    assert {row.name for row in shown} >= {"STALL_TIMEOUT", "PUBLISH_EVERY", "GPUS", "WORKDIR", "OOM_RETRIES"}
    for row in shown:
        assert row.read({row.name: row.default}) == row.unset, row.name
    assert Vars.RUN_ARGS.read({"RUN_ARGS": ""}) == Vars.RUN_ARGS.unset


def test_reading_a_variable_without_a_row_is_a_bug() -> None:
    env = Declared({"OUTPUT_REPO": "acme/yolo", "PATH": "/bin", "EMPTY": ""}, frozenset({"OUTPUT_REPO"}))
    assert env.get("OUTPUT_REPO") == "acme/yolo" and "OUTPUT_REPO" in env
    assert env.given() == {"OUTPUT_REPO": "acme/yolo", "PATH": "/bin"}
    with pytest.raises(AssertionError, match="PATH is read from the environment but has no row"):
        env.get("PATH")
    with pytest.raises(AssertionError):
        _ = "SOMETHING_NEW" in env


@pytest.mark.parametrize(
    "nodes",
    [
        {"SKYPILOT_NUM_NODES": "2", "SKYPILOT_NODE_RANK": "1", "SKYPILOT_NODE_IPS": "10.0.0.1 10.0.0.2"},
        {"NNODES": "2", "JOB_COMPLETION_INDEX": "1", "HEADLESS_SERVICE": "svc", "HOSTNAME": "job-1"},
        {"PET_NNODES": "2", "PET_NODE_RANK": "1", "MASTER_ADDR": "m", "MASTER_PORT": "29400"},
        {"WORLD_SIZE": "2", "RANK": "1", "MASTER_ADDR": "m", "SKYPILOT_NUM_GPUS_PER_NODE": "1"},
        {"NNODES": "2", "NODE_RANK": "0", "MASTER_ADDR": "m", "DDP_TIMEOUT": "5m", "RENDEZVOUS_TIMEOUT": "off"},
    ],
)
def test_every_launchers_variables_have_rows(nodes: dict[str, str]) -> None:
    found = make(OUTPUT_REPO="acme/yolo", **nodes)  # topology.py reads them through the same checked view
    assert found.topology.multi and found.topology.nnodes == 2
    assert set(nodes) <= {row.name for row in variables()}
