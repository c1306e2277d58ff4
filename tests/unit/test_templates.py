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
        """Variable-like keys of the dict literals of ``train`` (the environment it gives `trainbox run`)."""
        keys: set[str] = set()
        (train,) = [n for n in self.tree.body if isinstance(n, ast.FunctionDef) and n.name == "train"]
        for node in ast.walk(train):
            if isinstance(node, ast.Dict):
                keys.update(k.value for k in node.keys if isinstance(k, ast.Constant) and isinstance(k.value, str))
        return {key for key in keys if re.fullmatch(r"[A-Z][A-Z0-9_]+", key)}


def check_names(names: set[str]) -> None:
    unknown = names - interface_variables()
    assert not unknown, f"not documented variables (typo?): {sorted(unknown)}"
    assert names >= REQUIRED, f"missing {sorted(REQUIRED - names)}"


def test_every_template_is_checked() -> None:
    checked = {"runpod.json", "runpod-pod.json", "vast.json", "modal_train.py", "beam_train.py", "skypilot.yaml"}
    checked |= {"kubernetes.yaml", "kubernetes-multinode.yaml", ".beamignore", "kubernetes-jobset.yaml", "hf_jobs.sh"}
    checked |= {"runpod.sh", "vast.sh"}  # tests/unit/test_launch_scripts.py
    assert {p.name for p in TEMPLATES.iterdir()} - {"README.md"} == checked


# --- RunPod: both request bodies against RunPod's own published v2 document ---------------------------------------
RUNPOD_REFERENCE = REPO / "tests" / "fakes" / "runpod_v2_reference.json"


def runpod_validator(operation: str) -> Any:
    """A JSON Schema validator for the request body of ``operation`` (``POST /v2/templates``, ``POST /v2/pods``), from
    the excerpt of RunPod's v2 OpenAPI document vendored beside the release path's (its schemas verbatim)."""
    jsonschema = pytest.importorskip("jsonschema")
    reference = json.loads(RUNPOD_REFERENCE.read_text())
    schema = {"$ref": f"#/components/schemas/{reference['request_bodies'][operation]}", **reference}
    return jsonschema.Draft202012Validator(schema)


def runpod_errors(operation: str, body: dict[str, Any]) -> list[str]:
    return [
        f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in runpod_validator(operation).iter_errors(body)
    ]


def test_runpod_bodies_are_valid_for_runpods_document() -> None:
    template = json.loads((TEMPLATES / "runpod.json").read_text())
    pod = json.loads((TEMPLATES / "runpod-pod.json").read_text())
    assert not runpod_errors("POST /v2/templates", template)
    assert not runpod_errors("POST /v2/pods", pod)
    # the vendored document refuses what v2 refuses: v1's names, unknown fields, a network mount on a template,
    # and the CUDA fields where they do not belong
    assert runpod_errors("POST /v2/templates", {**template, "imageName": template["image"]})
    assert runpod_errors("POST /v2/templates", {**template, "mounts": {"network": [{"volumeId": "v", "path": "/w"}]}})
    assert runpod_errors("POST /v2/pods", {**pod, "allowedCudaVersions": ["12.6"]}), "on a pod it lives under gpu"
    assert runpod_errors("POST /v2/pods", {**pod, "gpu": {**pod["gpu"], "minCudaVersion": "12"}}), "major.minor"


def test_runpod() -> None:
    template = json.loads((TEMPLATES / "runpod.json").read_text())
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
    assert template["startSsh"] is False and template["startJupyter"] is False  # v2 defaults both to true
    readme = (TEMPLATES / "README.md").read_text()
    assert "2.5x" in readme, "disk size guidance"
    assert "POST https://api.runpod.io/v2/templates" in readme and "/v1/" not in readme


