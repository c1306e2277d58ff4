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
