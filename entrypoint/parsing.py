"""The row type of settings.py's table of variables, the environment view that refuses a name without
a row, and the parsers the rows name.

A parser is a pure function ``(name, text, unset) -> value``: the variable's name (for the message),
its text from the environment, and the value an unset variable gets (some messages give it as the
example). A bad text is a ``ConfigError`` naming the variable and an example of a good value.
``settings.py`` holds the table, the typed ``Settings`` and ``from_env``; this module holds no state.
"""

from __future__ import annotations

import enum
import math
import re
import shutil
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Generic, TypeVar

from . import log, procs
from .errors import ConfigError
from .procs import SECRET_PROVIDER_VARS

T = TypeVar("T")
_Choice = TypeVar("_Choice", bound=enum.StrEnum)
Parser = Callable[[str, str, object], T]

REPO_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,95}/[A-Za-z0-9][A-Za-z0-9._-]{0,95}$")
_RUN_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,95}$")
_LICENSE = re.compile(r"^[a-z0-9][a-z0-9.-]{0,63}$")
_DURATION_PART = re.compile(r"(\d+(?:\.\d+)?)([smhd])")
_UNIT_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


@dataclass(frozen=True)
class Variable(Generic[T]):
    """One row: what the variable means, how its text is read, what unset means, and that default as
    ``--help`` and ``--dry-run`` print it. The name is the attribute's name in the table (``__set_name__``).
    ``parse`` None: read elsewhere (``topology.from_env`` for the nodes, huggingface_hub for HF_ENDPOINT)."""

    meaning: str
    parse: Parser[T] | None
    unset: T
    default: str | None = None
    name: str = field(default="", init=False)

    def __set_name__(self, owner: type, name: str) -> None:
        object.__setattr__(self, "name", name)

    @property
    def secret(self) -> bool:
        return self.name in {"HF_TOKEN", *SECRET_PROVIDER_VARS} or self.name.endswith(("_TOKEN", "_KEY"))

    def read(self, env: Mapping[str, str]) -> T:
        return self.read_or(env, self.unset)

    def read_or(self, env: Mapping[str, str], unset: T) -> T:
        """The parsed value, or ``unset`` when the environment does not set it."""
        text = env.get(self.name)
        if text is None:
            return unset
        if self.parse is None:
            raise TypeError(f"{self.name} is read elsewhere, not through its row")
        return self.parse(self.name, text, unset)


class Declared(Mapping[str, str]):
    """The environment as ``from_env`` sees it: unset variables dropped (compose and templates pass them as
    empty strings), and reading a name that has no row in the table is a bug, not a silent None."""

    def __init__(self, env: Mapping[str, str], names: frozenset[str]) -> None:
        self._env = {key: value for key, value in env.items() if value != ""}
        self._names = names

    def __getitem__(self, key: str) -> str:
        if key not in self._names:
            raise AssertionError(f"{key} is read from the environment but has no row in variables.Vars")
        return self._env[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._env)

    def __len__(self) -> int:
        return len(self._env)

    def given(self) -> dict[str, str]:
        """Every variable that is set, with a row or not (for the child processes)."""
        return dict(self._env)


def elsewhere(meaning: str, default: str | None = None) -> Variable[None]:
    """A row for a variable that another reader parses (listed for --help, --dry-run and docs/configuration.md)."""
    return Variable(meaning, None, None, default)


def plain(parse: Callable[[str], T]) -> Parser[T]:
    """A parser from a function of the text alone (its own messages name the variable)."""
    return lambda _name, text, _unset: parse(text)


def text(_name: str, value: str, _unset: object) -> str:
    return value


class Secret:
    """A string that never prints itself."""

    __slots__ = ("_value",)

    def __init__(self, value: str) -> None:
        self._value = value
        log.register_secret(value)

    def reveal(self) -> str:
        return self._value

    def __repr__(self) -> str:
        return "Secret('***')"

    __str__ = __repr__

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Secret) and other._value == self._value

    def __hash__(self) -> int:
        return hash(self._value)


def secret(name: str, value: str, _unset: object) -> Secret:
    if value.strip() != value or any(ch.isspace() for ch in value):
        raise ConfigError(f"{name} contains whitespace", f"set {name} to the token alone, e.g. {name}=hf_xxx")
    return Secret(value)


