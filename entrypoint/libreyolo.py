"""What the agent knows of LibreYOLO: its command, its ``train`` options, its exit codes, its run folder, the export
formats EXPORT takes.

The run folder is ``WORKDIR/runs/RUN_NAME``. LibreYOLO writes its checkpoints in place, then renames
``status.json`` last; ``metrics.jsonl`` gets one row per epoch. The accepted ``train`` keys of the
releases this agent supports ship with it (``RELEASE_OPTIONS``, checked against the installed release's
source by the tests): asking libreyolo starts a child that imports torch, about 1 GB and seconds on every
fresh volume. For a release it does not know, they are read from the installed libreyolo's own command:
its versioned ``--help-json`` schema (kept per versions), else its source, parsed with ``ast``.
"""

from __future__ import annotations

import ast
import contextlib
import functools
import hashlib
import importlib.metadata
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from . import procs
from .errors import ConfigError
from .log import logger

# -- the run folder ---------------------------------------------------------------------------------
STATUS_FILE = "status.json"  # renamed into place last: the end of an epoch's writes
METRICS_FILE = "metrics.jsonl"
WEIGHTS_DIR = "weights"
LAST_NAME = "last.pt"
LAST_CHECKPOINT = f"{WEIGHTS_DIR}/{LAST_NAME}"  # what training resumes from
BEST_CHECKPOINT = f"{WEIGHTS_DIR}/best.pt"
EPOCH_GLOB = "epoch_*.pt"  # one per save_period, in WEIGHTS_DIR
EPOCH_CHECKPOINT = re.compile(rf"^{WEIGHTS_DIR}/epoch_(\d+)\.pt$")
# Files of a run's history, beside the checkpoints.
HISTORY_FILES = (METRICS_FILE, "results.csv", "train.log")


# -- reading the run folder -------------------------------------------------------------------------
def epochs_done(run_dir: Path) -> int | None:
    """The true number of completed epochs: the last row of metrics.jsonl (status.json counts
    only the current invocation's epochs after a resume)."""
    return last_recorded_epoch(run_dir / METRICS_FILE)


def last_recorded_epoch(metrics: Path) -> int | None:
    """The epoch of the last complete row of a metrics.jsonl (its last 64 KiB are enough); None
    when it has none or cannot be read. A row cut short by a kill is not a row."""
    try:
        with metrics.open("rb") as handle:
            handle.seek(max(0, metrics.stat().st_size - 65536))
            lines = handle.read().splitlines()
    except OSError:
        return None
    for line in reversed(lines):
        try:
            epoch = json.loads(line).get("epoch")
        except (ValueError, AttributeError):
            continue
        if isinstance(epoch, int):
            return epoch
    return None


def recorded_epochs(run_dir: Path) -> int | None:
    """Epochs libreyolo recorded in this run folder (metrics.jsonl); 0 when it started the run
    (status.json) but recorded none; None when the folder holds no libreyolo run to judge by."""
    done = epochs_done(run_dir)
    if done is not None:
        return done
    if (run_dir / METRICS_FILE).exists() or (run_dir / STATUS_FILE).exists():
        return 0
    return None


def trim_metrics(run_dir: Path, completed_epochs: int) -> None:
    """Drop metrics.jsonl rows of epochs after the checkpoint: libreyolo appends, so resuming
    from an older checkpoint would otherwise repeat them."""
    path = run_dir / METRICS_FILE
    try:
        lines = path.read_text().splitlines()
    except OSError:
        return
    kept = []
    for line in lines:
        try:
            epoch = json.loads(line).get("epoch")
        except ValueError:
            continue  # a row cut short by a kill
        if isinstance(epoch, int) and epoch <= completed_epochs:
            kept.append(line)
    if kept != lines:
        tmp = path.with_name(".metrics.jsonl.trim")
        tmp.write_text("".join(f"{line}\n" for line in kept))
        os.replace(tmp, path)
        logger.info("resume: metrics.jsonl trimmed to %d epochs", len(kept))


# -- exit codes of ``libreyolo`` (its cli/errors.py) --------------------------------------------------
EXIT_OK = 0
EXIT_BAD_OPTIONS = 2
EXIT_BAD_DATASET = 3
EXIT_BAD_MODEL = 4
EXIT_INTERRUPTED = 130

# Flags of libreyolo's CLI that shape its console output, not the training.
_OUTPUT_FLAGS = {"json_output", "quiet", "dry_run", "help_json"}


