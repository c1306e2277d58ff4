"""What the committers share with the uploader (``committer.Shared``), as a plain namespace: a test of the
committers alone gives its lanes and routing, and hooks where it records what they are told."""

from __future__ import annotations

import threading
from types import SimpleNamespace
from typing import Any

from entrypoint.sync import places
from entrypoint.sync.lane import Lane


def shared(repo: Lane, bucket: Lane | None = None, **overrides: Any) -> SimpleNamespace:
    defaults: dict[str, Any] = {
        "changed": threading.Condition(),
        "stopping": threading.Event(),
        "flush_deadlines": [],
        "cutoff": 0.0,
        "repo_id": "org/model",
        "repo": repo,
        "bucket": bucket,
        "lanes": [lane for lane in (bucket, repo) if lane is not None],
        "routing": places.Routing(repo, bucket, None),
        "snapshots": SimpleNamespace(answered=lambda _ticket: True),
        "lease": None,
        "taken_over": None,
        "owes_run_id": False,
        "kept_epochs": 0,
        "card_refused": None,
        "on_commit": None,
        "on_card": None,
        "on_storage": None,
        "on_taken_over": None,
        "poll_interval": 1.0,
        "fallback": None,
        "fallback_after": 60.0,
    }
    return SimpleNamespace(**(defaults | overrides))
