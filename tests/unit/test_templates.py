"""The launch files people copy: each parses, starts the published image, sets what the agent needs, and bounds
how long it may bill. Checked offline: no platform SDK or CLI is needed."""

from __future__ import annotations

import ast
import contextlib
import json
import operator
import re
import shlex
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
TEMPLATES = REPO / "templates"
IMAGE = "ghcr.io/libreyolo/trainbox"
# Every run needs these; HF_TOKEN must come from the platform's secret store, never a literal.
REQUIRED = {"DATASET_REPO", "OUTPUT_REPO", "RUN_ARGS"}


def interface_variables() -> set[str]:
    """The variables documented in README.md's configuration table (the public contract)."""
    names: set[str] = set()
    for line in (REPO / "README.md").read_text().splitlines():
        if line.startswith("| `"):
            names.update(re.findall(r"`([A-Z][A-Z0-9_]+)`", line.split("|")[1]))
    assert {"HF_TOKEN", "DATASET_REPO", "OUTPUT_REPO", "RUN_ARGS", "ON_EXIT"} <= names
    return names


def docker_env_flags(options: str) -> dict[str, str]:
    """``-e KEY=VALUE`` pairs of a `docker run` option string (Vast.ai's template format)."""
    words = shlex.split(options)
    return dict(words[i + 1].split("=", 1) for i, word in enumerate(words) if word == "-e")


def duration_s(text: str) -> float:
    parts = re.fullmatch(r"(?:(\d+)h)?(?:(\d+)m)?", text)
    assert parts and text, text
    return int(parts.group(1) or 0) * 3600 + int(parts.group(2) or 0) * 60


_OPS = {ast.Mult: operator.mul, ast.Add: operator.add, ast.Sub: operator.sub}


def constant(node: ast.AST) -> Any:
    """The value of a literal or of arithmetic on literals (``6 * 60 * 60``)."""
    if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
        return _OPS[type(node.op)](constant(node.left), constant(node.right))
    return ast.literal_eval(node)


class PythonTemplate:
    """A Modal or Beam launcher, read with ``ast`` (its SDK is not installed here)."""

    def __init__(self, path: Path) -> None:
        self.text = path.read_text()
        self.tree = ast.parse(self.text, filename=str(path))
        compile(self.tree, str(path), "exec")
        self.constants: dict[str, Any] = {}
        for node in self.tree.body:
            if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name):
                with contextlib.suppress(ValueError):  # not a constant: the app, the image object, ...
                    self.constants[node.targets[0].id] = constant(node.value)

    def decorator_kwargs(self, function: str) -> dict[str, ast.expr]:
        (found,) = [n for n in self.tree.body if isinstance(n, ast.FunctionDef) and n.name == function]
        (call,) = [d for d in found.decorator_list if isinstance(d, ast.Call) and d.keywords]
        return {keyword.arg: keyword.value for keyword in call.keywords if keyword.arg}

    def value(self, node: ast.expr) -> Any:
        return self.constants[node.id] if isinstance(node, ast.Name) else constant(node)

    def env_keys(self) -> set[str]:
        """Variable-like keys of the dict literals in the file (the environment it gives `trainbox run`)."""
        keys: set[str] = set()
        for node in ast.walk(self.tree):
            if isinstance(node, ast.Dict):
                keys.update(k.value for k in node.keys if isinstance(k, ast.Constant) and isinstance(k.value, str))
        return {key for key in keys if re.fullmatch(r"[A-Z][A-Z0-9_]+", key)}


def check_names(names: set[str]) -> None:
    unknown = names - interface_variables()
    assert not unknown, f"not documented variables (typo?): {sorted(unknown)}"
    assert names >= REQUIRED, f"missing {sorted(REQUIRED - names)}"


def test_every_template_is_checked() -> None:
    checked = {"runpod.json", "vast.json", "modal_train.py", "beam_train.py", "skypilot.yaml", "kubernetes.yaml"}
    assert {p.name for p in TEMPLATES.iterdir()} - {"README.md"} == checked


# The fields of RunPod REST v2's CreateTemplateRequest (OpenAPI 2.0.0); v2 rejects unknown fields,
# and v1's names (imageName, containerDiskInGb, isPublic, volumeInGb, readme) are not among them.
RUNPOD_V2_TEMPLATE_FIELDS = {
    "name",
    "image",
    "args",
    "disk",
    "env",
    "ports",
    "registry",
    "allowedCudaVersions",
    "category",
    "mounts",
    "public",
    "serverless",
    "startJupyter",
    "startSsh",
}


def test_runpod() -> None:
    template = json.loads((TEMPLATES / "runpod.json").read_text())
    unknown = set(template) - RUNPOD_V2_TEMPLATE_FIELDS
    assert not unknown, f"not v2 template fields: {sorted(unknown)}"
    assert {"name", "image"} <= set(template)
    assert template["image"].startswith(f"{IMAGE}:")
    assert template["public"] is False and template["serverless"] is False
    env = template["env"]
    check_names(set(env))
    assert env["HF_TOKEN"] == "{{ RUNPOD_SECRET_HF_TOKEN }}"
    assert env["ON_EXIT"] == "destroy"
    # A failed job must not stay up: RunPod restarts an exited container, so `exit` would rerun it forever.
    assert env["ON_FAILURE"] in {"stop", "destroy"}
    assert set(template["mounts"]) == {"persistent"}  # templates take no network mount
    assert template["mounts"]["persistent"]["path"] == "/workspace"
    assert template["mounts"]["persistent"]["size"] >= 50 and template["disk"] >= 20
    readme = (TEMPLATES / "README.md").read_text()
    assert "2.5x" in readme, "disk size guidance"
    assert "POST https://api.runpod.io/v2/templates" in readme and "/v1/" not in readme


