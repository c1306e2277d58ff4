"""RUN_ARGS: extra ``libreyolo train`` arguments, parsed, checked against libreyolo, never shelled.

The accepted keys are read from the installed libreyolo's own ``train`` command (its source,
parsed with ``ast``, so the agent does not pay for importing torch), not from a copied list.
"""

from __future__ import annotations

import ast
import difflib
import functools
import importlib.util
import os
import re
import shlex
import sys
from dataclasses import dataclass
from pathlib import Path

from .errors import ConfigError

# Keys the agent sets itself, and the variable a user sets instead.
OWNED_KEYS: dict[str, str] = {
    "data": "DATASET_REPO (and DATA_YAML)",
    "project": "WORKDIR",
    "name": "RUN_NAME",
    "exist_ok": "RUN_NAME (the agent always reuses the run folder)",
    "device": "GPUS",
}
# Flags of libreyolo's CLI that shape its console output, not the training.
_OUTPUT_FLAGS = {"json_output", "quiet", "dry_run", "help_json"}
_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_-]*$")
_TRUE, _FALSE = {"true", "1", "yes"}, {"false", "0", "no"}


@dataclass(frozen=True)
class RunArgs:
    """Ordered ``key=value`` pairs, keys in libreyolo's underscore form."""

    pairs: tuple[tuple[str, str], ...] = ()

    def get(self, key: str) -> str | None:
        return dict(self.pairs).get(key)

    def __contains__(self, key: str) -> bool:
        return any(k == key for k, _ in self.pairs)

    def with_defaults(self, defaults: RunArgs) -> RunArgs:
        """These pairs, plus the defaults' keys that are not set here."""
        return RunArgs(tuple((k, v) for k, v in defaults.pairs if k not in self) + self.pairs)

    def set(self, key: str, value: str) -> RunArgs:
        return RunArgs((*tuple((k, v) for k, v in self.pairs if k != key), (key, value)))

    def argv(self) -> list[str]:
        return [f"{k}={v}" for k, v in self.pairs]

    def __str__(self) -> str:
        return shlex.join(self.argv())


def parse(text: str) -> RunArgs:
    """Split shell-style (quotes group, nothing expands) into key=value pairs."""
    try:
        tokens = shlex.split(text, comments=False, posix=True)
    except ValueError as error:
        raise ConfigError(
            f"RUN_ARGS cannot be parsed: {error}", "close every quote, e.g. RUN_ARGS='epochs=100 name=\"a b\"'"
        ) from None
    pairs: list[tuple[str, str]] = []
    for token in tokens:
        key, sep, value = token.partition("=")
        key = key.lstrip("-").replace("-", "_")
        if not sep or not _KEY.match(key):
            raise ConfigError(
                f"RUN_ARGS item {token!r} is not key=value", "write each option as key=value, e.g. epochs=100"
            )
        if any(k == key for k, _ in pairs):
            raise ConfigError(f"RUN_ARGS sets {key!r} twice", f"keep one {key}=… in RUN_ARGS")
        pairs.append((key, value))
    return RunArgs(tuple(pairs))


def validate(args: RunArgs, options: dict[str, str]) -> None:
    """Refuse agent-owned keys, keys libreyolo does not accept, and values of the wrong type."""
    for key, value in args.pairs:
        if key in OWNED_KEYS:
            raise ConfigError(f"RUN_ARGS may not set {key!r}: the agent sets it", f"use {OWNED_KEYS[key]} instead")
        if key not in options:
            close = difflib.get_close_matches(key, list(options), n=3, cutoff=0.5)
            hint = f"did you mean {', '.join(close)}?" if close else "see `libreyolo train --help` for the options"
            raise ConfigError(f"RUN_ARGS key {key!r} is not a libreyolo train option", hint)
        _check_value(key, value, options[key])


def _check_value(key: str, value: str, kind: str) -> None:
    try:
        if kind == "int":
            int(value)
        elif kind == "float":
            float(value)
        elif kind == "bool" and value.lower() not in _TRUE | _FALSE:
            raise ValueError
    except ValueError:
        example = {"int": "100", "float": "0.01", "bool": "true"}[kind]
        raise ConfigError(f"RUN_ARGS {key}={value!r} is not a valid {kind}", f"e.g. {key}={example}") from None


@functools.cache
def libreyolo_options() -> dict[str, str]:
    """``{option: type}`` for ``libreyolo train``, type one of int, float, bool, str."""
    spec = importlib.util.find_spec("libreyolo")
    if spec is None or spec.origin is None:
        raise ConfigError("libreyolo is not installed", "install it: pip install libreyolo")
    source = Path(spec.origin).parent / "cli" / "commands" / "train.py"
    try:
        options = _options_from_source(source.read_text())
    except (OSError, SyntaxError, LookupError):
        options = {}
    # The source layout is libreyolo's private business: if it moved, ask the CLI itself.
    return options or _options_from_help()


def _options_from_source(source: str) -> dict[str, str]:
    tree = ast.parse(source)
    function = next(node for node in ast.walk(tree) if isinstance(node, ast.FunctionDef) and node.name == "train_cmd")
    options: dict[str, str] = {}
    for arg in function.args.args + function.args.kwonlyargs:
        if arg.arg not in _OUTPUT_FLAGS:
            options[arg.arg] = _type_name(arg.annotation)
    return options


def _type_name(annotation: ast.expr | None) -> str:
    if isinstance(annotation, ast.Subscript):  # Optional[int]
        annotation = annotation.slice
    if isinstance(annotation, ast.BinOp):  # int | None
        annotation = annotation.left
    name = annotation.id if isinstance(annotation, ast.Name) else "str"
    return name if name in {"int", "float", "bool"} else "str"


def _options_from_help() -> dict[str, str]:
    from . import procs  # not at the top: procs needs settings, which needs this module

    result = procs.run(
        [sys.executable, "-c", "from libreyolo.cli import entrypoint; entrypoint()", "train", "--help"],
        timeout=120,
        env={**os.environ, "COLUMNS": "200", "NO_COLOR": "1"},
        echo=False,
    )
    names = set(re.findall(r"--([a-z0-9][a-z0-9-]*)", result.stdout))
    # "--no-amp" is the negative form of "--amp"; "--no-aug-epochs" is an option of its own.
    names = {name for name in names if not (name.startswith("no-") and name[3:] in names)}
    options = {name.replace("-", "_"): "str" for name in names}
    for flag in ("json", "quiet", "dry_run", "help_json", "help"):
        options.pop(flag, None)
    if not options:
        raise ConfigError("cannot read libreyolo's train options", "check that `libreyolo train --help` works")
    return options
