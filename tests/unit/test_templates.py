"""The launch files people copy: each parses, starts the published image, sets what the agent needs, and bounds
how long it may bill. Checked offline: no platform SDK or CLI is needed."""

from __future__ import annotations

import ast
import contextlib
import json
import operator
import os
import re
import shlex
import signal
import subprocess
import sys
import time
import warnings
from pathlib import Path
from typing import Any

import pytest
import yaml

import entrypoint

REPO = Path(__file__).resolve().parents[2]
TEMPLATES = REPO / "templates"
IMAGE = "ghcr.io/libreyolo/trainbox"
# Every run needs these; HF_TOKEN must come from the platform's secret store, never a literal.
REQUIRED = {"DATASET_REPO", "OUTPUT_REPO", "RUN_ARGS"}


def interface_variables() -> set[str]:
    """The variables documented in docs/configuration.md's table (the public contract)."""
    names: set[str] = set()
    for line in (REPO / "docs" / "configuration.md").read_text().splitlines():
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
    checked |= {"kubernetes-multinode.yaml", ".beamignore", "kubernetes-jobset.yaml"}
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


def image_cuda(image: str) -> str:
    """The CUDA release (``12.6``) of a published image reference: its variant's base in docker/bases.Dockerfile."""
    tag = image.rsplit(":", 1)[-1]
    variant = re.search(r"-(cu\d+)", tag)
    stage = variant.group(1) if variant else "cu126"  # the plain X.Y.Z tags are the cu126 build
    bases = (REPO / "docker" / "bases.Dockerfile").read_text()
    (base,) = re.findall(rf"^FROM (\S+) AS {stage}$", bases, re.M)
    found = re.search(r"-cuda(\d+\.\d+)-", base)
    assert found, base
    return found.group(1)


def cuda_key(version: str) -> tuple[int, int]:
    major, minor = version.split(".")
    return int(major), int(minor)


def check_runpod_cuda(allowed: list[str], image_release: str) -> None:
    assert allowed, "an empty list lets the pod land on any driver"
    assert all(re.fullmatch(r"\d+\.\d+", version) for version in allowed), "RunPod v2 wants major.minor"
    assert allowed == sorted(set(allowed), key=cuda_key)
    # exact matching: the image's own release and every later one up to 13.2, no gap, nothing older
    assert allowed[0] == image_release
    known = [f"12.{minor}" for minor in range(10)] + [f"13.{minor}" for minor in range(3)]
    assert [v for v in known if cuda_key(v) >= cuda_key(image_release)] == [v for v in allowed if v in known]


def test_runpod_keeps_pods_off_hosts_whose_driver_is_too_old() -> None:
    template = json.loads((TEMPLATES / "runpod.json").read_text())
    check_runpod_cuda(template["allowedCudaVersions"], image_cuda(template["image"]))
    # the README gives the list of each variant
    readme = (TEMPLATES / "README.md").read_text()
    for variant in ("cu126", "cu130"):
        release = image_cuda(f"{IMAGE}:0.1.0-{variant}")
        lists = re.findall(r"`(\[[^`]*\])` for (?:the default image|a `-cu\d+` image)", readme)
        matching = [json.loads(found) for found in lists if json.loads(found)[0] == release]
        assert len(matching) == 1, f"{variant}: {lists}"
        check_runpod_cuda(matching[0], release)


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
    # DataLoader workers need cores and memory (both platforms default to about one core); retries are a choice
    assert template.value(kwargs["cpu"]) >= 4 and "memory" in kwargs
    assert template.value(kwargs["retries"]) == 0
    assert "subprocess.run(" not in template.text, "subprocess.run kills the agent 0.25 s after an interrupt"


def test_skypilot() -> None:
    task = yaml.safe_load((TEMPLATES / "skypilot.yaml").read_text())
    assert task["resources"]["image_id"].startswith(f"docker:{IMAGE}:")
    assert task["resources"]["disk_size"] >= 50
    check_names(set(task["envs"]))
    assert task["secrets"] == {"HF_TOKEN": None}, "HF_TOKEN given at launch, never in the file"
    assert duration_s(task["envs"]["MAX_RUNTIME"]) > 0
    assert "trainbox run" in task["run"]


