"""RUN_ARGS keys come from the installed libreyolo: the fast source reader matches its --help."""

import pytest

from entrypoint import libreyolo

pytestmark = pytest.mark.slow  # runs real libreyolo


def test_source_reader_and_help_reader_agree() -> None:
    from_help = libreyolo._options_from_help()
    assert set(from_help) == set(libreyolo.train_options())
