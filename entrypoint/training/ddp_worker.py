"""``python -m entrypoint.training.ddp_worker train key=value …``: libreyolo's CLI as one torchrun worker.

Two things the ``libreyolo train`` command cannot be told, set here before its own ``main`` runs:

* the process-group timeout: libreyolo asks torch for 3 hours; a peer that vanished without closing
  its sockets (a lost machine) must end the job after ``TRAINBOX_DDP_TIMEOUT`` seconds instead;
* ``device=cpu`` (CPU machines, tests): SyncBatchNorm has no CPU kernels and libreyolo's ``sync_bn`` is
  not a CLI option, so the conversion is skipped for this process. GPU runs keep it untouched.

Runs in the training's interpreter only (imports torch); the agent never imports it.
"""

from __future__ import annotations

import os
import sys

TIMEOUT_VAR = "TRAINBOX_DDP_TIMEOUT"


def _on_cpu(args: list[str]) -> bool:
    return any(arg in ("device=cpu", "--device=cpu") for arg in args) or "--device cpu" in " ".join(args)


def _shorter_timeout(seconds: float) -> None:
    from libreyolo.training import distributed, trainer  # type: ignore[import-untyped]

    original = distributed.init_distributed

    def init_distributed(timeout_seconds: int = int(seconds)) -> None:
        original(timeout_seconds=min(timeout_seconds, int(seconds)))

    # the trainer imported the name: patch the binding it calls
    trainer.init_distributed = init_distributed
    distributed.init_distributed = init_distributed


def _no_sync_bn() -> None:
    import torch

    def keep(cls: type, module: torch.nn.Module, process_group: object = None) -> torch.nn.Module:
        return module

    torch.nn.SyncBatchNorm.convert_sync_batchnorm = classmethod(keep)  # type: ignore[method-assign,assignment]


def main(args: list[str]) -> None:
    timeout = os.environ.get(TIMEOUT_VAR)
    if timeout:
        _shorter_timeout(float(timeout))
    if _on_cpu(args):
        _no_sync_bn()
    from libreyolo.cli import entrypoint  # type: ignore[import-untyped]

    sys.argv = ["libreyolo", *args]
    entrypoint()


if __name__ == "__main__":
    main(sys.argv[1:])
