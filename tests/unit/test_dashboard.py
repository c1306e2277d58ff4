"""report/dashboard.py: TRACKIO read and refused, the trackio run named, an epoch logged once the run kept it, a
dashboard that is down said once and back once, the end bounded. A stand-in client: the real server is
tests/integration/test_dashboard.py's."""

from __future__ import annotations

import json
import logging
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from entrypoint import log
from entrypoint.errors import ConfigError
from entrypoint.report import dashboard
from entrypoint.report.dashboard import Client, Dashboard, Refused, Sources, Target, Unreachable
from entrypoint.settings import from_env

WRITE_TOKEN = "trk_unitTestWriteToken0123456789"


def make(**env: str):
    return from_env({"WORKDIR": "/srv/work", "PROVIDER": "none"} | env)


def test_trackio_is_a_space_or_a_server_with_its_token_apart() -> None:
    assert make(TRACKIO="acme/dash").trackio == "acme/dash"
    settings = make(TRACKIO="http://10.0.0.5:7860/", TRACKIO_WRITE_TOKEN=WRITE_TOKEN)
    assert settings.trackio == "http://10.0.0.5:7860"
    assert WRITE_TOKEN in settings.secrets() and WRITE_TOKEN not in repr(settings)
    assert "TRACKIO_WRITE_TOKEN" not in settings.env  # never handed to the trainer
    assert log.redact(f"token {WRITE_TOKEN}") == "token ***"


@pytest.mark.parametrize(
    ("env", "fix"),
    [
        ({"TRACKIO": "http://host:7860"}, "set TRACKIO_WRITE_TOKEN"),
        ({"TRACKIO": f"http://host:7860/?write_token={WRITE_TOKEN}"}, "its token in TRACKIO_WRITE_TOKEN"),
        ({"TRACKIO": "dashboard"}, "use org/name (a Space)"),
    ],
)
def test_a_trackio_that_cannot_work_is_refused_naming_the_fix(env: dict[str, str], fix: str) -> None:
    with pytest.raises(ConfigError) as caught:
        make(**env)
    assert fix in caught.value.hint
    assert WRITE_TOKEN not in str(caught.value)


def test_the_trackio_run_is_the_run_name_and_its_id_in_the_output_repos_project() -> None:
    found = dashboard.target("http://h:1", None, "acme/cones-yolo", "exp1", "0123456789abcdef")
    assert found == Target("http://h:1", "cones-yolo", "exp1-01234567")
    assert found.address() == "http://h:1/?project=cones-yolo"
    space = dashboard.target("acme/My_Dash", "proj", None, "exp1", None)
    assert space is not None and space.api == "https://acme-my-dash.hf.space/"
    assert space.address("https://hub.example") == "https://hub.example/spaces/acme/My_Dash?project=proj"
    assert dashboard.target(None, None, "acme/x", "exp1", "ab") is None


def test_an_epoch_row_becomes_its_metrics_time_and_dollars() -> None:
    row = {"epoch": 3, "time": 36.0, "train/loss": 1.5, "metrics/mAP50": 0.6, "lr/group0": 0.01, "validated": True}
    row |= {"metrics/mAP50-95": float("nan"), "is_best": True}
    assert dashboard.epoch_metrics(row, price_per_hour=2.0) == {
        "train/loss": 1.5,
        "metrics/mAP50": 0.6,
        "lr/group0": 0.01,
        "epoch/seconds": 36.0,
        "epoch/dollars": pytest.approx(0.02),
    }


def test_the_trackers_get_the_run_id_unless_set() -> None:
    assert dashboard.tracker_env({}, "abc") == {"WANDB_RUN_ID": "trainbox-abc", "WANDB_RESUME": "allow"}
    assert dashboard.tracker_env({"WANDB_RUN_ID": "mine"}, "abc") == {"WANDB_RESUME": "allow"}
    assert dashboard.tracker_env({}, None) == {}


class StandIn(Client):
    """Answers as trackio would, or as a dashboard that is down; records what it got."""

    def __init__(self, holds: int | None = None) -> None:
        super().__init__(Target("http://h:1", "p", "run-1"), write_token=WRITE_TOKEN, hf_token=None)
        self.holds = holds
        self.down = False
        self.refuse = False
        self.sent: list[dict[str, Any]] = []
        self.changed = threading.Condition()

    def call(self, name: str, **kwargs: Any) -> Any:
        if self.down:
            raise Unreachable("ConnectError")
        if self.refuse:
            raise Refused("HTTP 401: A write_token is required")
        if name == "get_run_summary":
            return {"last_step": self.holds}
        with self.changed:
            self.sent += kwargs["logs"]
            self.changed.notify_all()
        return None

    def steps(self) -> list[int]:
        return [entry["step"] for entry in self.sent]

    def wait(self, count: int) -> None:
        with self.changed:
            assert self.changed.wait_for(lambda: len(self.sent) >= count, timeout=30), self.sent


