"""`trainbox status`: the run as this machine's volume holds it, or as the Hub does (``--repo``).

Both views render a trainbox.json, wherever it came from: the volume (``RUN_DIR``, else
WORKDIR/runs/RUN_NAME, else the newest run), or the Hub (``remote.fetch_remote_state``: the repo's
copy, or the working store's when newer). The remote view needs nothing but trainbox.json: at every epoch
boundary the agent writes there the epoch (``progress``), the pace and the mAP (``metrics``: both from
``progress_fields``), and the sync
carries it with the boundary, so a laptop sees the run at most one boundary behind.
"""

from __future__ import annotations

import datetime as dt
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeGuard

import click

from .. import libreyolo
from ..errors import EXIT_INTERRUPTED, ConfigError, RemoteUnreachableError
from ..state import STATE_FILE, TERMINAL_PHASES, read_state
from . import card_eval, dashboard, plot, receipt
from .card_facts import best_row
from .epochs import seconds_per_epoch, watch_view

# How a terminal phase reads in a line (the card, the status, the end message).
OUTCOME_WORDS = {
    "done": "done",
    "failed": "failed",
    "preempted": "preempted (the machine was taken back)",
    "stalled": "stopped: training stalled",
    "timed_out": "stopped: MAX_RUNTIME or MAX_COST reached",
}
REMOTE_INTERVAL = 10.0  # seconds between two looks at the Hub with --watch: each look is a few requests
# --watch keeps the last view through a Hub it cannot reach (a wifi blip, a laptop waking) this long, then exit 22.
WATCH_GIVE_UP = 10 * 60.0


# -- a run on this machine ---------------------------------------------------------------------
def find_state(run_dir: Path | None, workdir: Path, run_name: str | None) -> Path | None:
    """trainbox.json of ``run_dir``, else of WORKDIR/runs/RUN_NAME, else of the newest run under WORKDIR."""
    if run_dir is not None:
        candidate = run_dir / STATE_FILE if run_dir.is_dir() else run_dir
        return candidate if candidate.is_file() else None
    if run_name:
        candidate = workdir / "runs" / run_name / STATE_FILE
        return candidate if candidate.is_file() else None
    found = sorted((workdir / "runs").glob(f"*/{STATE_FILE}"), key=lambda path: path.stat().st_mtime)
    return found[-1] if found else None


def render_status(data: dict[str, Any]) -> str:
    lines = [f"run       {data.get('run_name')}", f"phase     {data.get('phase')}"]
    lines.append(
        f"attempt   {data.get('attempt')}   started {data.get('started_at')}   updated {data.get('updated_at')}"
    )
    progress = data.get("progress") or {}
    if progress:
        lines.append(f"epochs    {progress.get('epochs_done')}/{progress.get('epochs_total')}")
    for name, phase in (data.get("phases") or {}).items():
        seconds = phase.get("seconds")
        lines.append(f"  {name:<10} {'running' if seconds is None else f'{seconds:.1f} s'}")
    if data.get("cost"):
        from ..release.cost import describe_spend

        lines.append(f"cost      {describe_spend(data['cost'])}")
    lines += _end_lines(data)
    return "\n".join(lines)


def show_local(
    run_dir: Path | None, workdir: Path, run_name: str | None, *, as_json: bool, watch: bool, interval: float
) -> None:
    """Print the run of this volume once, or redraw it until it ends (``watch``)."""
    while True:
        path = find_state(run_dir, workdir, run_name)
        data = read_state(path) if path else None
        if data is None or path is None:
            raise ConfigError("no trainbox.json found", "pass the run folder, or set WORKDIR / RUN_NAME")
        if as_json:
            click.echo(json.dumps(data, indent=2))
            return
        text = "\n".join([render_status(data), *watch_view(path.parent, data, path.parent.parent.parent, time.time())])
        if not watch:
            click.echo(text)
            return
        click.clear()
        click.echo(text)
        if data.get("phase") in TERMINAL_PHASES or not _pause(interval):
            return


# -- what trainbox.json carries for a remote view ------------------------------------------------
def progress_fields(run_dir: Path, done: int, total: Any) -> dict[str, Any]:
    """trainbox.json's ``progress`` (the epochs) and ``metrics`` at an epoch boundary: from metrics.jsonl
    the pace, the last mAP50 and the best epoch (the one best.pt holds), so trainbox.json alone tells a
    remote reader how the run goes."""
    rows = plot.read_rows(run_dir / libreyolo.METRICS_FILE)
    fields: dict[str, Any] = {}
    pace = seconds_per_epoch(rows)
    if pace is not None:
        fields["seconds_per_epoch"] = round(pace, 2)
    validated = [row for row in rows if _number(row.get("metrics/mAP50"))]
    if validated:
        fields["mAP50"] = round(float(validated[-1]["metrics/mAP50"]), 4)
    best = best_row(rows)
    if best is not None:
        fields["best"] = {
            "epoch": best["epoch"],
            "mAP50": round(float(best["metrics/mAP50"]), 4) if _number(best.get("metrics/mAP50")) else None,
            "mAP50-95": round(float(best["metrics/mAP50-95"]), 4),
        }
    return {"progress": {"epochs_done": done, "epochs_total": total}, "metrics": fields}


