"""Evaluation: every shipped file (``best.pt`` and each export) scored on the dataset's held-out split (test, else
validation), per class, with a confusion matrix and its speed; ``eval.json`` and the judgement of an export
against the ``.pt`` (docs/evaluation.md)."""
