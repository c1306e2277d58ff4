"""Session-wide local Hugging Face Hub.

huggingface_hub reads HF_ENDPOINT, HF_HOME, HF_HUB_DISABLE_XET, ... once, when it is imported. So the server
socket is bound here, at conftest import (before any test module imports huggingface_hub), and the environment
is set from its URL. Child processes started by tests inherit it.

Fixtures: ``hub`` (session; the ``HubServer``) and ``hub_ctx`` (per test; a ``HubContext`` with a fresh user,
tokens, cache and repo names, faults cleared).

Transfer modes. ``xet`` (the default; what production takes): the Hub hands out a Xet CAS on local disk and
nothing sets HF_HUB_DISABLE_XET. ``lfs``: a Hub without Xet, and clients with HF_HUB_DISABLE_XET=1 (set on
the imported ``huggingface_hub.constants`` and in the environment children inherit). The tests of
``BOTH_TRANSFERS`` run in both modes, Xet first; any test can pin one with ``@pytest.mark.transfer("lfs")``.
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

from tests.fakes.hub import HubServer
from tests.hubfixtures import TRANSFERS, HubContext

_HF_HOME = tempfile.mkdtemp(prefix="trainbox-hf-home-")
_HUB = HubServer().start()  # serving from the start, so a stray client fails fast instead of hanging
atexit.register(shutil.rmtree, _HF_HOME, True)
atexit.register(_HUB.stop)

# Never let a developer's token, cache or offline setting leak into the tests.
for _var in (
    "HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "HF_TOKEN_PATH", "HF_STORED_TOKENS_PATH", "HF_HUB_CACHE",
    "HUGGINGFACE_HUB_CACHE", "HF_XET_CACHE", "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_HUB_ENABLE_HF_TRANSFER",
    "HF_HUB_DISABLE_XET",
):  # fmt: skip
    os.environ.pop(_var, None)
os.environ.update(
    {
        "HF_ENDPOINT": _HUB.url,
        "HF_HUB_DISABLE_TELEMETRY": "1",
        "HF_HUB_DISABLE_PROGRESS_BARS": "1",
        "HF_HOME": _HF_HOME,
        # Agents started by tests commit every epoch to OUTPUT_REPO, as the tests written for that expect;
        # the Storage Bucket tests (test_bucket_*.py) set CHECKPOINT_BUCKET themselves.
        "CHECKPOINT_BUCKET": "off",
        # libreyolo's train options, asked once per session (as the image asks once at build time): each
        # agent's fresh WORKDIR would otherwise pay seconds to start libreyolo and ask again.
        "TRAINBOX_CACHE_DIR": os.path.join(_HF_HOME, "trainbox"),
    }
)


@pytest.fixture(scope="session")
def hub() -> Iterator[HubServer]:
    """The local Hub, shared by the session. Prefer ``hub_ctx``, which isolates tests from one another."""
    if "huggingface_hub" in sys.modules:
        from huggingface_hub import constants

        if _HUB.url != constants.ENDPOINT or constants.HF_HUB_DISABLE_XET:
            pytest.fail(
                "huggingface_hub was imported before tests/conftest.py set HF_ENDPOINT and cleared HF_HUB_DISABLE_XET"
            )
    yield _HUB
    _HUB.stop()


# Where the transfer path differs between Xet and LFS: uploads, resumes, dataset downloads.
BOTH_TRANSFERS = ("test_sync", "test_resume", "test_dataset_hub")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", 'transfer(mode): run with the Hub in this transfer mode ("xet" or "lfs")')


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    module = metafunc.module.__name__.rsplit(".", 1)[-1]
    pinned = metafunc.definition.get_closest_marker("transfer")
    if "hub_ctx" in metafunc.fixturenames and module in BOTH_TRANSFERS and pinned is None:
        metafunc.parametrize("transfer", TRANSFERS, indirect=True)


@pytest.fixture
def transfer(request: pytest.FixtureRequest, hub: HubServer, monkeypatch: pytest.MonkeyPatch) -> str:
    """The transfer mode of this test (see the module docstring); the Hub and the clients are set to it."""
    marker = request.node.get_closest_marker("transfer")
    mode = getattr(request, "param", None) or (marker.args[0] if marker else "xet")
    if mode not in TRANSFERS:
        raise ValueError(f"transfer mode {mode!r}: one of {TRANSFERS}")
    from huggingface_hub import constants

    lfs = mode == "lfs"
    hub.set_xet(not lfs)
    monkeypatch.setattr(constants, "HF_HUB_DISABLE_XET", lfs)
    if lfs:
        monkeypatch.setenv("HF_HUB_DISABLE_XET", "1")  # agent children read it when they import huggingface_hub
    return mode


@pytest.fixture
def hub_ctx(hub: HubServer, transfer: str, tmp_path: Path) -> Iterator[HubContext]:
    """A fresh user with write/read tokens, an empty HF cache, unique repo names; no faults, empty log."""
    hub.clear_faults()
    hub.set_commit_rate_limit(None)
    hub.reset_log()
    yield HubContext.create(hub, tmp_path, transfer)
    hub.clear_faults()
    hub.set_commit_rate_limit(None)
    hub.set_xet(True)
    hub.set_buckets(True)
