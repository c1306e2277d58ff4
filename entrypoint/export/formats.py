"""The formats EXPORT may name: what each needs installed, where its file lands, and how a person loads it.

Only formats the agent can check by running them are offered: each is loaded by its own runtime and
compared with the ``.pt`` (export/verify.py). A format is refused before anything is spent when the image
lacks its packages (``missing``: looked up with ``importlib.util.find_spec``, nothing imported), or, for
TensorRT, when the run has no GPU: an engine is built for the GPU family it will run on.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from ..errors import ConfigError

# Every format `libreyolo export --format` 1.6.0 knows (libreyolo/export/support.py), aliases resolved.
LIBREYOLO_FORMATS = frozenset(
    {"onnx", "torchscript", "executorch", "tensorrt", "openvino", "paddle", "mnn", "rknn", "ncnn", "tflite"}
    | {"coreml", "coreai"}
)
ALIASES = {"engine": "tensorrt", "litert": "tflite"}
OFF = "off"


@dataclass(frozen=True)
class Format:
    name: str
    modules: tuple[str, ...]  # what the export and its check import (onnx: the intermediate graph too)
    extra: str  # libreyolo's extra that installs them
    runtime: str  # what loads the file, for the card and the logs
    gpu: bool = False  # built for the GPU it runs on: only on a run with a GPU
    directory: bool = False  # a folder of files, not one file

    def artifact(self, stem: Path) -> Path:
        """Where ``libreyolo export`` writes it for ``weights/best.pt`` (its own naming)."""
        suffix = {"onnx": ".onnx", "torchscript": ".torchscript", "tensorrt": ".engine"}.get(self.name)
        return stem.with_suffix(suffix) if suffix else stem.with_name(f"{stem.stem}_{self.name}")

    def missing(self, find: Callable[[str], object | None] = importlib.util.find_spec) -> list[str]:
        return [module for module in self.modules if find(module) is None]


FORMATS = {
    fmt.name: fmt
    for fmt in (
        Format("onnx", ("onnx", "onnxruntime"), "onnx", "ONNX Runtime"),
        Format("openvino", ("onnx", "openvino"), "openvino", "OpenVINO Runtime", directory=True),
        Format("tensorrt", ("onnx", "tensorrt"), "tensorrt", "TensorRT", gpu=True),
        Format("torchscript", (), "", "TorchScript (torch.jit)"),
    )
}


def parse(name: str, value: str, _unset: object) -> tuple[str, ...]:
    """``onnx,openvino`` → its formats in order, each once; ``off`` → none. A name libreyolo does not know, or one
    the agent cannot check, is refused here."""
    words = [ALIASES.get(word, word) for word in (part.strip().lower() for part in value.split(",")) if word]
    if words == [OFF]:
        return ()
    found: list[str] = []
    for word in words:
        if word not in FORMATS:
            known = "libreyolo exports it, but Trainbox cannot check it" if word in LIBREYOLO_FORMATS else "unknown"
            raise ConfigError(
                f"{name}: format {word!r}: {known}",
                f"use {', '.join(FORMATS)} (comma separated), or {name}=off",
            )
        if word not in found:
            found.append(word)
    if not found:
        raise ConfigError(f"{name} names no format", f"e.g. {name}=onnx, or {name}=off")
    return tuple(found)


def check_installed(formats: tuple[str, ...], find: Callable[[str], object | None] = importlib.util.find_spec) -> None:
    """Every format's packages are importable here; else exit 10 naming the image variant that has them."""
    for name in formats:
        missing = FORMATS[name].missing(find)
        if missing:
            extra = FORMATS[name].extra
            raise ConfigError(
                f"EXPORT={name} needs {', '.join(missing)}, which this image lacks",
                f"build the image with --build-arg LIBREYOLO_EXTRAS={extra} (or pip install 'libreyolo[{extra}]'),"
                f" or drop {name} from EXPORT",
            )


def check_gpu(formats: tuple[str, ...], has_gpu: bool) -> None:
    """TensorRT builds an engine for the GPU it runs on: without one there is nothing to build it for."""
    needing = [name for name in formats if FORMATS[name].gpu]
    if needing and not has_gpu:
        raise ConfigError(
            f"EXPORT={','.join(needing)} needs a GPU (an engine is built for the GPU family it runs on),"
            " and this run trains on the CPU",
            f"run on a GPU, or drop {','.join(needing)} from EXPORT (onnx runs anywhere)",
        )
