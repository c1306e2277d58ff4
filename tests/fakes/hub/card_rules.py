"""What the Hub's /api/validate-yaml refuses in a model card's metadata (the rules a Trainbox card could break).

huggingface_hub posts README.md there before any upload of a commit carrying it; an answer of 400 with
``errors`` makes ``create_commit`` raise ``ValueError("Invalid metadata in README.md. ...")``.
"""

from __future__ import annotations

import math
import re
from typing import Any

import yaml

# A sample of the Hub's license ids (https://huggingface.co/docs/hub/repositories-licenses); others are refused.
LICENSES = frozenset(
    {
        "apache-2.0",
        "mit",
        "agpl-3.0",
        "gpl-3.0",
        "lgpl-3.0",
        "bsd-2-clause",
        "bsd-3-clause",
        "cc-by-4.0",
        "cc-by-sa-4.0",
        "cc-by-nc-4.0",
        "cc-by-nc-sa-4.0",
        "cc0-1.0",
        "openrail",
        "other",
        "unknown",
    }
)
_REPO_ID = re.compile(r"^[\w.-]+/[\w.-]+$")


def errors(content: str) -> list[str]:
    """The Hub's complaints about the YAML block at the top of ``content`` (none for a card without one)."""
    match = re.match(r"^---\s*\n(.*?)\n---\s*(\n|$)", content, re.DOTALL)
    if match is None:
        return []
    try:
        data = yaml.safe_load(match.group(1))
    except yaml.YAMLError as error:
        return [f"YAML parse error: {error}"]
    if data is None:
        return []
    if not isinstance(data, dict):
        return ["metadata must be a YAML mapping"]
    found: list[str] = []
    license_id = data.get("license")
    if license_id is not None and license_id not in LICENSES:
        found.append(f'"license" must be one of the Hub\'s license ids, not {license_id!r}')
    base = data.get("base_model")
    for repo in [base] if isinstance(base, str) else list(base or []):
        if not isinstance(repo, str) or not _REPO_ID.match(repo):
            found.append(f'"base_model" must be a model id (owner/name), not {repo!r}')
    for model in data.get("model-index") or []:
        for result in (model or {}).get("results") or []:
            for metric in (result or {}).get("metrics") or []:
                found += _metric_errors(metric)
    return found


def _metric_errors(metric: Any) -> list[str]:
    if not isinstance(metric, dict) or not isinstance(metric.get("type"), str):
        return ['"model-index[].results[].metrics[].type" is required']
    value = metric.get("value")
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        return [f'"{metric["type"]}" value must be a number or a string']
    if isinstance(value, float) and not math.isfinite(value):
        return [f'"{metric["type"]}" value must be a finite number, not {value}']
    return []
