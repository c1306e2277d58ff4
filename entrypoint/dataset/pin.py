"""The dataset commit a run trains on: resolved at its first start and kept in trainbox.json
(``dataset_revision``); every later start (a resume, an extension) fetches that commit, wherever the dataset
repo's branch points now. An explicit DATASET_REVISION naming another commit is another dataset: refused."""

from __future__ import annotations

from dataclasses import replace

from ..hub import Hub
from ..log import logger
from ..parsing import DatasetKind
from ..settings import Settings
from ..sync import run_identity
from .hub_reads import dataset_revision


def pinned(settings: Settings, recorded: str | None) -> Settings:
    """``settings`` asking for the run's dataset commit ``recorded`` (None: the first start, nothing recorded yet)."""
    if recorded is None or settings.dataset_kind is not DatasetKind.HUB or settings.dataset_repo is None:
        return settings
    if settings.dataset_revision_given and settings.dataset_revision != recorded:
        commit = dataset_revision(Hub.for_settings(settings), settings.dataset_repo, settings.dataset_revision)
        mismatch = run_identity.refusal({"dataset_revision": recorded}, {}, dataset_commit=commit)
        if mismatch is not None:
            raise run_identity.refuse(mismatch, settings.run_name, "this run")
    elif not settings.dataset_revision_given:
        logger.info("dataset: the run trains on %s@%s, its first start's commit", settings.dataset_repo, recorded[:12])
    return replace(settings, dataset_revision=recorded)