def executable(command: str | None = None) -> str:
    """``command`` (TRAINBOX_LIBREYOLO: a wrapper, or the tests' stand-in), else the ``libreyolo`` script of
    this interpreter's environment, else PATH's."""
    if command:
        return command
    beside = Path(sys.executable).parent / "libreyolo"
    if beside.is_file():
        return str(beside)
    found = shutil.which("libreyolo")
    if found is None:
        raise ConfigError("the libreyolo command is not installed", "install it: pip install libreyolo")
    return found


# -- the options of ``libreyolo train`` ----------------------------------------------------------------
# Per release, ``name:type`` as its cli/commands/train.py declares them (the output flags left out).
RELEASE_OPTIONS = {
    "1.6.0": """
        data:str model:str task:str epochs:int batch:int imgsz:str device:str workers:int cache:str min_samples:int
        class_balanced:bool cls_pw:float class_weights:bool single_cls:bool classes:str average_best:int
        export_check:bool precise_bn:int aux_weight:float seed:int resume:str amp:bool amp_dtype:str cuda_graph:bool
        compile:str pretrained:bool lora:bool freeze:str distill_model:str dis:float distill_loss_type:str
        optimizer:str lr0:float momentum:float weight_decay:float nesterov:bool scheduler:str warmup_epochs:int
        warmup_lr_start:float min_lr_ratio:float lr_drop:int mosaic:float mixup:float hsv_prob:float flip_prob:float
        fliplr:float flipud:float degrees:float translate:float shear:float mosaic_scale:str mixup_scale:str
        no_aug_epochs:int auto_augment:str erasing:float cutmix:float scale:str crop_pct:float ema:bool
        ema_decay:float val:bool eval_interval:int max_det:int eval_max_det:int faster_coco_eval:bool save_plots:bool
        plot_samples:int patience:int project:str name:str exist_ok:bool save_period:int log_interval:int
        allow_download_scripts:bool
    """,
}


# What ``libreyolo train`` 1.6.0 trains when the arguments name none (its cli/commands/train.py: typer's defaults):
# `trainbox plan` prices and `trainbox run --dry-run` shows these (training/planned.py).
TRAIN_DEFAULTS = {"model": "yolox-s", "epochs": "300", "imgsz": "640"}


def installed_version() -> str | None:
    """The installed libreyolo's version, from its package metadata (nothing is imported)."""
    try:
        return importlib.metadata.version("libreyolo")
    except importlib.metadata.PackageNotFoundError:
        return None


def release_options(version: str | None) -> dict[str, str]:
    """The shipped options of ``version`` ({} for a release this agent does not know)."""
    text = RELEASE_OPTIONS.get(version or "", "")
    return dict(pair.split(":", 1) for pair in text.split())


@functools.cache
def train_options(cache_dir: Path | None = None, command: str | None = None) -> dict[str, str]:
    """``{option: type}`` for ``libreyolo train``, type one of int, float, bool, str.

    A supported release's options ship with the agent. Another's come from libreyolo's own versioned
    schema (``train --help-json``) where it works; it crashes with some typer releases (AttributeError on
    ``TyperOption.type`` with 0.29), and then the options are read from its source, else from ``--help``."""
    spec = importlib.util.find_spec("libreyolo")
    if spec is None or spec.origin is None:
        raise ConfigError("libreyolo is not installed", "install it: pip install libreyolo")
    options = release_options(installed_version())
    if options:
        return options
    options = help_json_options(cache_dir, command)
    if options:
        return options
    source = Path(spec.origin).parent / "cli" / "commands" / "train.py"
    try:
        options = _options_from_source(source.read_text())
    except (OSError, SyntaxError, LookupError):
        options = {}
    # The source layout is libreyolo's private business: if it moved, ask the CLI itself.
    return options or _options_from_help()


# click's type names in the --help-json schema (schema_version 1)
_SCHEMA_TYPES = {"integer": "int", "integer range": "int", "float": "float", "float range": "float", "boolean": "bool"}


def help_json_options(cache_dir: Path | None = None, command: str | None = None) -> dict[str, str]:
    """The options of ``libreyolo train --help-json`` ({} where it fails). Starting libreyolo costs seconds,
    so the answer (options, or that it failed) is kept per libreyolo, typer and click versions in
    ``cache_dir`` (TRAINBOX_CACHE_DIR: the image's, filled at build time; else on the volume)."""
    cache = _schema_cache_path(cache_dir, command)
    if cache is None:
        return _options_from_help_json(command)
    with contextlib.suppress(OSError, ValueError):
        cached = json.loads(cache.read_text())
        if isinstance(cached, dict):
            return {str(name): str(kind) for name, kind in cached.items()}
    options = _options_from_help_json(command)
    with contextlib.suppress(OSError):
        cache.parent.mkdir(parents=True, exist_ok=True)
        tmp = cache.with_name(f".{cache.name}.{os.getpid()}")
        tmp.write_text(json.dumps(options))
        os.replace(tmp, cache)
    return options


