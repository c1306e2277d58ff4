"""Session-wide local Hugging Face Hub.

huggingface_hub reads HF_ENDPOINT, HF_HOME, HF_HUB_DISABLE_XET, ... once, when it is imported. So the server
socket is bound here, at conftest import (before any test module imports huggingface_hub), and the environment
is set from its URL. Child processes started by tests inherit it.

Fixtures: ``hub`` (session; the ``HubServer``) and ``hub_ctx`` (per test; a ``HubContext`` with a fresh user,
tokens, cache and repo names, faults cleared).
"""

from __future__ import annotations

import atexit
import os
import shutil
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.hubfixtures import HubContext
from tests.hubserver import HubServer

_HF_HOME = tempfile.mkdtemp(prefix="trainbox-hf-home-")
_HUB = HubServer().start()  # serving from the start, so a stray client fails fast instead of hanging
atexit.register(shutil.rmtree, _HF_HOME, True)
atexit.register(_HUB.stop)

# Never let a developer's token, cache or offline setting leak into the tests.
for _var in (
    "HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "HF_TOKEN_PATH", "HF_STORED_TOKENS_PATH", "HF_HUB_CACHE",
    "HUGGINGFACE_HUB_CACHE", "HF_XET_CACHE", "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_HUB_ENABLE_HF_TRANSFER",
):  # fmt: skip
    os.environ.pop(_var, None)
os.environ.update(
    {
        "HF_ENDPOINT": _HUB.url,
        "HF_HUB_DISABLE_XET": "1",  # the local Hub speaks classic LFS, not xet
        "HF_HUB_DISABLE_TELEMETRY": "1",
        "HF_HUB_DISABLE_PROGRESS_BARS": "1",
        "HF_HOME": _HF_HOME,
    }
)


@pytest.fixture(scope="session")
def hub() -> Iterator[HubServer]:
    """The local Hub, shared by the session. Prefer ``hub_ctx``, which isolates tests from one another."""
    if "huggingface_hub" in sys.modules:
        from huggingface_hub import constants

        if _HUB.url != constants.ENDPOINT or not constants.HF_HUB_DISABLE_XET:
            pytest.fail("huggingface_hub was imported before tests/conftest.py set HF_ENDPOINT/HF_HUB_DISABLE_XET")
    yield _HUB
    _HUB.stop()


@pytest.fixture
def hub_ctx(hub: HubServer, tmp_path: Path) -> Iterator[HubContext]:
    """A fresh user with write/read tokens, an empty HF cache, unique repo names; no faults, empty log."""
    hub.clear_faults()
    hub.set_commit_rate_limit(None)
    hub.reset_log()
    yield HubContext.create(hub, tmp_path)
    hub.clear_faults()
    hub.set_commit_rate_limit(None)
