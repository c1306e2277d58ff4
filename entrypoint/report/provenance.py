"""Where the run's starting weights came from, for the model card's ``base_model`` and ``license``.

libreyolo takes the weights from the Hub in two ways: ``model=hf://owner/repo[@rev][/file.pt]``, and a bare
LibreYOLO name (``model=LibreYOLO9s.pt``) missing locally, which it downloads from the ``LibreYOLO/<Name>``
repo. ``pretrained=false`` starts from random weights: no base model then.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import TYPE_CHECKING

from ..errors import StopRequested
from ..log import logger
from ..run_args import RunArgs

if TYPE_CHECKING:
    from ..hub import Hub

_HF_MODEL = re.compile(r"^hf://([\w.-]+/[\w.-]+)(?:@[^/]+)?(?:/.*)?$")
_LIBREYOLO_NAME = re.compile(r"^(LibreYOLO[\w-]*)\.pt$")
_OFF = {"false", "0", "no", "off", "none"}


def base_model(args: RunArgs) -> str | None:
    """The Hub model id the training starts from, or None (local weights, random weights, no model=)."""
    if (args.get("pretrained") or "").lower() in _OFF:
        return None
    model = args.get("model") or ""
    found = _HF_MODEL.match(model) or _LIBREYOLO_NAME.match(model)
    if found is None:
        return None
    return found.group(1) if model.startswith("hf://") else f"LibreYOLO/{found.group(1)}"


def base_license(hub: Hub, repo_id: str, scratch: Path) -> str | None:
    """The ``license`` in the base model's own card, or None (no card, no license, not readable)."""
    from huggingface_hub import ModelCard

    try:
        text = hub.download(repo_id, "README.md", scratch).read_text(encoding="utf-8")
        license_id = ModelCard(text, ignore_metadata_errors=True).data.get("license")
    except StopRequested:
        raise
    except Exception as error:  # the card's license is a courtesy: never a reason to stop
        logger.info("card: cannot read %s's card for its license (%s)", repo_id, type(error).__name__)
        return None
    return license_id if isinstance(license_id, str) and license_id else None