# -- the run as the Hub holds it ----------------------------------------------------------------
def render_remote(data: dict[str, Any], now: float, repo_id: str | None = None) -> str:
    """The run in a few lines: epoch line, phase and outcome, cost, GPU, where its working state is. The file
    came from elsewhere (remote.sanitized gave it the types read here); a line its values still cannot make
    reads ``unreadable``, and the others are shown."""
    attempt = f" (attempt {data.get('attempt')})" if data.get("attempt") not in (None, 1) else ""
    lines = [f"run       {data.get('run_name')}{attempt}{f' · {repo_id}' if repo_id else ''}"]
    phase = str(data.get("phase"))
    heard = _guarded(lambda: _age(data.get("updated_at"), now))
    lines.append(f"phase     {phase}{f' · last heard {heard} ago' if heard else ''}")
    lines.append(f"epoch     {_guarded(lambda: epoch_line(data))}")
    lines += [f"scored    {scored}"] if (scored := _guarded(lambda: card_eval.scored_text(data))) else []
    spend = _guarded(lambda: cost_text(data, now))
    if spend:
        lines.append(f"cost      {spend}")
    lines.append(f"GPU       {_guarded(lambda: gpu_text(data.get('gpus')))}")
    lines.append(f"working   {_guarded(lambda: working_state(data, now))}")
    if board := dashboard.recorded_url(data):
        lines.append(f"dashboard {board}")
    try:
        lines += _end_lines(data)
    except (TypeError, ValueError, AttributeError, KeyError):
        lines.append("exit      unreadable")
    return "\n".join(lines)


def _guarded(line: Callable[[], str | None]) -> str | None:
    try:
        return line()
    except (TypeError, ValueError, AttributeError, KeyError, OverflowError):
        return "unreadable"


def epoch_line(data: dict[str, Any]) -> str:
    """``12/100 · 41 s/epoch · ETA 1h02 · mAP50 0.61 (best 0.63 @ 9, mAP50-95 0.41)``: ``progress``, ``metrics``."""
    progress, metrics = data.get("progress") or {}, data.get("metrics") or {}
    done, total = progress.get("epochs_done"), progress.get("epochs_total")
    parts = [f"{done if done is not None else 0}/{total or '?'}"]
    pace = metrics.get("seconds_per_epoch")
    if _number(pace):
        parts.append(f"{pace:.0f} s/epoch" if pace < 100 else f"{receipt.format_seconds(pace)}/epoch")
        if _number(total) and _number(done) and done < total and data.get("phase") not in TERMINAL_PHASES:
            parts.append(f"ETA {receipt.format_seconds(pace * (total - done))}")
    best = metrics.get("best") or {}
    if _number(metrics.get("mAP50")):
        best_text = ""
        if best:
            best_text = (
                f" (best {_fmt(best.get('mAP50'))} @ {best.get('epoch')}, mAP50-95 {_fmt(best.get('mAP50-95'))})"
            )
        parts.append(f"mAP50 {metrics['mAP50']:.3f}{best_text}")
    elif done:
        parts.append("mAP50 — (not validated yet)")
    return " · ".join(parts)


def best_text(data: dict[str, Any]) -> str:
    """``mAP50 0.634 · mAP50-95 0.412 (epoch 9)``: the epoch best.pt holds."""
    best = (data.get("metrics") or {}).get("best") or {}
    if not best:
        return "no validated epoch"
    return f"mAP50 {_fmt(best.get('mAP50'))} · mAP50-95 {_fmt(best.get('mAP50-95'))} (epoch {best.get('epoch')})"


def cost_text(data: dict[str, Any], now: float) -> str | None:
    """The spend: the final one once the run ended, else so far (from the agent's start to ``now``)."""
    cost = data.get("cost") or {}
    if data.get("phase") in TERMINAL_PHASES and cost.get("hours") is not None:
        from ..release.cost import describe_spend

        return describe_spend(cost)
    found = receipt.compute(data, now)
    if found is None:
        return None
    dollars = found.dollars(found.billed_seconds)
    price = f" at ${found.price_per_hour:.2f}/h" if found.price_per_hour is not None else ""
    spent = f"${dollars:.2f}" if dollars is not None else f"{receipt.format_seconds(found.billed_seconds)} billed"
    return f"{spent} so far{price}"


