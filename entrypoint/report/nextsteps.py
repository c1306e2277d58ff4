"""The last lines of a finished run: what a person now has, and what to do next with it.

Every line is a command that works as printed, or one with a single placeholder in capitals
(``YOUR_ORG``, ``YOUR_TOKEN``, ``DATASET_FOLDER``), so the way from the demo to one's own data is copy, edit, paste.
"""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any

from ..dataset import data_dir
from ..errors import AgentError
from ..libreyolo import WEIGHTS_DIR
from ..log import logger
from ..release import cost
from ..settings import Settings
from ..state import Phase

PREFIX = "next: "


def summary(
    settings: Settings, phase: Phase, outcome: AgentError | None, elapsed: float, spend: dict[str, Any]
) -> None:
    """The run's last lines in the log: how it ended, where the weights are, the cost, then what next."""
    weights = settings.run_dir / WEIGHTS_DIR
    found = sorted(p.name for p in weights.glob("*.pt")) if weights.is_dir() else []
    logger.info("run %s: %s after %.0f s; run folder %s", settings.run_name, phase, elapsed, settings.run_dir)
    if found:
        logger.info("weights: %s", ", ".join(str(Path(WEIGHTS_DIR) / name) for name in found))
    logger.info("cost: %s", cost.describe_spend(spend))
    if outcome is not None:
        logger.error("%s", outcome)
    elif phase is Phase.DONE:
        for line in lines(settings):
            logger.info("%s", line)


def lines(settings: Settings) -> list[str]:
    """The next-steps lines for a run that ended well; none when it left no weights."""
    weights = settings.run_dir / WEIGHTS_DIR
    best = next((weights / name for name in ("best.pt", "last.pt") if (weights / name).is_file()), None)
    if best is None:
        return []
    found = [
        f"the weights are in {weights} ({best.name}"
        + ("; last.pt is the last epoch)" if best.name == "best.pt" and (weights / "last.pt").is_file() else ")"),
        f"try them: {_predict(settings, best)}",
    ]
    if settings.output_repo is None:
        run_dir = shlex.quote(str(settings.run_dir))
        found += [
            "put this run on the Hub: HF_TOKEN=YOUR_TOKEN OUTPUT_REPO=YOUR_ORG/my-model "
            f"trainbox sync --once {run_dir}",
            "your own data (a folder with a data.yaml): tar -cf data.tar -C DATASET_FOLDER . "
            "&& hf upload YOUR_ORG/my-data data.tar --repo-type dataset --private",
            "then train on it (a rented GPU: templates/README.md): "
            "DATASET_REPO=YOUR_ORG/my-data OUTPUT_REPO=YOUR_ORG/my-model HF_TOKEN=YOUR_TOKEN trainbox run",
        ]
    else:
        found.append(f"the run and its model card: {settings.hub_url}/{settings.output_repo}")
    return [PREFIX + line for line in found]


def _predict(settings: Settings, weights: Path) -> str:
    """libreyolo's own command, on the demo's validation images when there is nothing better to name."""
    source = str(data_dir(settings) / "demo" / "images" / "val") if settings.is_demo else "IMAGE_OR_FOLDER"
    words = ["libreyolo", "predict", f"model={weights}", f"source={source}"]
    imgsz = settings.run_args.get("imgsz")
    if imgsz is not None:  # the size it was trained at, not libreyolo's default of 640
        words.append(f"imgsz={imgsz}")
    words.append("save=true")
    return shlex.join(words)