# SkyPilot's own task schema (the `skypilot` package pulls in every cloud's SDK, so its schema is vendored).
SKYPILOT_SCHEMA = REPO / "tests" / "fakes" / "skypilot_task_schema.json"


@pytest.mark.parametrize("nodes", [1, 2])
def test_skypilot_file_is_valid_for_skypilot(nodes: int) -> None:
    jsonschema = pytest.importorskip("jsonschema")
    text = (TEMPLATES / "skypilot.yaml").read_text()
    if nodes > 1:
        text = text.replace("# num_nodes: 2\n", f"num_nodes: {nodes}\n")
    validator = jsonschema.Draft202012Validator(json.loads(SKYPILOT_SCHEMA.read_text()))
    task = yaml.safe_load(text)
    errors = [f"{'/'.join(map(str, error.absolute_path))}: {error.message}" for error in validator.iter_errors(task)]
    assert not errors, errors
    # the vendored schema does refuse what SkyPilot refuses
    assert list(validator.iter_errors({"resources": {"job_recovery": {"recover_on_exit_code": [63]}}}))
    assert list(validator.iter_errors({"resources": {"job_recovery": {"recover_on_exit_codes": [63, 256]}}}))


def test_skypilot_relaunches_what_a_fresh_set_of_machines_fixes() -> None:
    """SkyPilot recovers a managed job by itself only when its cluster is gone; a node lost while the VMs stay up
    ends the job unless its exit code is listed (and max_restarts_on_errors defaults to 0)."""
    recovery = yaml.safe_load((TEMPLATES / "skypilot.yaml").read_text())["resources"]["job_recovery"]
    codes = set(recovery["recover_on_exit_codes"])
    assert {56, 63, 64, 143} <= codes, "a machine short of its datasheet, a lost node, nodes that never met, a SIGTERM"
    assert codes <= set(exit_codes()), "every code is one the agent uses"
    # listed codes are retried without limit: never one a retry repeats, nor the crash-loop guard's own exit
    assert not {0, 2, 10, 11, 12, 20, *range(30, 42), 52, 53, 61, 62, 80, 82, 90} & codes
    assert 1 <= recovery["max_restarts_on_errors"] <= 3, "other failures: a bounded number of retries"
    readme = (TEMPLATES / "README.md").read_text()
    assert "recover_on_exit_codes" in readme and "max_restarts_on_errors" in readme


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


def test_skypilot_several_nodes() -> None:
    text = (TEMPLATES / "skypilot.yaml").read_text()
    assert "# num_nodes: 2\n" in text, "the multi-node variant is one line to uncomment"
    task = yaml.safe_load(text.replace("# num_nodes: 2\n", "num_nodes: 2\n"))
    assert task["num_nodes"] == 2 and "trainbox run" in task["run"]
    # SkyPilot's own variables give the topology: nothing multi-node to set by hand
    assert not {"NNODES", "NODE_RANK", "MASTER_ADDR"} & set(task["envs"])


