# over 500 lines: the one table of variables (Vars), the typed Settings and their one reader belong together
"""Environment → one typed, validated, frozen ``Settings``. The only reader of the environment.

``Vars`` is the table of every variable the agent reads: its meaning, its parser, the value unset
means and that default as text. ``from_env`` reads through it (a name without a row is refused as a
bug); ``trainbox --help``, ``trainbox run --dry-run``, docs/configuration.md and README.md print its rows.
The parsers (and ``Secret``, whose repr is ``***``) are in parsing.py.
"""

from __future__ import annotations

import enum
import hashlib
import json
import os
import re
from collections.abc import Mapping, MutableMapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import NamedTuple

from . import libreyolo, log, run_args, topology
from . import parsing as parse
from .errors import ConfigError
from .parsing import (
    BoxFormat,
    DatasetKind,
    Declared,
    ExitAction,
    GpuSelection,
    HostCheck,
    Provider,
    Secret,
    Variable,
    elsewhere,
    parse_gpus,
    plain,
)
from .procs import SECRET_PROVIDER_VARS, child_env
from .run_args import RunArgs

__all__ = ["DatasetKind", "ExitAction", "GpuSelection", "HostCheck", "Provider", "parse_gpus"]  # from parsing.py
DEFAULT_WORKDIR = "/workspace"
DEFAULT_STALL_TIMEOUT = 30 * 60
# Two halvings reach a quarter of the batch: past that, the memory is not the batch's doing.
DEFAULT_OOM_RETRIES = 2
DEFAULT_PUBLISH_EVERY = 10 * 60
# One writer per run: a quiet holder's lease is taken over after this (sync/protocol.py says why two minutes).
DEFAULT_LEASE_PERIOD = 2 * 60.0
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
# RUN_ARGS defaults for the bundled demo (dataset/demo.py draws 128 px images), measured (docs/benchmarks.md) so a CPU
# shows a model that learns within minutes: one warm-up epoch, no mosaic (it shrinks 128 px objects; libreyolo turns it
# off for the last 15 epochs anyway), no PGI auxiliary branch (training-only compute).
DEMO_RUN_ARGS = (
    "model=LibreYOLO9t.pt pretrained=false imgsz=128 epochs=12 warmup_epochs=1 mosaic=0 aux_weight=0 "
    "eval_interval=1 workers=0"
)
# The demo on a CPU, without a batch in RUN_ARGS: batch=-1 keeps 16 there, and 8 gives the same images twice
# the updates (on GPUs batch=-1 still sizes it, and 8 would not split across 3 of them).
DEMO_CPU_BATCH = 8


class NotifyOn(enum.StrEnum):  # which messages NOTIFY gets (a self-heal or a storage fallback only with all)
    START_END = "start,end"
    END = "end"
    ALL = "all"


class Lookout(NamedTuple):  # what `trainbox status` reads: its run on this machine, or the Hub's token and bucket
    workdir: Path
    run_name: str | None
    hf_token: Secret | None
    checkpoint_bucket: str | None  # with --repo: where to look when the repo's trainbox.json does not say


@dataclass(frozen=True, kw_only=True)
class ProviderAccess:
    """What the agent needs to end the instance's bill; ``api_key`` is a secret."""

    provider: Provider
    instance_id: str | None = None
    api_key: Secret | None = None
    api_url: str = ""


