"""RUN_ARGS keys come from the installed libreyolo: the fast source reader matches its --help."""

import pytest

from entrypoint import run_args

pytestmark = pytest.mark.slow  # runs real libreyolo


def test_source_reader_and_help_reader_agree() -> None:
    from_help = run_args._options_from_help()
    assert set(from_help) == set(run_args.libreyolo_options())
