"""The ``trainbox`` command. ``main`` is the only place where errors become exit codes."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import sys
from pathlib import Path
from typing import Any, NoReturn

import click

from . import __version__, log
from .errors import EXIT_INTERRUPTED, AgentError, ConfigError
from .log import logger, redact
from .settings import Settings, debugging
from .variables import internal_variables, user_variables


def load_settings(*, quiet_transfers: bool = False) -> Settings:
    """Settings from this process's environment, and the defaults the agent gives it (settings.load)."""
    from . import settings

    return settings.load(os.environ, quiet_transfers=quiet_transfers)


def _env_epilog() -> str:
    """The text under ``--help``: one line per row of settings' table, ``NAME [default]: meaning``."""
    lines = ["Environment variables (defaults in brackets; secrets are never printed):", ""]
    for var in user_variables():
        default = f" [{var.default}]" if var.default is not None else ""
        lines.append(f"  {var.name}{default}: {var.meaning}")
    return "\n".join(lines)


def env_table(names: tuple[str, ...] | None = None, *, internal: bool = False) -> list[str]:
    """The same rows as a Markdown table, for docs/configuration.md (every row a person sets), README.md
    (``names``) and docs/development.md (``internal``); tests/unit/test_docs.py keeps them equal to it."""
    rows = ["| variable | default | meaning |", "|---|---|---|"]
    for var in internal_variables() if internal else user_variables():
        if names is None or var.name in names:
            rows.append(f"| `{var.name}` | {var.default if var.default is not None else 'unset'} | {var.meaning} |")
    return rows


