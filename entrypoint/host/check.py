"""The host check in the job: measure, judge, record in trainbox.json (``host``), say, and under
HOST_CHECK=strict end the job before the dataset is fetched (exit 56, then ON_FAILURE)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from ..errors import HostShortfallError
from ..log import logger, step
from ..settings import HostCheck, Settings
from . import judge, measure


def floors(settings: Settings) -> judge.Floors:
    return judge.Floors(settings.host_min_gpu_fraction, settings.host_min_copy_gbps, settings.host_min_disk_mbps)


def report(settings: Settings, gpu_details: Mapping[str, Any], rented: Mapping[str, Any] | None) -> dict[str, Any]:
    """The host report, without a verdict's consequences (``trainbox check`` shows it as it is)."""
    with step("host check"):
        found = judge.judge(gpu_details, measure.host(settings.workdir), rented, floors(settings))
    found["policy"] = settings.host_check.value
    return found


def check(
    settings: Settings,
    gpu_details: Mapping[str, Any],
    rented: Mapping[str, Any] | None,
    record: Callable[[dict[str, Any]], None],
) -> dict[str, Any] | None:
    if settings.host_check is HostCheck.OFF:
        return None
    found = report(settings, gpu_details, rented)
    record(found)
    for line in judge.lines(found):
        (logger.warning if line.startswith("host shortfall") else logger.info)("%s", line)
    shortfalls = found["shortfalls"]
    if shortfalls and settings.host_check is HostCheck.STRICT:
        more = f" (and {len(shortfalls) - 2} more)" if len(shortfalls) > 2 else ""
        raise HostShortfallError(
            f"HOST_CHECK=strict: this machine falls short: {'; '.join(shortfalls[:2])}{more}",
            "rent another machine (ON_FAILURE=destroy does it for the price of a minute), or HOST_CHECK=warn",
        )
    return found
