"""`--help` lists every variable settings.py reads; `run --dry-run` spends nothing and shows no secret."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from click.testing import CliRunner

from entrypoint import variables
from entrypoint.cli import cli

CONFIGURATION = Path(__file__).resolve().parents[2] / "docs" / "configuration.md"
SECRET = "hf_dryRunSecretValue0123456789"


def test_the_scan_finds_every_variable_with_its_default() -> None:
    found = {var.name: var.default for var in variables.user_variables()}
    # every variable of docs/configuration.md's table is read by settings.py, and found in its table (variables.py)
    table = CONFIGURATION.read_text().split("\n## ", 1)[0]
    names = set(re.findall(r"^\| `([A-Z_0-9]+)` \|", table, re.MULTILINE))
    assert names and names == set(found)
    assert found["WORKDIR"] == "/workspace" and found["STALL_TIMEOUT"] == "30m" and found["ON_EXIT"] == "exit"
    assert found["DATASET_REVISION"] == "main" and found["GPUS"] == "all" and found["PROVIDER"] == "auto"
    assert found["HF_TOKEN"] is None and found["MONITOR"] == "0"
    assert "RUNPOD_API_KEY" in found and "VAST_API_KEY" in found
    # what a provider, a launcher or the tests set is read, but not listed for a person
    internal = {var.name for var in variables.internal_variables()}
    assert {"CONTAINER_ID", "CONTAINER_API_KEY", "RUNPOD_POD_ID", "TRAINBOX_PROC_SELF", "PET_NNODES"} <= internal
    assert not internal & set(found) and internal | set(found) == {var.name for var in variables.variables()}


@pytest.mark.parametrize("args", [["--help"], ["run", "--help"]])
def test_help_lists_every_variable(args: list[str]) -> None:
    shown = CliRunner().invoke(cli, args)
    assert shown.exit_code == 0, shown.output
    for var in variables.user_variables():
        assert re.search(rf"^  {var.name}\b", shown.output, re.MULTILINE), var.name
    for var in variables.internal_variables():
        assert not re.search(rf"^  {var.name}\b", shown.output, re.MULTILINE), var.name
    assert "  STALL_TIMEOUT [30m]: " in shown.output and "  WORKDIR [/workspace]: " in shown.output
    # durations as a person writes them, the same in --help, --dry-run and the docs
    assert "  DDP_TIMEOUT [10m]: " in shown.output and "  RENDEZVOUS_TIMEOUT [15m]: " in shown.output
    if args[0] == "run":
        assert "--dry-run" in shown.output


def test_help_prints_each_row_once_with_its_default_and_meaning() -> None:
    shown = CliRunner().invoke(cli, ["--help"]).output
    epilog = shown.split("Environment variables", 1)[1]
    rows = variables.user_variables()
    assert len(re.findall(r"^  [A-Z][A-Z0-9_]+\b", epilog, re.MULTILINE)) == len(rows)
    for var in rows:
        default = f" [{var.default}]" if var.default is not None else ""
        assert epilog.count(f"\n  {var.name}{default}: {var.meaning}\n") == 1, var.name


def test_dry_run_lists_each_row_once(tmp_path: Path) -> None:
    env = {"WORKDIR": str(tmp_path), "PROVIDER": "none", "GPUS": "cpu", "MAX_COST": "", "HF_ENDPOINT": "http://hub"}
    out = CliRunner().invoke(cli, ["run", "--dry-run"], env=env).output
    listed = out.split("\nsettings\n", 1)[1].split("\n\n", 1)[0].splitlines()
    assert [line.split()[0] for line in listed] == [var.name for var in variables.user_variables()]
    assert re.search(r"^  MAX_COST\s+unset$", out, re.MULTILINE)
    assert re.search(r"^  HF_ENDPOINT\s+http://hub$", out, re.MULTILINE)


def test_dry_run_spends_nothing_and_shows_no_secret(tmp_path: Path) -> None:
    workdir = tmp_path / "work"
    env = {
        "WORKDIR": str(workdir),
        "HF_TOKEN": SECRET,
        "OUTPUT_REPO": "acme/yolo",
        "DATASET_REPO": "acme/cones",
        "DATASET_REVISION": "v2",
        "RUN_ARGS": "model=LibreYOLO9s.pt epochs=100 imgsz=640",
        "GPUS": "0,1",
        "PROVIDER": "none",
        "RUN_NAME": "cones-exp1",
        "HF_HUB_OFFLINE": "1",  # any Hub call would fail loudly
        "CHECKPOINT_BUCKET": "",  # unset: the default, a bucket (the test session sets it off)
    }
    result = CliRunner().invoke(cli, ["run", "--dry-run"], env=env)
    assert result.exit_code == 0, result.output
    out = result.output
    assert SECRET not in out
    assert re.search(r"^  HF_TOKEN\s+set$", out, re.MULTILINE)
    assert re.search(r"^  RUNPOD_API_KEY\s+unset$", out, re.MULTILINE)
    assert re.search(r"^  STALL_TIMEOUT\s+30m \(default\)$", out, re.MULTILINE)
    assert "run name   cones-exp1" in out
    assert "dataset    acme/cones @ v2 (pinned to a commit at start)" in out
    # by default every epoch goes to the bucket and the repo gets milestones: the dry run says so, as --help does
    assert (
        "output     acme/yolo (created private if missing): the weights, metrics and card at most every"
        " PUBLISH_EVERY; every epoch's working state to the bucket acme/yolo-checkpoints"
    ) in out
    assert "every epoch is uploaded" not in out
    assert "resume     no checkpoint of cones-exp1 on this disk; acme/yolo's newest checkpoint is compared" in out
    command = next(line for line in out.splitlines() if line.startswith("command"))
    assert " train model=LibreYOLO9s.pt epochs=100 imgsz=640 batch=-1 " in command
    assert f"project={workdir / 'runs'} name=cones-exp1 exist_ok=true device=0,1" in command
    assert "release    on success: exit" in out
    assert not workdir.exists(), "a dry run creates nothing"


def test_dry_run_leaves_resume_to_a_user_who_sets_it(tmp_path: Path) -> None:
    env = {"WORKDIR": str(tmp_path), "PROVIDER": "none", "GPUS": "cpu", "RUN_ARGS": "resume=true epochs=3"}
    result = CliRunner().invoke(cli, ["run", "--dry-run"], env=env)
    assert result.exit_code == 0, result.output
    assert "resume     RUN_ARGS sets resume" in result.output and "device=cpu" in result.output


def test_status_watch_draws_the_epoch_line_and_the_receipt(tmp_path: Path) -> None:
    import json
    import time

    run_dir = tmp_path / "runs" / "exp"
    run_dir.mkdir(parents=True)
    now = time.time()
    state = {
        "run_name": "exp",
        "phase": "done",
        "phases": {"training": {"seconds": 50.0}},
        "timeline": {
            "agent_started_at": now - 60,
            "price_per_hour": 3.6,
            "marks": {"training": now - 55, "done": now - 5, "released": now - 1},
        },
        "settings": {"output_repo": "acme/yolo"},
    }
    (run_dir / "trainbox.json").write_text(json.dumps(state))
    rows = [{"epoch": n, "time": 25.0, "train/loss": 1.0, "metrics/mAP50": 0.1 * n} for n in (1, 2)]
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    (run_dir / "status.json").write_text(json.dumps({"total_epochs": 2}))
    sidecar = tmp_path / ".trainbox" / "exp" / "progress.json"
    sidecar.parent.mkdir(parents=True)
    sidecar.write_text(json.dumps({"last_commit_at": now - 2, "hub": "acme/yolo"}))
    result = CliRunner().invoke(cli, ["status", str(run_dir), "--watch", "--interval", "0.01"])
    assert result.exit_code == 0, result.output
    assert "epoch 2/2 · 25 s/epoch · mAP50 0.20 (best 0.20 @ 2) · $0.06 so far · on the Hub" in result.output
    assert "receipt: setup 5 s $0.01 · GPU check 0 s $0.00 · dataset 0 s $0.00 · training 50 s $0.05" in result.output
    assert "billed 59 s $0.06 · billing efficiency 85%" in result.output


def test_dry_run_names_this_nodes_place(tmp_path: Path) -> None:
    env = {
        "WORKDIR": str(tmp_path),
        "PROVIDER": "none",
        "GPUS": "cpu",
        "OUTPUT_REPO": "acme/yolo",
        "HF_HUB_OFFLINE": "1",
        "SKYPILOT_NUM_NODES": "2",
        "SKYPILOT_NODE_RANK": "1",
        "SKYPILOT_NODE_IPS": "10.1.0.7\n10.1.0.9",
    }
    result = CliRunner().invoke(cli, ["run", "--dry-run"], env=env)
    assert result.exit_code == 0, result.output
    assert (
        "nodes      node 1 of 2 (skypilot, reads OUTPUT_REPO only); meets the others at 10.1.0.7:29501, "
        "then torchrun at 10.1.0.7:29500"
    ) in result.output