def until(predicate: Any) -> None:
    deadline = time.monotonic() + 30
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def rows(path: Path, *epochs: tuple[int, float]) -> None:
    with path.open("a") as f:
        for epoch, loss in epochs:
            f.write(json.dumps({"epoch": epoch, "time": 1.0, "train/loss": loss}) + "\n")


def start(tmp_path: Path, client: StandIn, kept: list[int | None]) -> tuple[Dashboard, list[dict[str, Any]]]:
    records: list[dict[str, Any]] = []
    sources = Sources(
        metrics=tmp_path / "metrics.jsonl",
        kept=lambda: kept[0],
        price=lambda: 3.6,
        config=lambda: {"model": "LibreYOLO9s.pt"},
        record=records.append,
    )
    board = Dashboard(client, sources, "http://h:1/?project=p", poll=0.01)
    board.start()
    return board, records


def test_only_kept_epochs_go_and_a_retrained_epoch_goes_with_its_kept_metrics(tmp_path: Path) -> None:
    client, kept = StandIn(), [1]
    rows(tmp_path / "metrics.jsonl", (1, 0.9), (2, 0.8))  # epoch 2 is on the volume, not yet in a store
    board, records = start(tmp_path, client, kept)
    client.wait(1)
    rows(tmp_path / "metrics.jsonl", (2, 0.7))  # lost to a kill, trained again: the later row is the run's
    kept[0] = 2
    client.wait(2)
    assert board.finish() == 0
    assert client.steps() == [1, 2]
    assert [entry["metrics"]["train/loss"] for entry in client.sent] == [0.9, 0.7]
    assert client.sent[0]["config"] == {"model": "LibreYOLO9s.pt"} and "config" not in client.sent[1]
    assert [entry["log_id"] for entry in client.sent] == ["run-1/epoch-1", "run-1/epoch-2"]
    assert client.sent[0]["metrics"]["epoch/dollars"] == pytest.approx(0.001)
    assert records[-1] == {"logged_epoch": 2}


def test_what_the_dashboard_holds_is_not_sent_again(tmp_path: Path) -> None:
    client = StandIn(holds=2)  # an earlier attempt, on another volume, logged epochs 1 and 2
    rows(tmp_path / "metrics.jsonl", (1, 0.9), (2, 0.8), (3, 0.7))
    board, _ = start(tmp_path, client, [None])
    client.wait(1)
    board.finish()
    assert client.steps() == [3]


def test_a_dashboard_down_is_said_once_and_back_once_and_the_end_drops_what_is_left(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="trainbox")
    client = StandIn()
    client.down = True
    rows(tmp_path / "metrics.jsonl", (1, 0.9))
    board, _ = start(tmp_path, client, [None])
    for epoch in (2, 3):
        rows(tmp_path / "metrics.jsonl", (epoch, 0.5))
    until(lambda: "cannot be reached" in caplog.text)
    client.down = False

    def retried() -> bool:  # the backoff's wait, skipped: what matters is the answer after it
        board._retry_at = 0.0
        board._wake.set()
        return len(client.sent) >= 3

    until(retried)
    assert client.steps() == [1, 2, 3]
    client.down = True
    rows(tmp_path / "metrics.jsonl", (4, 0.4), (5, 0.3))
    assert board.finish(timeout=0.5) in (1, 2)  # 4 (and 5, if read in time) are said and dropped
    messages = [record.getMessage() for record in caplog.records]
    assert sum("cannot be reached" in line for line in messages) == 2  # once per outage
    assert sum("answers again" in line for line in messages) == 1
    assert any("not on http://h:1/?project=p at the end: dropped" in line for line in messages)
    assert all(WRITE_TOKEN not in line for line in messages)


def test_a_refusal_stops_the_sending_in_one_line(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="trainbox")
    client = StandIn()
    client.refuse = True
    rows(tmp_path / "metrics.jsonl", (1, 0.9))
    board, _ = start(tmp_path, client, [None])
    board._done.wait(30)
    assert "refused the epochs (HTTP 401" in caplog.text
    assert board.finish() == 1