def test_kubernetes_several_nodes() -> None:
    service, job = yaml.safe_load_all((TEMPLATES / "kubernetes-multinode.yaml").read_text())
    assert service["kind"] == "Service" and service["spec"]["clusterIP"] == "None"
    assert job["kind"] == "Job" and job["spec"]["completionMode"] == "Indexed"
    assert service["spec"]["selector"] == {"job-name": job["metadata"]["name"]}
    pod = job["spec"]["template"]["spec"]
    assert pod["subdomain"] == service["metadata"]["name"] and pod["restartPolicy"] == "Never"
    (container,) = pod["containers"]
    assert container["image"].rsplit(":", 1)[-1] == entrypoint.__version__
    env = {item["name"]: item for item in container["env"]}
    check_names(set(env))
    assert env["HF_TOKEN"]["valueFrom"]["secretKeyRef"]["key"] == "HF_TOKEN"
    nodes = int(env["NNODES"]["value"])
    assert nodes == job["spec"]["completions"] == job["spec"]["parallelism"] > 1
    # node 0 through the headless Service, on the port the rendezvous uses
    assert env["MASTER_ADDR"]["value"] == f"{job['metadata']['name']}-0.{service['metadata']['name']}"
    assert int(env["MASTER_PORT"]["value"]) == service["spec"]["ports"][0]["port"]
    assert duration_s(env["MAX_RUNTIME"]["value"]) < job["spec"]["activeDeadlineSeconds"]
    # what a retry cannot fix fails the Job, as in the single-node manifest; a lost peer (63) is retried
    _, single = yaml.safe_load_all((TEMPLATES / "kubernetes.yaml").read_text())
    assert job["spec"]["podFailurePolicy"] == single["spec"]["podFailurePolicy"]
    retried = job["spec"]["podFailurePolicy"]["rules"][0]["onExitCodes"]["values"]
    assert 63 not in retried and 64 not in retried and 12 in retried  # lost or late nodes: retry; disagreeing: not
    # the nodes check meets beside the rendezvous port: both open on pod 0
    ports = {port["port"] for port in service["spec"]["ports"]}
    assert {int(env["MASTER_PORT"]["value"]), int(env["MASTER_PORT"]["value"]) + 1} <= ports
    # settings the agent reads the same way on every node
    from entrypoint import topology

    pod0 = {key: item["value"] for key, item in env.items() if "value" in item} | {"JOB_COMPLETION_INDEX": "0"}
    assert topology.from_env(pod0).leader and topology.from_env(pod0).nnodes == nodes
    assert topology.from_env(pod0 | {"JOB_COMPLETION_INDEX": "1"}).node_rank == 1


def test_kubernetes_jobset_restarts_every_node_together() -> None:
    (jobset,) = yaml.safe_load_all((TEMPLATES / "kubernetes-jobset.yaml").read_text())
    assert jobset["apiVersion"] == "jobset.x-k8s.io/v1alpha2" and jobset["kind"] == "JobSet"
    spec = jobset["spec"]
    (replicated,) = spec["replicatedJobs"]
    assert replicated["replicas"] == 1
    job = replicated["template"]["spec"]
    assert job["completionMode"] == "Indexed" and job["backoffLimit"] == 0, "one failed pod restarts the set"
    # the set restarts together, a bounded number of times; what a retry repeats fails it at once
    policy = spec["failurePolicy"]
    assert 1 <= policy["maxRestarts"] <= 5 and policy["restartStrategy"] == "BlockingRecreate"
    first = policy["rules"][0]
    assert first["action"] == "FailJobSet" and first["onJobFailureReasons"] == ["PodFailurePolicy"]
    assert re.fullmatch(r"[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?", first["name"]), "JobSet's rule-name pattern"
    _, single = yaml.safe_load_all((TEMPLATES / "kubernetes.yaml").read_text())
    assert job["podFailurePolicy"] == single["spec"]["podFailurePolicy"]
    # the same pod as the indexed-Job variant, with node 0 named the JobSet way
    _, indexed = yaml.safe_load_all((TEMPLATES / "kubernetes-multinode.yaml").read_text())
    pod, indexed_pod = job["template"]["spec"], indexed["spec"]["template"]["spec"]
    assert "subdomain" not in pod and spec["network"]["enableDNSHostnames"] is True
    (container,) = pod["containers"]
    assert container["image"].rsplit(":", 1)[-1] == entrypoint.__version__
    env = {item["name"]: item for item in container["env"]}
    check_names(set(env))
    nodes = int(env["NNODES"]["value"])
    assert nodes == job["completions"] == job["parallelism"] > 1
    subdomain = spec["network"].get("subdomain", jobset["metadata"]["name"])
    master = f"{jobset['metadata']['name']}-{replicated['name']}-0-0.{subdomain}"
    assert env["MASTER_ADDR"]["value"] == master
    assert {k: v for k, v in env.items() if k != "MASTER_ADDR"} == {
        item["name"]: item for item in indexed_pod["containers"][0]["env"] if item["name"] != "MASTER_ADDR"
    }
    assert duration_s(env["MAX_RUNTIME"]["value"]) < job["activeDeadlineSeconds"]
    from entrypoint import topology

    pod0 = {key: item["value"] for key, item in env.items() if "value" in item} | {"JOB_COMPLETION_INDEX": "0"}
    assert topology.from_env(pod0).leader and topology.from_env(pod0).master_addr == master
    assert topology.from_env(pod0 | {"JOB_COMPLETION_INDEX": "1"}).node_rank == 1