def _options_from_help_json(command: str | None) -> dict[str, str]:
    try:
        result = procs.run(
            [executable(command), "train", "--help-json"],
            timeout=60,
            env={**os.environ, "NO_COLOR": "1"},
            echo=False,
        )
        schema = json.loads(result.stdout) if result.returncode == 0 else None
    except (OSError, ValueError, ConfigError, subprocess.SubprocessError):
        schema = None
    if not isinstance(schema, dict) or schema.get("schema_version") != 1:
        return {}  # a schema version this reader does not know: read the source instead
    options: dict[str, str] = {}
    for parameter in schema.get("parameters") or []:
        name = parameter.get("name") if isinstance(parameter, dict) else None
        if isinstance(name, str) and name not in _OUTPUT_FLAGS | {"help"}:
            options[name] = _SCHEMA_TYPES.get(str(parameter.get("type")), "str")
    return options


def _schema_cache_path(cache_dir: Path | None, command: str | None) -> Path | None:
    base = cache_dir
    if not base:
        return None
    versions = []
    for package in ("libreyolo", "typer", "click"):
        try:
            versions.append(f"{package}={importlib.metadata.version(package)}")
        except importlib.metadata.PackageNotFoundError:
            versions.append(f"{package}=none")
    key = hashlib.sha256("\n".join([executable(command), *versions]).encode()).hexdigest()[:16]
    return Path(base) / f"libreyolo-train-options-{key}.json"


def _options_from_source(source: str) -> dict[str, str]:
    tree = ast.parse(source)
    function = next(node for node in ast.walk(tree) if isinstance(node, ast.FunctionDef) and node.name == "train_cmd")
    options: dict[str, str] = {}
    for arg in function.args.args + function.args.kwonlyargs:
        if arg.arg not in _OUTPUT_FLAGS:
            options[arg.arg] = _type_name(arg.annotation)
    return options


def _type_name(annotation: ast.expr | None) -> str:
    if isinstance(annotation, ast.Subscript):  # Optional[int]
        annotation = annotation.slice
    if isinstance(annotation, ast.BinOp):  # int | None
        annotation = annotation.left
    name = annotation.id if isinstance(annotation, ast.Name) else "str"
    return name if name in {"int", "float", "bool"} else "str"


def _options_from_help() -> dict[str, str]:
    result = procs.run(
        [sys.executable, "-c", "from libreyolo.cli import entrypoint; entrypoint()", "train", "--help"],
        timeout=120,
        env={**os.environ, "COLUMNS": "200", "NO_COLOR": "1"},
        echo=False,
    )
    names = set(re.findall(r"--([a-z0-9][a-z0-9-]*)", result.stdout))
    # "--no-amp" is the negative form of "--amp"; "--no-aug-epochs" is an option of its own.
    names = {name for name in names if not (name.startswith("no-") and name[3:] in names)}
    options = {name.replace("-", "_"): "str" for name in names}
    for flag in ("json", "quiet", "dry_run", "help_json", "help"):
        options.pop(flag, None)
    if not options:
        raise ConfigError("cannot read libreyolo's train options", "check that `libreyolo train --help` works")
    return options


