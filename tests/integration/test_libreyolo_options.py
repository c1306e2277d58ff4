"""RUN_ARGS keys come from the installed libreyolo: the fast source reader matches its --help."""

from entrypoint import libreyolo


def test_source_reader_and_help_reader_agree() -> None:
    from_help = libreyolo._options_from_help()
    assert set(from_help) == set(libreyolo.train_options())
