"""TRACKIO against a real trackio server (trackio's own, started here on loopback): one trackio run across a kill -9
and a new volume, every epoch once with the metrics the run kept; a server that stops mid-run costs the run
nothing; the write token never in a log, a record or an upload."""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from entrypoint.report import plot
from tests.fakes import libreyolo as fake_libreyolo
from tests.hubfixtures import HubContext
from tests.support import held_after, open_gate, run_trainbox, start_trainbox, trainbox_env

pytestmark = pytest.mark.slow  # every test here runs the agent

SERVE = "import sys, trackio; trackio.show(open_browser=False, block_thread=True, server_port=int(sys.argv[1]))"


class TrackioServer:
    """trackio's dashboard server in a child process, its data in ``root``, its write token a fresh secret."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.token = f"trk_{secrets.token_hex(16)}"
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            self.port = probe.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.process: subprocess.Popen[str] | None = None

    def start(self) -> None:
        env = os.environ | {"TRACKIO_DIR": str(self.root), "TRACKIO_WRITE_TOKEN": self.token}
        self.process = subprocess.Popen(
            [sys.executable, "-c", SERVE, str(self.port)],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        wait_for(self._answers, timeout=120)

    def _answers(self) -> bool:
        assert self.process is not None and self.process.poll() is None, "the trackio server exited"
        try:
            return httpx.get(f"{self.url}/version", timeout=2).is_success
        except httpx.HTTPError:
            return False

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout=30)

    def call(self, name: str, **kwargs: Any) -> Any:
        response = httpx.post(f"{self.url}/api/{name}", json={"kwargs": kwargs}, timeout=10)
        response.raise_for_status()
        return response.json()["data"]

    def runs(self, project: str) -> list[str]:
        return [
            run["name"] if isinstance(run, dict) else run for run in self.call("get_runs_for_project", project=project)
        ]

    def logs(self, project: str, run: str) -> list[dict[str, Any]]:
        return list(self.call("get_logs", project=project, run=run))

    def steps(self, project: str) -> list[int]:
        """Every logged step of the project's one run (0 runs: none)."""
        runs = self.runs(project)
        assert len(runs) <= 1, runs
        return [row["step"] for row in self.logs(project, runs[0])] if runs else []


@pytest.fixture(scope="module")
def trackio_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TrackioServer]:
    server = TrackioServer(tmp_path_factory.mktemp("trackio"))
    server.start()
    yield server
    server.stop()


def wait_for(predicate: Any, timeout: float = 300.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.2)


def stand_in(tmp_path: Path, workdir: Path, **env: str) -> dict[str, str]:
    trainer = fake_libreyolo.install(tmp_path / "bin")
    # EVAL=1: the held-out scores are logged to the dashboard at the end
    base = trainbox_env(workdir, GPUS="cpu", TRAINBOX_LIBREYOLO=str(trainer), FAKE_EPOCH_SECONDS="0.3", EVAL="1")
    return base | env


def kill_trainer(workdir: Path) -> None:
    """The stand-in trainer a kill -9 of the agent left behind: that machine is gone."""
    for pid_file in workdir.rglob("fake-pid"):
        with contextlib.suppress(ProcessLookupError, ValueError):
            os.kill(int(pid_file.read_text()), signal.SIGKILL)


def trainbox_json(workdir: Path) -> str:
    (path,) = (workdir / "runs").glob("*/trainbox.json")
    return path.read_text()


