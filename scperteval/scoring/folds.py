"""Pooled folds: each perturbation's fold, each fold's headline, and their spread.

A run under a split scores every held-out perturbation once, against the sources of
its own fold; the leaderboard pools every fold's test perturbations (Miller et al.
2025's convention). Each fold's headline is the same derivation on that fold's
perturbations alone, on the protocols the pooled run trusts (a fold is often too
small for the trust rule on its own, and the folds stay comparable).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pandas as pd

from scperteval.splits.split import Split

__all__ = [
    "CRITERION_PROTOCOL",
    "FOLD_COLUMN",
    "fold_column",
    "fold_scores",
    "fold_summary",
]

FOLD_COLUMN = "fold"
#: The protocol of Ahlmann-Eltze et al.'s criterion shown in the fold summary: L2
#: distance on the 1,000 genes most expressed in controls.
CRITERION_PROTOCOL = "l2_heg1000"


def fold_column(results: pd.DataFrame, split: Split) -> pd.Series:
    """The fold that holds each row's perturbation out (``None`` where none does)."""
    folds = [
        split.fold_of((str(covariate), str(perturbation)))
        for covariate, perturbation in zip(
            results["covariate"], results["perturbation"], strict=True
        )
    ]
    return pd.Series(folds, index=results.index, name=FOLD_COLUMN, dtype=object)


def fold_scores(
    results: pd.DataFrame,
    folds: tuple[str, ...],
    headline_of: Callable[[pd.DataFrame], pd.DataFrame],
) -> pd.DataFrame:
    """Every entry's headline score on each fold's perturbations alone.

    Parameters
    ----------
    results
        Tidy results with a :data:`FOLD_COLUMN` column.
    folds
        The split's folds, in order.
    headline_of
        Derives the headline table (``model, kind, score, perturbations``) of a
        results table, as the pooled run does.

    Returns
    -------
    pandas.DataFrame
        ``fold, model, kind, score, perturbations``, one row per fold and entry.

    """
    frames = []
    for fold in folds:
        own = results[results[FOLD_COLUMN] == fold]
        if own.empty:
            continue
        headline = headline_of(own.drop(columns=[FOLD_COLUMN]))
        columns = [c for c in ("model", "kind", "score", "perturbations") if c in headline]
        frames.append(headline[columns].assign(fold=fold))
    if not frames:
        return pd.DataFrame(columns=["fold", "model", "kind", "score", "perturbations"])
    table = pd.concat(frames, ignore_index=True)
    return table[["fold", *[c for c in table.columns if c != "fold"]]]


def fold_summary(
    pooled: pd.DataFrame, per_fold: pd.DataFrame, criterion: pd.DataFrame
) -> pd.DataFrame:
    """The pooled leaderboard's entries with their folds' spread and the criterion.

    Parameters
    ----------
    pooled
        The pooled headline table (``model, kind, score``).
    per_fold
        :func:`fold_scores`.
    criterion
        :func:`~scperteval.scoring.mean_ratio.mean_ratio_table`.

    Returns
    -------
    pandas.DataFrame
        ``model, kind, score`` (pooled), ``fold_mean, fold_sd, fold_min, fold_max``
        of the folds' finite headline scores (``fold_sd`` with ``ddof=1``, NaN for
        one fold), ``folds_scored``, and, when the criterion's L2 protocol was run,
        its ``mean_ratio_high`` and ``outperforms_mean`` columns.

    """
    rows = []
    for entry in pooled.itertuples(index=False):
        own = per_fold[(per_fold["model"] == entry.model) & (per_fold["kind"] == entry.kind)]
        scores = own["score"].to_numpy(dtype=np.float64)
        scores = scores[np.isfinite(scores)]
        rows.append(
            {
                "model": entry.model,
                "kind": entry.kind,
                "score": entry.score,
                "fold_mean": float(scores.mean()) if scores.size else np.nan,
                "fold_sd": float(scores.std(ddof=1)) if scores.size > 1 else np.nan,
                "fold_min": float(scores.min()) if scores.size else np.nan,
                "fold_max": float(scores.max()) if scores.size else np.nan,
                "folds_scored": int(scores.size),
            }
        )
    summary = pd.DataFrame(rows)
    judged = criterion[criterion["protocol"] == CRITERION_PROTOCOL] if len(criterion) else None
    if judged is not None and not judged.empty and not summary.empty:
        columns = {"ci_high": "mean_ratio_high", "outperforms": "outperforms_mean"}
        kept = judged[["model", "kind", *columns]].rename(columns=columns)
        summary = summary.merge(kept, on=["model", "kind"], how="left")
    return summary
