"""RUN_ARGS keys come from the installed libreyolo: the fast source reader matches its --help."""

import importlib.util
from pathlib import Path

import pytest

from entrypoint import libreyolo

pytestmark = pytest.mark.contract  # runs real libreyolo: the train options the agent accepts are its own


def test_source_reader_and_help_reader_agree() -> None:
    from_help = libreyolo._options_from_help()
    assert set(from_help) == set(libreyolo.train_options())


def test_help_json_where_the_installed_typer_allows_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The installed libreyolo's own schema agrees with its source where it works; where it crashes (typer
    0.29), the agent's options are the source's."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    libreyolo.train_options.cache_clear()
    try:
        from_schema = libreyolo.help_json_options()
        spec = importlib.util.find_spec("libreyolo")
        assert spec is not None and spec.origin is not None
        source = Path(spec.origin).parent / "cli" / "commands" / "train.py"
        from_source = libreyolo._options_from_source(source.read_text())
        if from_schema:
            assert from_schema == from_source
        assert libreyolo.train_options() == (from_schema or from_source)
    finally:
        libreyolo.train_options.cache_clear()


def test_the_image_answer_is_read_without_starting_libreyolo(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The image asks libreyolo once at build time into TRAINBOX_CACHE_DIR; a start then reads that answer."""
    path = libreyolo._schema_cache_path(tmp_path, None)
    assert path.parent == tmp_path
    path.write_text('{"epochs": "int", "only_in_the_cache": "str"}')
    monkeypatch.setattr(libreyolo, "_options_from_help_json", lambda _command: pytest.fail("libreyolo was started"))
    assert libreyolo.help_json_options(tmp_path) == {"epochs": "int", "only_in_the_cache": "str"}
