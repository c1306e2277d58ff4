"""Fixtures of the local Hub's own tests; the Hub itself and ``hub_ctx`` come from tests/conftest.py."""

from __future__ import annotations

import pytest

from tests.hubfixtures import HubContext, NewRepo


@pytest.fixture
def new_repo(hub_ctx: HubContext) -> NewRepo:
    """A model repo created by the real client for this test's user, empty but for the Hub's first commit."""
    api, repo = hub_ctx.api(), hub_ctx.repo_id()
    api.create_repo(repo)
    return NewRepo(api, repo, hub_ctx.hub)
