"""``trainbox eval --repo org/model``: the files a model repo ships, scored on a dataset's held-out split by the same
code the box runs (``run.evaluate_file``, ``libreyolo val`` in a child), printed as the same table, or as eval.json.

The files: those the repo's eval.json scored, else ``weights/best.pt`` and config.json's exports; a folder export
(OpenVINO's) comes down whole, every file under it (``Hub.download_folder``). The dataset: the
one the run trained on, at the commit it trained on (its trainbox.json), unless ``--dataset`` names another; a
dataset whose classes are not the model's is refused (exit 26), a ``--split`` it lacks too (exit 24).
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import MutableMapping
from pathlib import Path
from typing import Any

from .. import libreyolo
from ..errors import ConfigError, StopRequested
from ..hub import Hub
from ..log import logger
from . import record
from .run import EvaluationFailed, evaluate_file
from .split import choose, truths


def evaluate_repo(
    hub: Hub,
    repo: str,
    environ: MutableMapping[str, str],
    *,
    dataset: str | None,
    split: str | None,
    device: str,
) -> tuple[dict[str, Any], dict[str, int]]:
    """The evaluation document for ``repo``'s files, and each file's size."""
    with tempfile.TemporaryDirectory(prefix="trainbox-eval-") as scratch_dir:
        scratch = Path(scratch_dir)
        config = _json(hub, repo, "config.json", scratch) or {}
        earlier = _json(hub, repo, record.EVAL_FILE, scratch) or {}
        state = _json(hub, repo, "trainbox.json", scratch) or {}
        files = list(earlier.get("files") or {}) or [
            libreyolo.BEST_CHECKPOINT,
            *[str(path) for path in (config.get("exports") or {}).values()],
        ]
        source = dataset or (state.get("settings") or {}).get("dataset")
        if not isinstance(source, str) or not source:
            raise ConfigError(f"{repo} does not say which dataset trained it", "pass --dataset org/name")
        revision = None if dataset else (state.get("dataset") or {}).get("revision")
        data_yaml, found_revision, command = _dataset(environ, source, revision)
        names = config.get("names")
        chosen = choose(data_yaml, split, trained=[str(n) for n in names] if isinstance(names, list) else None)
        ground = truths(chosen)
        imgsz = config.get("imgsz")
        scored: dict[str, dict[str, Any]] = {}
        sizes: dict[str, int] = {}
        present = {str(entry.path) for entry in hub.list_files(repo)}
        for name in files:
            local = _download(hub, repo, name, present, scratch / "files")
            if local is None:
                logger.warning("evaluation %s: not scored: %s holds no such file or folder", name, repo)
                continue
            sizes[name] = _size(local)
            try:
                scored[name] = evaluate_file(
                    libreyolo.executable(command),
                    local,
                    data_yaml,
                    chosen,
                    imgsz=str(imgsz) if imgsz else None,
                    device=device,
                    scratch=scratch / "val" / Path(name).name,
                    env=dict(environ),
                    ground=ground,
                )
            except EvaluationFailed as error:
                logger.warning("evaluation %s: not scored: %s", name, error)
        return record.document(chosen.name, found_revision, scored), sizes


def _download(hub: Hub, repo: str, name: str, present: set[str], target: Path) -> Path | None:
    """A file of the repo, or a folder export (OpenVINO's: every file under it), into ``target``; None when the
    repo holds neither."""
    if name in present:
        return hub.download(repo, name, target)
    folder = name.strip("/")
    if any(path.startswith(f"{folder}/") for path in present):
        return hub.download_folder(repo, folder, target)
    return None


def _size(local: Path) -> int:
    if local.is_dir():
        return sum(part.stat().st_size for part in local.rglob("*") if part.is_file())
    return local.stat().st_size if local.is_file() else 0


def _json(hub: Hub, repo: str, name: str, scratch: Path) -> dict[str, Any] | None:
    try:
        found = json.loads(hub.download(repo, name, scratch / "meta").read_text())
    except StopRequested:
        raise
    except Exception:  # not there (an older run, a repo Trainbox did not write): the next source answers
        return None
    return found if isinstance(found, dict) else None


def _dataset(
    environ: MutableMapping[str, str], source: str, revision: str | None
) -> tuple[Path, str | None, str | None]:
    """The dataset prepared as ``trainbox fetch`` prepares it (cached on WORKDIR); TRAINBOX_LIBREYOLO."""
    from .. import dataset as datasets
    from .. import settings

    overrides = {"DATASET_REPO": source} | ({"DATASET_REVISION": revision} if revision else {})
    for key in ("DATASET_REPO", "DATASET_REVISION"):
        environ.pop(key, None)
    environ.update(overrides)
    loaded = settings.load(environ)
    prepared = datasets.prepare(loaded)
    return prepared.data_yaml, prepared.revision, loaded.libreyolo_command
