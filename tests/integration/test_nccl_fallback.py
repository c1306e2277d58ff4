"""A multi-GPU box whose NCCL works only with shared memory off: the real agent trains with the setting
the GPU check found (a stand-in probe reports the check, the stand-in libreyolo shows its environment)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.hubfixtures import HubContext
from tests.integration.test_host_check import run, stand_in_probe, state

pytestmark = pytest.mark.slow  # `trainbox run` with the stand-in libreyolo


def test_training_runs_with_the_first_nccl_setting_that_worked(tmp_path: Path, hub_ctx: HubContext) -> None:
    failed = "rank 0 (GPU 0): DistBackendError: NCCL error: unhandled system error"
    all_reduce = {
        "gpus": [0, 1],
        "ok": False,
        "error": failed,
        "fallbacks": [
            {"env": {"NCCL_P2P_DISABLE": "1"}, "ok": False, "error": failed},
            {"env": {"NCCL_SHM_DISABLE": "1"}, "ok": True, "seconds": 0.4, "busbw_gbps": 10.5},
        ],
        "p2p_disabled": {"ok": False, "error": failed},
        "nccl_env": {"NCCL_SHM_DISABLE": "1"},
    }
    probe = stand_in_probe(tmp_path, bf16=700.0, gpus=2, all_reduce=all_reduce)
    repo = hub_ctx.repo_id("nccl")
    result = run(
        tmp_path, hub_ctx, repo, TRAINBOX_GPU_PROBE=str(probe), HOST_CHECK="off",
        FAKE_PRINT_ENV="NCCL_SHM_DISABLE,NCCL_P2P_DISABLE",
    )  # fmt: skip

    assert result.returncode == 0, result.stderr[-3000:]
    assert "NCCL: the all-reduce failed with the defaults and works with NCCL_SHM_DISABLE=1" in result.stderr
    assert "env NCCL_SHM_DISABLE=1" in result.stdout and "env NCCL_P2P_DISABLE=None" in result.stdout
    assert state(tmp_path)["gpus"]["all_reduce"]["nccl_env"] == {"NCCL_SHM_DISABLE": "1"}
    card = hub_ctx.hub.file_bytes(repo, "README.md").decode()
    assert "NCCL: the all-reduce failed with the defaults; trained with NCCL_SHM_DISABLE=1." in card