# -- the models it knows (run_args.check_values refuses others; tests/unit/test_run_values.py reads the source)
# libreyolo 1.6.0's weight-file prefixes (``FILENAME_PREFIX``) and the family each names (``FAMILY``; its CLI
# aliases are ``<family>-<size>``, e.g. yolox-s). libreyolo finds the family by searching the file's name.
FAMILIES = {
    "LibreACT": "act_policy", "LibreAlexNet": "alexnet", "LibreBEN2": "ben2", "LibreBiRefNet": "birefnet",
    "LibreCenterNet": "centernet", "LibreCLIP": "clip", "LibreConvNeXt": "convnext", "LibreConvNeXtV2": "convnextv2",
    "LibreDDColor": "ddcolor", "LibreDeepLabv3": "deeplabv3", "LibreDeformableDETR": "deformable_detr",
    "LibreDEIM": "deim", "LibreDEIMv2": "deimv2", "LibreDeiT": "deit", "LibreDEKR": "dekr",
    "LibreDepthAnything3": "depth_anything3", "LibreDepthAnythingV2": "depth_anything", "LibreDETR": "detr",
    "LibreDexiNed": "dexined", "LibreDFINE": "dfine", "LibreDiffusionPolicy": "diffusion_policy",
    "LibreDINODETR": "dinodetr", "LibreDINOv2": "dinov2", "LibreDOMEDETR": "domedetr", "LibreEC": "ec",
    "LibreEdgeTAM": "edgetam", "LibreEfficientDet": "efficientdet", "LibreEfficientNetV2": "efficientnetv2",
    "LibreEoMT": "eomt", "LibreFasterRCNN": "faster_rcnn", "LibreFCN": "fcn", "LibreFCOS": "fcos",
    "LibreFeyNobg": "feynobg", "LibreFlorence2": "florence2", "LibreFOMO": "fomo", "LibreGemma4": "gemma4",
    "LibreGroundFlorence2": "ground_florence2", "LibreGroundingDINO": "grounding_dino",
    "LibreGroundQwen3VL": "ground_qwen3vl", "LibreGTR": "gtr", "LibreHRNet": "hrnet", "LibreHVICIDNet": "hvi_cidnet",
    "LibreInternVL3": "internvl3", "LibreKosmos2": "kosmos2", "LibreL2CS": "l2cs", "LibreLaMa": "lama",
    "LibreLeVJEPA": "levjepa", "LibreLFM2VL": "lfm2vl", "LibreLingBotVision": "lingbotvision",
    "LibreLWDETR": "lwdetr", "LibreMarigoldV2": "marigold_v2", "LibreMaskRCNN": "mask_rcnn", "LibreMiDaS": "midas",
    "LibreMobileNetV4": "mobilenetv4", "LibreMobileSAM": "mobilesam", "LibreMODUS": "libremodus",
    "LibreMoGe2": "moge2", "LibreMolmo2": "molmo2", "LibreMoondream": "moondream", "LibreNAFNet": "nafnet",
    "LibreNorthMicroVision": "northmicrovision", "LibreOMDetTurbo": "omdet_turbo", "LibreOVDEIM": "ov_deim",
    "LibreOWLv2": "owlv2", "LibrePE": "pe", "LibrePICODET": "picodet", "LibrePicoSAM3": "picosam3",
    "LibrePIDNet": "pidnet", "LibrePPLiteSeg": "ppliteseg", "LibrePPOCR": "ppocr", "LibrePPYOLOE": "ppyoloe",
    "LibreQuickSRNet": "quicksrnet", "LibreQwen3VL": "qwen3vl", "LibreRealESRGAN": "realesrgan",
    "LibreResNet": "resnet", "LibreRetinaNet": "retinanet", "LibreRFDETR": "rfdetr", "LibreRTDETR": "rtdetr",
    "LibreRTDETRv2": "rtdetrv2", "LibreRTDETRv4": "rtdetrv4", "LibreRTMDet": "rtmdet", "LibreSAM": "sam",
    "LibreSAM2": "sam2", "LibreSAM3": "sam3", "LibreSAM3DBody": "sam3dbody", "LibreSegformer": "segformer",
    "LibreShowUI": "showui", "LibreSigLIP2": "siglip2", "LibreSmolVLA": "smolvla", "LibreSmolVLM2": "smolvlm2",
    "LibreSSD": "ssd", "LibreSwin": "swin", "LibreSwinIR": "swinir", "LibreTEED": "teed",
    "LibreTinyFormer": "tinyformer", "LibreUNet": "unet", "LibreVGG": "vgg", "LibreViT": "vit",
    "LibreViTMatte": "vitmatte", "LibreVJEPA2": "vjepa2", "LibreYOLO1": "yolo1", "LibreYOLO2": "yolo2",
    "LibreYOLO3": "yolo3", "LibreYOLO4": "yolo4", "LibreYOLO7": "yolo7", "LibreYOLO9": "yolo9",
    "LibreYOLO9E2E": "yolo9_e2e", "LibreYOLO9P2": "yolo9_p2", "LibreYOLONAS": "yolonas", "LibreYOLOX": "yolox",
    "LibreZipDepth": "zipdepth", "LocateAnything": "locateanything", "SenseNovaVision": "sensenovavision",
}  # fmt: skip
# Families that only run on inputs aligned to their largest stride (``IMGSZ_STRIDE``): libreyolo rounds another
# imgsz up with a warning, so the run would train at a size nobody asked for.
IMGSZ_STRIDES = {"yolo9": 32, "yolo9_e2e": 32, "yolo9_p2": 32}
# `libreyolo train`'s model when RUN_ARGS names none.
DEFAULT_MODEL = "yolox-s"
# The detectors a person most likely means, named when a model is refused.
SUGGESTED = "LibreYOLO9{t,s,m,c}.pt, LibreYOLOX{n,t,s,m,l,x}.pt, LibreRTDETR…, LibreDFINE…, LibreDEIM…, LibreRFDETR…"


