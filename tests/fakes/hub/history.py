"""Super-squash of the local Hub: ``POST /api/{type}s/{repo}/super-squash/{branch}`` ({"message"}), as
``HfApi.super_squash_history`` calls it. The branch becomes one commit holding its current tree; the
commits no branch or tag reaches any more are gone, as on the Hub."""

from __future__ import annotations

import re
import secrets
import time
from typing import TYPE_CHECKING

from tests.fakes.hub.http import _ROUTES
from tests.fakes.hub.model import Commit

if TYPE_CHECKING:
    from tests.fakes.hub.http import _Call, _Handler


def register_routes() -> None:
    if not any(name == "super_squash" for _, _, name in _ROUTES):
        rx = r"/api/(?P<t>models|datasets|spaces)/(?P<repo>[^/]+/[^/]+)/super-squash/(?P<rev>[^/]+)"
        _ROUTES.append(("POST", re.compile(rx), "super_squash"))


class HistoryMixin:
    def _api_super_squash(self, h: _Handler, c: _Call) -> None:
        body = h.read_json()
        with self._lock:
            repo = self._writable(c)
            head = repo.resolve(c.rev)
            oid = secrets.token_hex(20)
            summary = str(body.get("message") or f"Super-squash branch '{c.rev}'")
            repo.commits[oid] = Commit(oid, None, summary, "", c.user.user if c.user else "", time.time(), head.files)
            repo.branches[c.rev] = oid
            kept = {commit.oid for ref in [*repo.branches.values(), *repo.tags.values()]
                    for commit in repo.history(repo.commits[ref])}  # fmt: skip
            repo.commits = {k: v for k, v in repo.commits.items() if k in kept}
        h.send_json(200, {"commitId": oid})