def gpu_text(gpus: Any) -> str:
    """``2 × NVIDIA H100 80GB HBM3``, or ``CPU``."""
    found = [str(gpu.get("name") or "GPU") for gpu in (gpus or {}).get("gpus") or [] if isinstance(gpu, dict)]
    if not found:
        return "CPU" if gpus else "not checked yet"
    counts: dict[str, int] = {}
    for name in found:
        counts[name] = counts.get(name, 0) + 1
    return ", ".join(f"{count} × {name}" for name, count in counts.items())


def working_state(data: dict[str, Any], now: float) -> str:
    """Where the run's every-epoch state lives, and how old the copy this view shows is."""
    storage = data.get("storage") or {}
    if storage.get("mode") == "bucket":
        where = f"bucket hf://buckets/{storage.get('bucket')}/{storage.get('prefix')}"
    else:
        repo = (data.get("settings") or {}).get("output_repo")
        where = f"repo {repo}" if repo else "the volume only (no OUTPUT_REPO)"
        if storage.get("unavailable"):
            where += " (the bucket was unavailable)"
    age = _age(data.get("updated_at"), now)
    return f"{where}, as of {age} ago" if age else where


def _end_lines(data: dict[str, Any]) -> list[str]:
    lines = []
    if data.get("release"):
        released = data["release"]
        error = f": {released['error']}" if released.get("error") else ""
        lines.append(f"release   {released.get('action')} {released.get('status')}{error}")
    if data.get("exit"):
        exit_info = data["exit"]
        words = OUTCOME_WORDS.get(str(data.get("phase")), str(data.get("phase")))
        lines.append(f"exit      {exit_info.get('code')} ({exit_info.get('reason')}): {exit_info.get('message')}")
        lines.append(f"outcome   {words}")
    return lines


def exit_code_of(data: dict[str, Any]) -> int | None:
    """The run's own exit code, once it ended (``--watch`` exits with it)."""
    if data.get("phase") not in TERMINAL_PHASES:
        return None
    code = (data.get("exit") or {}).get("code")
    return code if isinstance(code, int) else 1


def follow_line(repo_id: str) -> str:
    return f"trainbox status --repo {repo_id} --watch"


def show_remote(
    fetch: Callable[[], dict[str, Any] | None],
    repo_id: str,
    *,
    as_json: bool,
    watch: bool,
    interval: float | None,
    give_up: float = WATCH_GIVE_UP,
) -> int:
    """Print the run ``fetch`` finds on the Hub; with ``watch``, again at each change until it ends, then
    return the run's own exit code. With ``watch``, a Hub that does not answer keeps the last view, said to
    be stale and for how long, until ``give_up`` seconds pass without an answer (then RemoteUnreachableError)."""
    shown: str | None = None
    answered = time.monotonic()
    while True:
        try:
            data = fetch()
        except RemoteUnreachableError as error:
            silent = time.monotonic() - answered
            if not watch or silent >= give_up:
                if watch:
                    error.message += f"; no answer for {receipt.format_seconds(silent)}"
                raise
            _stale(shown, silent, give_up, as_json=as_json)
            if not _pause(REMOTE_INTERVAL if interval is None else interval):
                return EXIT_INTERRUPTED
            continue
        answered = time.monotonic()
        if data is None and not watch:
            raise ConfigError(
                f"{repo_id} holds no run yet (no trainbox.json there or in its bucket)",
                "check the repo id and --run, or wait for the run's first upload",
            )
        if data is not None:
            text = (
                json.dumps(data, indent=None if watch else 2) if as_json else render_remote(data, time.time(), repo_id)
            )
            if not watch:
                click.echo(text)
                return 0
            if as_json and text != shown:
                click.echo(text)
            elif not as_json:
                click.clear()
                click.echo(text)
            shown = text
            code = exit_code_of(data)
            if code is not None:
                return code
        if not _pause(REMOTE_INTERVAL if interval is None else interval):
            return EXIT_INTERRUPTED


def _stale(shown: str | None, silent: float, give_up: float, *, as_json: bool) -> None:
    """The last view kept while the Hub does not answer, and how stale it is (JSON lines: said on stderr)."""
    said = (
        f"the Hub has not answered for {receipt.format_seconds(silent)}: the view above is that old;"
        f" giving up after {receipt.format_seconds(give_up)} without an answer"
    )
    if as_json:
        click.echo(f"stale: {said}", err=True)
        return
    click.clear()
    if shown is not None:
        click.echo(shown)
    click.echo(f"stale     {said}")


def _pause(seconds: float) -> bool:
    """Wait between two redraws; False once the person pressed Ctrl-C."""
    try:
        time.sleep(seconds)
    except KeyboardInterrupt:
        return False
    return True


def _age(stamp: Any, now: float) -> str | None:
    if not isinstance(stamp, str):
        return None
    try:
        then = dt.datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None
    return receipt.format_seconds(now - then)


def _number(value: Any) -> TypeGuard[float]:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _fmt(value: Any) -> str:
    return f"{value:.3f}" if _number(value) else "—"
