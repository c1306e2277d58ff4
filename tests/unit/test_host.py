"""The host report: datasheet lookup, the provider's GPU against the card's name, the verdict, real host figures."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from entrypoint.host import datasheet, judge, measure
from entrypoint.release import providers

FLOORS = judge.Floors(gpu_fraction=0.5, copy_gbps=4.0, disk_mbps=100.0)
GOOD_DISK = {"cpu_cores": 32.0, "ram_gib": 250.0, "shm_gib": 64.0, "disk": {"write_mbps": 900.0, "read_mbps": 1500.0}}


@pytest.mark.parametrize(
    ("reported", "card"),
    [
        ("NVIDIA H100 80GB HBM3", "H100 SXM"),
        ("NVIDIA H100 PCIe", "H100 PCIe"),
        ("NVIDIA H200", "H200"),
        ("NVIDIA A100-SXM4-80GB", "A100 80GB"),
        ("NVIDIA A100-PCIE-40GB", "A100 40GB"),
        ("NVIDIA L40S", "L40S"),
        ("NVIDIA L4", "L4"),
        ("NVIDIA A10", "A10"),
        ("NVIDIA RTX 6000 Ada Generation", "RTX 6000 Ada"),
        ("NVIDIA RTX A6000", "RTX A6000"),
        ("NVIDIA GeForce RTX 4090", "RTX 4090"),
        ("NVIDIA GeForce RTX 3090", "RTX 3090"),
        ("NVIDIA L40", None),
        ("NVIDIA A10G", None),
        ("Tesla T4", None),
    ],
)
def test_cards_are_found_by_the_names_cuda_and_nvidia_smi_give(reported: str, card: str | None) -> None:
    found = datasheet.lookup(reported)
    assert (found.name if found else None) == card


def test_every_datasheet_figure_is_dense_and_cites_its_source() -> None:
    for card in datasheet.CARDS:
        assert "with sparsity" in card.source  # the sparse figure printed beside it is twice the dense one
        assert card.bf16_tflops > 0 and card.fp16_tflops > 0 and card.pcie_width == 16


@pytest.mark.parametrize(
    ("said", "seen", "same"),
    [
        ("H100 SXM", "NVIDIA H100 80GB HBM3", True),  # Vast's gpu_name
        ("A100 SXM4", "NVIDIA A100-SXM4-80GB", True),
        ("NVIDIA GeForce RTX 4090", "NVIDIA GeForce RTX 4090", True),  # RunPod's gpu.id
        ("RTX A5000", "NVIDIA RTX A5000", True),  # not in the table: the provider's words
        ("RTX 4090", "NVIDIA GeForce RTX 3090", False),
        ("H100 SXM", "NVIDIA A100-SXM4-80GB", False),
        ("RTX A5000", "NVIDIA RTX A4000", False),
    ],
)
def test_the_provider_s_gpu_is_compared_with_the_card_s_own_name(said: str, seen: str, same: bool) -> None:
    assert judge.same_card(said, seen) is same


def gpu_details(bf16: float, copy: float = 25.0, width: int = 16, throttle: list[str] | None = None) -> dict[str, Any]:
    return {
        "gpus": [
            {
                "index": 0,
                "name": "NVIDIA H100 80GB HBM3",
                "total_gib": 79.1,
                "bench": {"bf16_tflops": bf16, "fp16_tflops": bf16, "copy_gbps": copy},
            }
        ],
        "links": {"0": {"gen": 5, "gen_max": 5, "width": width, "width_max": 16, "throttle": throttle or []}},
    }


def test_a_healthy_h100_has_no_shortfall_and_every_figure_its_expected_value() -> None:
    report = judge.judge(gpu_details(700.0), GOOD_DISK, None, FLOORS)
    assert report["shortfalls"] == [] and report["notes"] == []
    (gpu,) = report["gpus"]
    assert gpu["bf16_tflops"] == {"measured": 700.0, "expected": 989.4, "floor": 494.7}
    assert gpu["datasheet"]["card"] == "H100 SXM" and gpu["pcie"]["expected"] == "gen5 x16"
    assert report["disk"]["write_mbps"] == {"measured": 900.0, "floor": 100.0}
    assert any("bf16 700 of 989.4 TFLOP/s" in line for line in judge.lines(report))


def test_each_kind_of_shortfall_is_named() -> None:
    slow_disk = {**GOOD_DISK, "cpu_cores": 2.0, "disk": {"write_mbps": 60.0, "read_mbps": 400.0}}
    rented = {"gpu_name": "RTX 4090", "gpu_count": 1, "source": "vast:gpu_name"}
    report = judge.judge(
        gpu_details(300.0, copy=0.8, width=1, throttle=["hw_thermal_slowdown"]), slow_disk, rented, FLOORS
    )
    text = "\n".join(report["shortfalls"])
    assert "bf16 matmul 300 TFLOP/s, under 50% of the H100 SXM datasheet's 989 (dense)" in text
    assert "host→device copy 0.8 GB/s, under HOST_MIN_COPY_GBPS=4" in text
    assert "PCIe link x1, the card can do x16" in text
    assert "clocks held back (hw_thermal_slowdown)" in text
    assert "WORKDIR disk writes 60 MB/s, under HOST_MIN_DISK_MBPS=100" in text
    assert "vast:gpu_name says this instance has 'RTX 4090', nvidia-smi sees NVIDIA H100 80GB HBM3" in text
    assert report["provider"]["match"] is False
    assert report["notes"] == ["2 CPU cores for 1 GPU(s): the data loaders may keep the cards waiting"]


def test_the_host_figures_are_measured_for_real(tmp_path: Path) -> None:
    found = measure.host(tmp_path)
    assert found["cpu_cores"] >= 1 and found["ram_gib"] > 0
    disk = found["disk"]
    assert disk["write_mbps"] > 0 and disk["read_mbps"] > 0 and disk["path"] == str(tmp_path / ".trainbox")
    assert list((tmp_path / ".trainbox").iterdir()) == []  # the scratch file is gone
    shm = found["shm_gib"]
    assert shm is None or shm > 0


def test_the_providers_say_which_gpu_they_rented() -> None:
    vast = providers.vast_state(
        {"instances": {"actual_status": "running", "gpu_name": "H100 SXM", "num_gpus": 2, "dph_total": 4.1}}
    )
    assert vast.gpu == {"gpu_name": "H100 SXM", "gpu_count": 2, "source": "vast:gpu_name"}
    runpod = providers.runpod_state({"status": "RUNNING", "gpu": {"id": "NVIDIA GeForce RTX 4090", "count": 1}})
    assert runpod.gpu == {"gpu_name": "NVIDIA GeForce RTX 4090", "gpu_count": 1, "source": "runpod:gpu.id"}
    assert providers.runpod_state({"status": "RUNNING"}).gpu is None


@pytest.mark.parametrize(
    ("env", "named"),
    [
        ({"HOST_CHECK": "paranoid"}, "HOST_CHECK"),
        ({"HOST_MIN_GPU_FRACTION": "1.5"}, "HOST_MIN_GPU_FRACTION"),
        ({"HOST_MIN_COPY_GBPS": "fast"}, "HOST_MIN_COPY_GBPS"),
        ({"HOST_MIN_DISK_MBPS": "-1"}, "HOST_MIN_DISK_MBPS"),
        ({"OOM_RETRIES": "two"}, "OOM_RETRIES"),
    ],
)
def test_a_bad_host_check_or_oom_setting_names_the_variable(tmp_path: Path, env: dict[str, str], named: str) -> None:
    from entrypoint import settings
    from entrypoint.errors import ConfigError

    with pytest.raises(ConfigError, match=named):
        settings.from_env({"WORKDIR": str(tmp_path), **env})


def test_the_host_check_defaults(tmp_path: Path) -> None:
    from entrypoint import settings

    found = settings.from_env({"WORKDIR": str(tmp_path)})
    assert found.host_check is settings.HostCheck.WARN and found.oom_retries == 2
    assert (found.host_min_gpu_fraction, found.host_min_copy_gbps, found.host_min_disk_mbps) == (0.5, 4.0, 100.0)
