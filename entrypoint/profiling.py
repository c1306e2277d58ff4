"""PROFILE=1: a short ``libreyolo profile run`` on the rented card before the long run.

The verdict (``dataloader``, ``host / launch``, ``compute``, ``memory-pressure``) says whether a
faster GPU would help at all; it is logged and kept in trainbox.json. A failed profile is a
warning, never a reason not to train.
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path
from typing import Any

from .log import logger, redact
from .settings import Settings
from .training import libreyolo_executable

PROFILE_TIMEOUT = 20 * 60.0
_SIZE = re.compile(r"(?i)libreyolo\d+([a-z])\.pt$")


def profile_command(settings: Settings, data_yaml: Path, device: int) -> list[str]:
    args = settings.run_args
    argv = [libreyolo_executable(), "profile", "run", str(data_yaml)]
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
    logger.info("+ %s", redact(" ".join(argv)))
    try:
        result = subprocess.run(
            argv, capture_output=True, text=True, timeout=PROFILE_TIMEOUT, cwd=settings.workdir, env=settings.env
        )
        verdict = json.loads(result.stdout[result.stdout.index("{") :])
    except (subprocess.TimeoutExpired, ValueError, OSError) as error:
        logger.warning("PROFILE=1: the profile did not complete (%s); training anyway", type(error).__name__)
        return None
    summary = {key: verdict.get(key) for key in ("bound", "img_per_s", "gpu_util", "profile")}
    logger.info("profile: %s img/s, bound by %s", summary.get("img_per_s"), summary.get("bound"))
    return summary
