"""Release: end the bill at the end of the job (exit, stop or destroy the instance)."""

from __future__ import annotations

from collections.abc import Callable

from .settings import ExitAction, Settings
from .state import RunState


def end_of_job(settings: Settings, state: RunState, *, failed: bool, publish: Callable[[], None]) -> int | None:
    """Do ON_EXIT (ON_FAILURE when ``failed``). Returns an exit code that replaces the job's
    when the release itself failed, else None. ``publish`` re-uploads trainbox.json."""
    action = settings.on_failure if failed else settings.on_exit
    if action is ExitAction.EXIT:
        return None
    raise NotImplementedError(action)
