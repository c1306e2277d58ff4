"""RUN_ARGS: extra ``libreyolo train`` arguments, parsed, checked against libreyolo, never shelled.

The accepted keys are libreyolo's own ``train`` options (``libreyolo.train_options``).
"""

from __future__ import annotations

import difflib
import re
import shlex
from dataclasses import dataclass
from pathlib import Path

from . import libreyolo
from .errors import ConfigError

# Keys the agent sets itself, and the variable a user sets instead.
OWNED_KEYS: dict[str, str] = {
    "data": "DATASET_REPO (and DATA_YAML)",
    "project": "WORKDIR",
    "name": "RUN_NAME",
    "exist_ok": "RUN_NAME (the agent always reuses the run folder)",
    "device": "GPUS",
}
# Keys that do not define the run: raising ``epochs`` extends the same run (same RUN_NAME, same repo),
# continuing from its last checkpoint; every other key (model, imgsz, lr0…) makes another run.
EXTENDS_THE_RUN = frozenset({"epochs"})
_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_-]*$")
_TRUE, _FALSE = {"true", "1", "yes"}, {"false", "0", "no"}


@dataclass(frozen=True)
class RunArgs:
    """Ordered ``key=value`` pairs, keys in libreyolo's underscore form."""

    pairs: tuple[tuple[str, str], ...] = ()

    def get(self, key: str) -> str | None:
        return dict(self.pairs).get(key)

    def __contains__(self, key: str) -> bool:
        return any(k == key for k, _ in self.pairs)

    def with_defaults(self, defaults: RunArgs) -> RunArgs:
        """These pairs, plus the defaults' keys that are not set here."""
        return RunArgs(tuple((k, v) for k, v in defaults.pairs if k not in self) + self.pairs)

    def set(self, key: str, value: str) -> RunArgs:
        return RunArgs((*tuple((k, v) for k, v in self.pairs if k != key), (key, value)))

    def defining(self) -> RunArgs:
        """The pairs that define the run: all but ``EXTENDS_THE_RUN`` (RUN_NAME is derived from these)."""
        return RunArgs(tuple((k, v) for k, v in self.pairs if k not in EXTENDS_THE_RUN))

    def argv(self) -> list[str]:
        return [f"{k}={v}" for k, v in self.pairs]

    def __str__(self) -> str:
        return shlex.join(self.argv())


def parse(text: str) -> RunArgs:
    """Split shell-style (quotes group, nothing expands) into key=value pairs."""
    try:
        tokens = shlex.split(text, comments=False, posix=True)
    except ValueError as error:
        raise ConfigError(
            f"RUN_ARGS cannot be parsed: {error}", "close every quote, e.g. RUN_ARGS='epochs=100 name=\"a b\"'"
        ) from None
    pairs: list[tuple[str, str]] = []
    for token in tokens:
        key, sep, value = token.partition("=")
        key = key.lstrip("-").replace("-", "_")
        if not sep or not _KEY.match(key):
            raise ConfigError(
                f"RUN_ARGS item {token!r} is not key=value", "write each option as key=value, e.g. epochs=100"
            )
        if any(k == key for k, _ in pairs):
            raise ConfigError(f"RUN_ARGS sets {key!r} twice", f"keep one {key}=… in RUN_ARGS")
        pairs.append((key, value))
    return RunArgs(tuple(pairs))


def validate(args: RunArgs, options: dict[str, str]) -> None:
    """Refuse agent-owned keys, keys libreyolo does not accept, and values of the wrong type."""
    for key, value in args.pairs:
        if key in OWNED_KEYS:
            raise ConfigError(f"RUN_ARGS may not set {key!r}: the agent sets it", f"use {OWNED_KEYS[key]} instead")
        if key not in options:
            close = difflib.get_close_matches(key, list(options), n=3, cutoff=0.5)
            hint = f"did you mean {', '.join(close)}?" if close else "see `libreyolo train --help` for the options"
            raise ConfigError(f"RUN_ARGS key {key!r} is not a libreyolo train option", hint)
        _check_value(key, value, options[key])


