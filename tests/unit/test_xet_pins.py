"""The Xet download imports private helpers of huggingface_hub (``huggingface_hub.utils._xet``) and hf_xet's
streaming API. A release without them would make every Xet fetch fail and fall back to plain HTTP, slower
and unnoticed: these tests fail instead, and the installed versions must lie in the pinned ranges."""

from __future__ import annotations

import ast
import importlib
import importlib.metadata
import re
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.version import Version

import entrypoint.dataset.hub_reads as hub_reads

ROOT = Path(__file__).resolve().parents[2]
PINNED = ("huggingface_hub", "hf_xet")


def _imported_names() -> dict[str, set[str]]:
    """module -> names, for every ``from huggingface_hub... / hf_xet import`` in the Xet download's module."""
    found: dict[str, set[str]] = {}
    for node in ast.walk(ast.parse(Path(hub_reads.__file__).read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] in PINNED:
            found.setdefault(node.module, set()).update(alias.name for alias in node.names)
    return found


def test_the_xet_download_imports_the_private_helpers_checked_here() -> None:
    names = _imported_names()
    assert {"get_xet_session", "refresh_xet_connection_info", "XetFileData"} <= names["huggingface_hub.utils._xet"]
    assert "XetFileInfo" in names["hf_xet"]


@pytest.mark.parametrize(("module", "name"), sorted((m, n) for m, ns in _imported_names().items() for n in ns))
def test_every_name_the_xet_download_imports_exists(module: str, name: str) -> None:
    assert hasattr(importlib.import_module(module), name), f"{module}.{name} is missing: check the pins"


def test_hf_xet_has_the_streaming_calls_used() -> None:
    import hf_xet

    assert hasattr(hf_xet.XetSession, "new_download_stream_group")
    assert hasattr(hf_xet.XetDownloadStreamGroup, "download_stream")
    for call in ("finish", "abort"):
        assert hasattr(hf_xet.XetDownloadStreamGroup, call)
    assert hasattr(hf_xet.XetDownloadStream, "cancel")


def test_installed_versions_lie_in_the_pinned_ranges() -> None:
    text = (ROOT / "pyproject.toml").read_text()
    deps = re.search(r"^dependencies = \[(.*?)^\]", text, re.S | re.M)
    assert deps is not None
    reqs = [Requirement(r) for r in re.findall(r'^\s*"([^"]+)"', deps[1], re.M)]
    pins = {r.name.replace("-", "_").lower(): r for r in reqs}
    for name in PINNED:
        req = pins.get(name.lower())
        assert req is not None and req.specifier, f"{name} has no version range in pyproject.toml"
        installed = Version(importlib.metadata.version(name))
        assert req.specifier.contains(installed), f"{name} {installed} is outside the tested range {req.specifier}"
