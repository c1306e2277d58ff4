"""Which source the settings name (demo, local folder, local tar, Hub repo), prepared and checked."""

from __future__ import annotations

from ..foreign import Area, Where, agent_error
from ..log import logger
from ..settings import DatasetKind, Settings
from . import demo, fetch, local
from .cache import PreparedDataset, data_dir
from .checks import DatasetCheck, Deferred


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
    return data, DatasetCheck(wanted, settings.libreyolo_command) if wanted else None
