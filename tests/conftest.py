"""Session-wide local Hugging Face Hub.

huggingface_hub reads HF_ENDPOINT, HF_HOME, HF_HUB_DISABLE_XET, ... once, when it is imported. So the server
socket is bound here, at conftest import (before any test module imports huggingface_hub), and the environment
is set from its URL. Child processes started by tests inherit it.

Fixtures: ``hub`` (session; the ``HubServer``) and ``hub_ctx`` (per test; a ``HubContext`` with a fresh user,
tokens, cache and repo names, faults cleared).

Transfer modes. ``xet`` (the default; what production takes): the Hub hands out a Xet CAS on local disk and
nothing sets HF_HUB_DISABLE_XET. ``lfs``: a Hub without Xet, and clients with HF_HUB_DISABLE_XET=1 (set on
the imported ``huggingface_hub.constants`` and in the environment children inherit). The tests of
``BOTH_TRANSFERS`` (and any test marked ``both_transfers``) run in both modes, Xet first; any test can pin one
with ``@pytest.mark.transfer("lfs")``.

Lanes (docs/testing.md): ``-m "not slow"`` is the fast lane; ``contract`` marks the tests of what Trainbox reads
from and passes to real libreyolo (always ``slow`` too); ``container`` and ``gpu`` need an engine or a card. The
hooks below give every test a timeout by its lane and start the longest tests first; ``WORKER_GROUPS`` keeps the
tests that must not overlap on one pytest-xdist worker.
"""

from __future__ import annotations

import atexit
import compileall
import logging
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
# libreyolo's train options, asked once per session: pytest-xdist's workers inherit the controller's folder.
_SESSION_CACHE = os.environ.get("TRAINBOX_TEST_SESSION_CACHE") or os.path.join(_HF_HOME, "trainbox")
os.environ["TRAINBOX_TEST_SESSION_CACHE"] = _SESSION_CACHE
# The agent's byte code, compiled once per session: with PYTHONDONTWRITEBYTECODE (the image's setting, and CI's
# where it runs) Python writes none, so every agent and every `python -m entrypoint.<x>` child compiled each of
# its modules from source again: a few tenths of a CPU-second per process. Written beside the sources (ignored
# by git); a module edited since is compiled anew when imported, as ever.
# The test modules' byte code too: pytest rewrites each module's asserts on import (a few CPU-seconds for the
# suite, in every pytest-xdist worker) and keeps the result only where Python may write byte code.
sys.dont_write_bytecode = False
if "PYTEST_XDIST_WORKER" not in os.environ:  # the controller (or the only process): once
    for _code in (Path(__file__).parents[1] / "entrypoint", Path(__file__).parent / "fakes"):
        compileall.compile_dir(_code, quiet=1)
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
        # Agents started by tests export nothing at the end (the default with OUTPUT_REPO is onnx); the export
        # tests (test_export*.py) set EXPORT themselves.
        "EXPORT": "off",
        # Nor do they score the model at the end (a `libreyolo val` child: seconds of CPU per run, some 7 with
        # the real libreyolo); the evaluation's tests (test_evaluation*.py, test_export.py, the card's and the
        # dashboard's scores, the demo) set EVAL=1 or keep the default.
        "EVAL": "0",
        # Nor do they measure the host: each agent's check writes and reads 128 MiB, fsync'd (hundreds of agents:
        # tens of GB through the disk the whole suite shares); the host check's tests (test_host_check.py,
        # test_gpu_check.py, test_nccl_fallback.py) and the demo set HOST_CHECK themselves or keep the default.
        "HOST_CHECK": "off",
        # libreyolo's train options, asked once per session (as the image asks once at build time): each
        # agent's fresh WORKDIR would otherwise pay seconds to start libreyolo and ask again.
        "TRAINBOX_CACHE_DIR": _SESSION_CACHE,
    }
)


