"""For a libreyolo release the agent does not ship the options of: its versioned `train --help-json` schema
where it works, its source where it crashes (typer 0.29: AttributeError on TyperOption.type); the answer is kept
per versions, as starting libreyolo costs seconds (tests/unit/test_train_options.py: the shipped releases)."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from entrypoint import libreyolo

SCHEMA = {
    "schema_version": 1,
    "command": "train",
    "parameters": [
        {"name": "epochs", "type": "integer", "default": 300},
        {"name": "lr0", "type": "float", "default": 0.01},
        {"name": "amp", "type": "boolean", "default": True},
        {"name": "model", "type": "text"},
        {"name": "imgsz", "type": "integer range"},
        {"name": "json_output", "type": "boolean"},  # output flags are the agent's business, not RUN_ARGS'
        {"name": "help_json", "type": "boolean"},
    ],
    "flags": ["--amp", "--no-amp", "--json"],
}


def stand_in(tmp_path: Path, body: str) -> Path:
    """A `libreyolo` that answers `train --help-json` with ``body`` and notes each start."""
    script = tmp_path / "libreyolo"
    script.write_text(f"#!{sys.executable}\nimport sys\nopen({str(tmp_path / 'starts')!r}, 'a').write('x')\n{body}\n")
    script.chmod(0o755)
    return script


def starts(tmp_path: Path) -> int:
    path = tmp_path / "starts"
    return len(path.read_text()) if path.exists() else 0


@pytest.fixture(autouse=True)
def fresh(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setattr(libreyolo, "installed_version", lambda: "9.9.9.dev0")  # a release it does not know
    libreyolo.train_options.cache_clear()
    yield
    libreyolo.train_options.cache_clear()


def test_the_schema_gives_names_and_types(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    command = str(stand_in(tmp_path, f"print({json.dumps(json.dumps(SCHEMA))})"))
    expected = {"epochs": "int", "lr0": "float", "amp": "bool", "model": "str", "imgsz": "int"}
    assert libreyolo.train_options(tmp_path / "cache", command) == expected
    # kept: the next agent start does not pay for starting libreyolo again
    libreyolo.train_options.cache_clear()
    assert libreyolo.train_options(tmp_path / "cache", command) == expected and starts(tmp_path) == 1


@pytest.mark.parametrize(
    "body",
    [
        # what libreyolo 1.6.0 does with typer 0.29.2
        "sys.stderr.write(\"AttributeError: 'TyperOption' object has no attribute 'type'\\n\"); sys.exit(1)",
        'print(\'{"schema_version": 2, "parameters": []}\')',  # a schema this reader does not know
        "print('not json')",
    ],
)
def test_where_it_fails_the_source_is_read(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, body: str) -> None:
    command = str(stand_in(tmp_path, body))
    assert libreyolo.help_json_options(tmp_path / "cache", command) == {}
    options = libreyolo.train_options(tmp_path / "cache", command)
    assert {"epochs", "batch", "imgsz", "lr0"} <= set(options) and options["epochs"] == "int"
    # the failure is kept too: no second start of libreyolo for the same versions
    libreyolo.train_options.cache_clear()
    assert libreyolo.train_options(tmp_path / "cache", command) == options and starts(tmp_path) == 1


def test_outside_the_image_the_answer_is_kept_on_the_volume(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from entrypoint import settings

    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    command = str(stand_in(tmp_path, f"print({json.dumps(json.dumps(SCHEMA))})"))
    environ = {"WORKDIR": str(tmp_path / "work"), "GPUS": "cpu", "RUN_ARGS": "epochs=3", "TRAINBOX_LIBREYOLO": command}
    settings.from_env(environ)
    assert [path.parent for path in (tmp_path / "work").rglob("libreyolo-train-options-*.json")] == [
        tmp_path / "work" / ".cache" / "trainbox"
    ]
    assert not (tmp_path / "home").exists()  # nothing under $HOME
