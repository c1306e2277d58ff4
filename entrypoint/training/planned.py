"""What a training would be: the model, the epochs and the image size libreyolo trains with for these arguments,
RUN_ARGS' own, else libreyolo's defaults (``libreyolo.TRAIN_DEFAULTS``). `trainbox plan` prices it and
`trainbox run --dry-run` shows it, both from here, so the two never disagree."""

from __future__ import annotations

import re
from dataclasses import dataclass

from ..libreyolo import TRAIN_DEFAULTS
from ..run_args import RunArgs

KEYS = ("model", "epochs", "imgsz")


@dataclass(frozen=True)
class Planned:
    model: str
    epochs: int
    imgsz: str  # as libreyolo takes it: "640", or "480x640" (height x width)
    defaulted: tuple[str, ...]  # the keys RUN_ARGS names not: libreyolo's defaults

    @property
    def side(self) -> int:
        """The longer side in pixels (what the per-image estimate scales with)."""
        sides = [int(part) for part in re.split(r"[x,]", self.imgsz.lower()) if part.strip().isdigit()]
        return max(sides, default=int(TRAIN_DEFAULTS["imgsz"]))

    def describe(self) -> str:
        """``model yolox-s, 300 epochs, imgsz 640 (libreyolo's defaults: model, epochs, imgsz)``."""
        text = f"model {self.model}, {self.epochs} epochs, imgsz {self.imgsz}"
        if self.defaulted:
            text += f" (libreyolo's default{'s' if len(self.defaulted) > 1 else ''}: {', '.join(self.defaulted)})"
        return text

    def as_dict(self) -> dict[str, object]:
        return {"model": self.model, "epochs": self.epochs, "imgsz": self.imgsz, "defaulted": list(self.defaulted)}


def planned(args: RunArgs) -> Planned:
    """The training ``args`` start (the effective RUN_ARGS: the demo's defaults included where the demo trains)."""
    given = {key: args.get(key) for key in KEYS}
    try:
        epochs = int(given["epochs"] or TRAIN_DEFAULTS["epochs"])
    except ValueError:  # settings.py refuses a non-integer epochs before anything asks
        epochs = int(TRAIN_DEFAULTS["epochs"])
    return Planned(
        model=given["model"] or TRAIN_DEFAULTS["model"],
        epochs=epochs,
        imgsz=given["imgsz"] or TRAIN_DEFAULTS["imgsz"],
        defaulted=tuple(key for key in KEYS if not given[key]),
    )