def test_runpod_deploys_the_template_on_the_gpu_asked_for() -> None:
    pod = json.loads((TEMPLATES / "runpod-pod.json").read_text())
    assert pod["templateId"] and pod["gpu"]["id"] and pod["gpu"]["count"] >= 1
    # the per-run settings override the template's, key by key (v2 merges env)
    check_names(set(pod["env"]))
    readme = (TEMPLATES / "README.md").read_text()
    assert "POST https://api.runpod.io/v2/pods" in readme and "runpod-pod.json" in readme
    # RunPod has no price ceiling of its own: the agent holds the pod's cost against MAX_PRICE_PER_HOUR
    assert float(pod["env"]["MAX_PRICE_PER_HOUR"]) > 0 and "MAX_PRICE_PER_HOUR" in readme


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


def test_runpod_keeps_pods_off_hosts_whose_driver_is_too_old() -> None:
    """v2 matches ``allowedCudaVersions`` exactly and its document lists no versions (no enum: a version no host
    reports matches nothing); ``gpu.minCudaVersion`` on pod creation is the documented open-ended floor."""
    template = json.loads((TEMPLATES / "runpod.json").read_text())
    pod = json.loads((TEMPLATES / "runpod-pod.json").read_text())
    assert "allowedCudaVersions" not in template and "allowedCudaVersions" not in pod["gpu"], "no guessed versions"
    assert pod["gpu"]["minCudaVersion"] == image_cuda(template["image"])
    reference = json.loads(RUNPOD_REFERENCE.read_text())["components"]["schemas"]
    floor = reference["CreateGpuConfig"]["allOf"][1]["properties"]["minCudaVersion"]
    assert "enum" not in floor or pod["gpu"]["minCudaVersion"] in floor["enum"]
    # the README gives the floor of each variant
    readme = (TEMPLATES / "README.md").read_text()
    for variant in ("cu126", "cu130"):
        release = image_cuda(f"{IMAGE}:{entrypoint.__version__}-{variant}")
        assert f'"minCudaVersion": "{release}"' in readme, variant
    assert "13.1" not in readme and "13.2" not in readme


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
    # Vast filters offers by price itself: the template keeps to its own filter, named in the readme
    assert template["extra_filters"]["dph_total"]["lte"] > 0 and "dph_total" in template["readme"]


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
    assert {56, 63, 64, 66, 143} <= codes, (
        "a machine short of its datasheet, a lost node, nodes that never met, a SIGTERM"
    )
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
    # a Job that reached its activeDeadlineSeconds fails the set: a restart would bill as long again
    deadline = [rule for rule in spec["failurePolicy"]["rules"] if "DeadlineExceeded" in rule["onJobFailureReasons"]]
    assert [rule["action"] for rule in deadline] == ["FailJobSet"]
    for rule in spec["failurePolicy"]["rules"]:
        assert re.fullmatch(r"[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?", rule["name"]), "JobSet's rule-name pattern"
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
        "hf_jobs.sh": shell_defaults(TEMPLATES / "hf_jobs.sh")["IMAGE"],
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


def shell_defaults(path: Path) -> dict[str, str]:
    """The ``NAME=${NAME:-default}`` settings of a launch script: what it runs with when nothing is set."""
    found = re.findall(r"^([A-Z_]+)=\$\{\1:-([^}]*)\}", path.read_text(), re.M)
    return dict(found)


