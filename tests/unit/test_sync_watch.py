"""The uploader's watcher: writes at an epoch boundary wake a snapshot; readers do not."""

from __future__ import annotations

import threading

import pytest
from watchdog.events import (
    FileClosedEvent,
    FileClosedNoWriteEvent,
    FileModifiedEvent,
    FileMovedEvent,
    FileOpenedEvent,
    FileSystemEvent,
)

from entrypoint.sync.watcher import _BoundaryHandler


def woken(event: FileSystemEvent) -> bool:
    wake = threading.Event()
    _BoundaryHandler(wake).on_any_event(event)
    return wake.is_set()


@pytest.mark.parametrize(
    "event",
    [
        FileMovedEvent("/run/.status.json.tmp", "/run/status.json"),  # libreyolo renames status.json last
        FileModifiedEvent("/run/trainbox.json"),
        FileClosedEvent("/run/status.json"),
    ],
)
def test_a_boundary_write_wakes_the_snapshot(event: FileSystemEvent) -> None:
    assert woken(event)


@pytest.mark.parametrize("event", [FileOpenedEvent("/run/status.json"), FileClosedNoWriteEvent("/run/trainbox.json")])
def test_reading_the_boundary_files_does_not(event: FileSystemEvent) -> None:
    # libreyolo's dashboard and `trainbox status --watch` read these files all the time
    assert not woken(event)


def test_other_files_do_not_wake_it() -> None:
    assert not woken(FileModifiedEvent("/run/weights/last.pt"))
