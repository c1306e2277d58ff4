"""Environment → one typed, validated, frozen ``Settings``. The only reader of the environment.

Every bad value is a ``ConfigError`` naming the variable and an example of a good value.
Secrets are held in ``Secret`` (its repr is ``***``) and registered for redaction.
"""

from __future__ import annotations

import enum
import hashlib
import json
import math
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TypeVar

from . import libreyolo, log, run_args, topology
from .errors import ConfigError
from .procs import SECRET_PROVIDER_VARS, child_env
from .run_args import RunArgs

DEFAULT_WORKDIR = "/workspace"
DEFAULT_STALL_TIMEOUT = 30 * 60
# Two halvings reach a quarter of the batch: past that, the memory is not the batch's doing.
DEFAULT_OOM_RETRIES = 2
DEFAULT_PUBLISH_EVERY = 10 * 60
# The host check's floors (README "Is this the machine I paid for?"). A healthy card reaches 60-80 % of
# its dense datasheet matmul figure in a large GEMM; under half, it is throttled or power-capped.
DEFAULT_HOST_MIN_GPU_FRACTION = 0.5
# Pinned host→device copies: PCIe 3.0 x16 gives about 12 GB/s, 4.0 x16 about 25; x4 or an x1 riser under 4.
DEFAULT_HOST_MIN_COPY_GBPS = 4.0
# The dataset is extracted and every checkpoint written there: a local SSD does 500+, a cheap network
# volume 50-100 MB/s, where a 20 GB dataset alone costs minutes.
DEFAULT_HOST_MIN_DISK_MBPS = 100.0
VAST_API_URL = "https://console.vast.ai"
RUNPOD_API_URL = "https://api.runpod.io"  # REST v2; v1 (rest.runpod.io) is retired
# RUN_ARGS defaults for the bundled demo dataset (dataset/demo.py draws its images at 128 px), chosen by
# measurement (docs/benchmarks.md) so a CPU shows a model that learns within minutes: one warm-up epoch, no
# mosaic (it shrinks 128 px objects; libreyolo turns it off for the last 15 epochs anyway), no PGI auxiliary
# branch (training-only compute).
DEMO_RUN_ARGS = (
    "model=LibreYOLO9t.pt pretrained=false imgsz=128 epochs=12 warmup_epochs=1 mosaic=0 aux_weight=0 "
    "eval_interval=1 workers=0"
)
# The demo on a CPU, without a batch in RUN_ARGS: batch=-1 keeps 16 there, and 8 gives the same images twice
# the updates (on GPUs batch=-1 still sizes it, and 8 would not split across 3 of them).
DEMO_CPU_BATCH = 8
_REPO_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,95}/[A-Za-z0-9][A-Za-z0-9._-]{0,95}$")
_RUN_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,95}$")
_DURATION_PART = re.compile(r"(\d+(?:\.\d+)?)([smhd])")
_UNIT_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
_Choice = TypeVar("_Choice", bound=enum.StrEnum)


class Secret:
    """A string that never prints itself."""

    __slots__ = ("_value",)

    def __init__(self, value: str) -> None:
        self._value = value
        log.register_secret(value)

    def reveal(self) -> str:
        return self._value

    def __repr__(self) -> str:
        return "Secret('***')"

    __str__ = __repr__

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Secret) and other._value == self._value

    def __hash__(self) -> int:
        return hash(self._value)


class ExitAction(enum.StrEnum):
    EXIT = "exit"
    STOP = "stop"
    DESTROY = "destroy"


class Provider(enum.StrEnum):
    NONE = "none"
    VAST = "vast"
    RUNPOD = "runpod"


class HostCheck(enum.StrEnum):
    OFF = "off"
    WARN = "warn"
    STRICT = "strict"


class DatasetKind(enum.StrEnum):
    DEMO = "demo"
    LOCAL_DIR = "local_dir"
    LOCAL_TAR = "local_tar"
    HUB = "hub"


