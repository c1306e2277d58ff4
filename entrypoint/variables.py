"""The table of every variable the agent reads (``Vars``): its meaning, its parser, the value unset means and
that default as text, and the defaults it states. ``settings.from_env`` reads through it (a name without a row
is refused as a bug); ``trainbox --help``, ``trainbox run --dry-run``, docs/configuration.md and README.md print
its rows. The parsers (and ``Secret``, whose repr is ``***``) are in parsing.py.
"""

from __future__ import annotations

import enum
from pathlib import Path

from . import libreyolo, run_args, topology
from . import parsing as parse
from .parsing import (
    BoxFormat,
    DatasetKind,
    ExitAction,
    GpuSelection,
    HostCheck,
    Secret,
    Variable,
    elsewhere,
    parse_gpus,
    plain,
)
from .run_args import RunArgs

DEFAULT_WORKDIR = "/workspace"
DEFAULT_STALL_TIMEOUT = 30 * 60
# Two halvings reach a quarter of the batch: past that, the memory is not the batch's doing.
DEFAULT_OOM_RETRIES = 2
DEFAULT_PUBLISH_EVERY = 10 * 60
# One writer per run: a quiet holder's lease is taken over after this (sync/protocol.py says why two minutes).
DEFAULT_LEASE_PERIOD = 2 * 60.0
MAX_LEASE_PERIOD = 24 * 3600.0  # sync/protocol.py's LEASE_PERIOD_MAX: a lease naming more is no lease
# The Hub allows 128 commits an hour per repo; the agent keeps to 100 (room for people and other tools), so no
# milestone comes more often than this (sync/ledger.py spends the same budget).
COMMITS_PER_HOUR = 100
MIN_PUBLISH_EVERY = 3600 / COMMITS_PER_HOUR
# The host check's floors, why each (docs/checks.md): a healthy card reaches 60-80 % of its datasheet matmul;
# PCIe 3.0 x16 copies ~12 GB/s, an x4 link or x1 riser under 4; a local SSD 500+ MB/s, a cheap network volume 50-100.
DEFAULT_HOST_MIN_GPU_FRACTION = 0.5
DEFAULT_HOST_MIN_COPY_GBPS = 4.0
DEFAULT_HOST_MIN_DISK_MBPS = 100.0
DEFAULT_STOP_MIN_GAIN = 0.005  # mAP50-95: below the epoch-to-epoch noise of a converged YOLO training
VAST_API_URL = "https://console.vast.ai"
RUNPOD_API_URL = "https://api.runpod.io"  # REST v2; v1 (rest.runpod.io) is retired


class NotifyOn(enum.StrEnum):  # which messages NOTIFY gets (a self-heal or a storage fallback only with all)
    START_END = "start,end"
    END = "end"
    ALL = "all"