def repo_id(name: str, value: str, _unset: object) -> str:
    if not REPO_ID.match(value):
        raise ConfigError(f"{name}={value!r} is not a repo id", f"use org/name, e.g. {name}=acme/yolo-run")
    return value


def bucket(name: str, value: str, _unset: object) -> str | None:
    """ns/name, or ``off`` (None: commits to OUTPUT_REPO)."""
    if value.strip().lower() == "off":
        return None
    if not REPO_ID.match(value):
        raise ConfigError(f"{name}={value!r} is not a bucket id", f"use ns/name, e.g. {name}=acme/ckpts, or off")
    return value


def trackio_target(name: str, value: str, _unset: object) -> str:
    """A Space id (org/name) or a self-hosted trackio server's http(s) URL; its write token is never in it."""
    text = value.strip().rstrip("/")
    if text.startswith(("https://", "http://")):
        if "write_token" in text or "?" in text:
            raise ConfigError(
                f"{name} carries a query (a write token would be printed with it)",
                f"set {name} to the server's address alone and its token in TRACKIO_WRITE_TOKEN",
            )
        return text
    if not REPO_ID.match(text):
        raise ConfigError(
            f"{name}={value!r} is neither a Space id nor a URL",
            f"use org/name (a Space) or http(s)://host:port (a trackio server), e.g. {name}=acme/dashboard",
        )
    return text


def workdir(_name: str, value: str, _unset: object) -> Path:
    path = Path(value).expanduser()
    return path if path.is_absolute() else Path.cwd() / path


def run_name(name: str, value: str, _unset: object) -> str:
    if not _RUN_NAME.match(value):
        raise ConfigError(f"{name}={value!r} is not valid", f"use letters, digits, . _ -, e.g. {name}=exp1")
    return value


def license_id(name: str, value: str, _unset: object) -> str:
    """A Hub license id (https://huggingface.co/docs/hub/repositories-licenses); the Hub checks the list itself."""
    if not _LICENSE.match(value):
        raise ConfigError(f"{name}={value!r} is not a Hub license id", f"use e.g. {name}=apache-2.0, mit or other")
    return value


def parse_duration(value: str, name: str) -> float:
    """``90m``, ``6h``, ``1h30m``, ``45s``, ``2d`` or a plain number of seconds."""
    text = value.strip().lower()
    try:
        seconds = float(text)
    except ValueError:
        parts = _DURATION_PART.findall(text)
        if not parts or "".join(number + unit for number, unit in parts) != text:
            raise ConfigError(f"{name}={value!r} is not a duration", f"use e.g. {name}=90m, 6h or 3600") from None
        seconds = sum(float(number) * _UNIT_SECONDS[unit] for number, unit in parts)
    if not math.isfinite(seconds):  # float() reads "inf" and "nan"
        raise ConfigError(f"{name}={value!r} is not a duration", f"use e.g. {name}=90m, 6h or 3600")
    if seconds < 0:
        raise ConfigError(f"{name}={value!r} is negative", f"use e.g. {name}=90m")
    return seconds


def optional_duration(name: str, value: str, _unset: object) -> float | None:
    """A duration, or ``off``/``none``/``0`` (None: the guard is off)."""
    if value.strip().lower() in {"off", "none", "0"}:
        return None
    return parse_duration(value, name)


def choice(kind: type[_Choice]) -> Parser[_Choice]:
    """One of an enum's values, any case."""

    def parse(name: str, value: str, unset: object) -> _Choice:
        try:
            return kind(value.strip().lower())
        except ValueError:
            allowed = ", ".join(member.value for member in kind)
            raise ConfigError(f"{name}={value!r} is not one of {allowed}", f"e.g. {name}={unset}") from None

    return parse


def provider(name: str, value: str, _unset: object) -> str:
    wanted = value.strip().lower()
    if wanted not in {"auto", "none", "vast", "runpod"}:
        raise ConfigError(f"{name}={wanted!r} is not one of auto, vast, runpod, none", f"e.g. {name}=auto")
    return wanted


def api_url(name: str, value: str, unset: object) -> str:
    url = value.rstrip("/")
    if not url.startswith(("https://", "http://")):
        raise ConfigError(f"{name}={url!r} is not an http(s) URL", f"leave it unset (default {unset})")
    return url


