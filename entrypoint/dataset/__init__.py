"""Dataset stage: get the data onto the volume in the layout libreyolo trains from, refuse what would
waste a GPU, and have libreyolo check it.

Sources: the bundled demo (generated), a local folder, a local tar or zip, or a Hugging Face dataset
repo holding the dataset as one archive or as parquet files (``dataset.fetch``). Forms (docs/datasets.md):
YOLO with its data.yaml (``forms``), COCO JSON (``coco``), parquet from ``push_to_hub`` (``parquet``).

A tar is extracted by ``extract`` (a zip by ``unzip``; checked member by member) into a staging folder
beside its final one; the folder is renamed into place once extraction, the refusals (``verify``) and
``libreyolo doctor`` succeeded, and a marker written only then lets a restart on the same volume skip
the work.
"""

from .cache import PreparedDataset, data_dir
from .checks import DatasetCheck
from .disk import disk_report
from .prepare import prepare, prepare_checked_in_background

__all__ = ["DatasetCheck", "PreparedDataset", "data_dir", "disk_report", "prepare", "prepare_checked_in_background"]