@dataclass(frozen=True, kw_only=True)
class Settings:
    hf_token: Secret | None
    dataset_kind: DatasetKind
    dataset_repo: str | None  # org/name, or the local path for local datasets
    dataset_file: str | None
    dataset_revision: str
    data_yaml: str | None
    output_repo: str | None
    user_run_args: RunArgs  # exactly what RUN_ARGS said
    run_args: RunArgs  # what libreyolo gets besides the agent-owned keys (demo defaults, batch=-1)
    gpus: GpuSelection
    workdir: Path
    hf_home: Path
    run_name: str
    max_runtime: float | None  # seconds
    stall_timeout: float | None  # seconds; None disables the guard
    on_exit: ExitAction
    on_failure: ExitAction
    provider: ProviderAccess
    price_per_hour: float | None
    max_cost: float | None = None  # dollars; the job is wrapped up once the run's spend reaches it
    max_price_per_hour: float | None = None  # $/h; an instance billing more is refused at the start
    card_license: str | None = None  # LICENSE: the model card's Hub license id
    libreyolo_command: str | None = None  # TRAINBOX_LIBREYOLO: a wrapper (or the tests' stand-in) for `libreyolo`
    cache_dir: Path | None = None  # TRAINBOX_CACHE_DIR: libreyolo's train options, answered once
    gpu_probe: str | None = None  # TRAINBOX_GPU_PROBE: a stand-in GPU check script (machines without a GPU)
    proc_self: Path | None = None  # TRAINBOX_PROC_SELF: a folder standing in for /proc/self (cgroup readings)
    hub_url: str = "https://huggingface.co"  # HF_ENDPOINT: where a person finds the repo (huggingface_hub reads it too)
    monitor: bool
    monitor_host: str
    profile: bool
    env: Mapping[str, str] = field(repr=False, compare=False)  # for child processes, secrets removed
    topology: topology.Topology = field(default_factory=topology.Topology)  # one node unless the launcher says
    oom_retries: int = DEFAULT_OOM_RETRIES  # out of GPU memory after an epoch: resumes with half the batch
    checkpoint_bucket: str | None = None  # the working state's Storage Bucket; None: commits to OUTPUT_REPO
    # Seconds between milestone commits to OUTPUT_REPO (bucket mode); None: only at the end.
    publish_every: float | None = DEFAULT_PUBLISH_EVERY
    workdir_given: bool = False  # WORKDIR was set, not defaulted: `trainbox sync` keeps its work there
    dataset_revision_given: bool = False  # DATASET_REVISION was set: a resume compares it with the run's commit
    lease_period: float = DEFAULT_LEASE_PERIOD  # one writer per run: sync/lease.py
    squash_history: bool = False  # CHECKPOINT_BUCKET=off: squash OUTPUT_REPO's history once the run is done
    host_check: HostCheck = HostCheck.WARN
    host_min_gpu_fraction: float = DEFAULT_HOST_MIN_GPU_FRACTION
    host_min_copy_gbps: float = DEFAULT_HOST_MIN_COPY_GBPS
    host_min_disk_mbps: float = DEFAULT_HOST_MIN_DISK_MBPS
    notify: tuple[Secret, ...] = ()  # NOTIFY: apprise URLs (secrets: a webhook URL carries its channel's key)
    notify_on: NotifyOn = NotifyOn.START_END
    stop_flat_spend: float | None = None  # dollars of training without STOP_MIN_GAIN in mAP50-95 end the run
    stop_min_gain: float = DEFAULT_STOP_MIN_GAIN
    dataset_bbox: BoxFormat = BoxFormat.XYWH  # DATASET_BBOX: a parquet dataset's box format
    export: tuple[str, ...] = ()  # EXPORT: formats made from best.pt at the end of a finished run, checked

    @property
    def is_demo(self) -> bool:
        return self.dataset_kind is DatasetKind.DEMO

    @property
    def run_dir(self) -> Path:
        return self.workdir / "runs" / self.run_name

    @property
    def agent_dir(self) -> Path:
        """The agent's own files for this run (staging, scratch): beside the run folder, never uploaded."""
        return self.workdir / ".trainbox" / self.run_name

    def record(self) -> dict[str, object]:
        """What trainbox.json records of the choices (no secret among them); ``identity``: what defines the run."""
        return {
            "dataset": self.dataset_repo or "demo",
            "output_repo": self.output_repo,
            "run_args": str(self.run_args),
            "gpus": str(self.gpus),
            "nodes": self.topology.describe(),
            "identity": self.identity(),
        }

    def identity(self) -> dict[str, str | None]:
        """What makes this run this run (the derived RUN_NAME's inputs): another value is another run."""
        return {
            "DATASET_REPO": self.dataset_repo,
            "DATASET_FILE": self.dataset_file,
            "DATA_YAML": self.data_yaml,
            "OUTPUT_REPO": self.output_repo,
            "RUN_ARGS": str(self.user_run_args.defining()),
        }

    def secrets(self) -> list[str]:
        values = [self.hf_token, self.provider.api_key]
        return [secret.reveal() for secret in values if secret is not None]


