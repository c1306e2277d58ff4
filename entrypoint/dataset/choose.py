"""Which archive of a Hugging Face dataset repo a run takes: ``DATASET_FILE``, else the only .tar/.tar.gz/.zip
at its root, else its parquet files (``PARQUET``); and that archive as the Hub describes it, found without
downloading it (``trainbox plan``)."""

from __future__ import annotations

from ..errors import AmbiguousArchiveError, NoArchiveError
from ..hub import Hub
from ..settings import Settings
from .hub_reads import RemoteFile, dataset_file, dataset_files, dataset_revision

ARCHIVE_SUFFIXES = (".tar", ".tar.gz", ".tgz", ".zip")
PARQUET = "*.parquet"  # the choice of a repo holding parquet files (datasets' push_to_hub)


def choose_archive(hub: Hub, repo: str, sha: str) -> str:
    """The only .tar/.tar.gz/.zip at the repo root; else ``PARQUET`` when the repo holds parquet files."""
    files = dataset_files(hub, repo, sha, recursive=False)
    tars = sorted(path for path in files if path.lower().endswith(ARCHIVE_SUFFIXES))
    if not tars:
        if any(path.endswith(".parquet") for path in dataset_files(hub, repo, sha)):
            return PARQUET
        listed = ", ".join(sorted(files)[:5]) or "nothing"
        raise NoArchiveError(
            f"dataset {repo} has no .tar, .tar.gz or .zip at its root, and no parquet files (it holds {listed})",
            "upload the dataset as one archive (tar -C DIR -cf data.tar .), or set DATASET_FILE; see docs/datasets.md",
        )
    if len(tars) > 1:
        raise AmbiguousArchiveError(
            f"dataset {repo} has several tars at its root: {', '.join(tars[:5])}", "choose one with DATASET_FILE"
        )
    return tars[0]


def remote_archive(settings: Settings) -> RemoteFile:
    """The tar a run would fetch (resolved on the Hub; nothing downloaded), for ``trainbox plan``."""
    assert settings.dataset_repo is not None
    repo, hub = settings.dataset_repo, Hub.for_settings(settings)
    sha = dataset_revision(hub, repo, settings.dataset_revision)
    name = settings.dataset_file or choose_archive(hub, repo, sha)
    if name == PARQUET:
        size = sum(size for path, size in dataset_files(hub, repo, sha).items() if path.endswith(".parquet"))
        return RemoteFile(repo, PARQUET, sha, size, None, False, "")
    return dataset_file(hub, repo, name, sha)
