"""The model card and its plot in the run folder, brought up to date before each snapshot, so the same commit
carries them with the epoch: the plot redrawn when an epoch ended (less often when drawing cannot keep up),
README.md rewritten on the card the Hub holds (a person may have edited it), or the local one.
"""

from __future__ import annotations

import contextlib
import os
import time
from typing import TYPE_CHECKING, Any

from ..log import logger
from . import card, card_eval, plot, provenance, receipt
from .card_facts import card_info
from .epochs import seconds_per_epoch

if TYPE_CHECKING:
    from ..hub import Hub
    from ..settings import Settings

CARD_FILE = "README.md"
# A plot that costs more than this share of an epoch is drawn less often (the card keeps the last one).
PLOT_SHARE = 0.2


class CardPage:
    """The plot and README.md of one attempt; the card's base is read once per attempt."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.run_dir = settings.run_dir
        self._plotted_epoch = 0
        self._plot_seconds = 0.0
        self._card_base: str | None = None
        self._card_base_known = False
        self._base_model = provenance.base_model(settings.user_run_args)
        self._license = settings.card_license  # else the base model's, read with the Hub's card

    def maybe_plot(self, rows: list[dict[str, Any]], *, final: bool) -> None:
        if not rows or rows[-1]["epoch"] == self._plotted_epoch:
            return
        pace = seconds_per_epoch(rows) or 0.0
        behind = rows[-1]["epoch"] - self._plotted_epoch
        # Cannot keep up (drawing costs a fair share of an epoch): skip boundaries, never the last one.
        if not final and self._plot_seconds > PLOT_SHARE * pace * behind:
            return
        started = time.monotonic()
        try:
            plot.draw(rows, self.run_dir / card.PLOT_FILE, f"{self.settings.run_name}: loss and mAP per epoch")
        except Exception as error:  # a broken plot must not cost the card or the upload
            logger.warning("plot: not drawn: %s", error)
        self._plot_seconds = time.monotonic() - started
        self._plotted_epoch = rows[-1]["epoch"]  # drawn, or tried: the next epoch tries again

    def load_base(self, hub: Hub | None, repo_id: str | None) -> bool:
        """The card to build on, once per attempt: the Hub's (the user may have edited it), else the local one."""
        if self._card_base_known:
            return True
        local = self.run_dir / CARD_FILE
        if hub is not None and repo_id is not None:
            from huggingface_hub.errors import EntryNotFoundError, RepositoryNotFoundError, RevisionNotFoundError

            scratch = self.settings.agent_dir / "card"
            try:
                self._card_base = hub.download(repo_id, CARD_FILE, scratch).read_text(encoding="utf-8")
            except (EntryNotFoundError, RepositoryNotFoundError, RevisionNotFoundError):
                self._card_base = None
            except Exception as error:
                logger.warning(
                    "card: cannot read %s's README.md yet (%s); trying again at the next upload", repo_id, error
                )
                return False
        if self._card_base is None and local.is_file():
            self._card_base = local.read_text(encoding="utf-8")
        self._card_base_known = True
        self._find_license(hub)
        return True

    def _find_license(self, hub: Hub | None) -> None:
        """LICENSE, else the base model's own; without either the card has none, and says so once."""
        if self._license is None and hub is not None and self._base_model is not None:
            scratch = self.settings.agent_dir / "base-card"
            self._license = provenance.base_license(hub, self._base_model, scratch)
            if self._license is not None:
                logger.info("card: license %s, from %s's card (LICENSE overrides it)", self._license, self._base_model)
        if self._license is None:
            logger.info("card: no license in the model card; set LICENSE to a Hub license id, e.g. LICENSE=apache-2.0")

    def write(
        self,
        snapshot: dict[str, Any],
        rows: list[dict[str, Any]],
        *,
        previous: dict[str, Any] | None,
        as_of: float,
        total: int | None,
    ) -> None:
        """README.md from ``snapshot``, and what ``previous`` (the last attempt's file) knew until this one knows it."""
        previous = previous or {}
        for key in ("training", "dataset"):  # until this attempt gets there (or never: already complete)
            if not snapshot.get(key) and previous.get(key):
                snapshot[key] = previous[key]
        info = card_info(
            snapshot,
            rows,
            repo_id=self.settings.output_repo,
            receipt=receipt.compute(snapshot, as_of),
            plot=(self.run_dir / card.PLOT_FILE).is_file(),
            total=total,
            license=self._license,
            base_model=self._base_model,
            evaluation=card_eval.gather(self.run_dir),
        )
        text = card.render(info, self._card_base)
        self._card_base = text
        path = self.run_dir / CARD_FILE
        with contextlib.suppress(OSError):
            if path.read_text(encoding="utf-8") == text:
                return
        tmp = path.with_name(f".{CARD_FILE}.tmp")
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, path)