def test_vast() -> None:
    template = json.loads((TEMPLATES / "vast.json").read_text())
    assert template["image"] == IMAGE and template["tag"]
    # `args` keeps the image's entrypoint (tini -- trainbox); ssh/jupyter would replace it.
    assert template["runtype"] == "args" and template["args_str"] == "run"
    env = docker_env_flags(template["env"])
    check_names(set(env))
    assert "HF_TOKEN" not in env, "the token belongs in the account's environment variables, not the template"
    assert "HF_TOKEN" in template["readme"]
    assert env["ON_EXIT"] == "destroy"
    assert template["recommended_disk_space"] >= 50
    assert "2.5x" in template["readme"]


@pytest.mark.parametrize("name", ["modal_train.py", "beam_train.py"])
def test_serverless_functions(name: str) -> None:
    template = PythonTemplate(TEMPLATES / name)
    assert template.constants["IMAGE"].startswith(f"{IMAGE}:")
    kwargs = template.decorator_kwargs("train")
    assert {"image", "gpu", "timeout", "volumes", "secrets"} <= set(kwargs)
    timeout = template.value(kwargs["timeout"])
    assert 0 < timeout <= 24 * 3600
    # the agent's own deadline comes first, so the final upload happens before the platform kills it
    assert duration_s(template.constants["MAX_RUNTIME"]) < timeout
    check_names(template.env_keys())
    assert "HF_TOKEN" in ast.unparse(kwargs["secrets"]) + template.text
    assert '"trainbox", "run"' in template.text


def test_skypilot() -> None:
    task = yaml.safe_load((TEMPLATES / "skypilot.yaml").read_text())
    assert task["resources"]["image_id"].startswith(f"docker:{IMAGE}:")
    assert task["resources"]["disk_size"] >= 50
    check_names(set(task["envs"]))
    assert task["secrets"] == {"HF_TOKEN": None}, "HF_TOKEN given at launch, never in the file"
    assert duration_s(task["envs"]["MAX_RUNTIME"]) > 0
    assert "trainbox run" in task["run"]


def test_kubernetes_job() -> None:
    claim, job = yaml.safe_load_all((TEMPLATES / "kubernetes.yaml").read_text())
    assert claim["kind"] == "PersistentVolumeClaim"
    assert claim["spec"]["resources"]["requests"]["storage"].endswith("Gi")
    assert job["kind"] == "Job"
    deadline = job["spec"]["activeDeadlineSeconds"]
    pod = job["spec"]["template"]["spec"]
    assert pod["terminationGracePeriodSeconds"] >= 60
    (container,) = pod["containers"]
    assert container["image"].startswith(f"{IMAGE}:")
    assert container["resources"]["limits"]["nvidia.com/gpu"] >= 1
    env = {item["name"]: item for item in container["env"]}
    check_names(set(env))
    assert env["HF_TOKEN"]["valueFrom"]["secretKeyRef"]["key"] == "HF_TOKEN"
    assert duration_s(env["MAX_RUNTIME"]["value"]) < deadline
    mounts = {mount["mountPath"] for mount in container["volumeMounts"]}
    assert {"/workspace", "/dev/shm"} <= mounts


def test_env_example_documents_the_interface() -> None:
    names = {
        line.split("=", 1)[0]
        for line in (REPO / ".env.example").read_text().splitlines()
        if line and not line.startswith("#")
    }  # fmt: skip
    check_names(names)
    assert "HF_TOKEN" in names
    # every value is empty: nothing (least of all a token) is set by copying the example
    assert all(line.endswith("=") for line in (REPO / ".env.example").read_text().splitlines() if "=" in line[:30])


def test_compose_file() -> None:
    config = yaml.safe_load((REPO / "compose.yaml").read_text())
    gpu, cpu = config["services"]["trainbox"], config["services"]["trainbox-cpu"]
    for service in (gpu, cpu):
        assert service["init"] is True
        assert service["shm_size"] or service.get("ipc") == "host"
        assert service["env_file"] == ".env"
        assert "workspace:/workspace" in service["volumes"]
        assert service["ports"] == ["127.0.0.1:8420:8420"]
        assert duration_s(service["stop_grace_period"]) >= 60
        assert IMAGE in service["image"]
    (device,) = gpu["deploy"]["resources"]["reservations"]["devices"]
    assert device["capabilities"] == ["gpu"] and device["count"] == "all"
    assert "deploy" not in cpu and cpu["profiles"] == ["cpu"] and cpu["environment"]["GPUS"] == "cpu"
    assert "workspace" in config["volumes"]
