"""The model card rides in a commit of its own: a card the Hub refuses (its YAML check) never holds back a
checkpoint, is logged once and recorded; a later card that passes lands and clears the record."""

from __future__ import annotations

from pathlib import Path

from entrypoint.hub import Hub
from entrypoint.sync.uploader import Uploader
from tests.hubfixtures import HubContext

GOOD_CARD = "---\nlicense: apache-2.0\nlibrary_name: libreyolo\n---\n\n# run\n"
# What a user's own card may hold, and what the Hub refuses: an unknown license id, a NaN metric.
BAD_CARD = (
    "---\nlicense: my-own-license\nmodel-index:\n- name: run\n  results:\n  - task: {type: object-detection}\n"
    "    dataset: {type: org/data, name: org/data}\n    metrics:\n    - {type: map, value: .nan}\n---\n\n# run\n"
)


def test_a_refused_card_holds_back_nothing(hub_ctx: HubContext, tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    (run_dir / "weights").mkdir(parents=True)
    repo = hub_ctx.repo_id("card")
    hub = Hub(token=hub_ctx.token)
    hub.ensure_writable_repo(repo)
    told: list[str | None] = []
    uploader = Uploader(hub, repo, run_dir, tmp_path / "sync", poll_interval=0.05, on_card=told.append)
    uploader.start()
    try:
        (run_dir / "metrics.jsonl").write_text('{"epoch": 1}\n')
        (run_dir / "README.md").write_text(BAD_CARD)
        uploader.snapshot()
        assert uploader.flush(60), uploader.last_error
        files = hub_ctx.hub.files(repo)
        assert "metrics.jsonl" in files and "README.md" not in files
        assert uploader.card_refused is not None and "license" in uploader.card_refused
        assert "finite" in uploader.card_refused and told == [uploader.card_refused]
        assert uploader.pending == [] and uploader.last_error is None

        # the next card passes: it rides with the epoch's files (one commit per boundary, for the commit budget)
        (run_dir / "metrics.jsonl").write_text('{"epoch": 1}\n{"epoch": 2}\n')
        (run_dir / "README.md").write_text(GOOD_CARD)
        uploader.snapshot()
        assert uploader.flush(60), uploader.last_error
    finally:
        uploader.stop()
    assert hub_ctx.hub.file_bytes(repo, "README.md") == GOOD_CARD.encode()
    assert uploader.card_refused is None and told[-1] is None
    newest, previous = hub_ctx.hub.commits(repo)[:2]
    changed = {path for path, entry in newest.files.items() if previous.files.get(path) != entry}
    assert changed == {"README.md", "metrics.jsonl"}, "an accepted card shares the boundary's commit"


def test_the_license_defaults_to_the_base_models_own(hub_ctx: HubContext, tmp_path: Path) -> None:
    from entrypoint.report import provenance

    base = hub_ctx.repo_id("base")
    hub_ctx.hub.create_repo(base, private=True)
    hub_ctx.hub.commit(base, {"README.md": b"---\nlicense: agpl-3.0\n---\n\n# base\n"}, message="card")
    bare = hub_ctx.repo_id("bare")
    hub_ctx.hub.create_repo(bare, private=True)
    hub_ctx.hub.commit(bare, {"model.pt": b"weights"}, message="no card")
    hub = Hub(token=hub_ctx.token)
    assert provenance.base_license(hub, base, tmp_path / "a") == "agpl-3.0"
    assert provenance.base_license(hub, bare, tmp_path / "b") is None  # no card: no license, no failure
    assert provenance.base_license(hub, hub_ctx.repo_id("missing"), tmp_path / "c") is None


def test_the_card_never_starves_behind_newer_epochs(hub_ctx: HubContext, tmp_path: Path) -> None:
    """Epochs that keep arriving while each commit runs: the card rides with the first of them."""
    import time

    run_dir = tmp_path / "run"
    run_dir.mkdir()
    repo = hub_ctx.repo_id("busy")
    hub = Hub(token=hub_ctx.token)
    hub.ensure_writable_repo(repo)
    commits: list[list[str]] = []
    uploader: Uploader

    def next_epoch(sha: str, names: list[str]) -> None:
        commits.append(names)
        if len(commits) < 6:  # a new epoch is waiting whenever a commit lands
            (run_dir / "metrics.jsonl").write_text("x\n" * (len(commits) + 1))
            uploader.snapshot()

    uploader = Uploader(hub, repo, run_dir, tmp_path / "sync", poll_interval=0.05, on_commit=next_epoch)
    uploader.start()
    try:
        (run_dir / "metrics.jsonl").write_text("x\n")
        (run_dir / "README.md").write_text(GOOD_CARD)
        uploader.snapshot()
        deadline = time.monotonic() + 60
        while len(commits) < 6 and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        uploader.stop()
    assert sorted(commits[0]) == ["README.md", "metrics.jsonl"], commits
    assert all(names == ["metrics.jsonl"] for names in commits[1:]), commits
