"""PROFILE=1: a short ``libreyolo profile run`` on the rented card before the long run.

The verdict (``dataloader``, ``host / launch``, ``compute``, ``memory-pressure``) says whether a
faster GPU would help at all; it is logged and kept in trainbox.json. A failed profile is a
warning, never a reason not to train.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from .. import libreyolo, procs
from ..log import logger
from ..settings import Settings

PROFILE_TIMEOUT = 20 * 60.0
_SIZE = re.compile(r"(?i)libreyolo\d+([a-z])\.pt$")


def profile_command(settings: Settings, data_yaml: Path, device: int) -> list[str]:
    args = settings.run_args
    argv = [libreyolo.executable(settings.libreyolo_command), "profile", "run", str(data_yaml)]
    model = args.get("model")
    if model:
        argv += ["--weights", model]
        size = _SIZE.search(model)
        if size:
            argv += ["--size", size.group(1).lower()]
    for key in ("batch", "imgsz", "workers"):
        value = args.get(key)
        if value is not None and value.lstrip("-").isdigit():
            argv += [f"--{key}", value]
    project = settings.workdir / ".trainbox" / "profile"
    return [*argv, "--device", str(device), "--project", str(project), "--json"]


def profile(settings: Settings, data_yaml: Path, gpu_indices: tuple[int, ...] | None) -> dict[str, Any] | None:
    if not settings.profile:
        return None
    if not gpu_indices:
        logger.warning("PROFILE=1: the profiler measures GPUs; skipped on the CPU")
        return None
    argv = profile_command(settings, data_yaml, gpu_indices[0])
    try:
        result = procs.run(argv, timeout=PROFILE_TIMEOUT, cwd=settings.workdir, env=settings.env)
        if result.timed_out:
            logger.warning("PROFILE=1: the profile did not finish in %.0f s; training anyway", PROFILE_TIMEOUT)
            return None
        verdict = json.loads(result.stdout[result.stdout.index("{") :])
    except (ValueError, OSError) as error:
        logger.warning("PROFILE=1: the profile did not complete (%s); training anyway", type(error).__name__)
        return None
    summary = {key: verdict.get(key) for key in ("bound", "img_per_s", "gpu_util", "profile")}
    logger.info("profile: %s img/s, bound by %s", summary.get("img_per_s"), summary.get("bound"))
    return summary
