"""One table of exit codes: distinct, documented in docs/exit-codes.md."""

from __future__ import annotations

import re
from pathlib import Path

from entrypoint import errors


def test_exit_codes_are_distinct_and_in_range() -> None:
    classes = [cls for cls in errors.all_errors() if cls is not errors.AgentError]
    codes = [cls.exit_code for cls in classes]
    assert len(codes) == len(set(codes)), "two errors share an exit code"
    assert all(2 < code < 256 for code in codes)
    reasons = [cls.reason for cls in classes]
    assert len(reasons) == len(set(reasons))


def test_every_code_is_documented_and_the_page_names_no_other() -> None:
    page = (Path(__file__).parents[2] / "docs" / "exit-codes.md").read_text()
    documented = {int(code) for code in re.findall(r"^\| (\d+) \|", page, re.MULTILINE)}
    codes = {cls.exit_code for cls in errors.all_errors() if cls is not errors.AgentError}
    missing = sorted(codes - documented)
    assert not missing, f"exit codes missing from docs/exit-codes.md: {missing}"
    # besides the error classes: success, an unexpected error and a bad command line
    assert documented - codes == {0, 1, 2}


def test_message_is_one_line_with_the_fix() -> None:
    error = errors.ConfigError("GPUS='x' is not valid", "use GPUS=all")
    assert str(error) == "GPUS='x' is not valid — use GPUS=all"


def test_the_stops_from_outside_are_one_family_without_an_exit_of_its_own() -> None:
    stops = {errors.PreemptedError, errors.UserInterruptError, errors.DeadlineError, errors.StallError}
    assert stops | {errors.CostLimitError} <= set(errors.all_errors())
    assert all(issubclass(cls, errors.StopRequested) for cls in stops | {errors.CostLimitError})
    assert errors.StopRequested not in errors.all_errors()
    assert (errors.EXIT_PREEMPTED, errors.EXIT_INTERRUPTED) == (143, 130)
    assert (errors.PreemptedError.exit_code, errors.UserInterruptError.exit_code) == (143, 130)


def test_no_module_but_errors_spells_a_signal_exit_code() -> None:
    # cli.main turns errors into exit codes; the codes themselves are named in errors.py
    package = Path(__file__).parents[2] / "entrypoint"
    for path in package.rglob("*.py"):
        if path.name in {"errors.py", "libreyolo.py"}:  # libreyolo.py: libreyolo's own exit codes
            continue
        text = path.read_text()
        assert "exit(143)" not in text and "exit(130)" not in text, path