@dataclass(frozen=True, kw_only=True)
class GpuSelection:
    """``GPUS``: every visible GPU, the listed indices, or the CPU."""

    cpu: bool = False
    indices: tuple[int, ...] | None = None  # None with cpu False means "all"

    @property
    def all(self) -> bool:
        return not self.cpu and self.indices is None

    def __str__(self) -> str:
        if self.cpu:
            return "cpu"
        return "all" if self.indices is None else ",".join(map(str, self.indices))


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
    max_cost: float | None = None  # dollars; the job is wrapped up once the spend reaches it
    card_license: str | None = None  # LICENSE: the model card's Hub license id
    monitor: bool
    monitor_host: str
    profile: bool
    env: Mapping[str, str] = field(repr=False, compare=False)  # for child processes, secrets removed
    topology: topology.Topology = field(default_factory=topology.Topology)  # one node unless the launcher says
    oom_retries: int = DEFAULT_OOM_RETRIES  # out of GPU memory after an epoch: resumes with half the batch
    checkpoint_bucket: str | None = None  # the working state's Storage Bucket; None: commits to OUTPUT_REPO
    publish_every: float = DEFAULT_PUBLISH_EVERY  # seconds between milestone commits to OUTPUT_REPO (bucket mode)
    squash_history: bool = False  # CHECKPOINT_BUCKET=off: squash OUTPUT_REPO's history once the run is done
    host_check: HostCheck = HostCheck.WARN
    host_min_gpu_fraction: float = DEFAULT_HOST_MIN_GPU_FRACTION
    host_min_copy_gbps: float = DEFAULT_HOST_MIN_COPY_GBPS
    host_min_disk_mbps: float = DEFAULT_HOST_MIN_DISK_MBPS

    @property
    def is_demo(self) -> bool:
        return self.dataset_kind is DatasetKind.DEMO

    @property
    def run_dir(self) -> Path:
        return self.workdir / "runs" / self.run_name

    def secrets(self) -> list[str]:
        values = [self.hf_token, self.provider.api_key]
        return [secret.reveal() for secret in values if secret is not None]