@pytest.fixture(autouse=True)
def _one_torch_thread_in_the_contract_lane(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """The contract tests' real trainings get one torch thread each (tests/support.py: ONE_TORCH_THREAD)."""
    from tests.support import ONE_TORCH_THREAD  # not at the top: it imports huggingface_hub (see above)

    if request.node.get_closest_marker("contract") is not None:
        for name, value in ONE_TORCH_THREAD.items():
            monkeypatch.setenv(name, value)


@pytest.fixture(autouse=True)
def _secrets_stay_with_their_test() -> Iterator[None]:
    """The agent's secret list is process-wide: one test's value (a key of twenty x's) would otherwise make a
    later test's checkpoint, which holds the same bytes, a file that "contains a secret"."""
    from entrypoint import log

    before = set(log._secrets)
    yield
    with log._secrets_lock:
        log._secrets.clear()
        log._secrets.update(before)


@pytest.fixture(autouse=True)
def _the_agents_logger_stays_with_its_test() -> Iterator[None]:
    """A test that runs the CLI in this process sets the agent's logger up as a container's (log.setup: its own
    stderr handler, no propagation to the root): put back after it, or a later test's caplog, which listens at
    the root, hears none of the agent's lines, depending on which tests its worker ran before."""
    logger = logging.getLogger("trainbox")
    handlers, level, propagate = logger.handlers[:], logger.level, logger.propagate
    yield
    logger.handlers[:] = handlers
    logger.setLevel(level)
    logger.propagate = propagate


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


# Per-test timeouts (pytest-timeout) by lane, where a test names none and the command line gives no --timeout.
FAST_TIMEOUT = 120  # the fast lane: seconds at most, even on a busy machine
SLOW_TIMEOUT = 600  # an agent run on the stand-in libreyolo, real timers: minutes on a busy machine
LONG_TIMEOUT = 1800  # real libreyolo training on the CPU; a container test, the first building the images


# Fast-lane tests of seconds of CPU each (the protocol simulation's sample of generated histories).
LONG_IN_THE_FAST_LANE = ("tests/unit/test_protocol_sim.py::test_a_sample_of_generated_histories",)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", 'transfer(mode): run with the Hub in this transfer mode ("xet" or "lfs")')
    config.addinivalue_line("markers", "both_transfers: run in both transfer modes (where the transfer differs)")


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    module = metafunc.module.__name__.rsplit(".", 1)[-1]
    pinned = metafunc.definition.get_closest_marker("transfer")
    both = module in BOTH_TRANSFERS or metafunc.definition.get_closest_marker("both_transfers") is not None
    if "hub_ctx" in metafunc.fixturenames and both and pinned is None:
        metafunc.parametrize("transfer", TRANSFERS, indirect=True)


@pytest.hookimpl(tryfirst=True)  # before `-m` deselects: a contract test is a slow one
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # A hang fails its test instead of the run. "thread": the agent's own SIGALRM (MAX_RUNTIME) must never meet
    # pytest-timeout's; a test that runs out stops its pytest-xdist worker, which xdist replaces.
    timeouts = config.pluginmanager.hasplugin("timeout") and config.getoption("timeout", None) is None
    for item in items:
        contract, slow = item.get_closest_marker("contract"), item.get_closest_marker("slow")
        container = item.get_closest_marker("container")
        if contract is not None and slow is None:
            item.add_marker(pytest.mark.slow)
        if timeouts and item.get_closest_marker("timeout") is None:
            seconds = LONG_TIMEOUT if contract or container else SLOW_TIMEOUT if slow else FAST_TIMEOUT
            item.add_marker(pytest.mark.timeout(seconds, method="thread"))
    # The longest allowed first (stable: files keep their order), so that no worker is still on a long test
    # started last while the others are idle; in the fast lane, the few that take seconds of CPU lead it.
    items.sort(key=lambda item: (-_timeout_of(item), not item.nodeid.startswith(LONG_IN_THE_FAST_LANE)))


# Tests that one pytest-xdist worker runs, one after the other, whatever -n: the container tests (one builds the
# images the others reuse: session fixtures), the tests whose agents meet on loopback ports they picked free (no
# other test may take them meanwhile), and a fast-lane file that imports torch. By path: with pytest 9.2, xdist 3.8
# can no longer read the `xdist_group` mark (pytest-dev/pytest-xdist#1386).
WORKER_GROUPS = {
    "tests/container/": "docker",
    "tests/integration/test_multinode.py::": "nodes",
    "tests/integration/test_nodes_check.py::": "nodes",
    "tests/unit/test_checkpoint.py::": "torch",  # torch imported by one worker, not by each (seconds of CPU)
}


def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object:
    """`-n N` (xdist's "load") and `--dist loadgroup` schedule test by test, but ``WORKER_GROUPS`` as one unit."""
    if config.getoption("dist") not in ("load", "loadgroup"):
        return None
    from xdist.scheduler import LoadGroupScheduling

    class ByWorkerGroup(LoadGroupScheduling):
        def _split_scope(self, nodeid: str) -> str:
            group = next((name for prefix, name in WORKER_GROUPS.items() if nodeid.startswith(prefix)), None)
            return group or super()._split_scope(nodeid)

    return ByWorkerGroup(config, log)  # type: ignore[arg-type]


def _timeout_of(item: pytest.Item) -> float:
    marker = item.get_closest_marker("timeout")
    if marker is None:
        return 0.0
    return float(marker.args[0] if marker.args else marker.kwargs.get("timeout", 0))


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
