"""What the model card says, gathered from trainbox.json (a snapshot), metrics.jsonl's rows and status.json:
the run's state and metrics, the notes on what it mended or changed on its way (out of GPU memory, NCCL,
the host, an extension), and its cost outlook (the estimate until the first epoch, then the measured pace)."""

from __future__ import annotations

from typing import Any

from ..training import extend
from . import card, dashboard, estimate, receipt


def card_info(
    snapshot: dict[str, Any],
    rows: list[dict[str, Any]],
    *,
    repo_id: str | None,
    receipt: receipt.Receipt | None,
    plot: bool,
    total: int | None,
    license: str | None = None,
    base_model: str | None = None,
    evaluation: dict[str, Any] | None = None,
) -> card.CardInfo:
    validated = [row for row in rows if isinstance(row.get("metrics/mAP50"), int | float)]
    dataset = dict(snapshot.get("dataset") or {})
    settings = snapshot.get("settings") or {}
    source = settings.get("dataset")
    hub_dataset = source if isinstance(source, str) and "/" in source and not source.startswith(("/", ".")) else None
    gpus_block = snapshot.get("gpus") or {}
    gpus = [str(gpu.get("name") or f"GPU {gpu.get('index')}") for gpu in gpus_block.get("gpus") or []]
    if gpus and gpus_block.get("driver"):
        gpus.append(f"driver {gpus_block['driver']}")
    training = snapshot.get("training") or {}
    argv = list(training.get("argv") or [])
    return card.CardInfo(
        repo_id=repo_id,
        run_name=str(snapshot.get("run_name")),
        phase=str(snapshot.get("phase")),
        exit=snapshot.get("exit"),
        epochs_done=(snapshot.get("progress") or {}).get("epochs_done") or (rows[-1]["epoch"] if rows else None),
        epochs_total=total,
        best=best_row(rows),
        last=validated[-1] if validated else None,
        dataset=dataset,
        dataset_repo=hub_dataset,
        argv=["libreyolo", *argv] if argv else [],
        run_args=str(settings.get("run_args") or ""),
        versions=dict(snapshot.get("versions") or {}),
        gpus=gpus,
        receipt=receipt,
        plot=plot,
        updated_at=snapshot.get("updated_at"),
        notes=tuple(
            f"Out of GPU memory at epoch {a['epochs_done'] + 1} with batch={a['batch']}:"
            f" resumed after epoch {a['epochs_done']} with batch={a['next_batch']}."
            for a in snapshot.get("attempts") or []
            if isinstance(a.get("next_batch"), int) and isinstance(a.get("epochs_done"), int)
        )
        + _nccl_notes(snapshot.get("gpus"))
        + _host_notes(snapshot.get("host"))
        + tuple(extend.describe(entry) for entry in extend.history(snapshot)),
        license=license,
        base_model=base_model,
        storage=snapshot.get("storage"),
        cost_outlook=cost_outlook(snapshot, rows, total),
        exports=snapshot.get("exports"),
        dashboard=dashboard.recorded_url(snapshot),
        evaluation=evaluation,
    )


def _nccl_notes(gpus: Any) -> tuple[str, ...]:
    result = (gpus or {}).get("all_reduce") if isinstance(gpus, dict) else None
    found = result.get("nccl_env") if isinstance(result, dict) else None
    if not isinstance(found, dict) or not found:
        return ()
    words = " ".join(f"{name}={value}" for name, value in found.items())
    return (f"NCCL: the all-reduce failed with the defaults; trained with {words}.",)


def _host_notes(host: Any) -> tuple[str, ...]:
    """The host report on the card: what this machine measured, and what fell short."""
    if not isinstance(host, dict):
        return ()
    from ..host import judge

    return tuple(f"{line[0].upper()}{line[1:]}" for line in judge.lines(host))


def cost_outlook(snapshot: dict[str, Any], rows: list[dict[str, Any]], total: int | None) -> str | None:
    """What training all the epochs costs: at the measured pace once an epoch is done, else the start's estimate."""
    price = (snapshot.get("cost") or {}).get("price_per_hour")
    ahead = estimate.projected(rows, total, price)
    if ahead is not None:
        money = f"~${ahead['dollars']:.2f}" if ahead["dollars"] is not None else "dollars unknown (no price)"
        block = snapshot.get("estimate")
        images = block.get("images") if isinstance(block, dict) else None
        per_image = f", {ahead['seconds_per_epoch'] / images:.3g} s/image" if isinstance(images, int) and images else ""
        return (
            f"Training all {total} epochs: {money} (~{estimate.hours_text(ahead['training_hours'] * 3600)}"
            f" at the measured {ahead['seconds_per_epoch']:.0f} s/epoch{per_image})."
        )
    planned = estimate.from_record(snapshot.get("estimate"))
    if planned is None:
        return None
    return (
        f"Training all {planned.epochs} epochs: {planned.money()} (~{estimate.hours_text(planned.seconds)}),"
        f" an estimate until the first epoch is measured: {planned.seconds_per_image:.3g} s/image from"
        f" {planned.speed_source}."
    )


def best_row(rows: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The epoch LibreYOLO calls best (its watched metric, mAP50-95), else the highest mAP50-95."""
    validated = [row for row in rows if isinstance(row.get("metrics/mAP50-95"), int | float)]
    if not validated:
        return None
    marked = [row for row in validated if row.get("is_best")]
    return marked[-1] if marked else max(validated, key=lambda row: row["metrics/mAP50-95"])
