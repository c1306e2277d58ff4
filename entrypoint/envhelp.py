"""The environment variables for ``--help``, found in settings.py itself so the list cannot drift.

``settings.from_env`` is the only reader of the environment; every name it reads appears there as
a string literal next to ``env`` (``env.get("X", default)``, ``_flag(env, "X")``, ``"X" in env`` …).
This module collects those names from the module's syntax tree, with the default when it is a
literal or a module constant. Meanings come from ``MEANINGS``; a variable without one still shows.
"""

from __future__ import annotations

import ast
import inspect
import re
from dataclasses import dataclass
from functools import cache

from . import settings, topology
from .procs import SECRET_PROVIDER_VARS

_NAME = re.compile(r"^[A-Z][A-Z0-9_]+$")
MEANINGS = {
    "HF_TOKEN": "Hugging Face token (secret)",
    "HF_HOME": "huggingface_hub's home (default: WORKDIR/.cache/huggingface)",
    "DATASET_REPO": "org/name of an HF dataset repo, or a local folder / .tar (unset: the demo)",
    "DATASET_FILE": "which tar in the dataset repo",
    "DATASET_REVISION": "branch, tag or commit of the dataset",
    "DATA_YAML": "which data.yaml, relative to the dataset root",
    "OUTPUT_REPO": "org/name of the HF model repo that receives every epoch",
    "RUN_ARGS": "extra `libreyolo train` key=value arguments",
    "GPUS": "all, cpu, or indices like 0,1",
    "WORKDIR": "persistent volume root",
    "RUN_NAME": "stable run id (default: derived from dataset, output repo and RUN_ARGS)",
    "MAX_RUNTIME": "wall-clock limit like 90m or 6h",
    "STALL_TIMEOUT": "no epoch or output for this long ends the run (off disables)",
    "ON_EXIT": "exit, stop or destroy the instance at the end",
    "ON_FAILURE": "the same for a failed run (default: ON_EXIT)",
    "PROVIDER": "auto, vast, runpod or none",
    "CONTAINER_ID": "Vast.ai instance id (set by Vast.ai)",
    "CONTAINER_API_KEY": "Vast.ai API key (secret; set by Vast.ai)",
    "RUNPOD_POD_ID": "RunPod pod id (set by RunPod)",
    "RUNPOD_API_KEY": "RunPod API key (secret)",
    "VAST_API_URL": "Vast.ai API base URL",
    "RUNPOD_API_URL": "RunPod API base URL",
    "PRICE_PER_HOUR": "instance price in $/h, for the cost receipt",
    "MONITOR": "1 starts `libreyolo monitor` beside training",
    "MONITOR_HOST": "address the dashboard binds",
    "PROFILE": "1 profiles a few steps first",
    "NNODES": "several machines: how many (default 1)",
    "NODE_RANK": "several machines: this one's number, 0 … NNODES-1",
    "MASTER_ADDR": "several machines: node 0's address",
    "MASTER_PORT": "several machines: the rendezvous port (default 29500)",
    "HEADLESS_SERVICE": "Kubernetes indexed Job: the Service naming pod 0",
    "DDP_TIMEOUT": "several machines: a silent lost node ends the others after this",
    "RENDEZVOUS_TIMEOUT": "several machines: how long the nodes wait for each other at the start",
    "SKYPILOT_NUM_NODES": "set by SkyPilot",
    "SKYPILOT_NODE_RANK": "set by SkyPilot",
    "SKYPILOT_NODE_IPS": "set by SkyPilot",
    "SKYPILOT_NUM_GPUS_PER_NODE": "set by SkyPilot",
    "JOB_COMPLETION_INDEX": "set by a Kubernetes indexed Job: the node rank",
    "HOSTNAME": "set by Kubernetes: the pod's name",
    "WORLD_SIZE": "set by PyTorchJob (one pod per node): the number of nodes",
    "RANK": "set by PyTorchJob (one pod per node): the node rank",
    "OOM_RETRIES": "out of GPU memory after an epoch: resume with half the batch, at most this often",
    "LICENSE": "the model card's license, a Hub license id (default: the base model's)",
    "HOST_CHECK": "warn, strict or off: the host report's shortfalls are said, end the job, or are not measured",
    "HOST_MIN_GPU_FRACTION": "a card's matmul TFLOP/s under this fraction of its datasheet figure is a shortfall",
    "HOST_MIN_COPY_GBPS": "a host→device copy under this many GB/s is a shortfall",
    "HOST_MIN_DISK_MBPS": "a WORKDIR disk writing or reading under this many MB/s is a shortfall",
    "CHECKPOINT_BUCKET": "Storage Bucket for the working state (default: <OUTPUT_REPO>-checkpoints; off: commits)",
    "PUBLISH_EVERY": "bucket mode: at most one milestone commit to OUTPUT_REPO per this long",
    "SQUASH_HISTORY": "CHECKPOINT_BUCKET=off: 1 squashes OUTPUT_REPO's history once the run is done",
}
_SECRETS = {"HF_TOKEN", *SECRET_PROVIDER_VARS}


