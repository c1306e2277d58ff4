"""One version: written in entrypoint/__init__.py, read by the build, pinned by the docs, checked against the tag."""

from __future__ import annotations

import os
import re
import subprocess
import tomllib
from pathlib import Path

import yaml
from setuptools.config.pyprojecttoml import read_configuration

import entrypoint

REPO = Path(__file__).resolve().parents[2]
# Where a release of the image is named outside templates/ (tests/unit/test_templates.py checks those).
PINNED_IMAGE = re.compile(r"ghcr\.io/libreyolo/trainbox:(\d+\.\d+\.\d+(?:-rc\.\d+)?)")


def test_the_build_reads_the_version_from_the_package() -> None:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    assert "version" not in project and "version" in project["dynamic"], "pyproject.toml must not write the version"
    # what setuptools puts in the wheel's metadata
    assert read_configuration(REPO / "pyproject.toml")["project"]["version"] == entrypoint.__version__


def test_docs_and_compose_pin_the_current_release() -> None:
    docs = [str(path.relative_to(REPO)) for path in sorted((REPO / "docs").glob("*.md"))]
    for name in ("README.md", *docs, "compose.yaml", "templates/README.md", "templates/kubernetes.yaml"):
        versions = set(PINNED_IMAGE.findall((REPO / name).read_text()))
        assert versions <= {entrypoint.__version__}, f"{name} pins {versions}, not {entrypoint.__version__}"
    assert PINNED_IMAGE.findall((REPO / "README.md").read_text()), "README.md shows no pinned image"


def tag_check(ref_name: str) -> subprocess.CompletedProcess[str]:
    """The image workflow's tag check, run by bash as the runner would."""
    job = yaml.safe_load((REPO / ".github" / "workflows" / "image.yml").read_text())["jobs"]["version"]
    (script,) = [s["run"] for s in job["steps"] if s.get("id") == "check"]
    env = {**os.environ, "REF_NAME": ref_name}
    return subprocess.run(["bash", "-e", "-c", script], cwd=REPO, env=env, capture_output=True, text=True, timeout=30)


def test_a_release_tag_must_be_v_plus_the_package_version() -> None:
    assert tag_check(f"v{entrypoint.__version__}").returncode == 0
    wrong = tag_check("v999.0.0")
    assert wrong.returncode != 0
    assert f"tag v999.0.0 is not v{entrypoint.__version__}" in wrong.stdout


def test_the_tests_and_the_push_wait_for_the_tag_check() -> None:
    jobs = yaml.safe_load((REPO / ".github" / "workflows" / "image.yml").read_text())["jobs"]
    assert jobs["tests"]["needs"] == "version" and jobs["publish"]["needs"] == "tests"
    assert "refs/tags/v" in jobs["version"]["if"]