class _EnvHelp(click.Command):
    """``--help`` ends with the environment variables and their defaults, from settings' table."""

    def format_epilog(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        formatter.write("\n" + _env_epilog() + "\n")


class _EnvHelpGroup(_EnvHelp, click.Group):
    pass


@click.group(cls=_EnvHelpGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="trainbox")
@click.option("--log-json", is_flag=True, help="Log one JSON object per line.")
@click.option("-v", "--verbose", is_flag=True, help="Log debug detail too.")
def cli(log_json: bool, verbose: bool) -> None:
    """Train a LibreYOLO model on this machine from env vars, upload it, then stop the bill."""
    log.setup(json_lines=log_json, verbose=verbose)


@cli.command(cls=_EnvHelp)
@click.option(
    "--dry-run", is_flag=True, help="Print what would happen (settings, command, resume, release); spend nothing."
)
def run(dry_run: bool) -> None:
    """The whole job: preflight, dataset, training with live upload, release."""
    if dry_run:
        settings = load_settings()
        from . import dryrun

        click.echo(redact("\n".join(dryrun.report(settings, dict(os.environ)))))
        return
    loaded = load_settings(quiet_transfers=True)  # before huggingface_hub is imported (by pipeline)
    from . import pipeline

    _end_hard()
    code = pipeline.run(loaded)
    sys.exit(code)


@cli.command()
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
def check(as_json: bool) -> None:
    """Preflight alone: prove every GPU runs kernels, and NCCL across them; exits with the GPU error code."""
    from . import preflight
    from .gpu import report as gpu_report

    settings = load_settings()
    report = preflight.probe_gpus(settings)
    host = _host_report(settings, report.details) if report.problem is None else None
    if as_json:
        click.echo(json.dumps(gpu_report.as_json(report) | ({"host": host} if host else {}), indent=2))
    else:
        click.echo(gpu_report.render(report))
        if host:
            from .host import judge

            click.echo("\n".join(judge.lines(host)))
    report.raise_problem()


def _host_report(settings: Settings, gpu_details: dict[str, Any]) -> dict[str, Any] | None:
    """The host report beside the GPU check (HOST_CHECK=off: none); the provider is not asked here."""
    from .host import check as host_check
    from .settings import HostCheck

    return None if settings.host_check is HostCheck.OFF else host_check.report(settings, gpu_details, None)


@cli.command()
@click.option("--json", "as_json", is_flag=True, help="Print where the dataset is as JSON.")
def fetch(as_json: bool) -> None:
    """The dataset stage alone: download, extract safely, check with libreyolo doctor (cached by revision)."""
    loaded = load_settings()  # before huggingface_hub is imported
    from . import dataset
    from .evaluation import split

    prepared = dataset.prepare(loaded)
    found: dict[str, object] = {
        "source": prepared.description,
        "revision": prepared.revision,
        "data_yaml": str(prepared.data_yaml),
        "root": str(prepared.root),
        # a test split that cannot be scored: refused here too
        "scored_on": split.choose(prepared.data_yaml).words if loaded.evaluate else "nothing (EVAL=0)",
    }
    if as_json:
        found["seconds"] = dict(prepared.timings)
        click.echo(json.dumps(found, indent=2))
    else:
        click.echo("\n".join(f"{key:<10}{value}" for key, value in found.items() if value is not None))


@cli.command("sync")
@click.argument("run_dir", type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.option("--once", is_flag=True, help="Upload what is there now, then exit.")
@click.option("--timeout", default=600.0, show_default=True, help="Seconds the final upload may take (a stop: 5).")
def sync_command(run_dir: Path, once: bool, timeout: float) -> None:
    """Mirror any LibreYOLO run folder to OUTPUT_REPO until its training ends. SIGTERM or Ctrl-C ends it within
    5 s: exit 143, or 70 naming what is not on the Hub yet (still in the run folder)."""
    settings = load_settings(quiet_transfers=True)  # before huggingface_hub is imported
    from .sync.mirror import mirror

    mirror(settings, run_dir, once=once, timeout=timeout, uploading=_end_hard)


@cli.command("release")
@click.argument("run_dir", required=False, type=click.Path(file_okay=False, path_type=Path))
@click.option(
    "--action",
    type=click.Choice(["exit", "stop", "destroy"]),
    help="What to do with this instance (default: ON_EXIT, or ON_FAILURE with --failed).",
)
@click.option("--failed", is_flag=True, help="Use ON_FAILURE instead of ON_EXIT.")
@click.option("--json", "as_json", is_flag=True, help="Print the outcome as JSON.")
def release_command(run_dir: Path | None, action: str | None, failed: bool, as_json: bool) -> None:
    """The end-of-job action alone: stop or destroy this instance and confirm it with the provider."""
    from .release.end import action_for, record_in_state_file, release, require_provider
    from .settings import ExitAction

    settings = load_settings()
    chosen = ExitAction(action) if action else action_for(settings, failed=failed)
    require_provider(settings.provider, chosen)
    if chosen is ExitAction.EXIT:
        outcome: dict[str, Any] = {"action": "exit", "status": "not_requested"}
    else:
        outcome = {"action": chosen.value, **release(settings.provider, chosen)}
    # Noted in the run's trainbox.json when there is one (RUN_DIR, else WORKDIR/runs/RUN_NAME).
    record_in_state_file(run_dir or settings.run_dir, outcome)
    if as_json:
        click.echo(json.dumps(outcome, indent=2))
    elif chosen is ExitAction.EXIT:
        click.echo("exit: nothing to release; a marketplace instance keeps billing until stopped or destroyed")
    else:
        click.echo(f"{chosen}: confirmed by the provider ({outcome['detail']})")


@cli.command()
@click.option("--gpu", help="The GPU to price, e.g. H100, A100-80GB, L40S, L4, T4, RTX 4090 (see docs/costs.md).")
@click.option(
    "--price", type=click.FloatRange(min=0), help="$/h of the instance (default: the table's, or PRICE_PER_HOUR)."
)
@click.option(
    "--epochs", type=click.IntRange(min=1), help="Epochs to train (default: RUN_ARGS' epochs, else libreyolo's 300)."
)
@click.option(
    "--images",
    type=click.IntRange(min=1),
    help="Training images (default: a local folder's, counted; else estimated from the tar's size).",
)
@click.option(
    "--seconds-per-image",
    type=click.FloatRange(min=0, min_open=True),
    help="Measured training seconds per image (a run's card gives it after its first epoch).",
)
@click.option("--disk-gb", type=click.FloatRange(min=0, min_open=True), help="Allocated disk in GB.")
@click.option(
    "--storage-price", type=click.FloatRange(min=0, min_open=True), help="The provider's disk price in $/GB-month."
)
@click.option("--rebuild-cost", type=click.FloatRange(min=0), help="$ to rent, pull and stage the data again.")
@click.option("--json", "as_json", is_flag=True, help="Print the numbers as JSON.")
def plan(
    gpu: str | None,
    price: float | None,
    epochs: int | None,
    images: int | None,
    seconds_per_image: float | None,
    disk_gb: float | None,
    storage_price: float | None,
    rebuild_cost: float | None,
    as_json: bool,
) -> None:
    """Before renting: the run `trainbox run` would start, its dollars on a GPU (an estimate), the disk it needs,
    when stopping beats destroying."""
    from .report import plan as planning
    from .settings import dataset_named

    options = planning.Options(gpu, price, epochs, images, seconds_per_image, disk_gb, storage_price, rebuild_cost)
    wants_run = any(value is not None for value in (gpu, price, epochs, images, seconds_per_image))
    # The stop-or-destroy arithmetic alone (--disk-gb and --storage-price) reads no settings.
    settings = load_settings() if wants_run or disk_gb is None or dataset_named(os.environ) else None
    report, lines = planning.report(settings, options)
    click.echo(json.dumps(report, indent=2) if as_json else "\n".join(lines))


@cli.command()
@click.argument("run_dir", required=False, type=click.Path(path_type=Path))
@click.option(
    "--repo", metavar="ORG/NAME", help="The run as the Hub holds it, from any machine with a token that reads it."
)
@click.option("--run", "run_name", metavar="RUN_NAME", help="With --repo: which run (default: the repo's newest).")
@click.option("--json", "as_json", is_flag=True, help="Print trainbox.json as it is.")
@click.option("--watch", is_flag=True, help="Redraw until the run ends; with --repo, then exit with the run's code.")
@click.option("--interval", type=float, help="Seconds between redraws with --watch (2; with --repo 10).")
def status(
    run_dir: Path | None, repo: str | None, run_name: str | None, as_json: bool, watch: bool, interval: float | None
) -> None:
    """What the agent is doing, or did (reads trainbox.json: the volume's, or the Hub's with --repo)."""
    from .report import status as view
    from .settings import lookout_from_env

    if repo is None:
        if run_name is not None:
            raise ConfigError("--run needs --repo", "pass --repo ORG/NAME, or RUN_DIR for a run on this machine")
        look = lookout_from_env(os.environ)
        view.show_local(run_dir, look.workdir, look.run_name, as_json=as_json, watch=watch, interval=interval or 2.0)
        return
    if run_dir is not None:
        raise ConfigError("RUN_DIR and --repo name two places", "pass one of them")
    from .parsing import repo_id

    look = lookout_from_env(os.environ, repo_id("--repo", repo, None))
    from huggingface_hub import get_token

    from .hub import Hub
    from .report import remote

    hub = Hub(token=look.hf_token.reveal() if look.hf_token else get_token())  # else `hf auth login`'s token
    code = view.show_remote(
        lambda: remote.fetch_remote_state(hub, repo, run_name, bucket=look.checkpoint_bucket),
        repo,
        as_json=as_json,
        watch=watch,
        interval=interval,
    )
    sys.exit(code)


@cli.command("eval")
@click.option("--repo", required=True, metavar="ORG/NAME", help="The model repo whose files are scored.")
@click.option("--dataset", metavar="ORG/NAME", help="Score on this dataset (default: the one the run trained on).")
@click.option("--split", type=click.Choice(["test", "val"]), help="The split (default: test, else val).")
@click.option("--device", default="auto", show_default=True, help="Where libreyolo val runs: cpu, 0, auto.")
@click.option("--json", "as_json", is_flag=True, help="Print eval.json's format.")
def eval_command(repo: str, dataset: str | None, split: str | None, device: str, as_json: bool) -> None:
    """Score a model repo's files on the dataset's held-out split, as the box did (docs/evaluation.md)."""
    from .parsing import repo_id

    repo_id("--repo", repo, None)
    if dataset is not None and not dataset.startswith(("/", ".")):
        repo_id("--dataset", dataset, None)
    environ = dict(os.environ)
    from huggingface_hub import get_token

    from .evaluation import command, record
    from .hub import Hub

    hub = Hub(token=environ.get("HF_TOKEN") or get_token())
    evaluation, sizes = command.evaluate_repo(hub, repo, environ, dataset=dataset, split=split, device=device)
    if as_json:
        click.echo(json.dumps(evaluation, indent=2))
    else:
        click.echo("\n".join(record.table(evaluation, sizes)))


_HARD_END: list[bool] = []  # set by the commands that upload beside the main thread


def _end_hard() -> None:
    """This command ends with ``end_process``: the interpreter's exit would join huggingface_hub's
    upload threads, and a commit of several LFS files still in flight would hold the exit for minutes."""
    _HARD_END.append(True)


def end_process(code: int) -> NoReturn:
    """Exit now with ``code``: the logs flushed, any thread still uploading abandoned (the job
    already said what the Hub holds; a commit in flight lands or not, and the next start checks)."""
    with contextlib.suppress(Exception):
        logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(code)


def main(argv: list[str] | None = None) -> None:
    """Entry point: run the CLI, turn a known error into one line and its exit code."""
    try:
        _main(argv)
    except SystemExit as done:
        if _HARD_END:
            end_process(done.code if isinstance(done.code, int) else 0 if done.code is None else 1)
        raise


def _main(argv: list[str] | None) -> None:
    try:
        cli.main(args=argv, prog_name="trainbox", standalone_mode=False)
    except AgentError as error:
        if not logger.handlers:
            log.setup()
        logger.error("%s", error)  # the level is the one prefix: "ERROR: <what> — <fix>"
        sys.exit(error.exit_code)
    except click.exceptions.Exit as done:
        sys.exit(done.exit_code)
    except click.ClickException as error:
        error.show()
        sys.exit(error.exit_code)
    except (click.exceptions.Abort, KeyboardInterrupt):
        sys.exit(EXIT_INTERRUPTED)
    except Exception as error:  # an unknown failure still gets one clean, scrubbed line
        if not logger.handlers:
            log.setup()
        logger.error("unexpected %s: %s", type(error).__name__, redact(str(error)))
        if debugging(os.environ):
            logger.exception("traceback")
        sys.exit(1)
