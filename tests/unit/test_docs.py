"""README.md and docs/ say what the code does: the variable tables are the settings table's own rows (as
`--help` and `--dry-run` print them), the GPU table is the estimator's, and every exit code is documented."""

from __future__ import annotations

import re
from pathlib import Path

from entrypoint import variables
from entrypoint.cli import env_table
from entrypoint.report import estimate

REPO = Path(__file__).resolve().parents[2]
README = REPO / "README.md"
DOCS = REPO / "docs"
# The variables the README's short table names: what most people set.
README_VARIABLES = ("HF_TOKEN", "DATASET_REPO", "OUTPUT_REPO", "RUN_ARGS", "ON_EXIT", "PRICE_PER_HOUR", "MAX_COST",
                    "MAX_RUNTIME")  # fmt: skip
REGENERATE = (
    "regenerate it: PYTHONPATH=. python -c 'from entrypoint.cli import env_table; print(*env_table(), sep=chr(10))'"
)


def test_the_configuration_page_prints_the_settings_table_row_for_row() -> None:
    text = (DOCS / "configuration.md").read_text()
    assert "\n".join(env_table()) in text, REGENERATE
    assert len(env_table()) == len(variables.user_variables()) + 2


def test_the_development_page_lists_the_variables_set_for_the_agent() -> None:
    text = (DOCS / "development.md").read_text()
    assert "\n".join(env_table(internal=True)) in text, REGENERATE.replace("env_table()", "env_table(internal=True)")
    assert len(env_table(internal=True)) == len(variables.internal_variables()) + 2


def test_the_readme_table_is_the_same_rows_for_the_variables_most_people_set() -> None:
    text = README.read_text()
    assert "\n".join(env_table(README_VARIABLES)) in text, REGENERATE
    rows = {row.split("`")[1]: row for row in env_table()[2:]}
    for line in text.splitlines():  # any variable row anywhere in the README is the table's own
        if found := re.match(r"^\| `([A-Z][A-Z0-9_]+)` \|", line):
            assert line == rows[found.group(1)], found.group(1)


def test_the_meanings_say_what_the_code_does() -> None:
    meanings = {var.name: var.meaning for var in variables.variables()}
    # every epoch goes to the bucket by default; the repo gets milestones (not "every epoch")
    assert "CHECKPOINT_BUCKET" in meanings["OUTPUT_REPO"] and "every epoch" not in meanings["OUTPUT_REPO"].split(";")[0]
    assert "but epochs" in meanings["RUN_NAME"]
    defaults = {var.name: var.default for var in variables.variables()}
    assert (defaults["DDP_TIMEOUT"], defaults["RENDEZVOUS_TIMEOUT"], defaults["PUBLISH_EVERY"]) == ("10m", "15m", "10m")


def test_the_costs_page_prints_the_estimators_gpu_table() -> None:
    text = (DOCS / "costs.md").read_text()
    assert "\n".join(estimate.gpu_table()) in text, "regenerate it from entrypoint.report.estimate.gpu_table()"
    for gpu in estimate.GPUS:
        if gpu.price_per_hour is not None:
            assert gpu.price_source and re.search(r"\d{4}-\d{2}-\d{2}", gpu.price_source), gpu.name


def test_stopping_the_bill_names_the_provider_credentials() -> None:
    for text in (README.read_text(), (DOCS / "costs.md").read_text()):
        section = text.split("## Stopping the bill", 1)[1].split("\n## ", 1)[0]
        for name in ("CONTAINER_ID", "CONTAINER_API_KEY", "RUNPOD_POD_ID", "RUNPOD_API_KEY"):
            assert f"`{name}`" in section, name


def test_the_readme_stays_short_and_its_commands_consistent() -> None:
    text = README.read_text()
    assert len(text.splitlines()) <= 130
    # the dataset is packed the way the dataset stage's own hints say
    assert "tar -cf data.tar -C my-dataset ." in text and "hf upload your-org/my-data data.tar " in text
    assert "trainbox sync --once ./workspace/runs/" in text  # with its RUN_DIR