# How each template names the GPU and its price. Vast.ai and RunPod report the instance's price to the agent
# (dph_total, the pod's cost), so their files carry none; the GPU there is the offer rented / the pod's gpu.id.
def gpu_and_price(name: str) -> tuple[str, str]:
    path = TEMPLATES / name
    if name == "vast.json":
        template = json.loads(path.read_text())
        assert "PRICE_PER_HOUR" not in docker_env_flags(template["env"]) and "GPU" in template["readme"]
        return "the offer rented", "provider"
    if name == "runpod.json":
        assert "PRICE_PER_HOUR" not in json.loads(path.read_text())["env"]
        return "runpod-pod.json", "provider"
    if name == "runpod-pod.json":
        return json.loads(path.read_text())["gpu"]["id"], "provider"
    if name.endswith(".py"):
        template = PythonTemplate(path)
        gpu, prices = template.constants["GPU"], template.constants["GPU_PRICE"]
        assert gpu in prices and all(price > 0 for price in prices.values())
        assert "--gpu" in template.text and "--price-per-hour" in template.text, "arguments, not constants"
        return gpu, str(prices[gpu])
    if name == "hf_jobs.sh":
        defaults = shell_defaults(path)
        text = path.read_text()
        price = re.search(rf"^\s+{re.escape(defaults['FLAVOR'])}\) price=([\d.]+) ;;$", text, re.M)
        # the Hub's listed price first (test_hf_jobs_template.py holds it), the table as the fallback
        assert price and "PRICE_PER_HOUR=${PRICE_PER_HOUR:-${listed:-$price}}" in text
        return defaults["FLAVOR"], price.group(1)
    if name in {"runpod.sh", "vast.sh"}:  # the price: RunPod's catalog, Vast.ai's offer (test_launch_scripts.py)
        text = path.read_text()
        gpu = re.search(r'^GPU="([^"]+)"$', text, re.M)
        assert gpu and "--price-max" in text
        return gpu.group(1), "provider"
    if name == "skypilot.yaml":
        task = yaml.safe_load(path.read_text())
        return str(task["resources"]["accelerators"]), task["envs"]["PRICE_PER_HOUR"]
    documents = list(yaml.safe_load_all(path.read_text()))
    pod = documents[-1]["spec"]
    if pod.get("replicatedJobs"):
        pod = pod["replicatedJobs"][0]["template"]["spec"]
    (container,) = pod["template"]["spec"]["containers"]
    env = {item["name"]: item.get("value") for item in container["env"]}
    assert "nodeSelector:" in path.read_text(), "which GPU model: a node selector to uncomment"
    return f"nvidia.com/gpu: {container['resources']['limits']['nvidia.com/gpu']}", env["PRICE_PER_HOUR"]


@pytest.mark.parametrize(
    "name", sorted(p.name for p in TEMPLATES.iterdir() if p.suffix in {".json", ".py", ".sh", ".yaml"})
)
def test_every_template_passes_a_gpu_and_a_price(name: str) -> None:
    """The card, the progress line and MAX_COST need the price; a template that fixes neither the GPU nor its price
    leaves the card saying "set PRICE_PER_HOUR"."""
    gpu, price = gpu_and_price(name)
    assert gpu
    assert price == "provider" or float(price) > 0, f"{name}: PRICE_PER_HOUR {price!r}"
    readme = (TEMPLATES / "README.md").read_text()
    assert name in readme


@pytest.mark.parametrize(
    ("platform", "follow", "stop"),
    [
        ("Modal", "modal app logs -f trainbox", "modal app stop trainbox"),
        ("Beam", "beam task list --filter status=running", "beam task stop TASK_ID"),
        ("Hugging Face Jobs", "hf jobs logs -f JOB_ID", "hf jobs cancel JOB_ID"),
    ],
)
def test_readme_says_how_to_follow_stop_and_resume_a_run(platform: str, follow: str, stop: str) -> None:
    readme = (TEMPLATES / "README.md").read_text()
    section = readme.split(f"\n## {platform}\n", 1)[1].split("\n## ", 1)[0]
    assert follow in section and stop in section
    assert "same command again resumes" in section


def test_readme_picks_a_template_from_one_table() -> None:
    readme = (TEMPLATES / "README.md").read_text()
    table = readme.split("## Which one do I pick", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in table.splitlines() if line.startswith("| ") and "---" not in line][1:]
    named = {name for row in rows for name in re.findall(r"\[`([\w.-]+)`\]", row)}
    assert named == {p.name for p in TEMPLATES.iterdir()} - {"README.md", ".beamignore"}
    assert any("Hugging Face Jobs" in row and "hf_jobs.sh" in row for row in rows)