def test_a_run_killed_and_resumed_on_a_new_volume_is_one_trackio_run_with_every_epoch_once(
    hub_ctx: HubContext, tmp_path: Path, trackio_server: TrackioServer
) -> None:
    repo, project = hub_ctx.repo_id("dash"), f"dash-{secrets.token_hex(4)}"
    base = dict(
        HF_TOKEN=hub_ctx.token,
        LEASE_PERIOD="6s",  # the killed agent's lease on the run: taken over after this
        OUTPUT_REPO=repo,
        RUN_ARGS="epochs=5",
        RUN_NAME="cones",
        TRACKIO=trackio_server.url,
        TRACKIO_PROJECT=project,
        TRACKIO_WRITE_TOKEN=trackio_server.token,
        FAKE_MAP="0.1,0.2,0.3,0.4,0.5",
        FAKE_PRINT_ENV="WANDB_RUN_ID,WANDB_RESUME,TRACKIO_WRITE_TOKEN",
    )
    first = tmp_path / "machine1"
    process = start_trainbox("run", env=stand_in(tmp_path, first, **held_after(tmp_path, 2), **base))
    # epochs 1 and 2 on the dashboard once the stores hold them; the trainer waits after epoch 2
    wait_for(lambda: len(trainbox_steps(trackio_server, project)) >= 2 or process.poll() is not None)
    process.kill()  # kill -9: no handler, no final upload, no dashboard flush
    first_output = process.communicate(timeout=30)[0]
    kill_trainer(first)
    assert trainbox_steps(trackio_server, project) == [1, 2], first_output[-3000:]

    second = tmp_path / "machine2"  # a new volume: everything comes from the Hub
    result = run_trainbox("run", env=stand_in(tmp_path, second, **base))
    assert result.returncode == 0, result.output[-3000:]

    (run,) = trackio_server.runs(project)
    assert run.startswith("cones-")  # RUN_NAME, and the run id that makes it unique
    logged = [row for row in trackio_server.logs(project, run) if "train/loss" in row]
    assert [row["step"] for row in logged] == [1, 2, 3, 4, 5]  # every epoch exactly once, across both machines
    (shown,) = [row for row in trackio_server.logs(project, run) if "training/plot" in row]  # at the end, once
    assert shown["step"] == 5 and shown["training/plot"]["_type"] == "trackio.image"
    media = trackio_server.root / "media" / project / run / "5" / "training-5.png"
    assert media.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"  # the card's plot, where the dashboard looks
    scored = json.loads(hub_ctx.hub.file_bytes(repo, "eval.json"))["files"]["weights/best.pt"]
    (evaluated,) = [row for row in trackio_server.logs(project, run) if "eval/weights/best.pt/mAP50-95" in row]
    assert evaluated["step"] == 5 and evaluated["eval/weights/best.pt/mAP50-95"] == pytest.approx(scored["map50_95"])
    kept = {row["epoch"]: row for row in plot.read_rows(_hub_metrics(hub_ctx, repo, tmp_path))}
    for row in logged:  # the metrics of the epochs the run kept
        assert row["metrics/mAP50-95"] == pytest.approx(kept[row["step"]]["metrics/mAP50-95"])
        assert row["train/loss"] == pytest.approx(kept[row["step"]]["train/loss"])
        assert "epoch/seconds" in row
    # libreyolo's wandb logger continues one wandb run too; the write token never reaches the trainer
    run_id = json.loads(trainbox_json(second))["run_id"]
    for output in (first_output, result.output):
        assert f"env WANDB_RUN_ID=trainbox-{run_id}" in output and "env WANDB_RESUME=allow" in output
        assert "env TRACKIO_WRITE_TOKEN=None" in output
    record = json.loads(trainbox_json(second))["dashboard"]
    assert record["run"] == run and record["logged_epoch"] == 5
    assert record["url"] == f"{trackio_server.url}/?project={project}"
    assert f"dashboard: trackio at {trackio_server.url}/?project={project}" in result.stderr
    address = f"{trackio_server.url}/?project={project}"
    assert f"[the trackio dashboard]({address})" in hub_ctx.hub.file_bytes(repo, "README.md").decode()
    laptop = hub_ctx.env(HF_TOKEN=hub_ctx.read_token, WORKDIR=str(tmp_path / "laptop"))
    shown = run_trainbox("status", "--repo", repo, env=laptop)
    assert f"dashboard {address}" in shown.stdout, shown.output[-2000:]
    for text in (first_output, result.output, trainbox_json(first), trainbox_json(second)):
        assert trackio_server.token not in text
    for name in hub_ctx.hub.files(repo):
        assert trackio_server.token.encode() not in hub_ctx.hub.file_bytes(repo, name)


def test_a_dashboard_that_stops_mid_run_costs_the_run_nothing(tmp_path: Path) -> None:
    server = TrackioServer(tmp_path / "trackio")
    server.start()
    project = "stopping"
    env = stand_in(
        tmp_path,
        tmp_path / "work",
        RUN_ARGS="epochs=4",
        TRACKIO=server.url,
        TRACKIO_PROJECT=project,
        TRACKIO_WRITE_TOKEN=server.token,
        **held_after(tmp_path, 1),
    )
    process = start_trainbox("run", env=env)
    try:
        wait_for(lambda: server.steps(project) == [1] or process.poll() is not None)
    finally:
        server.stop()  # the dashboard goes away with epochs 2-4 still to come
    open_gate(tmp_path, 1, 2, 3)
    output = process.communicate(timeout=300)[0]
    assert process.returncode == 0, output[-3000:]
    assert output.count("cannot be reached") == 1, output[-3000:]  # said once, not per epoch
    assert "epoch(s) (2-4) not on" in output and "dropped" in output
    assert server.token not in output + trainbox_json(tmp_path / "work")


def trainbox_steps(server: TrackioServer, project: str) -> list[int]:
    try:
        return server.steps(project)
    except httpx.HTTPError:
        return []


def _hub_metrics(hub_ctx: HubContext, repo: str, tmp_path: Path) -> Path:
    path = tmp_path / "hub-metrics.jsonl"
    path.write_bytes(hub_ctx.hub.file_bytes(repo, "metrics.jsonl"))
    return path
