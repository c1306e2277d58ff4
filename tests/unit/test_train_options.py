"""libreyolo's train options are known without starting it for the releases the agent supports (starting it
imports torch: about 1 GB and seconds on every fresh volume outside the image); the shipped list is the
installed release's own, read from its source."""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator
from pathlib import Path

import pytest

from entrypoint import libreyolo, procs


@pytest.fixture(autouse=True)
def fresh(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.delenv("TRAINBOX_CACHE_DIR", raising=False)
    libreyolo.train_options.cache_clear()
    yield
    libreyolo.train_options.cache_clear()


def installed_source() -> str:
    spec = importlib.util.find_spec("libreyolo")
    assert spec is not None and spec.origin is not None
    return (Path(spec.origin).parent / "cli" / "commands" / "train.py").read_text()


def test_the_installed_release_is_shipped_and_its_list_is_its_source() -> None:
    version = libreyolo.installed_version()
    assert version in libreyolo.RELEASE_OPTIONS, f"libreyolo {version}: ship its options in RELEASE_OPTIONS"
    assert libreyolo.release_options(version) == libreyolo._options_from_source(installed_source())


def test_a_known_release_starts_nothing_and_writes_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def no_child(*args: object, **kwargs: object) -> None:
        pytest.fail(f"libreyolo was started: {args}")

    monkeypatch.setattr(procs, "run", no_child)
    options = libreyolo.train_options(tmp_path / "cache")
    assert options["epochs"] == "int" and options["lr0"] == "float" and options["amp"] == "bool"
    assert "json_output" not in options and "help_json" not in options
    assert not (tmp_path / "cache").exists()


def test_an_unknown_release_is_asked(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(libreyolo, "installed_version", lambda: "1.7.0")
    asked: list[str] = []
    monkeypatch.setattr(
        libreyolo, "_options_from_help_json", lambda _command: asked.append("help-json") or {"only": "str"}
    )
    assert libreyolo.train_options(tmp_path / "cache") == {"only": "str"} and asked == ["help-json"]
    assert libreyolo.release_options("1.7.0") == {} and libreyolo.release_options(None) == {}


def test_the_defaults_plan_and_dry_run_assume_are_the_installed_releases() -> None:
    """``trainbox plan`` and ``--dry-run`` say what libreyolo trains when RUN_ARGS names no model, epochs or imgsz:
    the typer defaults of the installed release's ``train`` command."""
    import ast

    tree = ast.parse(installed_source())
    (train,) = [node for node in ast.walk(tree) if isinstance(node, ast.FunctionDef) and node.name == "train_cmd"]
    positional = train.args.args[len(train.args.args) - len(train.args.defaults) :]
    pairs = [
        *zip(positional, train.args.defaults, strict=True),
        *zip(train.args.kwonlyargs, train.args.kw_defaults, strict=True),
    ]
    found = {  # name = typer.Option(DEFAULT, ...)
        arg.arg: str(default.args[0].value)
        for arg, default in pairs
        if isinstance(default, ast.Call) and default.args and isinstance(default.args[0], ast.Constant)
    }
    assert {key: found[key] for key in libreyolo.TRAIN_DEFAULTS} == libreyolo.TRAIN_DEFAULTS