# -- the formats of ``libreyolo export`` that EXPORT takes ---------------------------------------------
# Only formats the agent can check by running them are offered: each is loaded by its own runtime and compared
# with the ``.pt`` (export/verify.py). A format is refused before anything is spent when the image lacks its
# packages (``missing``: looked up with ``importlib.util.find_spec``, nothing imported), or, for TensorRT, when
# the run has no GPU: an engine is built for the GPU family it will run on.
# Every format `libreyolo export --format` 1.6.0 knows (libreyolo/export/support.py), aliases resolved.
ALL_EXPORT_FORMATS = frozenset(
    {"onnx", "torchscript", "executorch", "tensorrt", "openvino", "paddle", "mnn", "rknn", "ncnn", "tflite"}
    | {"coreml", "coreai"}
)
EXPORT_ALIASES = {"engine": "tensorrt", "litert": "tflite"}
# What the image leaves out and the agent fetches when the run starts (runtimes/fetch.py's ONNX: the same modules).
FETCHED_ON_FIRST_USE = frozenset({"onnx", "onnxruntime"})
EXPORT_OFF = "off"


@dataclass(frozen=True)
class ExportFormat:
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
        """What the image lacks and the agent cannot fetch when the run starts (``runtimes``: onnx, onnxruntime)."""
        return [module for module in self.modules if find(module) is None and module not in FETCHED_ON_FIRST_USE]


EXPORT_FORMATS = {
    fmt.name: fmt
    for fmt in (
        ExportFormat("onnx", ("onnx", "onnxruntime"), "onnx", "ONNX Runtime"),
        ExportFormat("openvino", ("onnx", "openvino"), "openvino", "OpenVINO Runtime", directory=True),
        ExportFormat("tensorrt", ("onnx", "tensorrt"), "tensorrt", "TensorRT", gpu=True),
        ExportFormat("torchscript", (), "", "TorchScript (torch.jit)"),
    )
}


def parse_export(name: str, value: str, _unset: object) -> tuple[str, ...]:
    """``onnx,openvino`` → its formats in order, each once; ``off`` → none. A name libreyolo does not know, or one
    the agent cannot check, is refused here."""
    words = [EXPORT_ALIASES.get(word, word) for word in (part.strip().lower() for part in value.split(",")) if word]
    if words == [EXPORT_OFF]:
        return ()
    found: list[str] = []
    for word in words:
        if word not in EXPORT_FORMATS:
            known = "libreyolo exports it, but Trainbox cannot check it" if word in ALL_EXPORT_FORMATS else "unknown"
            raise ConfigError(
                f"{name}: format {word!r}: {known}",
                f"use {', '.join(EXPORT_FORMATS)} (comma separated), or {name}=off",
            )
        if word not in found:
            found.append(word)
    if not found:
        raise ConfigError(f"{name} names no format", f"e.g. {name}=onnx, or {name}=off")
    return tuple(found)


def check_export_installed(
    formats: tuple[str, ...], find: Callable[[str], object | None] = importlib.util.find_spec
) -> None:
    """Every format's packages are importable here; else exit 10 naming the image variant that has them."""
    for name in formats:
        missing = EXPORT_FORMATS[name].missing(find)
        if missing:
            extra = EXPORT_FORMATS[name].extra
            raise ConfigError(
                f"EXPORT={name} needs {', '.join(missing)}, which this image lacks",
                f"build the image with --build-arg LIBREYOLO_EXTRAS={extra} (or pip install 'libreyolo[{extra}]'),"
                f" or drop {name} from EXPORT",
            )


def check_export_gpu(formats: tuple[str, ...], has_gpu: bool) -> None:
    """TensorRT builds an engine for the GPU it runs on: without one there is nothing to build it for."""
    needing = [name for name in formats if EXPORT_FORMATS[name].gpu]
    if needing and not has_gpu:
        raise ConfigError(
            f"EXPORT={','.join(needing)} needs a GPU (an engine is built for the GPU family it runs on),"
            " and this run trains on the CPU",
            f"run on a GPU, or drop {','.join(needing)} from EXPORT (onnx runs anywhere)",
        )
