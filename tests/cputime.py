"""Per-test CPU count, a pytest plugin: ``-p tests.cputime`` with TRAINBOX_TEST_CPU_LOG naming a file.

Each test (setup, call and teardown) appends one line: its CPU-seconds (user + system, of the worker and the
children it reaped meanwhile: ``getrusage``), its wall seconds and its node id, tab-separated. On a loaded machine
the CPU count, unlike the wall time, is the test's own cost (docs/testing.md: "Where the time goes")."""

from __future__ import annotations

import os
import resource
import time
from collections.abc import Iterator

import pytest


def _cpu() -> float:
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item) -> Iterator[None]:
    log = os.environ.get("TRAINBOX_TEST_CPU_LOG")
    cpu, wall = _cpu(), time.monotonic()
    yield
    if log:
        line = f"{_cpu() - cpu:.2f}\t{time.monotonic() - wall:.2f}\t{item.nodeid}\n"
        with open(log, "a") as out:  # one short append per line: the workers' lines never interleave
            out.write(line)
