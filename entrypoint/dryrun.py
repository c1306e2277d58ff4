"""``trainbox run --dry-run``: what the job would do, before anything is spent.

Reads the settings and the run folder on this disk only: no GPU check, no download, no Hub call,
no training, no release. Secrets show as set/unset.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

from .libreyolo import EXPORT_FORMATS, LAST_CHECKPOINT
from .report import dashboard
from .run_args import RunArgs
from .runtimes import fetch
from .settings import DatasetKind, ExitAction, Settings
from .training import resume, sizing
from .training.planned import planned
from .training.process import build_command, device_arg
from .variables import user_variables


def report(settings: Settings, env: dict[str, str]) -> list[str]:
    lines = ["dry run: nothing is checked on the GPU, downloaded, trained, uploaded or released", "", "settings"]
    for var in user_variables():
        value = env.get(var.name) or None
        if var.secret:
            shown = "set" if value else "unset"
        else:
            shown = value if value is not None else f"{var.default} (default)" if var.default else "unset"
        lines.append(f"  {var.name:<18} {shown}")
    lines += ["", f"run name   {settings.run_name}", f"run folder {settings.run_dir}"]
    lines.append(f"dataset    {_dataset(settings)}")
    if settings.output_repo and settings.checkpoint_bucket:
        when = (
            "at the end only (PUBLISH_EVERY=off)" if settings.publish_every is None else "at most every PUBLISH_EVERY"
        )
        lines.append(
            f"output     {settings.output_repo} (created private if missing): the weights, metrics and card {when};"
            f" every epoch's working state to the bucket {settings.checkpoint_bucket}"
        )
    elif settings.output_repo:
        lines.append(f"output     {settings.output_repo} (created private if missing): every epoch is a commit")
    else:
        lines.append("output     none: OUTPUT_REPO is unset, the weights stay in the run folder")
    if settings.topology.multi:
        lines.append(f"nodes      {_nodes(settings)}")
    point_text, args = _resume(settings)
    lines.append(f"resume     {point_text}")
    lines.append(f"training   {planned(args).describe()}")  # what `trainbox plan` prices
    feed = _feed(settings, args)
    lines += _feed_lines(feed)
    lines.append(f"command    + {shlex.join(_command(settings, args, feed.args))}")
    exports = ", ".join(settings.export) or "none"
    lines.append(f"export     {exports}{' (from best.pt, each checked, beside it)' if settings.export else ''}")
    needed = tuple(module for name in settings.export for module in EXPORT_FORMATS[name].modules)
    if fetched := fetch.not_importable(needed):  # not in this image: the start fetches them
        lines.append(f"fetch      {', '.join(fetched)} at the start (pip, into {fetch.root(settings.workdir)})")
    lines.append(f"release    {_release(settings)}")
    lines.append(f"dashboard  {dashboard.where(settings) or 'none (TRACKIO is unset)'}")
    return lines


def _nodes(settings: Settings) -> str:
    top = settings.topology
    role = "writes OUTPUT_REPO" if top.leader else "reads OUTPUT_REPO only"
    return (
        f"node {top.node_rank} of {top.nnodes} ({top.source}, {role}); meets the others at "
        f"{top.master_addr}:{top.store_port}, then torchrun at {top.master_addr}:{top.master_port}"
    )


def _dataset(settings: Settings) -> str:
    if settings.dataset_kind is DatasetKind.DEMO:
        return "the bundled demo (generated into WORKDIR/data/demo)"
    if settings.dataset_kind is DatasetKind.HUB:
        file = settings.dataset_file or "the only tar at the repo root"
        return (
            f"{settings.dataset_repo} @ {settings.dataset_revision} (pinned to a commit at start), {file},"
            f" data.yaml: {settings.data_yaml or 'the only one'}"
        )
    return f"{settings.dataset_repo} (local {settings.dataset_kind.value.replace('local_', '')})"


def _resume(settings: Settings) -> tuple[str, RunArgs]:
    args = settings.run_args
    if args.get("resume") is not None:
        return "RUN_ARGS sets resume: the agent leaves resuming to you", args
    found = resume.newest_local(settings.run_dir)
    hub = f"; {settings.output_repo}'s newest checkpoint is compared at start" if settings.output_repo else ""
    if found is None:
        return f"no checkpoint of {settings.run_name} on this disk{hub}; otherwise a fresh start", args
    path, info = found
    total = resume._requested_epochs(args, info)
    done = info.completed_epochs or 0
    if done >= total:
        return f"{path.name} on this disk has all {total} epochs: nothing would be trained", args
    if info.total_epochs is not None and total > info.total_epochs:
        text = f"extend the run from {info.total_epochs} to {total} epochs: continue from {path.name}, epoch {done}"
        return text + hub, resume.resume_args(args, _point(settings, done, total))
    point = _point(settings, done, total)
    return f"continue from {path.name} on this disk, epoch {done} of {total}{hub}", resume.resume_args(args, point)


def _point(settings: Settings, done: int, total: int) -> resume.ResumePoint:
    checkpoint = settings.run_dir / LAST_CHECKPOINT
    return resume.ResumePoint(checkpoint=checkpoint, completed_epochs=done, total_epochs=total, source="volume")


def _gpus_seen(settings: Settings) -> tuple[int, ...] | None:
    """The GPUs the training would get, as far as a dry run can tell without CUDA: GPUS's list, else the
    device nodes (``/dev/nvidiaN``); None: the CPU."""
    if settings.gpus.cpu:
        return None
    if settings.gpus.indices is not None:
        return settings.gpus.indices
    found = sorted(int(m[1]) for p in Path("/dev").glob("nvidia*") if (m := re.fullmatch(r"nvidia(\d+)", p.name)))
    return tuple(found) or None


def _feed(settings: Settings, args: RunArgs) -> sizing.Feed:
    """Threads and workers as the training would get them; the cache is weighed once the dataset is there."""
    return sizing.for_job(settings, args, _gpus_seen(settings), None)


def _feed_lines(feed: sizing.Feed) -> list[str]:
    record = feed.record
    threads = record["threads"]
    processes = record["processes"]
    each = f"each of {processes} training processes" if processes > 1 else "the training process"
    chosen = threads["set"] if threads["source"] == "user" else feed.env
    shown = " ".join(f"{name}={value}" for name, value in chosen.items())
    thread_text = f"{shown} {'as you set them' if threads['source'] == 'user' else 'sized'}, in {each}"
    workers = record["workers"]
    why = workers.get("why") or f"set by {workers['source']}"
    cache = record["cache"]
    if cache["source"] != "sized":
        cache_text = f"{cache['value']} (set by {cache['source']})"
    elif workers["value"] == 0:
        cache_text = "ram when the decoded images fit in memory (weighed once the dataset is in place), else off"
    else:
        cache_text = f"off: {cache['why']}"
    return [
        f"cpus       {record['cpus']['cpus']} granted (affinity {record['cpus']['affinity']}, "
        + (f"cgroup quota {record['cpus']['quota']:g})" if record["cpus"]["quota"] is not None else "no CPU quota)"),
        f"threads    {thread_text}",
        f"workers    {workers['value']} ({why})",
        f"cache      {cache_text}",
    ]


def _command(settings: Settings, args: RunArgs, extra: RunArgs) -> list[str]:
    if settings.gpus.cpu:
        device = "cpu"
    elif settings.gpus.indices is not None:
        device = device_arg(settings.gpus.indices)
    else:
        device = "<every GPU the check proves, e.g. 0,1>"
    # The real path holds the dataset's commit, known only once the dataset stage ran.
    folder = "demo" if settings.is_demo else "<dataset>"
    data_yaml = settings.workdir / "data" / folder / "data.yaml"
    command = build_command(
        args,
        data_yaml=data_yaml,
        workdir=settings.workdir,
        run_name=settings.run_name,
        device=device,
        extra=extra,
        libreyolo_command=settings.libreyolo_command,
    )
    return list(command.argv)


def _release(settings: Settings) -> str:
    def say(action: ExitAction) -> str:
        if action is ExitAction.EXIT:
            return "exit (the agent ends; a marketplace instance keeps billing until you stop it)"
        instance = settings.provider.instance_id or "?"
        return f"{action} {settings.provider.provider} instance {instance}, confirmed with the provider"

    text = f"on success: {say(settings.on_exit)}"
    if settings.on_failure is not settings.on_exit:
        text += f"; on failure: {say(settings.on_failure)}"
    return text