class Vars:
    """Every variable the agent reads, in the order --help, --dry-run and docs/configuration.md list them (the
    eight most people set first): meaning, parser, unset value, default text. A row's ``read(env)`` is its typed
    value; rows built by ``elsewhere`` are read by topology.py or a library."""

    HF_TOKEN = Variable(
        "Hugging Face token that may write OUTPUT_REPO (secret: never printed or uploaded)", parse.secret, None
    )
    DATASET_REPO = Variable[tuple[DatasetKind, str | None]](
        "org/name of an HF dataset repo holding the dataset as one tar, or a local folder / .tar (unset: the demo)",
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
        " ends, exit 72); the bucket's fallback and resume's retries take half of it",
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
    EXPORT = Variable[tuple[str, ...] | None](
        "formats made from best.pt at the end of a finished run, checked against it and published beside it:"
        " onnx, openvino, tensorrt (GPU only), torchscript, comma separated, or off (default: onnx with"
        " OUTPUT_REPO, else off)",
        libreyolo.parse_export,
        None,
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
    TRAINBOX_PROC_SELF = Variable("a folder standing in for /proc/self when reading cgroups (tests)", plain(Path), None)
    OMP_NUM_THREADS = elsewhere("threads per training process (default: CPUs granted ÷ processes; yours are kept)")


VARIABLES: tuple[Variable[object], ...] = tuple(row for row in vars(Vars).values() if isinstance(row, Variable))
_NAMES = frozenset(row.name for row in VARIABLES)


# Set by a launcher, a provider or the tests, never by a person: --help, --dry-run and docs/configuration.md leave
# them out (docs/development.md lists them).
INTERNAL = frozenset({
    "CONTAINER_ID", "CONTAINER_API_KEY", "RUNPOD_POD_ID", "VAST_API_URL", "RUNPOD_API_URL", "SKYPILOT_NUM_NODES",
    "SKYPILOT_NODE_RANK", "SKYPILOT_NODE_IPS", "SKYPILOT_NUM_GPUS_PER_NODE", "JOB_COMPLETION_INDEX", "HOSTNAME",
    "WORLD_SIZE", "RANK", "PET_NNODES", "PET_NODE_RANK", "TRAINBOX_LIBREYOLO", "TRAINBOX_CACHE_DIR",
    "TRAINBOX_GPU_PROBE", "TRAINBOX_PROC_SELF",
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


def from_env(environ: Mapping[str, str], *, options: Mapping[str, str] | None = None) -> Settings:
    """Read and check every variable of the interface; ``options`` are libreyolo's train options."""
    env = Declared(environ, _NAMES)
    hf_token = Vars.HF_TOKEN.read(env)
    for name in SECRET_PROVIDER_VARS:
        log.register_secret(env.get(name))

    dataset_kind, dataset_repo = Vars.DATASET_REPO.read(env)
    output_repo = Vars.OUTPUT_REPO.read(env)
    workdir = Vars.WORKDIR.read(env)
    user_args = Vars.RUN_ARGS.read(env)
    command, cache_dir = Vars.TRAINBOX_LIBREYOLO.read(env), Vars.TRAINBOX_CACHE_DIR.read(env)
    cache_dir = cache_dir or workdir / ".cache" / "trainbox"
    known = dict(options) if options is not None else libreyolo.train_options(cache_dir, command)
    run_args.validate(user_args, known)
    effective = user_args
    if dataset_kind is DatasetKind.DEMO:
        effective = user_args.with_defaults(run_args.parse(DEMO_RUN_ARGS))
    if "batch" not in effective:
        effective = effective.set("batch", "-1")
    run_args.check_values(effective)  # epochs, batch, imgsz, model: refused here, before anything is spent

    hf_home = Vars.HF_HOME.read(env) or workdir / ".cache" / "huggingface"
    on_exit = Vars.ON_EXIT.read(env)
    dataset_file, data_yaml = Vars.DATASET_FILE.read(env), Vars.DATA_YAML.read(env)
    settings = Settings(
        hf_token=hf_token,
        dataset_kind=dataset_kind,
        dataset_repo=dataset_repo,
        dataset_file=dataset_file,
        dataset_revision=Vars.DATASET_REVISION.read(env),
        dataset_bbox=Vars.DATASET_BBOX.read(env),
        data_yaml=data_yaml,
        output_repo=output_repo,
        user_run_args=user_args,
        run_args=effective,
        gpus=Vars.GPUS.read(env),
        workdir=workdir,
        workdir_given="WORKDIR" in env,
        dataset_revision_given="DATASET_REVISION" in env,
        hf_home=hf_home,
        run_name=Vars.RUN_NAME.read(env)
        or _derived_name(workdir, dataset_repo, dataset_file, data_yaml, output_repo, args=user_args),
        max_runtime=Vars.MAX_RUNTIME.read(env),
        stall_timeout=Vars.STALL_TIMEOUT.read(env),
        on_exit=on_exit,
        on_failure=Vars.ON_FAILURE.read_or(env, on_exit),
        provider=_provider(env),
        price_per_hour=Vars.PRICE_PER_HOUR.read(env),
        max_cost=Vars.MAX_COST.read(env),
        max_price_per_hour=Vars.MAX_PRICE_PER_HOUR.read(env),
        monitor=Vars.MONITOR.read(env),
        monitor_host=Vars.MONITOR_HOST.read(env),
        profile=Vars.PROFILE.read(env),
        card_license=Vars.LICENSE.read(env),
        hub_url=env.get("HF_ENDPOINT", "https://huggingface.co").rstrip("/"),
        libreyolo_command=command,
        cache_dir=cache_dir,
        gpu_probe=Vars.TRAINBOX_GPU_PROBE.read(env),
        proc_self=Vars.TRAINBOX_PROC_SELF.read(env),
        env=child_env(env.given()) | {"HF_HOME": str(hf_home)},
        topology=_topology(env),
        oom_retries=Vars.OOM_RETRIES.read(env),
        checkpoint_bucket=_checkpoint_bucket(env, output_repo),
        publish_every=_publish_every(env),
        squash_history=Vars.SQUASH_HISTORY.read(env),
        lease_period=Vars.LEASE_PERIOD.read(env) or DEFAULT_LEASE_PERIOD,
        host_check=Vars.HOST_CHECK.read(env),
        host_min_gpu_fraction=Vars.HOST_MIN_GPU_FRACTION.read(env),
        host_min_copy_gbps=Vars.HOST_MIN_COPY_GBPS.read(env),
        host_min_disk_mbps=Vars.HOST_MIN_DISK_MBPS.read(env),
        notify=Vars.NOTIFY.read(env),
        notify_on=Vars.NOTIFY_ON.read(env),
        stop_flat_spend=Vars.STOP_FLAT_SPEND.read(env),
        stop_min_gain=Vars.STOP_MIN_GAIN.read(env),
        export=_export(env, output_repo, Vars.GPUS.read(env)),
    )
    if settings.squash_history and settings.checkpoint_bucket is not None:
        raise ConfigError(
            "SQUASH_HISTORY=1 squashes a repo that holds every epoch; with a bucket the repo holds a few milestones",
            "set CHECKPOINT_BUCKET=off with SQUASH_HISTORY=1, or drop SQUASH_HISTORY",
        )
    if ExitAction.DESTROY in {settings.on_exit, settings.on_failure} and settings.output_repo is None:
        raise ConfigError(
            "ON_EXIT/ON_FAILURE=destroy without OUTPUT_REPO would delete the weights with the machine",
            "set OUTPUT_REPO=org/name, or use ON_EXIT=stop",
        )
    if settings.topology.multi and settings.output_repo is None:
        raise ConfigError(
            f"{settings.topology.nnodes} nodes without OUTPUT_REPO: node 0's weights and the resume point have no home",
            "set OUTPUT_REPO=org/name (every node reads it, node 0 writes it)",
        )
    launcher = settings.topology.source in {"skypilot", "kubernetes", "pytorchjob"}
    if launcher and {settings.on_exit, settings.on_failure} != {ExitAction.EXIT}:
        raise ConfigError(
            f"ON_EXIT/ON_FAILURE other than exit on {settings.topology.source} nodes: the launcher owns these"
            " machines and would recover (and bill) what the agent stopped",
            "use ON_EXIT=exit and ON_FAILURE=exit; the launcher ends the machines when the job ends",
        )
    unpriced = settings.price_per_hour is None and settings.provider.provider is Provider.NONE
    # dollars; with a provider, its price is read at start
    for name in ("MAX_COST", "STOP_FLAT_SPEND", "MAX_PRICE_PER_HOUR"):
        if name in env and unpriced:
            raise ConfigError(
                f"{name}={env[name]} needs the instance's price, and no provider here reports one",
                "set PRICE_PER_HOUR to the instance's $/h, e.g. PRICE_PER_HOUR=2.49",
            )
    for action in {settings.on_exit, settings.on_failure} - {ExitAction.EXIT}:
        if settings.provider.provider is Provider.NONE:
            raise ConfigError(
                f"ON_EXIT/ON_FAILURE={action} but no provider was detected",
                "run on Vast.ai or RunPod (their env is read automatically), set PROVIDER, or use ON_EXIT=exit",
            )
    _refuse_unusable(settings)
    return settings


def _refuse_unusable(settings: Settings) -> None:
    """GPUS indices this machine has no GPU for, NOTIFY services apprise does not know (parsing.py)."""
    if settings.gpu_probe is None and settings.gpus.indices is not None:
        parse.check_gpus(settings.gpus, parse.visible_gpus())
    if settings.notify:
        parse.check_notify("NOTIFY", settings.notify)


def lookout_from_env(environ: Mapping[str, str], repo_id: str | None = None) -> Lookout:
    """What `trainbox status` reads (no job's settings): WORKDIR, RUN_NAME, HF_TOKEN, with --repo CHECKPOINT_BUCKET."""
    env = Declared(environ, _NAMES)
    bucket = _checkpoint_bucket(env, repo_id) if repo_id is not None else None
    return Lookout(Vars.WORKDIR.read(env), Vars.RUN_NAME.read(env), Vars.HF_TOKEN.read(env), bucket)


def _topology(env: Mapping[str, str]) -> topology.Topology:
    """The nodes of this training (topology.py), with its timeouts."""
    found = topology.from_env(env)
    peer, join = Vars.DDP_TIMEOUT.read(env), Vars.RENDEZVOUS_TIMEOUT.read(env)
    return replace(found, peer_timeout=peer or topology.DEFAULT_PEER_TIMEOUT, join_timeout=join or found.join_timeout)


def _checkpoint_bucket(env: Mapping[str, str], output_repo: str | None) -> str | None:
    """CHECKPOINT_BUCKET: ns/name, ``off``, or unset (derived from OUTPUT_REPO: ``<repo>-checkpoints``)."""
    derived = f"{output_repo}-checkpoints" if output_repo is not None else None
    if "CHECKPOINT_BUCKET" not in env:
        return derived
    value = Vars.CHECKPOINT_BUCKET.read(env)
    if value is not None and output_repo is None:
        raise ConfigError("CHECKPOINT_BUCKET without OUTPUT_REPO", "set OUTPUT_REPO=org/name as well")
    return value


def _export(env: Mapping[str, str], output_repo: str | None, gpus: GpuSelection) -> tuple[str, ...]:
    """EXPORT, or its default: ONNX when there is a repo to publish it to (its packages fetched at the start), so a
    finished run's page offers the format most runtimes load; without a repo none (nobody gets a file)."""
    formats = Vars.EXPORT.read(env)
    if formats is None:
        formats = ("onnx",) if output_repo is not None else ()
    libreyolo.check_export_gpu(formats, has_gpu=not gpus.cpu)  # GPUS=all on a machine without one: the GPU check
    libreyolo.check_export_installed(formats)
    return formats


def _publish_every(env: Mapping[str, str]) -> float | None:
    """PUBLISH_EVERY: off (None) publishes only at the end; more often than the Hub's commit budget allows is
    raised to its floor, said in one line."""
    every = Vars.PUBLISH_EVERY.read(env)
    if every is not None and every < MIN_PUBLISH_EVERY:
        log.logger.warning(
            "PUBLISH_EVERY=%s is more often than the Hub allows commits (%d an hour for the agent):"
            " milestones go at most every %.0f s",
            env["PUBLISH_EVERY"],
            COMMITS_PER_HOUR,
            MIN_PUBLISH_EVERY,
        )
        return MIN_PUBLISH_EVERY
    return every


def _derived_name(workdir: Path, *identity: str | None, args: RunArgs) -> str:
    """Same run → same name across restarts; ``epochs`` is left out (raising it extends the run). A volume holding
    the run under the name that included ``epochs`` (Trainbox 0.1.0) keeps it: a newer image continues it there."""
    name, legacy = _run_name(identity, args.defining()), _run_name(identity, args)
    runs = workdir / "runs"
    if legacy != name and not (runs / name).exists() and (runs / legacy / "trainbox.json").is_file():
        log.logger.info("run %s: the name an older Trainbox derived for these settings, found on this volume", legacy)
        return legacy
    return name


def _run_name(identity: tuple[str | None, ...], args: RunArgs) -> str:
    dataset, file, data_yaml, output = identity
    text = json.dumps(
        {"dataset": dataset, "file": file, "data_yaml": data_yaml, "output": output, "args": sorted(args.pairs)},
        sort_keys=True,
    )
    stem = re.sub(r"[^A-Za-z0-9._-]+", "-", Path(dataset).name if dataset else "demo").strip("-.") or "run"
    return f"{stem[:60]}-{hashlib.sha256(text.encode()).hexdigest()[:8]}"


def _provider(env: Mapping[str, str]) -> ProviderAccess:
    wanted = Vars.PROVIDER.read(env)
    given = {name: value for name in ("CONTAINER_ID", "CONTAINER_API_KEY") if (value := env.get(name)) is not None}
    vast_env = {**_proc1_vast_env(), **given}
    vast = ProviderAccess(
        provider=Provider.VAST,
        instance_id=Vars.CONTAINER_ID.read(vast_env),
        api_key=Secret(vast_env["CONTAINER_API_KEY"]) if "CONTAINER_API_KEY" in vast_env else None,
        api_url=Vars.VAST_API_URL.read(env),
    )
    runpod = ProviderAccess(
        provider=Provider.RUNPOD,
        instance_id=Vars.RUNPOD_POD_ID.read(env),
        api_key=Vars.RUNPOD_API_KEY.read(env),
        api_url=Vars.RUNPOD_API_URL.read(env),
    )
    if wanted == "none":
        return ProviderAccess(provider=Provider.NONE)
    candidates = {"vast": [vast], "runpod": [runpod], "auto": [vast, runpod]}[wanted]
    for candidate in candidates:
        if candidate.instance_id and candidate.api_key:
            return candidate
    if wanted != "auto":
        names = "CONTAINER_ID and CONTAINER_API_KEY" if wanted == "vast" else "RUNPOD_POD_ID and RUNPOD_API_KEY"
        raise ConfigError(f"PROVIDER={wanted} but {names} are not set", f"set {names}, or PROVIDER=auto")
    return ProviderAccess(provider=Provider.NONE)


def _proc1_vast_env() -> dict[str, str]:
    """Vast.ai puts its variables in PID 1's environment; SSH sessions don't inherit them."""
    if os.getpid() == 1:
        return {}
    try:
        raw = Path("/proc/1/environ").read_bytes()
    except OSError:
        return {}
    pairs = (item.partition(b"=") for item in raw.split(b"\0") if item)
    found = {key.decode(errors="replace"): value.decode(errors="replace") for key, _, value in pairs}
    return {k: found[k] for k in ("CONTAINER_ID", "CONTAINER_API_KEY") if found.get(k)}


# hf_xet reads these when its session starts (see ``load``).
_XET_FETCH = "HF_XET_RECONSTRUCTION_MIN_RECONSTRUCTION_FETCH_SIZE"
_XET_BUFFER = {
    "HF_XET_RECONSTRUCTION_DOWNLOAD_BUFFER_SIZE": "32mb",
    "HF_XET_RECONSTRUCTION_DOWNLOAD_BUFFER_PERFILE_SIZE": "32mb",
    "HF_XET_RECONSTRUCTION_MAX_RECONSTRUCTION_FETCH_SIZE": "16mb",
}
# hf_xet's CAS client retries each request up to 5 times, 3 s apart and growing: minutes on a failing CAS.
# Two quick retries ride out a blip; the rest is ours (hub.with_retries).
_XET_RETRIES = {"HF_XET_CLIENT_RETRY_MAX_ATTEMPTS": "2", "HF_XET_CLIENT_RETRY_BASE_DELAY": "100ms"}


def load(environ: MutableMapping[str, str], *, quiet_transfers: bool = False) -> Settings:
    """``from_env``, then the defaults the agent writes into its own environment for the libraries (and
    every child) that read it themselves; a value the user set wins. Called before huggingface_hub is
    imported. ``quiet_transfers``: no progress bars (the uploader works beside training's log)."""
    if quiet_transfers:
        environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    loaded = from_env(environ)
    # huggingface_hub and hf_xet read HF_HOME/HF_XET_CACHE when imported: on the volume first, for every child
    # too (the container disk is small and lost).
    environ.setdefault("HF_HOME", str(loaded.hf_home))
    environ.setdefault("HF_XET_CACHE", str(Path(environ["HF_HOME"]) / "xet"))
    # hf_xet plans a file's reconstruction in steps of at least 256 MB by default, so a streamed dataset's
    # first byte waits for that much; 16 MB steps start the extraction sooner (same total time measured).
    environ.setdefault(_XET_FETCH, "16mb")
    # hf_xet keeps fetched data in RAM up to its download buffer, 2 GB + 512 MB per file by default, so the
    # agent's peak grew with the tar (bench/xet_memory.py). 64 MB in all keeps it flat, beside the training's
    # data loaders; hf_xet clamps a larger term's request to the whole buffer, so nothing waits forever.
    # Steps of at most 16 MB (not whole ~64 MB xorb ranges) also cut what hf_xet hands over at once: the
    # piece, compressed, decompressed and copied to Python, ~110 MB less at the peak, same speed measured.
    for name, size in {**_XET_BUFFER, **_XET_RETRIES}.items():
        environ.setdefault(name, size)
    kept = ("HF_XET_CACHE", _XET_FETCH, *_XET_BUFFER, *_XET_RETRIES)
    return replace(loaded, env={**loaded.env, **{name: environ[name] for name in kept}})


def dataset_named(environ: Mapping[str, str]) -> bool:
    """DATASET_REPO is set (``trainbox plan`` then weighs that dataset's tar)."""
    return bool(environ.get("DATASET_REPO"))


def debugging(environ: Mapping[str, str]) -> bool:
    """TRAINBOX_DEBUG=1: an unexpected error's traceback is logged too."""
    return environ.get("TRAINBOX_DEBUG") == "1"