def from_env(env: Mapping[str, str], *, options: Mapping[str, str] | None = None) -> Settings:
    """Read and check every variable of the interface; ``options`` are libreyolo's train options."""
    # compose and templates pass unset variables as empty strings: treat them as unset.
    env = {key: value for key, value in env.items() if value != ""}
    hf_token = _secret(env.get("HF_TOKEN"), "HF_TOKEN")
    for name in SECRET_PROVIDER_VARS:
        log.register_secret(env.get(name))

    dataset_kind, dataset_repo = _dataset(env.get("DATASET_REPO"))
    output_repo = env.get("OUTPUT_REPO")
    if output_repo is not None and not _REPO_ID.match(output_repo):
        raise ConfigError(
            f"OUTPUT_REPO={output_repo!r} is not a repo id", "use org/name, e.g. OUTPUT_REPO=acme/yolo-run"
        )

    workdir = Path(env.get("WORKDIR", DEFAULT_WORKDIR)).expanduser()
    if not workdir.is_absolute():
        workdir = Path.cwd() / workdir
    user_args = run_args.parse(env.get("RUN_ARGS", ""))
    known = dict(options) if options is not None else libreyolo.train_options(workdir / ".cache" / "trainbox")
    run_args.validate(user_args, known)
    effective = user_args
    if dataset_kind is DatasetKind.DEMO:
        effective = user_args.with_defaults(run_args.parse(DEMO_RUN_ARGS))
    if "batch" not in effective:
        effective = effective.set("batch", "-1")

    hf_home = Path(env.get("HF_HOME", str(workdir / ".cache" / "huggingface")))
    on_exit = _choice(env, "ON_EXIT", ExitAction, ExitAction.EXIT)
    settings = Settings(
        hf_token=hf_token,
        dataset_kind=dataset_kind,
        dataset_repo=dataset_repo,
        dataset_file=env.get("DATASET_FILE"),
        dataset_revision=env.get("DATASET_REVISION", "main"),
        data_yaml=env.get("DATA_YAML"),
        output_repo=output_repo,
        user_run_args=user_args,
        run_args=effective,
        gpus=parse_gpus(env.get("GPUS", "all")),
        workdir=workdir,
        hf_home=hf_home,
        run_name=_run_name(env, dataset_repo, output_repo, user_args),
        max_runtime=_optional_duration(env, "MAX_RUNTIME", None),
        stall_timeout=_optional_duration(env, "STALL_TIMEOUT", DEFAULT_STALL_TIMEOUT),
        on_exit=on_exit,
        on_failure=_choice(env, "ON_FAILURE", ExitAction, on_exit),
        provider=_provider(env),
        price_per_hour=_dollars("PRICE_PER_HOUR", env.get("PRICE_PER_HOUR"), "2.49", zero_ok=True),
        max_cost=_dollars("MAX_COST", env.get("MAX_COST"), "25", zero_ok=False),
        monitor=_flag(env, "MONITOR"),
        monitor_host=env.get("MONITOR_HOST", "127.0.0.1"),
        profile=_flag(env, "PROFILE"),
        card_license=_license(env.get("LICENSE")),
        env=child_env(env) | {"HF_HOME": str(hf_home)},
        topology=_topology(env),
        oom_retries=_count(env, "OOM_RETRIES", DEFAULT_OOM_RETRIES),
        checkpoint_bucket=_checkpoint_bucket(env, output_repo),
        publish_every=_optional_duration(env, "PUBLISH_EVERY", DEFAULT_PUBLISH_EVERY) or 0.0,
        squash_history=_flag(env, "SQUASH_HISTORY"),
        host_check=_choice(env, "HOST_CHECK", HostCheck, HostCheck.WARN),
        host_min_gpu_fraction=_ratio(env, "HOST_MIN_GPU_FRACTION", DEFAULT_HOST_MIN_GPU_FRACTION),
        host_min_copy_gbps=_positive(env, "HOST_MIN_COPY_GBPS", DEFAULT_HOST_MIN_COPY_GBPS),
        host_min_disk_mbps=_positive(env, "HOST_MIN_DISK_MBPS", DEFAULT_HOST_MIN_DISK_MBPS),
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
    if settings.max_cost is not None and unpriced:  # with a provider, its price is read at start
        raise ConfigError(
            f"MAX_COST={env['MAX_COST']} needs the instance's price, and no provider here reports one",
            "set PRICE_PER_HOUR to the instance's $/h, e.g. PRICE_PER_HOUR=2.49",
        )
    for action in {settings.on_exit, settings.on_failure} - {ExitAction.EXIT}:
        if settings.provider.provider is Provider.NONE:
            raise ConfigError(
                f"ON_EXIT/ON_FAILURE={action} but no provider was detected",
                "run on Vast.ai or RunPod (their env is read automatically), set PROVIDER, or use ON_EXIT=exit",
            )
    return settings


def _topology(env: Mapping[str, str]) -> topology.Topology:
    """The nodes of this training (topology.py), with its timeouts."""
    found = topology.from_env(env)
    peer = _optional_duration(env, "DDP_TIMEOUT", topology.DEFAULT_PEER_TIMEOUT)
    join = _optional_duration(env, "RENDEZVOUS_TIMEOUT", topology.DEFAULT_JOIN_TIMEOUT)
    return replace(found, peer_timeout=peer or topology.DEFAULT_PEER_TIMEOUT, join_timeout=join or found.join_timeout)


def parse_gpus(value: str) -> GpuSelection:
    text = value.strip().lower()
    if text == "all":
        return GpuSelection()
    if text == "cpu":
        return GpuSelection(cpu=True)
    parts = [part.strip() for part in text.split(",")]
    if not parts or not all(part.isdigit() for part in parts) or len(set(parts)) != len(parts):
        raise ConfigError(f"GPUS={value!r} is not valid", "use GPUS=all, GPUS=cpu or a list of indices like GPUS=0,1")
    return GpuSelection(indices=tuple(int(part) for part in parts))


def parse_duration(value: str, name: str) -> float:
    """``90m``, ``6h``, ``1h30m``, ``45s``, ``2d`` or a plain number of seconds."""
    text = value.strip().lower()
    try:
        seconds = float(text)
    except ValueError:
        parts = _DURATION_PART.findall(text)
        if not parts or "".join(number + unit for number, unit in parts) != text:
            raise ConfigError(f"{name}={value!r} is not a duration", f"use e.g. {name}=90m, 6h or 3600") from None
        seconds = sum(float(number) * _UNIT_SECONDS[unit] for number, unit in parts)
    if seconds < 0:
        raise ConfigError(f"{name}={value!r} is negative", f"use e.g. {name}=90m")
    return seconds


def _optional_duration(env: Mapping[str, str], name: str, default: float | None) -> float | None:
    value = env.get(name)
    if value is None:
        return default
    if value.strip().lower() in {"off", "none", "0"}:
        return None
    return parse_duration(value, name)


def _checkpoint_bucket(env: Mapping[str, str], output_repo: str | None) -> str | None:
    """CHECKPOINT_BUCKET: ns/name, ``off``, or unset (derived from OUTPUT_REPO: ``<repo>-checkpoints``)."""
    value = env.get("CHECKPOINT_BUCKET")
    if value is not None and value.strip().lower() == "off":
        return None
    if value is None:
        return f"{output_repo}-checkpoints" if output_repo is not None else None
    if not _REPO_ID.match(value):
        raise ConfigError(
            f"CHECKPOINT_BUCKET={value!r} is not a bucket id", "use ns/name, e.g. CHECKPOINT_BUCKET=acme/ckpts, or off"
        )
    if output_repo is None:
        raise ConfigError("CHECKPOINT_BUCKET without OUTPUT_REPO", "set OUTPUT_REPO=org/name as well")
    return value


def _secret(value: str | None, name: str) -> Secret | None:
    if value is None:
        return None
    if value.strip() != value or any(ch.isspace() for ch in value):
        raise ConfigError(f"{name} contains whitespace", f"set {name} to the token alone, e.g. {name}=hf_xxx")
    return Secret(value)


def _dataset(value: str | None) -> tuple[DatasetKind, str | None]:
    if value is None:
        return DatasetKind.DEMO, None
    looks_local = value.startswith(("/", "./", "../", "~")) or Path(value).expanduser().exists()
    if looks_local:
        path = Path(value).expanduser().resolve()
        if path.is_dir():
            return DatasetKind.LOCAL_DIR, str(path)
        if path.is_file() and path.name.endswith((".tar", ".tar.gz", ".tgz")):
            return DatasetKind.LOCAL_TAR, str(path)
        raise ConfigError(
            f"DATASET_REPO={value!r} is neither a folder nor a .tar file",
            "point it at a folder holding a data.yaml, a .tar, or a Hub dataset like org/name",
        )
    if not _REPO_ID.match(value):
        raise ConfigError(f"DATASET_REPO={value!r} is not a repo id or a path", "use org/name or an absolute path")
    return DatasetKind.HUB, value


_LICENSE = re.compile(r"^[a-z0-9][a-z0-9.-]{0,63}$")


def _license(value: str | None) -> str | None:
    """A Hub license id (https://huggingface.co/docs/hub/repositories-licenses); the Hub checks the list itself."""
    if value is not None and not _LICENSE.match(value):
        raise ConfigError(f"LICENSE={value!r} is not a Hub license id", "use e.g. LICENSE=apache-2.0, mit or other")
    return value


def _run_name(env: Mapping[str, str], dataset: str | None, output: str | None, args: RunArgs) -> str:
    explicit = env.get("RUN_NAME")
    if explicit is not None:
        if not _RUN_NAME.match(explicit):
            raise ConfigError(f"RUN_NAME={explicit!r} is not valid", "use letters, digits, . _ -, e.g. RUN_NAME=exp1")
        return explicit
    # Same job → same name across restarts, so a restarted container finds its own run.
    identity = json.dumps(
        {
            "dataset": dataset,
            "file": env.get("DATASET_FILE"),
            "data_yaml": env.get("DATA_YAML"),
            "output": output,
            "args": sorted(args.pairs),
        },
        sort_keys=True,
    )
    stem = re.sub(r"[^A-Za-z0-9._-]+", "-", Path(dataset).name if dataset else "demo").strip("-.") or "run"
    return f"{stem[:60]}-{hashlib.sha256(identity.encode()).hexdigest()[:8]}"


def _choice(env: Mapping[str, str], name: str, kind: type[_Choice], default: _Choice) -> _Choice:
    value = env.get(name)
    if value is None:
        return default
    try:
        return kind(value.strip().lower())
    except ValueError:
        allowed = ", ".join(member.value for member in kind)
        raise ConfigError(f"{name}={value!r} is not one of {allowed}", f"e.g. {name}={default}") from None


def _flag(env: Mapping[str, str], name: str) -> bool:
    value = env.get(name, "0").strip().lower()
    if value in {"1", "true", "yes", "on"}:
        return True
    if value in {"0", "false", "no", "off"}:
        return False
    raise ConfigError(f"{name}={value!r} is not 0 or 1", f"e.g. {name}=1")


def _count(env: Mapping[str, str], name: str, default: int) -> int:
    value = env.get(name)
    if value is None:
        return default
    if not value.strip().isdigit():
        raise ConfigError(f"{name}={value!r} is not a whole number", f"e.g. {name}={default}, or 0 to turn it off")
    return int(value.strip())


def _positive(env: Mapping[str, str], name: str, default: float) -> float:
    value = env.get(name)
    if value is None:
        return default
    try:
        number = float(value)
    except ValueError:
        number = math.nan
    if not math.isfinite(number) or number < 0:
        raise ConfigError(f"{name}={value!r} is not a number", f"e.g. {name}={default:g}, or 0 to judge nothing")
    return number


def _ratio(env: Mapping[str, str], name: str, default: float) -> float:
    number = _positive(env, name, default)
    if number > 1:
        raise ConfigError(f"{name}={env[name]!r} is more than 1", f"a fraction, e.g. {name}={default:g}")
    return number


def _dollars(name: str, value: str | None, example: str, *, zero_ok: bool) -> float | None:
    """PRICE_PER_HOUR (0 allowed: a free machine) and MAX_COST (must be positive): finite dollars."""
    if value is None:
        return None
    try:
        dollars = float(value.strip().lstrip("$"))
    except ValueError:
        dollars = math.nan
    if not math.isfinite(dollars) or dollars < 0 or (dollars == 0 and not zero_ok):
        raise ConfigError(f"{name}={value!r} is not an amount of dollars", f"give dollars, e.g. {name}={example}")
    return dollars


def _provider(env: Mapping[str, str]) -> ProviderAccess:
    wanted = env.get("PROVIDER", "auto").strip().lower()
    if wanted not in {"auto", "none", "vast", "runpod"}:
        raise ConfigError(f"PROVIDER={wanted!r} is not one of auto, vast, runpod, none", "e.g. PROVIDER=auto")
    vast_env = {**_proc1_vast_env(), **{k: env[k] for k in ("CONTAINER_ID", "CONTAINER_API_KEY") if k in env}}
    vast = ProviderAccess(
        provider=Provider.VAST,
        instance_id=vast_env.get("CONTAINER_ID"),
        api_key=Secret(vast_env["CONTAINER_API_KEY"]) if "CONTAINER_API_KEY" in vast_env else None,
        api_url=env.get("VAST_API_URL", VAST_API_URL).rstrip("/"),
    )
    runpod = ProviderAccess(
        provider=Provider.RUNPOD,
        instance_id=env.get("RUNPOD_POD_ID"),
        api_key=Secret(env["RUNPOD_API_KEY"]) if "RUNPOD_API_KEY" in env else None,
        api_url=env.get("RUNPOD_API_URL", RUNPOD_API_URL).rstrip("/"),
    )
    for name, url, default in (
        ("VAST_API_URL", vast.api_url, VAST_API_URL),
        ("RUNPOD_API_URL", runpod.api_url, RUNPOD_API_URL),
    ):
        if not url.startswith(("https://", "http://")):
            raise ConfigError(f"{name}={url!r} is not an http(s) URL", f"leave it unset (default {default})")
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


def demo_cpu_batch(settings: Settings, gpu_indices: tuple[int, ...] | None) -> RunArgs | None:
    """The demo on a CPU trains at DEMO_CPU_BATCH, unless RUN_ARGS names a batch."""
    if settings.is_demo and gpu_indices is None and "batch" not in settings.user_run_args:
        return RunArgs((("batch", str(DEMO_CPU_BATCH)),))
    return None
