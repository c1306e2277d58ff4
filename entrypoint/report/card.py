"""The model card (README.md of OUTPUT_REPO): Hub metadata, then a page a person reads.

Built with huggingface_hub's ``ModelCard``/``ModelCardData``. Trainbox owns only the text between
``BEGIN``/``END`` and a few metadata keys: ``library_name``, ``pipeline_tag``, ``license`` and
``base_model`` when unset, its tags and dataset added to the user's, and the ``model-index`` (best
mAP50 / mAP50-95, when the dataset is a Hub repo the Hub can link). A card the user wrote keeps
every other line and key. No NaN or infinity reaches the metadata (the Hub refuses it); the page
shows them as "—".
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..libreyolo import BEST_CHECKPOINT
from ..training.stoprule import REASON as STOP_RULE
from . import card_eval, card_exports
from .receipt import Receipt

if TYPE_CHECKING:
    from huggingface_hub import ModelCardData

BEGIN = "<!-- trainbox:begin (this section is rewritten by Trainbox at every upload; edit outside it) -->"
END = "<!-- trainbox:end -->"
_SECTION = re.compile(r"<!-- trainbox:begin[^>]*-->.*?<!-- trainbox:end -->", re.DOTALL)
TAGS = ("libreyolo", "object-detection", "trainbox")
PLOT_FILE = "training.png"
# model-index metric ids: COCO's mAP@[.5:.95] and mAP@.5 under the ids torchmetrics' MeanAveragePrecision
# (and transformers' object-detection evaluation) report them; the names keep LibreYOLO's labels.
METRIC_IDS = {"mAP50-95": "map", "mAP50": "map_50"}

_STATE_WORDS = {
    "done": "done",
    "failed": "failed",
    "preempted": "preempted (the machine was taken back)",
    "stalled": "stopped: training stalled",
    "timed_out": "stopped: MAX_RUNTIME expired",
}


@dataclass(frozen=True)
class CardInfo:
    """What the card says, gathered from trainbox.json, metrics.jsonl and status.json."""

    repo_id: str | None
    run_name: str
    phase: str
    exit: dict[str, Any] | None
    epochs_done: int | None
    epochs_total: int | None
    best: dict[str, Any] | None  # a metrics.jsonl row: the best mAP50-95 epoch
    last: dict[str, Any] | None  # the last validated row
    dataset: dict[str, Any]  # source, revision
    dataset_repo: str | None  # org/name when the data came from the Hub
    argv: list[str]
    run_args: str
    versions: dict[str, Any]
    gpus: list[str]
    receipt: Receipt | None
    plot: bool
    updated_at: str | None
    notes: tuple[str, ...] = ()  # what the run mended on its way (out of GPU memory → a smaller batch)
    license: str | None = None  # a Hub license id: LICENSE, else the base model's
    base_model: str | None = None  # the Hub model the weights came from
    storage: dict[str, Any] | None = None  # trainbox.json's "storage": where the working state lives
    cost_outlook: str | None = None  # all the epochs' dollars: estimated before the first epoch, then measured
    exports: dict[str, Any] | None = None  # trainbox.json's "exports": EXPORT's files, or why not
    dashboard: str | None = None  # TRACKIO: the run's live trackio dashboard
    evaluation: dict[str, Any] | None = None  # eval.json (report/card_eval.gather): the held-out split's scores


def metadata(info: CardInfo) -> ModelCardData:
    # Imported here: `trainbox status` shows the receipt without paying for huggingface_hub's import.
    from huggingface_hub import EvalResult, ModelCardData

    data = ModelCardData(
        library_name="libreyolo",
        pipeline_tag="object-detection",
        tags=list(TAGS),
        datasets=[info.dataset_repo] if info.dataset_repo else None,
        license=info.license,
        base_model=info.base_model,
    )
    mAP50, mAP50_95, split = _metric(info.best, "mAP50"), _metric(info.best, "mAP50-95"), "val"
    if (scored := card_eval.headline(info.evaluation)) is not None:  # best.pt on the held-out split
        mAP50_95, mAP50, split = scored
    # Results name the dataset by its Hub id: a local dataset has none the Hub could link, so no model-index.
    if info.dataset_repo and (mAP50 is not None or mAP50_95 is not None):
        data.model_name = info.repo_id.split("/", 1)[1] if info.repo_id else info.run_name
        data.eval_results = [
            EvalResult(
                metric_type=METRIC_IDS[name],
                metric_name=name,
                metric_value=round(value, 4),
                task_type="object-detection",
                task_name="Object Detection",
                dataset_type=info.dataset_repo,
                dataset_name=info.dataset_repo,
                dataset_split=split,
                dataset_revision=info.dataset.get("revision"),
            )
            for name, value in (("mAP50", mAP50), ("mAP50-95", mAP50_95))
            if value is not None
        ]
    return data


def render(info: CardInfo, existing: str | None = None) -> str:
    """The whole README.md: ``existing`` (the user's card, or our previous one) with our parts replaced."""
    from huggingface_hub import ModelCard, ModelCardData

    ours = metadata(info)
    section = f"{BEGIN}\n{page(info)}\n{END}"
    if not existing or not existing.strip():
        card = ModelCard(f"---\n{ours.to_yaml()}\n---\n\n# {info.run_name}\n\n{section}\n")
        return str(card)
    card = ModelCard(existing, ignore_metadata_errors=True)
    theirs = card.data
    assert isinstance(theirs, ModelCardData)  # ModelCard's card_data_class
    theirs.library_name = theirs.library_name or ours.library_name
    theirs.pipeline_tag = theirs.pipeline_tag or ours.pipeline_tag
    theirs.license = theirs.license or ours.license
    theirs.base_model = theirs.base_model or ours.base_model
    theirs.tags = _union(theirs.tags, ours.tags)
    if ours.datasets:
        theirs.datasets = _union(_as_list(theirs.datasets), ours.datasets)
    if ours.eval_results:
        theirs.model_name, theirs.eval_results = ours.model_name, ours.eval_results
    if _SECTION.search(card.text):
        card.text = _SECTION.sub(lambda _: section, card.text, count=1)
    else:
        card.text = card.text.rstrip("\n") + f"\n\n## Training run\n\n{section}\n"
    return str(card)


def page(info: CardInfo) -> str:
    """The human part: state, metrics, plot, how to load, arguments, cost, versions, GPUs."""
    lines = [_state_line(info), ""]
    lines += [f"Live metrics, every epoch: [the trackio dashboard]({info.dashboard}).", ""] if info.dashboard else []
    lines += _metrics_table(info)
    if info.plot:
        lines += [f"![Loss and mAP per epoch]({PLOT_FILE})", ""]
    lines += _load_snippet(info)
    lines += card_exports.section(info.exports or {}, info.repo_id, info.run_name)
    lines += card_eval.section(info.evaluation)
    lines += ["### Training arguments", "", "```bash", " ".join(_quote(arg) for arg in info.argv) or "(not started)"]
    lines += ["```", "", f"`RUN_ARGS`: `{info.run_args or '(empty)'}`", ""]
    lines += [*(f"- {note}" for note in info.notes), ""] if info.notes else []
    if info.receipt is not None or info.cost_outlook:
        lines += ["### Cost", "", *([info.cost_outlook, ""] if info.cost_outlook else [])]
        lines += [info.receipt.markdown(), ""] if info.receipt is not None else []
    lines += ["### Versions and hardware", "", "| | |", "|---|---|"]
    for name, version in info.versions.items():
        lines.append(f"| {name} | {version or '—'} |")
    lines.append(f"| GPU(s) | {', '.join(info.gpus) if info.gpus else 'CPU'} |")
    if info.dataset:
        revision = info.dataset.get("revision")
        lines.append(f"| dataset | {info.dataset.get('source')}{f' @ `{revision}`' if revision else ''} |")
    lines += ["", f"<sub>Updated {info.updated_at or ''} by Trainbox.</sub>"]
    return "\n".join(lines)


def _state_line(info: CardInfo) -> str:
    epochs = f"{info.epochs_done if info.epochs_done is not None else 0}/{info.epochs_total or '?'} epochs"
    if info.phase in _STATE_WORDS:
        text = f"**State: {_STATE_WORDS[info.phase]}** after {epochs}"
        message = (info.exit or {}).get("message")
        early = (info.exit or {}).get("reason") == STOP_RULE  # finished, before its last epoch
        if early:
            text = f"**State: done, stopped early by the dollar rule** after {epochs}"
        if message and (info.phase != "done" or early):
            text += f": {message}"
        return text + "." + _freshness(info, live=False)
    return f"**State: running** ({info.phase}), {epochs} so far." + _freshness(info, live=True)


def _freshness(info: CardInfo, *, live: bool) -> str:
    """How old the card's state is; while the run goes on, where to see it live (the card is published
    at most every PUBLISH_EVERY, the run's trainbox.json at every epoch)."""
    stamp = info.updated_at
    when = f" As of {stamp.replace('T', ' ').removesuffix('Z')[:16]} UTC" if stamp else ""
    if not live or info.repo_id is None:
        return f"{when}." if when else ""
    return f"{when or ' This card may be behind'}; live: `trainbox status --repo {info.repo_id} --watch`."


def _metrics_table(info: CardInfo) -> list[str]:
    if info.best is None and info.last is None:
        return ["No validated epoch yet.", ""]
    rows = ["| | epoch | mAP50 | mAP50-95 | train loss |", "|---|---:|---:|---:|---:|"]
    for label, row in (("best", info.best), ("last", info.last)):
        if row is not None:
            rows.append(
                f"| {label} | {row.get('epoch')} | {_fmt(_metric(row, 'mAP50'))} | {_fmt(_metric(row, 'mAP50-95'))}"
                f" | {_fmt(row.get('train/loss'))} |"
            )
    return [*rows, ""]


def _load_snippet(info: CardInfo) -> list[str]:
    """Three lines with LibreYOLO's own Hub loader (``hf://owner/repo/file``, needs ``libreyolo[hf]``)."""
    source = f"hf://{info.repo_id}/{BEST_CHECKPOINT}" if info.repo_id else f"runs/{info.run_name}/{BEST_CHECKPOINT}"
    return [
        "### Use the weights",
        "",
        "```python",
        "from libreyolo import LibreYOLO  # pip install 'libreyolo[hf]'",
        f'model = LibreYOLO("{source}")',
        'results = model.predict("image.jpg")',
        "```",
        "",
        "`weights/last.pt` is the last epoch (resumable); `weights/epoch_N.pt` every `save_period` epochs.",
        "",
        *_bucket_lines(info),
    ]


def _bucket_lines(info: CardInfo) -> list[str]:
    """Where the working state is when it lives in a Storage Bucket, and how to fetch it."""
    storage = info.storage or {}
    if storage.get("mode") != "bucket":
        return []
    bucket, prefix = storage.get("bucket"), storage.get("prefix")
    return [
        f"During training this repo gets milestones; every epoch's `last.pt`, the `epoch_N.pt` snapshots and"
        f" `metrics.jsonl` are in the Storage Bucket `hf://buckets/{bucket}/{prefix}/`, one whole epoch"
        " boundary at a time (each boundary's files under new keys, named by a manifest):",
        "",
        "```python",
        "import json",
        "from huggingface_hub import HfApi",
        "",
        f'api, bucket, prefix = HfApi(), "{bucket}", "{prefix}"',
        'newest = max(f.path for f in api.list_bucket_tree(bucket, prefix=f"{prefix}/manifests"))',
        'api.download_bucket_files(bucket, [(newest, "manifest.json")])',
        'key = json.load(open("manifest.json"))["files"]["weights/last.pt"]["key"]',
        'api.download_bucket_files(bucket, [(key, "last.pt")])',
        "```",
        "",
    ]


def _metric(row: dict[str, Any] | None, name: str) -> float | None:
    if not row:
        return None
    value: Any = row.get(f"metrics/{name}")
    return float(value) if _finite(value) else None


def _finite(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _fmt(value: Any) -> str:
    return f"{value:.4f}" if _finite(value) else "—"


def _quote(arg: str) -> str:
    return json.dumps(arg) if any(ch.isspace() for ch in arg) or not arg else arg


def _as_list(value: Any) -> list[str]:
    if value is None:
        return []
    return [value] if isinstance(value, str) else list(value)


def _union(first: Any, second: Any) -> list[str]:
    merged: list[str] = []
    for item in [*_as_list(first), *_as_list(second)]:
        if item not in merged:
            merged.append(item)
    return merged