def flag(name: str, value: str, _unset: object) -> bool:
    value = value.strip().lower()
    if value in {"1", "true", "yes", "on"}:
        return True
    if value in {"0", "false", "no", "off"}:
        return False
    raise ConfigError(f"{name}={value!r} is not 0 or 1", f"e.g. {name}=1")


def count(name: str, value: str, unset: object) -> int:
    if not value.strip().isdigit():
        raise ConfigError(f"{name}={value!r} is not a whole number", f"e.g. {name}={unset}, or 0 to turn it off")
    return int(value.strip())


def positive(name: str, value: str, unset: object) -> float:
    try:
        number = float(value)
    except ValueError:
        number = math.nan
    if not math.isfinite(number) or number < 0:
        raise ConfigError(f"{name}={value!r} is not a number", f"e.g. {name}={unset:g}, or 0 to judge nothing")
    return number


def ratio(name: str, value: str, unset: object) -> float:
    number = positive(name, value, unset)
    if number > 1:
        raise ConfigError(f"{name}={value!r} is more than 1", f"a fraction, e.g. {name}={unset:g}")
    return number


def dollars(example: str, *, zero_ok: bool) -> Parser[float]:
    """PRICE_PER_HOUR (0 allowed: a free machine) and MAX_COST (must be positive): finite dollars."""

    def parse(name: str, value: str, _unset: object) -> float:
        try:
            amount = float(value.strip().lstrip("$"))
        except ValueError:
            amount = math.nan
        if not math.isfinite(amount) or amount < 0 or (amount == 0 and not zero_ok):
            raise ConfigError(f"{name}={value!r} is not an amount of dollars", f"give dollars, e.g. {name}={example}")
        return amount

    return parse


def urls(name: str, value: str, _unset: object) -> tuple[Secret, ...]:
    """NOTIFY: URLs, comma separated, each a secret of its own (redacted wherever it shows alone). The form
    only: the service is checked by settings (check_notify, below), the whole URL when the job starts
    (report/notify.py)."""
    found = tuple(Secret(part.strip()) for part in _split_urls(value) if part.strip())
    for index, url in enumerate(found, 1):
        scheme, sep, rest = url.reveal().partition("://")
        if not sep or not scheme or not rest or any(ch.isspace() for ch in url.reveal()):
            raise ConfigError(
                f"{name}: target {index} is not a URL (its value is a secret: not shown)",
                f"use apprise URLs, comma separated, e.g. {name}=ntfy://my-topic,json://host:8080/hook",
            )
    if not found:
        raise ConfigError(f"{name} names no URL", f"e.g. {name}=ntfy://my-topic, or leave it unset")
    return found


def check_notify(name: str, urls: Sequence[Secret]) -> None:
    """Each NOTIFY URL's scheme is a service apprise knows (the URL's details are judged when it is used)."""
    try:
        from apprise.manager_plugins import NotificationManager
    except ImportError:
        raise ConfigError(
            f"{name} is set but apprise is not installed", f"pip install apprise, or unset {name}"
        ) from None
    known = NotificationManager()  # type: ignore[no-untyped-call]
    for number, url in enumerate(urls, 1):
        scheme = url.reveal().partition("://")[0].lower()
        if scheme not in known:
            raise ConfigError(
                f"{name}: target {number} ({scheme}://…) is not a service apprise knows",
                "see https://appriseit.com/services/ for each service's URL, e.g. ntfy://my-topic",
            )


def _split_urls(value: str) -> list[str]:
    """apprise's own split (a comma inside a URL, ``mailto://…?to=a@x,b@y``, stays in it); by commas without it."""
    try:
        from apprise.utils.parse import parse_urls
    except ImportError:
        return value.split(",")
    found = parse_urls(value)  # type: ignore[no-untyped-call]
    return [str(url).rstrip(",;") for url in found]  # it keeps a list's trailing comma


# -- the choices and the types of Settings' fields (settings.py re-exports them) -----------------
class ExitAction(enum.StrEnum):
    EXIT = "exit"
    STOP = "stop"
    DESTROY = "destroy"


class Provider(enum.StrEnum):
    NONE = "none"
    VAST = "vast"
    RUNPOD = "runpod"


class HostCheck(enum.StrEnum):
    OFF = "off"
    WARN = "warn"
    STRICT = "strict"


