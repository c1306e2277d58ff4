"""Reading a fine-grained token's write grants from whoami-v2, and what a target lacks (no Hub needed).

The answers below have the Hub's shape: ``auth.accessToken.role == "fineGrained"`` and the grants in
``auth.accessToken.fineGrained.scoped`` (``entity.type`` user/org/model/..., ``permissions`` like ``repo.write``).
"""

from __future__ import annotations

from typing import Any

import pytest

from entrypoint.hub import WriteGrants, token_write_grants, write_gap


def whoami(*scoped: dict[str, Any], fine: Any = "default") -> dict[str, Any]:
    block = {"canReadGatedRepos": True, "global": ["discussion.write", "post.write"], "scoped": list(scoped)}
    access: dict[str, Any] = {"displayName": "ci", "role": "fineGrained"}
    if fine is not None:
        access["fineGrained"] = block if fine == "default" else fine
    return {"type": "user", "name": "alice", "orgs": [{"name": "team"}], "auth": {"accessToken": access}}


def grant(kind: str, name: str, *permissions: str) -> dict[str, Any]:
    return {"entity": {"_id": "6650aa", "type": kind, "name": name}, "permissions": list(permissions)}


def never_asked() -> bool:
    raise AssertionError("existence is asked only for a grant on the target alone")


def test_grants_on_namespaces_and_single_repos() -> None:
    found = token_write_grants(
        whoami(
            grant("user", "alice", "repo.content.read", "repo.write", "inference.serverless.write"),
            grant("org", "team", "repo.content.read"),  # read only: no write there
            grant("model", "team/detector", "repo.content.read", "repo.write"),
        )
    )
    assert found == WriteGrants(namespaces=frozenset({"alice"}), targets=frozenset({"team/detector"}))


@pytest.mark.parametrize("fine", [None, {}, {"scoped": "all"}, ["repo.write"]])
def test_an_answer_without_readable_grants_is_not_judged(fine: Any) -> None:
    # an unknown shape must never read as "no permission": that would refuse a token the Hub accepts
    assert token_write_grants(whoami(fine=fine)) is None


def test_malformed_grants_are_skipped_not_fatal() -> None:
    found = token_write_grants(whoami({"entity": "alice"}, {"permissions": ["repo.write"]}, grant("org", "team")))
    assert found == WriteGrants(frozenset(), frozenset())


def test_a_namespace_grant_covers_every_repo_and_bucket_there() -> None:
    grants = WriteGrants(frozenset({"team"}), frozenset())
    assert write_gap(grants, "team/detector", exists=never_asked) is None
    assert write_gap(grants, "team/detector-checkpoints", exists=never_asked) is None


def test_no_grant_names_the_permission_and_the_namespace() -> None:
    gap = write_gap(WriteGrants(frozenset({"alice"}), frozenset()), "team/detector", exists=never_asked)
    assert gap is not None
    action, needed = gap
    assert action == "write to" and "'repo.write' on team" in needed


def test_a_grant_on_the_repo_alone_writes_it_but_cannot_create_it() -> None:
    grants = WriteGrants(frozenset(), frozenset({"team/detector"}))
    assert write_gap(grants, "team/detector", exists=lambda: True) is None
    gap = write_gap(grants, "team/detector", exists=lambda: False)
    assert gap is not None and gap[0] == "create" and "'repo.write' on team" in gap[1]
    # the bucket beside it is another target: that grant does not reach it
    gap = write_gap(grants, "team/detector-checkpoints", exists=never_asked)
    assert gap is not None and gap[0] == "write to"


@pytest.mark.parametrize("permission", ["repo.write", "bucket.write", "repo.content.write"])
def test_write_permissions_are_read_generously(permission: str) -> None:
    found = token_write_grants(whoami(grant("org", "team", permission)))
    assert found is not None and found.namespaces == {"team"}


@pytest.mark.parametrize("permission", ["repo.content.read", "discussion.write", "inference.endpoints.write"])
def test_other_permissions_do_not_write_repos(permission: str) -> None:
    found = token_write_grants(whoami(grant("org", "team", permission)))
    assert found == WriteGrants(frozenset(), frozenset())


@pytest.mark.parametrize("kind", ["user", "org", "organization"])
def test_a_namespace_is_a_user_or_an_organisation(kind: str) -> None:
    found = token_write_grants(whoami(grant(kind, "team", "repo.write")))
    assert found == WriteGrants(frozenset({"team"}), frozenset())
