"""Fine-grained tokens against the local Hub: a token that cannot write (or create) OUTPUT_REPO or its bucket is
refused at start, naming the permission to add, before any byte of the dataset is fetched.

The test Hub answers whoami-v2 for a fine-grained token as the Hub does (``role: "fineGrained"``, the grants in
``fineGrained.scoped``) and enforces the grants on every write: the old behaviour (trust the token, find out at
the first commit) would pass its start and fail after the dataset and an epoch.
"""

from __future__ import annotations

import secrets
import subprocess
import sys
import tarfile
from pathlib import Path
from typing import Any

import pytest

from entrypoint.errors import AccessError
from entrypoint.hub import Hub
from tests.fakes import libreyolo as fake_libreyolo
from tests.hubfixtures import HubContext
from tests.support import make_dataset, trainbox_env


def grant(kind: str, name: str, *permissions: str) -> dict[str, Any]:
    return {"entity": {"type": kind, "name": name}, "permissions": list(permissions)}


def fine_grained(ctx: HubContext, *scoped: dict[str, Any]) -> str:
    """A fine-grained token of this test's user with these grants."""
    token = f"hf_f_{secrets.token_hex(8)}"
    ctx.hub.add_token(token, ctx.user, "write", scoped=scoped)
    return token


def hub_for(ctx: HubContext, token: str) -> Hub:
    return Hub(token=token, endpoint=ctx.url)


def test_the_test_hub_answers_whoami_like_the_hub(hub_ctx: HubContext) -> None:
    token = fine_grained(hub_ctx, grant("user", hub_ctx.user, "repo.content.read", "repo.write"))
    access = hub_ctx.api(token).whoami()["auth"]["accessToken"]
    assert access["role"] == "fineGrained"
    (scoped,) = access["fineGrained"]["scoped"]
    assert scoped["entity"]["type"] == "user" and scoped["entity"]["name"] == hub_ctx.user and scoped["entity"]["_id"]
    assert scoped["permissions"] == ["repo.content.read", "repo.write"]


def test_a_namespace_grant_creates_and_writes_the_repo_and_the_bucket(hub_ctx: HubContext) -> None:
    repo = hub_ctx.repo_id("model")
    token = fine_grained(hub_ctx, grant("user", hub_ctx.user, "repo.content.read", "repo.write"))
    hub_for(hub_ctx, token).ensure_writable_repo(repo, bucket=f"{repo}-checkpoints")
    assert hub_ctx.hub.repo_exists(repo)


def test_a_read_only_grant_is_refused_before_the_first_commit(hub_ctx: HubContext) -> None:
    repo = hub_ctx.repo_id("model")
    hub_ctx.hub.create_repo(repo)  # it exists: create_repo(exist_ok) alone would let this token through
    token = fine_grained(hub_ctx, grant("user", hub_ctx.user, "repo.content.read"))
    with pytest.raises(AccessError) as refused:
        hub_for(hub_ctx, token).ensure_writable_repo(repo)
    message = str(refused.value)
    assert f"may not write to OUTPUT_REPO {repo}" in message and f"'repo.write' on {hub_ctx.user}" in message
    assert token not in message
    # and the Hub agrees: this token's commit is refused
    with pytest.raises(Exception, match="403"):
        hub_ctx.api(token).upload_file(path_or_fileobj=b"x", path_in_repo="x.txt", repo_id=repo)


def test_a_grant_on_the_repo_alone_writes_it_once_it_exists(hub_ctx: HubContext) -> None:
    repo = hub_ctx.repo_id("model")
    token = fine_grained(hub_ctx, grant("model", repo, "repo.content.read", "repo.write"))
    with pytest.raises(AccessError, match=f"may not create OUTPUT_REPO {repo}"):
        hub_for(hub_ctx, token).ensure_writable_repo(repo)
    assert not hub_ctx.hub.repo_exists(repo)
    hub_ctx.hub.create_repo(repo, private=True)
    hub_for(hub_ctx, token).ensure_writable_repo(repo)  # no bucket asked for (CHECKPOINT_BUCKET=off)
    # its bucket is another target, which that grant does not reach
    with pytest.raises(AccessError) as refused:
        hub_for(hub_ctx, token).ensure_writable_repo(repo, bucket=f"{repo}-checkpoints")
    assert f"may not write to the bucket {repo}-checkpoints" in refused.value.message
    assert "CHECKPOINT_BUCKET=off" in str(refused.value.hint)


# -- the agent: refused at start, before the dataset ----------------------------------------------------------


def publish_dataset(ctx: HubContext, tmp_path: Path) -> str:
    root = tmp_path / "src" / "cones"
    make_dataset(root)
    tar = tmp_path / "src" / "cones.tar"
    with tarfile.open(tar, "w") as archive:
        archive.add(root, arcname="cones")
    repo = ctx.repo_id("data")
    ctx.hub.create_repo(repo, repo_type="dataset")
    ctx.hub.commit(repo, {"cones.tar": tar}, repo_type="dataset", message="dataset")
    return repo


def run_agent(
    ctx: HubContext, tmp_path: Path, token: str, dataset: str, output: str
) -> subprocess.CompletedProcess[str]:
    fake_libreyolo.install(tmp_path / "bin")
    env = trainbox_env(tmp_path / "work") | ctx.env(
        HF_TOKEN=token,
        DATASET_REPO=dataset,
        OUTPUT_REPO=output,
        CHECKPOINT_BUCKET=f"{output}-checkpoints",
        GPUS="cpu",
        RUN_ARGS="epochs=1",
        FAKE_EPOCH_SECONDS="0.2",
        TRAINBOX_LIBREYOLO=str(tmp_path / "bin" / "libreyolo"),
    )
    return subprocess.run(
        [sys.executable, "-m", "entrypoint", "run"], env=env, capture_output=True, text=True, timeout=300
    )


@pytest.mark.slow
@pytest.mark.transfer("xet")
def test_the_agent_refuses_a_token_that_cannot_write_before_any_dataset_byte(
    hub_ctx: HubContext, tmp_path: Path
) -> None:
    dataset = publish_dataset(hub_ctx, tmp_path)
    output = hub_ctx.repo_id("model")
    hub_ctx.hub.create_repo(output, private=True)
    token = fine_grained(hub_ctx, grant("user", hub_ctx.user, "repo.content.read"))
    hub_ctx.hub.reset_log()

    result = run_agent(hub_ctx, tmp_path, token, dataset, output)

    text = result.stdout + result.stderr
    assert result.returncode == AccessError.exit_code, text[-3000:]
    assert f"'repo.write' on {hub_ctx.user}" in text and token not in text
    assert not hub_ctx.hub.find_requests(path=rf"/{dataset}"), "the dataset was touched before the token was judged"
    assert not hub_ctx.hub.find_requests(method="POST", path=r"/commit/")


@pytest.mark.slow
@pytest.mark.transfer("xet")
def test_the_agent_trains_with_a_token_granted_the_namespace(hub_ctx: HubContext, tmp_path: Path) -> None:
    dataset = publish_dataset(hub_ctx, tmp_path)
    output = hub_ctx.repo_id("model")
    token = fine_grained(hub_ctx, grant("user", hub_ctx.user, "repo.content.read", "repo.write"))

    result = run_agent(hub_ctx, tmp_path, token, dataset, output)

    text = result.stdout + result.stderr
    assert result.returncode == 0, text[-3000:]
    assert hub_ctx.hub.bucket_files(f"{output}-checkpoints"), "the working state went to the bucket"
    assert "trainbox.json" in hub_ctx.hub.files(output)
