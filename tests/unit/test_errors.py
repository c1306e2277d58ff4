"""One table of exit codes: distinct, documented in README."""

from __future__ import annotations

from pathlib import Path

from entrypoint import errors


def test_exit_codes_are_distinct_and_in_range() -> None:
    classes = [cls for cls in errors.all_errors() if cls is not errors.AgentError]
    codes = [cls.exit_code for cls in classes]
    assert len(codes) == len(set(codes)), "two errors share an exit code"
    assert all(2 < code < 256 for code in codes)
    reasons = [cls.reason for cls in classes]
    assert len(reasons) == len(set(reasons))


def test_every_code_is_documented_in_readme() -> None:
    readme = (Path(__file__).parents[2] / "README.md").read_text()
    for cls in errors.all_errors():
        if cls is errors.AgentError:
            continue
        assert f"| {cls.exit_code} |" in readme, f"exit code {cls.exit_code} ({cls.__name__}) missing from README"


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
