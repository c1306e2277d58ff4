"""Environment → one typed, validated, frozen ``Settings``. The only reader of the environment.

``from_env`` reads every variable through the table of variables.py (``Vars``: meaning, parser, the value unset
means, its default as text; a name without a row is refused as a bug) and checks them against each other.
The parsers (and ``Secret``, whose repr is ``***``) are in parsing.py.
"""

from __future__ import annotations

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
    parse_gpus,
)
from .procs import SECRET_PROVIDER_VARS, child_env
from .run_args import RunArgs
from .variables import (
    COMMITS_PER_HOUR,
    DEFAULT_HOST_MIN_COPY_GBPS,
    DEFAULT_HOST_MIN_DISK_MBPS,
    DEFAULT_HOST_MIN_GPU_FRACTION,
    DEFAULT_LEASE_PERIOD,
    DEFAULT_OOM_RETRIES,
    DEFAULT_PUBLISH_EVERY,
    DEFAULT_STOP_MIN_GAIN,
    MAX_LEASE_PERIOD,
    MIN_PUBLISH_EVERY,
    NAMES,
    NotifyOn,
    Vars,
)

__all__ = ["DatasetKind", "ExitAction", "GpuSelection", "HostCheck", "Provider", "parse_gpus"]  # from parsing.py
# RUN_ARGS defaults for the bundled demo (dataset/demo.py draws 128 px images), measured (docs/benchmarks.md) so a CPU
# shows a model that learns within minutes: one warm-up epoch, no mosaic (it shrinks 128 px objects; libreyolo turns it
# off for the last 15 epochs anyway), no PGI auxiliary branch (training-only compute).
DEMO_RUN_ARGS = (
    "model=LibreYOLO9t.pt pretrained=false imgsz=128 epochs=8 warmup_epochs=1 mosaic=0 aux_weight=0 "
    "eval_interval=1 workers=0"
)
# The demo on a CPU, without a batch in RUN_ARGS: batch=-1 keeps 16 there, and 8 gives the same images twice
# the updates (on GPUs batch=-1 still sizes it, and 8 would not split across 3 of them).
DEMO_CPU_BATCH = 8


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
    raw_check: str | None = None  # TRAINBOX_RAW_CHECK: a stand-in for the raw-output check's child (tests)
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
    trackio: str | None = None  # TRACKIO: a Space id or a trackio server's URL (report/dashboard.py)
    trackio_project: str | None = None  # TRACKIO_PROJECT (None: OUTPUT_REPO's name, else RUN_NAME)
    trackio_write_token: Secret | None = None  # TRACKIO_WRITE_TOKEN: a self-hosted server's
    stop_flat_spend: float | None = None  # dollars of training without STOP_MIN_GAIN in mAP50-95 end the run
    stop_min_gain: float = DEFAULT_STOP_MIN_GAIN
    dataset_bbox: BoxFormat = BoxFormat.XYWH  # DATASET_BBOX: a parquet dataset's box format
    export: tuple[str, ...] = ()  # EXPORT: formats made from best.pt at the end of a finished run, checked
    evaluate: bool = True  # EVAL: best.pt and each export scored on the held-out split at the end

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
        values = [self.hf_token, self.provider.api_key, self.trackio_write_token]
        return [secret.reveal() for secret in values if secret is not None]


def from_env(environ: Mapping[str, str], *, options: Mapping[str, str] | None = None) -> Settings:
    """Read and check every variable of the interface; ``options`` are libreyolo's train options."""
    env = Declared(environ, NAMES)
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
        raw_check=Vars.TRAINBOX_RAW_CHECK.read(env),
        proc_self=Vars.TRAINBOX_PROC_SELF.read(env),
        env=child_env(env.given()) | {"HF_HOME": str(hf_home)},
        topology=_topology(env),
        oom_retries=Vars.OOM_RETRIES.read(env),
        checkpoint_bucket=_checkpoint_bucket(env, output_repo),
        publish_every=_publish_every(env),
        squash_history=Vars.SQUASH_HISTORY.read(env),
        lease_period=_lease_period(env),
        host_check=Vars.HOST_CHECK.read(env),
        host_min_gpu_fraction=Vars.HOST_MIN_GPU_FRACTION.read(env),
        host_min_copy_gbps=Vars.HOST_MIN_COPY_GBPS.read(env),
        host_min_disk_mbps=Vars.HOST_MIN_DISK_MBPS.read(env),
        notify=Vars.NOTIFY.read(env),
        notify_on=Vars.NOTIFY_ON.read(env),
        trackio=Vars.TRACKIO.read(env),
        trackio_project=Vars.TRACKIO_PROJECT.read(env),
        trackio_write_token=Vars.TRACKIO_WRITE_TOKEN.read(env),
        stop_flat_spend=Vars.STOP_FLAT_SPEND.read(env),
        stop_min_gain=Vars.STOP_MIN_GAIN.read(env),
        export=_export(env, output_repo, Vars.GPUS.read(env)),
        evaluate=Vars.EVAL.read(env),
    )
    if not settings.evaluate and settings.export:
        raise ConfigError(
            f"EVAL=0 with EXPORT={','.join(settings.export)}: an export is published only once it scored like best.pt",
            "set EXPORT=off as well, or drop EVAL=0",
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
    if settings.trackio is not None and settings.trackio.startswith("http") and settings.trackio_write_token is None:
        raise ConfigError(
            f"TRACKIO={settings.trackio} is a trackio server, and TRACKIO_WRITE_TOKEN is not set",
            "set TRACKIO_WRITE_TOKEN to the server's write token (trackio show prints it)",
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
    env = Declared(environ, NAMES)
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


def _lease_period(env: Mapping[str, str]) -> float:
    """LEASE_PERIOD: off or unset is the default; longer than a day is refused (a lease naming more is read as
    no lease at all, sync/protocol.py)."""
    period = Vars.LEASE_PERIOD.read(env) or DEFAULT_LEASE_PERIOD
    if period > MAX_LEASE_PERIOD:
        raise ConfigError(
            f"LEASE_PERIOD={env['LEASE_PERIOD']} is longer than a day", "use e.g. LEASE_PERIOD=2m (at most 24h)"
        )
    return period


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
