"""Stand-in trainings for ``entrypoint.training.ddp_worker`` (``TRAINBOX_DDP_ENTRY=tests.fakes.ddp_teardown:<name>``).
``finishes``: its interpreter's teardown aborts the process, as gloo's threads can once a peer node has left
(SIGABRT, ``terminate called without an active exception``). ``exits``: ``sys.exit(<first argument>)``, its
teardown printing ``teardown ran``."""

from __future__ import annotations

import atexit
import os
import sys


def finishes(args: list[str]) -> None:
    atexit.register(os.abort)
    print("trained: " + " ".join(args))  # buffered (a pipe): lost if the worker left without flushing


def exits(args: list[str]) -> None:
    atexit.register(lambda: print("teardown ran", file=sys.stderr, flush=True))
    print("stopped", file=sys.stderr)
    sys.exit(int(args[0]))
