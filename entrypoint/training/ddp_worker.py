"""``python -m entrypoint.training.ddp_worker train key=value …``: libreyolo's CLI as one torchrun worker.

Three things the ``libreyolo train`` command cannot be told, set here before its own ``main`` runs:

* the process-group timeout: libreyolo asks torch for 3 hours; a peer that vanished without closing
  its sockets (a lost machine) must end the job after ``TRAINBOX_DDP_TIMEOUT`` seconds instead;
* ``device=cpu`` (CPU machines, tests): SyncBatchNorm has no CPU kernels and libreyolo's ``sync_bn`` is
  not a CLI option, so the conversion is skipped for this process. GPU runs keep it untouched;
* a worker whose training returned leaves at once (``os._exit``), skipping the interpreter's teardown: libreyolo
  never destroys its process group, and gloo's threads, torn down after a peer node already left, can abort the
  process (``terminate called without an active exception``, SIGABRT) after the last epoch was saved, which
  torchrun reports as a failed training;
* out of GPU memory on one worker must end every node at once and be known to every agent (node 0
  records the halved batch for the set's next start): the worker that runs out says so in torchrun's
  own store (served by node 0's torchrun at ``MASTER_ADDR:MASTER_PORT``); every worker watches it,
  leaves as soon as another one said it (a peer stuck in a collective would wait ``DDP_TIMEOUT``),
  and each node's first worker writes what it read to ``TRAINBOX_PEER_REPORT`` for its agent.

Runs in the training's interpreter only (imports torch); the agent never imports it.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import sys
import threading
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

TIMEOUT_VAR = "TRAINBOX_DDP_TIMEOUT"
PEER_REPORT_VAR = "TRAINBOX_PEER_REPORT"  # the agent's file for what another worker reported
# ``module:function`` run with the train arguments instead of libreyolo's CLI (the tests' stand-in trainer)
ENTRY_VAR = "TRAINBOX_DDP_ENTRY"
OUT_OF_MEMORY_KEY = "trainbox/out_of_memory"
WATCH_INTERVAL = 1.0
# A worker that saw another's out-of-memory leaves with this code (its agent reads the report, not the code).
PEER_EXIT_CODE = 1


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


def _store() -> Any:
    """A client of the store node 0's torchrun serves for this training (None when unreachable)."""
    address, port = os.environ.get("MASTER_ADDR"), os.environ.get("MASTER_PORT", "")
    if not address or not port.isdigit():
        return None
    from torch.distributed import TCPStore  # type: ignore[attr-defined]  # exported where distributed is built

    try:
        return TCPStore(address, int(port), is_master=False, timeout=timedelta(seconds=10))
    except (ValueError, RuntimeError):
        return None


def _me() -> dict[str, Any]:
    return {"node": int(os.environ.get("GROUP_RANK", "0")), "rank": int(os.environ.get("RANK", "0"))}


def tell_out_of_memory(detail: str) -> None:
    """This worker ran out of GPU memory: say so in the store, before the process ends, for every node."""
    store = _store()
    if store is None:
        print("trainbox: cannot reach the training's store to report out of memory", file=sys.stderr, flush=True)
        return
    store.set(OUT_OF_MEMORY_KEY, json.dumps({**_me(), "detail": detail[-500:]}))
    # Stay until every peer's watcher has polled once: this process leaving closes its sockets, and a peer in a
    # collective would fail on the closed connection before it read why (an unexplained failure, not a halving).
    time.sleep(2 * WATCH_INTERVAL)


def _report_libreyolo_out_of_memory() -> None:
    """libreyolo's CLI names every training failure with ``model_call_error_code``: out of memory → tell."""
    from libreyolo.cli.commands import train as train_command  # type: ignore[import-untyped]

    original = train_command.model_call_error_code

    def model_call_error_code(exc: BaseException) -> str:
        code = str(original(exc))
        if code == "cuda_oom":
            tell_out_of_memory(f"{type(exc).__name__}: {exc}")
        return code

    train_command.model_call_error_code = model_call_error_code


def _watch_peers(report: Path | None) -> None:
    """Poll the store; once another worker ran out of memory: the node's report, then leave at once."""
    store = _store()
    if store is None:
        return
    me = _me()
    while True:
        time.sleep(WATCH_INTERVAL)
        try:
            if not store.check([OUT_OF_MEMORY_KEY]):
                continue
            found = json.loads(store.get(OUT_OF_MEMORY_KEY))
        except (RuntimeError, ValueError):
            return  # the store is gone: the training is ending anyway
        if found.get("rank") == me["rank"]:
            return  # this worker's own: it is leaving through libreyolo's error path
        if report is not None and os.environ.get("LOCAL_RANK", "0") == "0":
            with contextlib.suppress(OSError):
                temporary = report.with_name(report.name + ".tmp")
                temporary.write_text(json.dumps(found))
                os.replace(temporary, report)
        print(f"trainbox: node {found.get('node')} ran out of GPU memory: this worker leaves too", file=sys.stderr)
        sys.stderr.flush()
        os._exit(PEER_EXIT_CODE)


def main(args: list[str]) -> None:
    timeout = os.environ.get(TIMEOUT_VAR)
    if timeout:
        _shorter_timeout(float(timeout))
    if _on_cpu(args):
        _no_sync_bn()
    report = os.environ.get(PEER_REPORT_VAR)
    threading.Thread(
        target=_watch_peers, args=(Path(report) if report else None,), name="trainbox-peers", daemon=True
    ).start()
    entry = os.environ.get(ENTRY_VAR)
    if entry:
        module, _, function = entry.partition(":")
        getattr(importlib.import_module(module), function)(args)
        return
    _report_libreyolo_out_of_memory()
    from libreyolo.cli import entrypoint  # type: ignore[import-untyped]

    sys.argv = ["libreyolo", *args]
    entrypoint()


def leave_finished() -> None:
    """The training returned: end the worker 0, its output flushed, without the interpreter's teardown."""
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):
            stream.flush()
    os._exit(0)


if __name__ == "__main__":
    try:
        main(sys.argv[1:])
    except SystemExit as exit_:
        if exit_.code not in (None, 0):
            raise  # a failed training ends as Python ends it (its peers are told through the store first)
    leave_finished()