class Vars:
    """Every variable the agent reads, in the order --help, --dry-run and docs/configuration.md list them (the
    eight most people set first): meaning, parser, unset value, default text. A row's ``read(env)`` is its typed
    value; rows built by ``elsewhere`` are read by topology.py or a library."""

    HF_TOKEN = Variable(
        "Hugging Face token that may write OUTPUT_REPO (secret: never printed or uploaded)", parse.secret, None
    )
    DATASET_REPO = Variable[tuple[DatasetKind, str | None]](
        "org/name of an HF dataset repo (one .tar/.tar.gz/.zip at its root, or parquet files), or a local folder,"
        " .tar or .zip; inside: YOLO with a data.yaml (Roboflow/Ultralytics exports too) or COCO JSON"
        " (docs/datasets.md; unset: the demo)",
        parse.dataset_source,
        (DatasetKind.DEMO, None),
    )
    OUTPUT_REPO = Variable(
        "org/name of the HF model repo (created private) for the weights, metrics and card; every epoch's"
        " working state goes to CHECKPOINT_BUCKET (unset: the weights stay in WORKDIR)",
        parse.repo_id,
        None,
    )
    RUN_ARGS = Variable(
        "extra `libreyolo train` key=value arguments, e.g. model=LibreYOLO9s.pt epochs=100 imgsz=640",
        plain(run_args.parse),
        RunArgs(),
        '""',
    )
    ON_EXIT = Variable(
        "exit, stop or destroy the instance at the end (stop and destroy use the provider's API key)",
        parse.choice(ExitAction),
        ExitAction.EXIT,
        "exit",
    )
    PRICE_PER_HOUR = Variable(
        "the instance's $/h, for the cost line, the receipt and MAX_COST (default: Vast.ai's or RunPod's price)",
        parse.dollars("2.49", zero_ok=True),
        None,
    )
    MAX_COST = Variable(
        "spending limit in dollars like 25 for the whole run, every attempt's spend together: the run is wrapped"
        " up (exit 82) and released once it is reached",
        parse.dollars("25", zero_ok=False),
        None,
    )
    MAX_PRICE_PER_HOUR = Variable(
        "price ceiling in $/h like 2.50: an instance billing more (the provider's price, else PRICE_PER_HOUR) is"
        " refused at the start, before the dataset (exit 83), and released as ON_FAILURE says",
        parse.dollars("2.50", zero_ok=True),
        None,
    )
    MAX_RUNTIME = Variable(
        "wall-clock limit like 90m or 6h: the run is wrapped up (exit 80) and released; run again to resume",
        parse.optional_duration,
        None,
    )
    HF_HOME = Variable("huggingface_hub's home (default: WORKDIR/.cache/huggingface)", plain(Path), None)
    HF_ENDPOINT = elsewhere("Hub URL, honoured through huggingface_hub", "the public Hub")
    DATASET_FILE = Variable("which tar in the dataset repo (default: the only one at its root)", parse.text, None)
    DATASET_REVISION = Variable(
        "branch, tag or commit of the dataset repo, pinned to a commit at the run's first start (resumes and"
        " extensions keep it)",
        parse.text,
        "main",
        "main",
    )
    DATA_YAML = Variable("which data.yaml, relative to the dataset root (default: the only one)", parse.text, None)
    DATASET_BBOX = Variable(
        "a parquet dataset's box format: xywh (COCO pixels), xyxy or cxcywh; add n for normalised (xywhn ...)",
        parse.choice(BoxFormat),
        BoxFormat.XYWH,
        "xywh",
    )
    GPUS = Variable(
        "all, cpu, or device indices from 0 like 0,1 (GPUS=1 is the second GPU, not one GPU)",
        plain(parse_gpus),
        GpuSelection(),
        "all",
    )
    WORKDIR = Variable(
        "persistent volume root: data/, runs/RUN_NAME/ and the caches",
        parse.workdir,
        Path(DEFAULT_WORKDIR),
        DEFAULT_WORKDIR,
    )
    RUN_NAME = Variable(
        "the run's name on the volume and the Hub (default: derived from the dataset, OUTPUT_REPO and RUN_ARGS"
        " but epochs, so raising epochs extends the run)",
        parse.run_name,
        None,
    )
    STALL_TIMEOUT = Variable[float | None](
        "no sign of progress for this long ends the run as stalled, exit 81 (off disables)",
        parse.optional_duration,
        DEFAULT_STALL_TIMEOUT,
        "30m",
    )
    ON_FAILURE = Variable("ON_EXIT for a failed run (default: ON_EXIT)", parse.choice(ExitAction), ExitAction.EXIT)
    PROVIDER = Variable(
        "auto, vast, runpod or none: whose API stops or destroys this instance", parse.provider, "auto", "auto"
    )
    CONTAINER_ID = Variable("Vast.ai instance id (set by Vast.ai)", parse.text, None)
    CONTAINER_API_KEY = Variable(
        "Vast.ai instance API key, to stop or destroy it (secret; set by Vast.ai)", parse.text, None
    )
    RUNPOD_POD_ID = Variable("RunPod pod id (set by RunPod)", parse.text, None)
    RUNPOD_API_KEY = Variable(
        "RunPod API key, to stop or terminate the pod (secret; set by RunPod)", plain(Secret), None
    )
    VAST_API_KEY = Variable("a Vast.ai account API key (secret: redacted, never passed to training)", parse.text, None)
    VAST_API_URL = Variable("Vast.ai API base URL", parse.api_url, VAST_API_URL, VAST_API_URL)
    RUNPOD_API_URL = Variable("RunPod API base URL", parse.api_url, RUNPOD_API_URL, RUNPOD_API_URL)
    CHECKPOINT_BUCKET = Variable(
        "Storage Bucket for every epoch's working state (default: OUTPUT_REPO + -checkpoints;"
        " off: every epoch is a commit to OUTPUT_REPO)",
        parse.bucket,
        None,
    )
    PUBLISH_EVERY = Variable[float | None](
        "with a bucket: at most one milestone commit to OUTPUT_REPO per this long (off: only at the end;"
        f" under {MIN_PUBLISH_EVERY:.0f}s is raised to it, the Hub's commit limit)",
        parse.optional_duration,
        DEFAULT_PUBLISH_EVERY,
        "10m",
    )
    LEASE_PERIOD = Variable[float | None](
        "one writer per run: a container finding the run's holder quiet this long takes the run over (else it"
        " ends, exit 72); the bucket's fallback and resume's retries take half of it; at most 24h",
        parse.optional_duration,
        DEFAULT_LEASE_PERIOD,
        "2m",
    )
    SQUASH_HISTORY = Variable(
        "CHECKPOINT_BUCKET=off: 1 squashes OUTPUT_REPO's history once the run is done", parse.flag, False, "0"
    )
    NOTIFY = Variable[tuple[Secret, ...]](
        "apprise URLs, comma separated, told of the start and the end (secret; e.g. ntfy://topic)", parse.urls, ()
    )
    NOTIFY_ON = Variable(
        "which messages NOTIFY gets: start,end; end; or all (adds self-heals and storage fallbacks)",
        parse.choice(NotifyOn),
        NotifyOn.START_END,
        "start,end",
    )
    TRACKIO = Variable(
        "a trackio dashboard for the run: a Space id org/name (created private) or a trackio server's URL",
        parse.trackio_target,
        None,
    )
    TRACKIO_PROJECT = Variable("the trackio project (default: OUTPUT_REPO's name, else RUN_NAME)", parse.text, None)
    TRACKIO_WRITE_TOKEN = Variable(
        "a self-hosted trackio server's write token (secret: never printed, logged or uploaded)", parse.secret, None
    )
    EXPORT = Variable[tuple[str, ...] | None](
        "formats made from best.pt at the end of a finished run, scored like it and published beside it:"
        " onnx, openvino, tensorrt (GPU only), torchscript, comma separated, or off (default: onnx with"
        " OUTPUT_REPO, else off)",
        libreyolo.parse_export,
        None,
    )
    EVAL = Variable(
        "1 scores best.pt and each export on the held-out split at the end (eval.json, the card's tables);"
        " 0 scores nothing, with EXPORT=off only (an export is published once it scored like best.pt)",
        parse.flag,
        True,
        "1",
    )
    LICENSE = Variable("the model card's license, a Hub license id (default: the base model's)", parse.license_id, None)
    OOM_RETRIES = Variable(
        "out of GPU memory after an epoch: resume with half the batch, at most this often (0: off)",
        parse.count,
        DEFAULT_OOM_RETRIES,
        "2",
    )
    MONITOR = Variable("1 starts `libreyolo monitor` beside training (port 8420)", parse.flag, False, "0")
    MONITOR_HOST = Variable("address the dashboard binds (the image: 0.0.0.0)", parse.text, "127.0.0.1", "127.0.0.1")
    PROFILE = Variable("1 profiles a few steps first and records the verdict", parse.flag, False, "0")
    HOST_CHECK = Variable(
        "warn, strict or off: the host report's shortfalls are said, end the job (exit 56), or are not measured",
        parse.choice(HostCheck),
        HostCheck.WARN,
        "warn",
    )
    HOST_MIN_GPU_FRACTION = Variable(
        "a card's matmul TFLOP/s under this fraction of its datasheet figure is a shortfall",
        parse.ratio,
        DEFAULT_HOST_MIN_GPU_FRACTION,
        "0.5",
    )
    HOST_MIN_COPY_GBPS = Variable(
        "a host→device copy under this many GB/s is a shortfall", parse.positive, DEFAULT_HOST_MIN_COPY_GBPS, "4"
    )
    HOST_MIN_DISK_MBPS = Variable(
        "a WORKDIR disk writing or reading under this many MB/s is a shortfall",
        parse.positive,
        DEFAULT_HOST_MIN_DISK_MBPS,
        "100",
    )
    NNODES = elsewhere("several machines: how many", "1")
    NODE_RANK = elsewhere("several machines: this one's number, 0 … NNODES-1")
    MASTER_ADDR = elsewhere("several machines: node 0's address")
    MASTER_PORT = elsewhere("several machines: the rendezvous port (the nodes check uses the next one)", "29500")
    HEADLESS_SERVICE = elsewhere("Kubernetes indexed Job: the Service naming pod 0")
    DDP_TIMEOUT = Variable[float | None](
        "several machines: a silent lost node ends the others after this",
        parse.optional_duration,
        topology.DEFAULT_PEER_TIMEOUT,
        "10m",
    )
    RENDEZVOUS_TIMEOUT = Variable[float | None](
        "several machines: how long the nodes wait for each other at the start",
        parse.optional_duration,
        topology.DEFAULT_JOIN_TIMEOUT,
        "15m",
    )
    SKYPILOT_NUM_NODES = elsewhere("set by SkyPilot")
    SKYPILOT_NODE_RANK = elsewhere("set by SkyPilot")
    SKYPILOT_NODE_IPS = elsewhere("set by SkyPilot", '""')
    SKYPILOT_NUM_GPUS_PER_NODE = elsewhere("set by SkyPilot")
    JOB_COMPLETION_INDEX = elsewhere("set by a Kubernetes indexed Job: the node rank")
    HOSTNAME = elsewhere("set by Kubernetes: the pod's name", '""')
    WORLD_SIZE = elsewhere("set by PyTorchJob (one pod per node): the number of nodes")
    RANK = elsewhere("set by PyTorchJob (one pod per node): the node rank")
    PET_NNODES = elsewhere("set by PyTorchJob (torchrun's variables): the number of nodes")
    PET_NODE_RANK = elsewhere("set by PyTorchJob (torchrun's variables): the node rank")
    STOP_FLAT_SPEND = Variable(
        "$ like 5: done once best mAP50-95 rose < STOP_MIN_GAIN over that much", parse.dollars("5", zero_ok=False), None
    )
    STOP_MIN_GAIN = Variable("the mAP50-95 rise STOP_FLAT_SPEND waits for", parse.ratio, DEFAULT_STOP_MIN_GAIN, "0.005")
    TRAINBOX_LIBREYOLO = Variable(
        "the libreyolo command: a wrapper, or a stand-in (default: libreyolo)", parse.text, None
    )
    TRAINBOX_CACHE_DIR = Variable(
        "where libreyolo's train options are kept once asked (the image's; default: WORKDIR/.cache/trainbox)",
        plain(Path),
        None,
    )
    TRAINBOX_GPU_PROBE = Variable(
        "a stand-in script for the GPU check (machines without a GPU: tests)", parse.text, None
    )
    TRAINBOX_RAW_CHECK = Variable(
        "a stand-in for the raw-output check's child, python -m entrypoint.evaluation.rawcheck (tests)",
        parse.text,
        None,
    )
    TRAINBOX_PROC_SELF = Variable("a folder standing in for /proc/self when reading cgroups (tests)", plain(Path), None)
    OMP_NUM_THREADS = elsewhere("threads per training process (default: CPUs granted ÷ processes; yours are kept)")


