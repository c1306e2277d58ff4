"""Dataset stage: get the data onto the volume, find its data.yaml, and have libreyolo check it.

Sources: the bundled demo (generated), a local folder holding a data.yaml, a local tar, or a
Hugging Face dataset repo holding the dataset as one tar (``dataset.fetch``).

A tar is extracted by ``extract`` (checked member by member) into a staging folder beside its
final one; the folder is renamed into place once extraction and ``libreyolo doctor`` succeeded,
and a marker written only then lets a restart on the same volume skip the work.
"""

from __future__ import annotations

from ..foreign import Area, Where, agent_error
from ..log import logger
from ..settings import DatasetKind, Settings
from . import demo, fetch, local
from .cache import PreparedDataset, data_dir
from .checks import DatasetCheck, Deferred
from .disk import disk_report

__all__ = ["DatasetCheck", "PreparedDataset", "data_dir", "disk_report", "prepare", "prepare_checked_in_background"]


def prepare(settings: Settings, *, defer_to: Deferred | None = None) -> PreparedDataset:
    """The dataset on the volume, checked (``defer_to``: the check noted there instead, ``checks.doctor``)."""
    try:
        return _prepare(settings, defer_to)
    except OSError as error:
        where = Where(
            Area.DISK,
            doing="preparing the dataset in WORKDIR",
            disk_hint=f"free space in {settings.workdir}, or rent a bigger disk",
        )
        mapped = agent_error(error, where)
        if mapped is None:
            raise
        raise mapped from None


def _prepare(settings: Settings, defer_to: Deferred | None) -> PreparedDataset:
    if settings.dataset_kind is DatasetKind.DEMO:
        data_yaml = demo.write_demo_dataset(data_dir(settings) / "demo")
        logger.info(
            "dataset: the bundled demo (%d images, classes %s)",
            demo.TRAIN_IMAGES + demo.VAL_IMAGES,
            ", ".join(demo.CLASSES),
        )
        return PreparedDataset(data_yaml=data_yaml, root=data_yaml.parent, description="bundled demo")
    if settings.dataset_kind is DatasetKind.LOCAL_DIR:
        return local.prepare_folder(settings, defer_to=defer_to)
    if settings.dataset_kind is DatasetKind.LOCAL_TAR:
        return local.prepare_tar(settings, defer_to=defer_to)
    return fetch.prepare(settings, defer_to=defer_to)


def prepare_checked_in_background(settings: Settings) -> tuple[PreparedDataset, DatasetCheck | None]:
    """``prepare``, with the dataset check (if not cached) started once the data is in place, not waited for.

    The caller starts training, watches ``done()`` and stops training if ``result()`` raises. An
    archive is then marked ready before its check passed: a restart finds it extracted and checks it
    again (a pass is remembered only when it happens).
    """
    wanted: Deferred = {}
    data = prepare(settings, defer_to=wanted)
    return data, DatasetCheck(wanted) if wanted else None
