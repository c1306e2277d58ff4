"""Release: end the bill at the end of the job, and never claim it ended when it did not.

``ON_EXIT`` (``ON_FAILURE`` for a failed run): ``exit`` leaves the machine to the platform (on a
serverless platform that ends the bill; a marketplace instance keeps billing), ``stop`` and
``destroy`` call the provider's API and then read the instance back until the provider shows it
stopped or gone. Anything less is a ``ReleaseError`` (exit 90, ``release.status: failed`` in
trainbox.json). The final trainbox.json is published before the provider call, because after a
confirmed destroy the machine, and this process, may vanish at any moment.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..errors import AccessError, ConfigError, ReleaseError
from ..log import logger, redact
from ..settings import ExitAction, Provider, ProviderAccess, Settings
from ..state import STATE_FILE, RunState, now_iso, read_state, write_json_atomic
from . import providers
from .providers import InstanceState, ProviderHttpError, ReleaseRetry

# The provider part of the release (read, stop/destroy, confirm: retries and Retry-After waits
# included) ends within this, confirmed or failed; it runs after the SIGTERM bound.
RELEASE_TIMEOUT = 120.0


def action_for(settings: Settings, *, failed: bool) -> ExitAction:
    return settings.on_failure if failed else settings.on_exit


def end_of_job(
    settings: Settings,
    state: RunState,
    *,
    failed: bool,
    publish: Callable[[], bool | None],
    policy: ReleaseRetry | None = None,
) -> int | None:
    """Do ON_EXIT (ON_FAILURE when ``failed``). Returns an exit code that replaces the job's
    when the release itself failed, else None. ``publish`` uploads what the Hub lacks of the run,
    trainbox.json included, and returns False when something is still missing there."""
    action = action_for(settings, failed=failed)
    record = _record(settings.provider, action)
    if action is ExitAction.EXIT:
        state.update(release={**record, "status": "not_requested"})
        _publish(publish)
        if settings.provider.provider is not Provider.NONE:
            logger.warning(
                "%s=exit: this %s instance keeps billing until it is stopped or destroyed",
                "ON_FAILURE" if failed else "ON_EXIT",
                settings.provider.provider,
            )
        return None

    state.update(release={**record, "status": "requested", "requested_at": now_iso()})
    if not _publish(publish) and action is ExitAction.DESTROY:
        # Destroying deletes the disk: with part of the run missing on the Hub that loses it.
        # A stopped instance keeps the disk for a few cents an hour instead.
        logger.error("the Hub does not have all of this run: stopping the instance instead of destroying it")
        action = ExitAction.STOP
        state.update(release={"action": action.value, "downgraded_from": ExitAction.DESTROY.value})
    policy = policy or ReleaseRetry()
    if policy.deadline is None:
        policy = dataclasses.replace(policy, deadline=policy.clock() + RELEASE_TIMEOUT)
    try:
        outcome = release(settings.provider, action, policy)
    except ReleaseError as error:
        previous = state.snapshot().get("exit") or {}
        state.update(
            release={"status": "failed", "error": str(error), "finished_at": now_iso()},
            exit={
                "code": error.exit_code,
                "reason": error.reason,
                "message": str(error),
                "job": {"code": previous.get("code"), "reason": previous.get("reason")},
                "final": True,
            },
        )
        logger.error("release failed: %s", error)
        _publish(publish)
        return error.exit_code
    state.update(release={**outcome, "finished_at": now_iso()})
    _publish(publish)  # best effort: a destroyed machine may be gone before this lands
    return None


def release(access: ProviderAccess, action: ExitAction, policy: ReleaseRetry | None = None) -> dict[str, Any]:
    """Stop or destroy this instance and confirm it; the record for trainbox.json. ``ReleaseError`` otherwise."""
    instance = providers.instance_for(access)
    seen = providers.end_bill(instance, action, policy)
    verb = "destroyed" if action is ExitAction.DESTROY else "stopped"
    if action is ExitAction.STOP and seen.state is InstanceState.GONE:
        verb = "gone"
    logger.info("%s %s: confirmed by the provider (%s)", instance.label, verb, seen.detail)
    return {"status": "confirmed", "observed": seen.state.value, "detail": seen.detail}


def check_access(settings: Settings, policy: ReleaseRetry | None = None) -> providers.Observed | None:
    """At start: read this instance once, for its price and to prove the key can read it, so a
    wrong id or key fails now, not at the end.

    Strict only when ON_EXIT or ON_FAILURE needs the provider: then a refused key or an unknown
    instance is an error. An unreachable API is only a warning (it may be back by the end).
    """
    if settings.provider.provider is Provider.NONE:
        return None
    needed = {settings.on_exit, settings.on_failure} != {ExitAction.EXIT}
    instance = providers.instance_for(settings.provider)
    try:
        seen = providers.with_provider_retries(
            instance.observe, f"reading {instance.label}", policy or ReleaseRetry(attempts=3)
        )
    except ProviderHttpError as error:
        if needed and error.status in {401, 403}:
            raise AccessError(
                f"the provider refused {instance.key_name} when reading {instance.label} ({redact(error.answer)})",
                f"fix {instance.key_name}, or set ON_EXIT=exit and release the machine yourself",
            ) from None
        logger.warning("cannot read %s from the provider API yet: %s", instance.label, redact(error.answer))
        return None
    if seen.state is InstanceState.GONE:
        if not needed:
            logger.warning("the provider does not know %s (%s)", instance.label, seen.detail)
            return None
        raise ConfigError(
            f"the provider does not know {instance.label} ({seen.detail})",
            "check the instance id the provider gave this machine, or set PROVIDER=none and ON_EXIT=exit",
        )
    return seen


def record_in_state_file(run_dir: Path, release_record: dict[str, Any]) -> bool:
    """``trainbox release`` outside a job: note the outcome in the run's trainbox.json, if there is one."""
    path = run_dir / STATE_FILE
    data = read_state(path)
    if data is None:
        return False
    data["release"] = {**(data.get("release") or {}), **release_record, "finished_at": now_iso()}
    data["updated_at"] = now_iso()
    write_json_atomic(path, data)
    return True


def require_provider(access: ProviderAccess, action: ExitAction) -> None:
    if action is not ExitAction.EXIT and access.provider is Provider.NONE:
        raise ConfigError(
            f"cannot {action}: no provider was detected",
            "run on Vast.ai or RunPod (their env is read automatically), set PROVIDER, or use exit",
        )


def _record(access: ProviderAccess, action: ExitAction) -> dict[str, Any]:
    return {"action": action.value, "provider": access.provider.value, "instance": access.instance_id}


def _publish(publish: Callable[[], bool | None]) -> bool:
    """True when the Hub has the run. Ending the bill matters more: a failed upload is never fatal."""
    try:
        return publish() is not False
    except Exception as error:  # whatever broke the upload must not keep the machine billing
        logger.warning("could not upload trainbox.json before the release: %s", error)
        return False