# -- the dataset source and the GPUs: types of Settings' fields, and their parsers ------------
class BoxFormat(enum.StrEnum):
    """``DATASET_BBOX``: a parquet dataset's boxes, corners or centre, in pixels or normalised to 0-1 (``n``)."""

    XYWH = "xywh"  # COCO: the top-left corner, width, height
    XYXY = "xyxy"  # Pascal VOC: two corners
    CXCYWH = "cxcywh"  # the centre, width, height
    XYWHN = "xywhn"
    XYXYN = "xyxyn"
    CXCYWHN = "cxcywhn"

    @property
    def normalised(self) -> bool:
        return self.value.endswith("n")


class DatasetKind(enum.StrEnum):
    DEMO = "demo"
    LOCAL_DIR = "local_dir"
    LOCAL_TAR = "local_tar"
    HUB = "hub"


@dataclass(frozen=True, kw_only=True)
class GpuSelection:
    """``GPUS``: every visible GPU, the listed indices, or the CPU."""

    cpu: bool = False
    indices: tuple[int, ...] | None = None  # None with cpu False means "all"

    @property
    def all(self) -> bool:
        return not self.cpu and self.indices is None

    def __str__(self) -> str:
        if self.cpu:
            return "cpu"
        return "all" if self.indices is None else ",".join(map(str, self.indices))


def parse_gpus(value: str) -> GpuSelection:
    """``GPUS``: ``all``, ``cpu`` or a list of indices."""
    text = value.strip().lower()
    if text == "all":
        return GpuSelection()
    if text == "cpu":
        return GpuSelection(cpu=True)
    parts = [part.strip() for part in text.split(",")]
    if not parts or not all(part.isdigit() for part in parts) or len(set(parts)) != len(parts):
        raise ConfigError(f"GPUS={value!r} is not valid", "use GPUS=all, GPUS=cpu or a list of indices like GPUS=0,1")
    return GpuSelection(indices=tuple(int(part) for part in parts))


def check_gpus(selection: GpuSelection, count: int | None) -> None:
    """Listed indices that this machine has no GPU for; ``count``: its GPUs (None: no driver to ask, which
    the GPU check reports)."""
    if selection.indices is None or not count:
        return
    missing = [index for index in selection.indices if index >= count]
    if missing:
        have = f"{count} GPU{'s' if count != 1 else ''} (index{'es' if count != 1 else ''} 0-{count - 1})"
        raise ConfigError(
            f"GPUS={selection} names GPU index {','.join(map(str, missing))}, and this machine has {have}",
            "GPUS lists device indices from 0, not a count: GPUS=all trains on every GPU, GPUS=0 on the first,"
            " GPUS=0,1 on the first two",
        )


def visible_gpus() -> int | None:
    """How many NVIDIA GPUs this machine shows, counted without CUDA (the agent never initialises it: a
    CUDA context in the agent would hold GPU memory beside training): ``nvidia-smi -L``, else the driver's
    /proc entries; None when neither is there."""
    smi = shutil.which("nvidia-smi")
    if smi is not None:
        try:
            listed = procs.run([smi, "-L"], timeout=15, echo=False)
        except OSError:
            listed = None
        if listed is not None and listed.returncode == 0:
            return sum(1 for line in listed.stdout.splitlines() if line.startswith("GPU "))
    try:
        return len(list(Path("/proc/driver/nvidia/gpus").iterdir())) or None
    except OSError:
        return None


def dataset_source(_name: str, value: str, _unset: object) -> tuple[DatasetKind, str | None]:
    """``DATASET_REPO``: a local folder or tar, or a Hub repo id."""
    looks_local = value.startswith(("/", "./", "../", "~")) or Path(value).expanduser().exists()
    if looks_local:
        path = Path(value).expanduser().resolve()
        if path.is_dir():
            return DatasetKind.LOCAL_DIR, str(path)
        if path.is_file() and path.name.lower().endswith((".tar", ".tar.gz", ".tgz", ".zip")):
            return DatasetKind.LOCAL_TAR, str(path)
        raise ConfigError(
            f"DATASET_REPO={value!r} is neither a folder nor a .tar or .zip file",
            "point it at a dataset folder, a .tar or .zip, or a Hub dataset like org/name",
        )
    if not REPO_ID.match(value):
        raise ConfigError(f"DATASET_REPO={value!r} is not a repo id or a path", "use org/name or an absolute path")
    return DatasetKind.HUB, value
