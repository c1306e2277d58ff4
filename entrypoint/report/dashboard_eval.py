"""The run's evaluation on its trackio dashboard: eval.json's scores, logged once at the end beside the plot, as
``eval/<file in the repo>/<metric>`` and ``eval/<file>/AP50-95/<class>``, so runs compare on the held-out split."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

_HEADLINE = {"map50_95": "mAP50-95", "map50": "mAP50", "precision": "precision", "recall": "recall"}
_SPEED = "ms_per_image"


def metrics(path: Path | None) -> dict[str, float]:
    """eval.json's numbers, flat (empty without an evaluation, or one that cannot be read)."""
    if path is None or not path.is_file():
        return {}
    try:
        document = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    files = document.get("files") if isinstance(document, dict) else None
    flat: dict[str, float] = {}
    for name, scores in (files or {}).items():
        if not isinstance(scores, dict):
            continue
        for key, shown in (*_HEADLINE.items(), (_SPEED, _SPEED)):
            _put(flat, f"eval/{name}/{shown}", scores.get(key))
        for label, per_class in (scores.get("per_class") or {}).items():
            if isinstance(per_class, dict):
                _put(flat, f"eval/{name}/AP50-95/{label}", per_class.get("ap50_95"))
    return flat


def entry(path: Path | None, project: str, run: str, step: int) -> dict[str, Any] | None:
    """The one trackio entry the end logs at ``step`` (the last epoch), named by its split; None when nothing."""
    found = metrics(path)
    if not found:
        return None
    return {"project": project, "run": run, "step": step, "metrics": found, "log_id": f"{run}/eval-{step}"}


def _put(flat: dict[str, float], key: str, value: Any) -> None:
    if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):
        flat[key] = float(value)