def exit_codes() -> dict[int, str]:
    """docs/exit-codes.md's table."""
    text = (REPO / "docs" / "exit-codes.md").read_text()
    return {int(code): meaning for code, meaning in re.findall(r"^\| (\d+) \| (.+) \|$", text, re.M)}


def test_kubernetes_fails_the_job_on_failures_a_retry_would_repeat() -> None:
    _, job = yaml.safe_load_all((TEMPLATES / "kubernetes.yaml").read_text())
    pod = job["spec"]["template"]["spec"]
    assert pod["restartPolicy"] == "Never", "podFailurePolicy requires it"
    (container,) = pod["containers"]
    fail, ignore = job["spec"]["podFailurePolicy"]["rules"]
    assert fail["action"] == "FailJob"
    assert fail["onExitCodes"]["containerName"] == container["name"] and fail["onExitCodes"]["operator"] == "In"
    codes = fail["onExitCodes"]["values"]
    assert codes == sorted(set(codes)), "Kubernetes wants the values ordered and unique"
    assert set(codes) <= set(exit_codes()), "every code is one the agent uses"
    # configuration, access and the dataset: the same input fails the same way
    assert {2, 10, 11, 12, 20, *range(31, 42), 52, 53} <= set(codes)
    # what a retry can fix stays retried: transient failures, GPU faults on a node, preemption
    assert not {0, 1, 30, 50, 51, 54, 55, 60, 70, 81, 143} & set(codes)
    # an evicted or preempted pod does not count against backoffLimit
    assert ignore == {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget"}]}
    text = (TEMPLATES / "kubernetes.yaml").read_text()
    for optional in ("# tolerations:", "# securityContext:", "runAsNonRoot", "nvidia.com/gpu"):
        assert optional in text


def test_every_template_pins_a_release_of_the_image() -> None:
    version = entrypoint.__version__
    found = {
        "vast.json": json.loads((TEMPLATES / "vast.json").read_text())["tag"],
        "runpod.json": json.loads((TEMPLATES / "runpod.json").read_text())["image"],
        "skypilot.yaml": yaml.safe_load((TEMPLATES / "skypilot.yaml").read_text())["resources"]["image_id"],
        "kubernetes.yaml": list(yaml.safe_load_all((TEMPLATES / "kubernetes.yaml").read_text()))[1]["spec"]["template"][
            "spec"
        ]["containers"][0]["image"],
        "modal_train.py": PythonTemplate(TEMPLATES / "modal_train.py").constants["IMAGE"],
        "beam_train.py": PythonTemplate(TEMPLATES / "beam_train.py").constants["IMAGE"],
    }
    for name, reference in found.items():
        assert reference.rsplit(":", 1)[-1] == version, f"{name}: {reference} (not the current release)"


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
    # one profile each: `--profile cpu up` never starts the GPU service on the same volume and port
    assert gpu["profiles"] == ["gpu"] and cpu["profiles"] == ["cpu"]
    example = {line.split("=", 1)[0] for line in (REPO / ".env.example").read_text().splitlines() if "=" in line[:30]}
    for service in (gpu, cpu):
        assert service["init"] is True
        assert service["shm_size"] or service.get("ipc") == "host"
        # no env_file (it fails when .env is missing, short of compose 2.24): each setting passed by name
        assert "env_file" not in service
        assert set(service["environment"]) >= example
        assert all(service["environment"][name] == f"${{{name}:-}}" for name in example - {"GPUS"})
        assert "workspace:/workspace" in service["volumes"]
        assert service["ports"] == ["127.0.0.1:8420:8420"]
        assert duration_s(service["stop_grace_period"]) >= 60
        assert IMAGE in service["image"]
    (device,) = gpu["deploy"]["resources"]["reservations"]["devices"]
    assert device["capabilities"] == ["gpu"] and device["count"] == "all"
    assert "deploy" not in cpu and cpu["environment"]["GPUS"] == "cpu"
    assert "workspace" in config["volumes"]


# --- The Modal and Beam launchers, run against stand-ins of the platform's SDK and of the agent ---------------

# The SDK calls the launchers make, each running the function in this process (as the platform's container does).
FAKE_MODAL = """
class Image:
    @staticmethod
    def from_registry(name):
        return Image()

    def entrypoint(self, argv):
        return self


class Volume:
    @staticmethod
    def from_name(name, create_if_missing=False):
        return Volume()

    def commit(self):
        print("volume committed", flush=True)


class Secret:
    @staticmethod
    def from_name(name):
        return Secret()


class _Function:
    def __init__(self, fn):
        self.fn = fn

    def remote(self, *args):
        return self.fn(*args)


class App:
    def __init__(self, name):
        pass

    def function(self, **options):
        return _Function

    def local_entrypoint(self):
        return lambda fn: fn
"""

# Beam's `.remote()` returns None when the function failed (FAKE_BEAM_FAILS=1 plays that).
FAKE_BEAM = """
import os


def Image(base_image):
    return base_image


def Volume(name, mount_path):
    return name


class _Function:
    def __init__(self, fn):
        self.fn = fn

    def remote(self, *args):
        print("beam uploads the folder", os.getcwd(), flush=True)  # the SDK syncs the working folder here
        result = self.fn(*args)
        return None if os.environ.get("FAKE_BEAM_FAILS") else result


def function(**options):
    return _Function
"""

# `trainbox` as the launchers see it on PATH: records what reaches it; on SIGTERM it takes a second to wrap up
# (longer than the 0.25 s subprocess.run would leave it) and exits 143 as the real agent does.
FAKE_AGENT = """
import os, signal, sys, time

def note(text):
    with open(os.environ["AGENT_RECORD"], "a") as record:
        record.write(text + "\\n")

def on_signal(signum, frame):
    note(signal.Signals(signum).name)
    if signum == signal.SIGTERM:
        time.sleep(1)
        note("wrapped up")
        sys.exit(143)

signal.signal(signal.SIGTERM, on_signal)
signal.signal(signal.SIGINT, on_signal)
note("started " + " ".join(sys.argv[1:]) + " ON_EXIT=" + os.environ["ON_EXIT"])
if os.environ.get("AGENT_EXIT"):
    sys.exit(int(os.environ["AGENT_EXIT"]))
time.sleep(120)
"""


def launcher(name: str, tmp_path: Path, **env: str) -> tuple[subprocess.Popen[str], Path]:
    """Start a launcher as the platform would: Modal calls the local entrypoint, Beam runs the script."""
    sdk = tmp_path / "sdk"
    sdk.mkdir()
    (sdk / "modal.py").write_text(FAKE_MODAL)
    (sdk / "beam.py").write_text(FAKE_BEAM)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    agent = bin_dir / "trainbox"
    agent.write_text(f"#!{sys.executable}\n{FAKE_AGENT}")
    agent.chmod(0o755)
    record = tmp_path / "agent.log"
    environment = {
        **os.environ,
        "PYTHONPATH": str(sdk),
        "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
        "AGENT_RECORD": str(record),
        **env,
    }
    template = str(TEMPLATES / name)
    if name == "modal_train.py":
        call = "import runpy, sys; runpy.run_path(sys.argv[1])['main'](*sys.argv[2:])"
        argv = [sys.executable, "-c", call, template, "org/data", "org/model"]
    else:
        argv = [sys.executable, template, "org/data", "org/model"]
    process = subprocess.Popen(argv, env=environment, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    return process, record


def wait_for_agent(process: subprocess.Popen[str], record: Path) -> None:
    deadline = time.monotonic() + 60
    while not (record.exists() and "started" in record.read_text()):
        assert process.poll() is None, process.communicate()[0]
        assert time.monotonic() < deadline, "the stand-in agent never started"
        time.sleep(0.05)


# Modal interrupts the function with SIGINT on preemption; Beam (like any container platform) stops with SIGTERM.
@pytest.mark.parametrize(("name", "interrupt"), [("modal_train.py", signal.SIGINT), ("beam_train.py", signal.SIGTERM)])
def test_serverless_launcher_forwards_the_interrupt_as_sigterm_and_waits(
    name: str, interrupt: signal.Signals, tmp_path: Path
) -> None:
    process, record = launcher(name, tmp_path)
    try:
        wait_for_agent(process, record)
        process.send_signal(interrupt)
        output, _ = process.communicate(timeout=60)
    finally:
        process.kill()
    lines = record.read_text().splitlines()
    assert lines[0] == "started run ON_EXIT=exit"
    # SIGTERM (what the agent treats as preemption), once, and the agent finished its wrap-up
    assert lines[1:] == ["SIGTERM", "wrapped up"], lines
    # the agent's exit code comes out of the launcher: the run did not finish
    assert process.returncode == 143, output
    if name == "modal_train.py":
        assert "volume committed" in output


@pytest.mark.parametrize("name", ["modal_train.py", "beam_train.py"])
def test_serverless_launcher_exits_with_the_agent_failure(name: str, tmp_path: Path) -> None:
    process, record = launcher(name, tmp_path, AGENT_EXIT="20")
    output, _ = process.communicate(timeout=60)
    assert process.returncode == 20, output
    assert record.read_text().startswith("started run")


@pytest.mark.parametrize("name", ["modal_train.py", "beam_train.py"])
def test_serverless_launcher_exits_zero_on_success(name: str, tmp_path: Path) -> None:
    process, _ = launcher(name, tmp_path, AGENT_EXIT="0")
    output, _ = process.communicate(timeout=60)
    assert process.returncode == 0, output


def test_beam_launcher_fails_when_beam_returns_no_result(tmp_path: Path) -> None:
    # Beam's .remote() returns None when the function failed or was left running: never exit 0 then
    process, _ = launcher("beam_train.py", tmp_path, AGENT_EXIT="0", FAKE_BEAM_FAILS="1")
    output, _ = process.communicate(timeout=60)
    assert process.returncode == 1, output
    assert "no result" in output


def test_modal_launcher_documents_detach() -> None:
    text = (TEMPLATES / "modal_train.py").read_text()
    assert "modal run --detach templates/modal_train.py" in text
    # since Modal 1.4 `modal app logs` prints the last lines and exits; -f follows
    assert "modal app logs -f trainbox" in text and "modal app logs trainbox" not in text


def test_beam_uploads_the_launcher_alone(tmp_path: Path) -> None:
    """Beam syncs the working folder, filtered by the .beamignore found there (gitignore syntax)."""
    process, _ = launcher("beam_train.py", tmp_path, AGENT_EXIT="0")
    output, _ = process.communicate(timeout=60)
    assert process.returncode == 0, output
    assert f"beam uploads the folder {TEMPLATES}" in output, "run from anywhere, it syncs the templates folder"
    pathspec = pytest.importorskip("pathspec")
    with warnings.catch_warnings():  # Beam vendors a pathspec from before "gitwildmatch" was deprecated
        warnings.simplefilter("ignore", DeprecationWarning)
        rules = pathspec.PathSpec.from_lines("gitwildmatch", (TEMPLATES / ".beamignore").read_text().splitlines())
    kept = {path.name for path in TEMPLATES.iterdir() if not rules.match_file(path.name)}
    assert kept == {"beam_train.py"}
    assert rules.match_file(".env") and rules.match_file("data/images/a.jpg")
