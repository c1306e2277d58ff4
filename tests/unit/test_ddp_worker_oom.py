"""The torchrun worker tells every node when libreyolo's training runs out of GPU memory (ddp_worker)."""

from __future__ import annotations

import json
import socket
from datetime import timedelta

import pytest

from entrypoint.training import ddp_worker

pytestmark = pytest.mark.slow  # imports torch and libreyolo


def test_libreyolos_out_of_memory_is_told_in_the_trainings_store(monkeypatch: pytest.MonkeyPatch) -> None:
    import torch
    from libreyolo.cli.commands import train as train_command  # type: ignore[import-untyped]
    from torch.distributed import TCPStore  # type: ignore[attr-defined]

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    server = TCPStore("127.0.0.1", port, is_master=True, timeout=timedelta(seconds=10))  # as node 0's torchrun
    for name, value in {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "GROUP_RANK": "1", "RANK": "3"}.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setattr(train_command, "model_call_error_code", train_command.model_call_error_code)

    ddp_worker._report_libreyolo_out_of_memory()
    assert train_command.model_call_error_code(ValueError("imgsz must be a multiple of 32")) == "config_type_error"
    assert not server.check([ddp_worker.OUT_OF_MEMORY_KEY])
    oom = torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
    assert train_command.model_call_error_code(oom) == "cuda_oom"  # libreyolo's own verdict is unchanged

    told = json.loads(server.get(ddp_worker.OUT_OF_MEMORY_KEY))
    assert (told["node"], told["rank"]) == (1, 3) and "CUDA out of memory" in told["detail"]