VARIABLES: tuple[Variable[object], ...] = tuple(row for row in vars(Vars).values() if isinstance(row, Variable))
NAMES = frozenset(row.name for row in VARIABLES)


# Set by a launcher, a provider or the tests, never by a person: --help, --dry-run and docs/configuration.md leave
# them out (docs/development.md lists them).
INTERNAL = frozenset({
    "CONTAINER_ID", "CONTAINER_API_KEY", "RUNPOD_POD_ID", "VAST_API_URL", "RUNPOD_API_URL", "SKYPILOT_NUM_NODES",
    "SKYPILOT_NODE_RANK", "SKYPILOT_NODE_IPS", "SKYPILOT_NUM_GPUS_PER_NODE", "JOB_COMPLETION_INDEX", "HOSTNAME",
    "WORLD_SIZE", "RANK", "PET_NNODES", "PET_NODE_RANK", "TRAINBOX_LIBREYOLO", "TRAINBOX_CACHE_DIR",
    "TRAINBOX_GPU_PROBE", "TRAINBOX_RAW_CHECK", "TRAINBOX_PROC_SELF",
})  # fmt: skip


def variables() -> tuple[Variable[object], ...]:
    """Every row of the table, in order (what ``from_env`` may read)."""
    return VARIABLES


def user_variables() -> tuple[Variable[object], ...]:
    """The rows a person sets, in order (--help, --dry-run, docs/configuration.md)."""
    return tuple(row for row in VARIABLES if row.name not in INTERNAL)


def internal_variables() -> tuple[Variable[object], ...]:
    """The rows a launcher, a provider or the tests set (docs/development.md)."""
    return tuple(row for row in VARIABLES if row.name in INTERNAL)
