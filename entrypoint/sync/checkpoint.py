"""Check a ``.pt`` checkpoint without torch and without running any of its code.

A checkpoint is uploaded (or resumed from) only if it is a complete zip archive (every CRC
right, so a file caught mid-write is refused), its pickle uses nothing outside the handful of
globals that torch's ``weights_only`` loader allows for plain tensors, and every tensor storage
it names is present with the right number of bytes. The pickle is read by a restricted
unpickler whose only callables are inert stand-ins, which also yields the metadata (epoch…).
"""

from __future__ import annotations

import io
import pickle
import zipfile
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import StopRequested

_ELEMENT_SIZE = {
    "DoubleStorage": 8, "FloatStorage": 4, "HalfStorage": 2, "BFloat16Storage": 2, "LongStorage": 8,
    "IntStorage": 4, "ShortStorage": 2, "CharStorage": 1, "ByteStorage": 1, "BoolStorage": 1,
    "ComplexFloatStorage": 8, "ComplexDoubleStorage": 16,
}  # fmt: skip
_REBUILDERS = {"_rebuild_tensor", "_rebuild_tensor_v2", "_rebuild_parameter", "_rebuild_parameter_with_state"}
_DTYPES = {
    "float32", "float64", "float16", "bfloat16", "int64", "int32", "int16", "int8", "uint8", "bool",
    "complex64", "complex128",
}  # fmt: skip


class InvalidCheckpoint(Exception):
    """Torn, truncated, or holding something a safe loader would refuse."""


class TornCheckpoint(InvalidCheckpoint):
    """Cut short or changed while written (0 bytes, a zip archive without its end, a CRC that fails): the
    bytes hold no checkpoint, so a copy of them is worth nothing either. The other refusals are whole
    files (a secret inside, a pickle a safe loader refuses, not a zip at all) that only their volume holds."""


@dataclass(frozen=True)
class CheckpointInfo:
    epoch: int | None  # libreyolo's 0-based epoch of the last completed epoch
    metadata: dict[str, Any]  # the plain (non-tensor) top-level values

    @property
    def completed_epochs(self) -> int | None:
        return None if self.epoch is None else self.epoch + 1

    @property
    def total_epochs(self) -> int | None:
        config = self.metadata.get("config")
        value = config.get("epochs") if isinstance(config, dict) else None
        return value if isinstance(value, int) else None


class _Tensor:
    """What a tensor becomes here: its shape, no data."""

    def __init__(self, *args: Any) -> None:
        self.args = args


class _Storage:
    def __init__(self, name: str) -> None:
        self.name = name


class _SafeUnpickler(pickle.Unpickler):
    def __init__(self, data: bytes, records: dict[str, int], prefix: str) -> None:
        super().__init__(io.BytesIO(data))
        self.records = records
        self.prefix = prefix

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) == ("collections", "OrderedDict"):
            return OrderedDict
        if module == "torch._utils" and name in _REBUILDERS:
            return _Tensor
        if module == "torch" and (name.endswith("Storage") or name == "Size"):
            return _Storage(name) if name.endswith("Storage") else tuple
        if module == "torch" and name in _DTYPES:
            return name
        if (module, name) in {("builtins", "set"), ("builtins", "complex"), ("builtins", "bytearray")}:
            return {"set": set, "complex": complex, "bytearray": bytearray}[name]
        raise InvalidCheckpoint(f"refers to {module}.{name}, which a weights-only loader refuses")

    def persistent_load(self, pid: Any) -> Any:
        if not (isinstance(pid, tuple) and len(pid) == 5 and pid[0] == "storage"):
            raise InvalidCheckpoint(f"unexpected persistent id {pid!r:.80}")
        _, storage_type, key, _location, numel = pid
        record = f"{self.prefix}/data/{key}"
        if record not in self.records:
            raise InvalidCheckpoint(f"tensor storage {key} is missing")
        size = _ELEMENT_SIZE.get(getattr(storage_type, "name", ""))
        if size is not None and isinstance(numel, int) and self.records[record] != numel * size:
            raise InvalidCheckpoint(f"tensor storage {key} has {self.records[record]} bytes, expected {numel * size}")
        return storage_type


def inspect(path: Path, *, check_crc: bool = True) -> CheckpointInfo:
    """Validate ``path``; raise InvalidCheckpoint, else return its epoch and metadata.

    ``check_crc=False`` reads only the archive's directory and its pickle, not every tensor: for
    a copy already checked whole, whose metadata is wanted again."""
    try:
        with zipfile.ZipFile(path) as archive:
            broken = archive.testzip() if check_crc else None
            if broken is not None:
                raise TornCheckpoint(f"{broken} fails its CRC check (file changed while being read)")
            names = [info.filename for info in archive.infolist()]
            pickles = [name for name in names if name.endswith("/data.pkl") and name.count("/") == 1]
            if len(pickles) != 1:
                raise InvalidCheckpoint("not a torch checkpoint (no single data.pkl)")
            prefix = pickles[0].split("/", 1)[0]
            records = {info.filename: info.file_size for info in archive.infolist()}
            data = archive.read(pickles[0])
    except (zipfile.BadZipFile, zipfile.LargeZipFile, EOFError, OSError) as error:
        if _begins_as_zip(path):  # torch.save writes the archive from its first entry: cut short
            raise TornCheckpoint(f"not a complete zip archive ({error})") from None
        raise InvalidCheckpoint(f"not a zip archive ({error})") from None
    try:
        loaded = _SafeUnpickler(data, records, prefix).load()
    except (InvalidCheckpoint, StopRequested):  # a stop (signal handler, resume) is never a bad pickle
        raise
    except Exception as error:  # any malformed pickle
        raise InvalidCheckpoint(f"unreadable pickle ({type(error).__name__}: {error})") from None
    if not isinstance(loaded, dict):
        raise InvalidCheckpoint("the checkpoint is not a dictionary")
    metadata = {key: value for key, value in loaded.items() if _plain(value)}
    epoch = loaded.get("epoch")
    return CheckpointInfo(epoch=epoch if isinstance(epoch, int) else None, metadata=metadata)


def _plain(value: Any) -> bool:
    if isinstance(value, str | int | float | bool | type(None)):
        return True
    if isinstance(value, list | tuple):
        return all(_plain(item) for item in value)
    if isinstance(value, dict):
        return all(isinstance(key, str | int) and _plain(item) for key, item in value.items())
    return False


def is_valid(path: Path) -> bool:
    try:
        inspect(path)
    except InvalidCheckpoint:
        return False
    return True


def _begins_as_zip(path: Path) -> bool:
    """Empty, or a zip archive's first bytes: a file whose writing stopped before its end."""
    try:
        with path.open("rb") as file:
            head = file.read(4)
    except OSError:
        return False
    return b"PK\x03\x04".startswith(head)
