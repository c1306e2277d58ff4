"""Per-test view of the shared local Hub (see ``tests/fakes/hub/`` and the ``hub_ctx`` fixture)."""

from __future__ import annotations

import itertools
import os
import secrets
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

from tests.fakes.hub import HubServer

if TYPE_CHECKING:
    from huggingface_hub import HfApi

_users = itertools.count(1)
TRANSFERS = ("xet", "lfs")  # Xet first: the path production takes


@dataclass
class HubContext:
    """A fresh user (namespace) with a write and a read token, a fresh HF cache, and unique repo names.

    The server is shared by the whole session; this keeps tests from seeing each other's repos, cached files,
    faults or log entries.
    """

    hub: HubServer
    user: str
    token: str  # write token for ``user``
    read_token: str  # read-only token for ``user``
    cache_dir: Path  # an empty HF hub cache for this test
    transfer: str = "xet"  # "xet": the Hub hands out a CAS and clients use it; "lfs": neither speaks Xet
    _repos: itertools.count = field(default_factory=lambda: itertools.count(1))

    @classmethod
    def create(cls, hub: HubServer, tmp_path: Path, transfer: str = "xet") -> HubContext:
        user = f"user{next(_users)}"
        token, read_token = f"hf_w_{secrets.token_hex(8)}", f"hf_r_{secrets.token_hex(8)}"
        hub.add_token(token, user, "write")
        hub.add_token(read_token, user, "read")
        cache = tmp_path / "hf-cache"
        cache.mkdir()
        return cls(hub, user, token, read_token, cache, transfer)

    @property
    def url(self) -> str:
        return self.hub.url

    def repo_id(self, stem: str = "repo") -> str:
        """A repo id in this test's namespace that no other test uses (not created)."""
        return f"{self.user}/{stem}-{next(self._repos)}"

    def new_user(self, role: str = "write", orgs: tuple[str, ...] = ()) -> tuple[str, str]:
        """Another user with its own token: (user, token)."""
        user, token = f"user{next(_users)}", f"hf_o_{secrets.token_hex(8)}"
        self.hub.add_token(token, user, role, orgs=orgs)
        return user, token

    def api(self, token: str | bool | None = None) -> HfApi:
        """An ``HfApi`` on this Hub; ``token`` defaults to the write token, ``False`` means anonymous."""
        from huggingface_hub import HfApi

        return HfApi(endpoint=self.hub.url, token=self.token if token is None else token)

    def env(self, **extra: str) -> dict[str, str]:
        """Environment for a child process (e.g. the agent): this Hub, this test's token, cache and transfer mode."""
        # One writer per run: a test's agent started after another one's kill waits one short lease period.
        env = {**os.environ, "LEASE_PERIOD": "6s", "HF_TOKEN": self.token, "HF_HUB_CACHE": str(self.cache_dir), **extra}
        if self.transfer == "lfs":
            env["HF_HUB_DISABLE_XET"] = "1"
        elif "HF_HUB_DISABLE_XET" not in extra:
            env.pop("HF_HUB_DISABLE_XET", None)
        return env

    @property
    def xet(self) -> bool:
        return self.transfer == "xet"

    def download_kwargs(self, **extra: Any) -> dict[str, Any]:
        """``hf_hub_download``/``snapshot_download`` keyword arguments for this test's cache and token."""
        return {"cache_dir": self.cache_dir, "token": self.token, **extra}


class NewRepo(NamedTuple):
    """A fresh, empty model repo of the test's user (the ``new_repo`` fixture of the local Hub's own tests)."""

    api: HfApi  # the real client, with the user's write token
    repo: str
    hub: HubServer