def test_gpu_utilisation_and_memory_come_from_nvidia_smi_at_most_every_interval(tmp_path: Path) -> None:
    smi, calls = tmp_path / "nvidia-smi", tmp_path / "calls"
    smi.write_text(f'#!/bin/sh\necho x >> {calls}\necho "90, 20480"\necho "70, 10240"\n')
    smi.chmod(0o755)
    sampler = dashboard.GpuSampler(str(smi), every=3600)
    assert sampler.sample() == {"gpu/utilization_percent": 80.0, "gpu/memory_used_gb": 30.0}
    assert sampler.sample() == {"gpu/utilization_percent": 80.0, "gpu/memory_used_gb": 30.0}  # the last, kept
    assert calls.read_text().count("x") == 1
    assert dashboard.GpuSampler(None).sample() == {}  # GPUS=cpu, or no nvidia-smi: nothing asked
    broken = tmp_path / "broken"
    broken.write_text("#!/bin/sh\necho 'NVIDIA-SMI has failed'\nexit 9\n")
    broken.chmod(0o755)
    assert dashboard.GpuSampler(str(broken)).sample() == {}


def test_a_space_still_being_created_at_the_end_is_said(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="trainbox")
    creating = threading.Event()
    rows(tmp_path / "metrics.jsonl", (1, 0.9))
    sources = Sources(
        metrics=tmp_path / "metrics.jsonl",
        kept=lambda: None,
        price=lambda: None,
        config=dict,
        record=lambda _: None,
        prepare=lambda: creating.wait(30) and None,
    )
    board = Dashboard(StandIn(), sources, "https://hub/spaces/acme/dash", poll=0.01)
    board.start()
    board.finish(timeout=0.05)
    creating.set()
    assert "https://hub/spaces/acme/dash was still being prepared at the end: no epoch was sent" in caplog.text


def test_the_end_logs_the_evaluation_once_at_the_last_epoch(tmp_path: Path) -> None:
    evaluation = tmp_path / "eval.json"
    per_class = {"cone": {"ap50_95": 0.25, "ap50": 0.5, "instances": 3}, "ball": {"ap50_95": 0.75, "ap50": 0.9}}
    best = {"map50_95": 0.5, "map50": 0.7, "precision": 0.6, "recall": 0.4, "ms_per_image": 2.5, "per_class": per_class}
    onnx = {"map50_95": 0.498, "map50": float("nan"), "device": "cpu"}  # a value that is no number is left out
    files = {"weights/best.pt": best, "weights/best.onnx": onnx}
    evaluation.write_text(json.dumps({"split": "test", "files": files}))
    client = StandIn()
    rows(tmp_path / "metrics.jsonl", (1, 0.9), (2, 0.8))
    sources = Sources(
        metrics=tmp_path / "metrics.jsonl",
        kept=lambda: None,
        price=lambda: None,
        config=dict,
        record=lambda fields: None,
        evaluation=evaluation,
    )
    board = Dashboard(client, sources, "http://h:1/?project=p", poll=0.01)
    board.start()
    client.wait(2)
    assert board.finish() == 0
    (scored,) = [entry for entry in client.sent if entry.get("log_id") == "run-1/eval-2"]
    assert scored["step"] == 2  # at the last epoch, beside the plot
    assert scored["metrics"] == {
        "eval/weights/best.pt/mAP50-95": 0.5,
        "eval/weights/best.pt/mAP50": 0.7,
        "eval/weights/best.pt/precision": 0.6,
        "eval/weights/best.pt/recall": 0.4,
        "eval/weights/best.pt/ms_per_image": 2.5,
        "eval/weights/best.pt/AP50-95/cone": 0.25,
        "eval/weights/best.pt/AP50-95/ball": 0.75,
        "eval/weights/best.onnx/mAP50-95": 0.498,
    }


def test_no_evaluation_or_an_unreadable_one_logs_nothing_at_the_end(tmp_path: Path) -> None:
    from entrypoint.report import dashboard_eval

    assert dashboard_eval.entry(None, "p", "r", 3) is None
    assert dashboard_eval.entry(tmp_path / "absent.json", "p", "r", 3) is None
    (tmp_path / "torn.json").write_text('{"split": "te')
    assert dashboard_eval.entry(tmp_path / "torn.json", "p", "r", 3) is None


def test_the_dashboards_http_client_comes_with_huggingface_hub() -> None:
    """The image installs the agent's dependencies only: the client the dashboard speaks with must be one of them
    (trackio's own httpx is a test dependency, absent from the image)."""
    import ast
    import importlib.metadata
    import inspect

    source = ast.parse(inspect.getsource(dashboard))
    clients = {alias.name for node in ast.walk(source) if isinstance(node, ast.Import) for alias in node.names} & {
        "httpx",
        "httpx2",
        "requests",
    }
    required = {
        req.split(";")[0].split(">")[0].split("<")[0].split("=")[0].split("[")[0].strip().lower()
        for req in importlib.metadata.requires("huggingface_hub") or []
    }
    assert clients == {"httpx2"} and "httpx2" in required