def _check_value(key: str, value: str, kind: str) -> None:
    try:
        if kind == "int":
            int(value)
        elif kind == "float":
            float(value)
        elif kind == "bool" and value.lower() not in _TRUE | _FALSE:
            raise ValueError
    except ValueError:
        example = {"int": "100", "float": "0.01", "bool": "true"}[kind]
        raise ConfigError(f"RUN_ARGS {key}={value!r} is not a valid {kind}", f"e.g. {key}={example}") from None


_ULTRALYTICS = re.compile(r"^yolo(v\d+|1[0-9]|2[0-9])[a-z]*(-[a-z]+)?(\.(pt|yaml))?$")
_WEIGHTS = (".pt", ".pth", ".safetensors", ".onnx")


def check_values(args: RunArgs) -> None:
    """Values that cannot train, refused before anything is spent: epochs, batch, imgsz and model as libreyolo
    would get them (``validate`` checked their types)."""
    epochs = args.get("epochs")
    if epochs is not None and int(epochs) <= 0:
        raise ConfigError(f"RUN_ARGS epochs={epochs} trains nothing", "set epochs to 1 or more, e.g. epochs=100")
    batch = args.get("batch")
    if batch is not None and (int(batch) == 0 or int(batch) < -1):
        raise ConfigError(
            f"RUN_ARGS batch={batch} is not a batch size",
            "set batch to 1 or more images, or batch=-1 to size it to the GPU's memory",
        )
    model = args.get("model") or libreyolo.DEFAULT_MODEL
    family = model_family(model)
    imgsz = args.get("imgsz")
    if imgsz is not None:
        _check_imgsz(imgsz, model, family)


def model_family(model: str) -> str | None:
    """The libreyolo family ``model`` names; None for a path, an hf:// reference or a checkpoint of one's own
    (libreyolo reads its family from inside). A bare name libreyolo does not know is refused."""
    if model.startswith("hf://") or "/" in model or Path(model).expanduser().exists():
        return None
    lowered = model.lower()
    if _ULTRALYTICS.match(lowered):
        raise ConfigError(
            f"RUN_ARGS model={model} is an Ultralytics model, which LibreYOLO does not train",
            f"use a LibreYOLO model, e.g. model=LibreYOLO9s.pt or model=LibreYOLOXs.pt ({libreyolo.SUGGESTED})",
        )
    found = [
        (prefix, family) for prefix, family in libreyolo.FAMILIES.items() if re.search(rf"{prefix.lower()}\w", lowered)
    ]
    if found:
        return max(found, key=lambda item: len(item[0]))[1]  # LibreYOLO9E2E over LibreYOLO9
    alias = lowered.partition("-")[0]
    if "-" in lowered and alias in libreyolo.FAMILIES.values():
        return alias
    if lowered.endswith(_WEIGHTS):
        return None  # a checkpoint file of one's own, e.g. best.pt: libreyolo reads its family from it
    raise ConfigError(
        f"RUN_ARGS model={model} is not a model LibreYOLO knows",
        f"name one of LibreYOLO's ({libreyolo.SUGGESTED}), an alias like yolox-s, a .pt path or hf://org/name",
    )


def _check_imgsz(text: str, model: str, family: str | None) -> None:
    sides = re.split(r"[x,]", text.lower())
    try:
        numbers = [int(side) for side in sides]
    except ValueError:
        raise ConfigError(f"RUN_ARGS imgsz={text!r} is not an image size", "e.g. imgsz=640 or imgsz=480x640") from None
    if len(numbers) > 2 or any(side <= 0 for side in numbers):
        raise ConfigError(f"RUN_ARGS imgsz={text} is not an image size", "use pixels above 0, e.g. imgsz=640")
    stride = libreyolo.IMGSZ_STRIDES.get(family or "")
    if stride and any(side % stride for side in numbers):
        nearest = "x".join(str(max(stride, round(side / stride) * stride)) for side in numbers)
        up = "x".join(str(-(-side // stride) * stride) for side in numbers)
        trained = f" ({up} is what libreyolo would train at)" if up != nearest else ""
        raise ConfigError(
            f"RUN_ARGS imgsz={text} is not a multiple of {model}'s stride {stride} (libreyolo would round it up)",
            f"use imgsz={nearest}{trained}",
        )