@dataclass(frozen=True)
class Variable:
    name: str
    default: str | None
    meaning: str

    @property
    def secret(self) -> bool:
        return self.name in _SECRETS or self.name.endswith(("_TOKEN", "_KEY"))


# Read by a library rather than by settings.py.
LIBRARY_VARIABLES = (Variable("HF_ENDPOINT", "the public Hub", "Hub URL, honoured through huggingface_hub"),)


def _literal(node: ast.expr | None) -> str | None:
    """A default as text: a literal, or a module constant of settings (``DEFAULT_WORKDIR``)."""
    if node is None:
        return None
    if isinstance(node, ast.Constant) and node.value is not None:
        return str(node.value) if node.value != "" else '""'
    if isinstance(node, ast.Name) and isinstance(getattr(settings, node.id, None), str | int | float):
        value = getattr(settings, node.id)
        if node.id in {"DEFAULT_STALL_TIMEOUT", "DEFAULT_PUBLISH_EVERY"}:
            return f"{value // 60}m"
        return str(value)
    if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
        found = getattr(getattr(settings, node.value.id, None), node.attr, None)
        return None if found is None else str(found)
    return None


@cache
def variables() -> tuple[Variable, ...]:
    found: dict[str, str | None] = {}

    def add(name: object, default: str | None = None) -> None:
        if isinstance(name, str) and _NAME.match(name) and (name not in found or found[name] is None):
            found[name] = default

    # settings reads the environment; topology.py (several machines) is its part for the launchers' variables
    nodes = [node for module in (settings, topology) for node in ast.walk(ast.parse(inspect.getsource(module)))]
    for node in nodes:
        if isinstance(node, ast.Call):
            func = node.func
            args = node.args
            # env.get("X", default) / env.get("X")
            if isinstance(func, ast.Attribute) and func.attr == "get" and args and isinstance(args[0], ast.Constant):
                if isinstance(func.value, ast.Name) and func.value.id in {"env", "vast_env"}:
                    add(args[0].value, _literal(args[1]) if len(args) > 1 else None)
            # helper(env, "X", …): _flag, _choice, _optional_duration
            elif (
                len(args) >= 2
                and isinstance(args[0], ast.Name)
                and args[0].id == "env"
                and isinstance(args[1], ast.Constant)
            ):
                add(args[1].value, _literal(args[-1]) if len(args) > 2 else None)
        elif isinstance(node, ast.Compare) and isinstance(node.left, ast.Constant):
            # "X" in env
            if any(isinstance(c, ast.Name) and c.id == "env" for c in node.comparators):
                add(node.left.value)
        elif (
            isinstance(node, ast.Subscript)
            and isinstance(node.value, ast.Name)
            and node.value.id == "env"
            and isinstance(node.slice, ast.Constant)
        ):
            add(node.slice.value)
    for name in SECRET_PROVIDER_VARS:
        add(name)
    # the helpers' own defaults, as the code spells them
    if found.get("MONITOR") is None:
        found["MONITOR"] = "0"
    if found.get("PROFILE") is None:
        found["PROFILE"] = "0"
    if found.get("SQUASH_HISTORY") is None:
        found["SQUASH_HISTORY"] = "0"
    known = list(MEANINGS)  # the README's order; a variable new to settings goes last
    ordered = sorted(found, key=lambda name: (known.index(name) if name in known else len(known), name))
    ours = tuple(Variable(name, found[name], MEANINGS.get(name, "see README.md")) for name in ordered)
    return ours + LIBRARY_VARIABLES


def epilog() -> str:
    """The text under ``--help``: one line per variable, ``NAME [default]: meaning``."""
    lines = ["Environment variables (defaults in brackets; secrets are never printed):", ""]
    for var in variables():
        default = f" [{var.default}]" if var.default is not None else ""
        lines.append(f"  {var.name}{default}: {var.meaning}")
    return "\n".join(lines)
