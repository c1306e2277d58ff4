"""Dataset stage: get the data onto the volume, find its data.yaml, and have libreyolo check it.

Sources: the bundled demo (generated), a local folder holding a data.yaml, a local tar, or a
Hugging Face dataset repo holding the dataset as one tar (``dataset.fetch``).

A tar is extracted by ``extract`` (checked member by member) into a staging folder beside its
final one; the folder is renamed into place once extraction and ``libreyolo doctor`` succeeded,
and a marker written only then lets a restart on the same volume skip the work.
"""

from .cache import PreparedDataset, data_dir
from .checks import DatasetCheck
from .disk import disk_report
from .prepare import prepare, prepare_checked_in_background

__all__ = ["DatasetCheck", "PreparedDataset", "data_dir", "disk_report", "prepare", "prepare_checked_in_background"]
