"""The host check in a real ``trainbox run``: the host's figures measured for real, the GPU's from a
stand-in probe child (``TRAINBOX_GPU_PROBE``, speaking the probe's protocol), the provider a local fake."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from entrypoint import errors
from entrypoint.gpu import probe as gpu_probe
from tests.fakes import libreyolo as fake_libreyolo
from tests.fakes.providers import FakeVast
from tests.hubfixtures import HubContext

pytestmark = pytest.mark.slow  # `trainbox run` with the stand-in libreyolo
VAST_KEY = "vast-canary-key-host-0c1d"


@pytest.fixture
def vast() -> Iterator[FakeVast]:
    with FakeVast("4242", VAST_KEY) as server:
        yield server


def stand_in_probe(tmp_path: Path, bf16: float, gpus: int = 1, **extra: Any) -> Path:
    """A probe child reporting ``gpus`` working H100s (the GPU check's passing report of its unit tests) whose
    matmul reaches ``bf16`` TFLOP/s (``extra``: more)."""
    from tests.unit.test_preflight import passing_report

    report = passing_report(gpus)
    for gpu in report["gpus"]:
        gpu["bench"] = {"bf16_tflops": bf16, "fp16_tflops": bf16, "copy_gbps": 24.8}
    link = {"gen": 5, "gen_max": 5, "width": 16, "width_max": 16, "throttle": []}
    report["links"] = {str(index): link for index in range(gpus)}
    report.update(extra)
    script = tmp_path / "probe_stand_in.py"
    script.write_text(
        textwrap.dedent(
            f"""
            import json, sys
            report = json.loads({json.dumps(json.dumps(report))})
            if "--bench" not in sys.argv:
                for gpu in report["gpus"]:
                    gpu.pop("bench", None)
                report.pop("links")
            print({gpu_probe.PREFIX!r} + json.dumps({{"report": report}}), flush=True)
            """
        )
    )
    return script


def run(tmp_path: Path, hub_ctx: HubContext, repo: str, **extra: str) -> subprocess.CompletedProcess[str]:
    fake_libreyolo.install(tmp_path / "bin")
    env = hub_ctx.env() | {
        "WORKDIR": str(tmp_path / "work"),
        "OUTPUT_REPO": repo,
        "PROVIDER": "none",
        "TRAINBOX_LIBREYOLO": str(tmp_path / "bin" / "libreyolo"),
        "RUN_ARGS": "epochs=2",
        "HOST_CHECK": "warn",  # the default, which the other tests turn off (tests/conftest.py)
        **extra,
    }
    return subprocess.run(
        [sys.executable, "-m", "entrypoint", "run"], env=env, capture_output=True, text=True, timeout=120
    )


def state(tmp_path: Path) -> dict[str, Any]:
    (path,) = (tmp_path / "work" / "runs").glob("*/trainbox.json")
    return json.loads(path.read_text())


def test_strict_on_a_too_slow_disk_ends_before_the_dataset_and_destroys(
    tmp_path: Path, hub_ctx: HubContext, vast: FakeVast
) -> None:
    # The disk is measured for real; the floor is set above what any disk writes.
    env = {**vast.env(), "PROVIDER": "vast", "GPUS": "cpu", "HOST_CHECK": "strict", "HOST_MIN_DISK_MBPS": "1e9"}
    result = run(tmp_path, hub_ctx, hub_ctx.repo_id("host"), ON_FAILURE="destroy", **env)

    assert result.returncode == errors.HostShortfallError.exit_code == 56, result.stderr[-3000:]
    assert "HOST_CHECK=strict: this machine falls short: WORKDIR disk writes" in result.stderr
    final = state(tmp_path)
    assert final["exit"]["reason"] == "host_shortfall"
    assert "dataset" not in final["phases"] and not (tmp_path / "work" / "data").exists()  # not a byte fetched
    disk = final["host"]["disk"]
    assert disk["write_mbps"]["measured"] > 0 and disk["write_mbps"]["floor"] == 1e9
    (destroy,) = vast.actions()
    assert (destroy.method, destroy.path) == ("DELETE", "/api/v0/instances/4242/")
    assert VAST_KEY not in result.stderr + json.dumps(final)


def test_warn_reports_every_figure_says_the_shortfalls_and_trains(
    tmp_path: Path, hub_ctx: HubContext, vast: FakeVast
) -> None:
    vast.gpu_name = "RTX 4090"  # rented a 4090, got (a slow) H100
    repo = hub_ctx.repo_id("host")
    probe = stand_in_probe(tmp_path, bf16=300.0)
    # The disk is measured for real (this machine's is shared, and slow under load): its floor is left out of this
    # test's count, set below any disk; test_strict_on_a_too_slow_disk_ends_before_the_dataset_and_destroys holds it.
    result = run(
        tmp_path, hub_ctx, repo, **vast.env(), PROVIDER="vast", TRAINBOX_GPU_PROBE=str(probe), HOST_MIN_DISK_MBPS="1e-9"
    )

    assert result.returncode == 0, result.stderr[-3000:]
    assert "host shortfall: GPU 0 (NVIDIA H100 80GB HBM3): bf16 matmul 300 TFLOP/s" in result.stderr
    assert "host shortfall: vast:gpu_name says this instance has 'RTX 4090'" in result.stderr
    host = state(tmp_path)["host"]
    assert host["policy"] == "warn"
    (gpu,) = host["gpus"]
    assert gpu["bf16_tflops"] == {"measured": 300.0, "expected": 989.4, "floor": 494.7}
    assert gpu["copy_gbps"] == {"measured": 24.8, "floor": 4.0} and gpu["pcie"]["current"] == "gen5 x16"
    assert host["cpu_cores"]["measured"] >= 1 and host["ram_gib"] > 0 and host["disk"]["read_mbps"]["measured"] > 0
    assert host["provider"] == {
        "gpu_name": "RTX 4090",
        "gpu_count": 1,
        "source": "vast:gpu_name",
        "seen": ["NVIDIA H100 80GB HBM3"],
        "match": False,
    }
    assert len(host["shortfalls"]) == 3  # bf16, fp16, the provider's word
    card = hub_ctx.hub.file_bytes(repo, "README.md").decode()
    assert "Host: GPU 0 NVIDIA H100 80GB HBM3: bf16 300 of 989.4 TFLOP/s" in card
    assert "Host shortfall: vast:gpu_name says this instance has 'RTX 4090'" in card
    # and the receipt says what the money bought
    brief = "GPU 0 bf16 300/989.4 TFLOP/s, disk "
    assert brief in state(tmp_path)["receipt"]["host"] and "3 shortfalls" in state(tmp_path)["receipt"]["host"]
    assert f"host: {brief}" in result.stderr.splitlines()[-1]


def test_the_dataset_download_speed_joins_the_report(tmp_path: Path, hub_ctx: HubContext) -> None:
    from tests.integration.test_dataset_hub import dataset_tar, publish

    dataset = publish(hub_ctx, {"cones.tar": dataset_tar(tmp_path)})
    result = run(tmp_path, hub_ctx, hub_ctx.repo_id("host"), GPUS="cpu", DATASET_REPO=dataset)

    assert result.returncode == 0, result.stderr[-3000:]
    host = state(tmp_path)["host"]
    assert host["dataset_mbps"] > 0
    assert f"host: dataset download {host['dataset_mbps']:.1f} MB/s" in result.stderr
