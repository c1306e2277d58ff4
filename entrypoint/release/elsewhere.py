"""Another instance of this provider account, as the provider sees it: whether it still runs.

A container that finds its run's lease held by an attempt on another instance asks the provider about that
instance (sync/job.py hands this to the lease). Only the provider's record of it saying its container no longer
runs is an answer (``Observed.ended``: Vast.ai ``cur_state=unloaded`` or ``actual_status`` ``exited`` or
``stopped``; RunPod ``TERMINATED`` or ``EXITED``): every process of that container has ended, and a restart of
the instance runs a new agent, a new attempt that reads the lease like any other container. Everything else
proves nothing and is waited out as before:

- a 404: the keys the providers put in a container (Vast.ai's ``CONTAINER_API_KEY``, RunPod's
  ``RUNPOD_API_KEY``) are scoped to their own instance, so "not found" may mean "not yours to see";
- a stop only asked for (Vast.ai's ``intended_status=stopped`` while the container runs, a host offline that
  never acted on it), ``frozen`` (its memory, the holder's process with it, comes back), RunPod's ``ERROR``;
- an error, a 429, a 5xx, no answer within the time given, a 200 without a record.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import replace

from ..log import logger, redact
from ..settings import ProviderAccess
from .providers import ProviderHttpError, ReleaseRetry, instance_for, with_provider_retries

# The longest a relaunch asks: a provider that answers slowly is never waited on longer than this.
ASK_WITHIN = 5.0


def ended(
    access: ProviderAccess,
    provider: str | None,
    instance_id: str | None,
    within: float = ASK_WITHIN,
    *,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> str | None:
    """The provider's words when instance ``instance_id`` of ``provider`` ("vast", "runpod") no longer runs;
    None when they say anything else, do not come within ``within`` seconds, or cannot be asked (no provider
    access, another provider's instance, this very instance: its answer would be this container's own)."""
    if (
        not instance_id
        or provider != access.provider.value
        or access.api_key is None
        or access.instance_id is None
        or instance_id == access.instance_id
        or within <= 0
    ):
        return None
    other = instance_for(replace(access, instance_id=instance_id))
    what = f"reading {other.label}"
    policy = ReleaseRetry(deadline=clock() + within, max_retry_after=within, clock=clock, sleep=sleep)
    try:
        seen = with_provider_retries(other.observe, what, policy)
    except ProviderHttpError as error:
        logger.info("lease: %s does not say whether it still runs (%s)", other.label, redact(error.answer))
        return None
    return f"{other.label}, which no longer runs ({seen.detail})" if seen.ended else None
