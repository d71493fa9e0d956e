"""The Virtual Cell Challenge's baseline-scaled score, from a tidy results table.

``cell-eval score`` compares a model's mean metric values with those of a baseline
model scored on the same data (cell-eval's baseline predicts, for every perturbed
cell, the mean of the perturbation centroids). Per metric, with ``u`` the model's and
``b`` the baseline's mean over perturbations:

- metrics whose best value is 0 (``mae``, ``mse``, ``mae_delta``, ``mse_delta``):
  ``1 - u / b``;
- metrics whose best value is 1 (every other scored cell-eval metric):
  ``(u - b) / (1 - b)``;

a NaN becomes 0, values below 0 are raised to 0 (there is no upper clip), and the
score is the mean over the metrics present. ``de_nsig_counts`` has no best value and
is not scored, nor is a protocol whose name is not a cell-eval metric.

The means follow cell-eval's table: a NaN that a metric returned (an AUC with one
class of genes, a correlation of a constant) makes its mean NaN, while a perturbation
that cell-eval leaves out of a metric (no truth DEG for the direction, Spearman and
recall metrics; recorded here as NaN with the failure's reason) is skipped.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np
import pandas as pd

from scperteval.engine.dispatch import UNDEFINED_REASON
from scperteval.errors import SpecError

__all__ = ["BEST_ZERO", "BEST_ONE", "metric_means", "vcc_scores"]

#: cell-eval metrics whose best value is 0.
BEST_ZERO = frozenset({"mae", "mse", "mae_delta", "mse_delta"})
#: cell-eval metrics whose best value is 1.
BEST_ONE = frozenset(
    {f"{m}_at_{n}" for m in ("overlap", "precision") for n in ("N", 50, 100, 200, 500)}
    | {
        "de_spearman_sig",
        "de_direction_match",
        "de_spearman_lfc_sig",
        "de_sig_genes_recall",
        "pr_auc",
        "roc_auc",
        "pearson_delta",
        "discrimination_score_l1",
        "discrimination_score_l2",
        "discrimination_score_cosine",
        "pearson_edistance",
        "clustering_agreement",
    }
)
_REQUIRED = ("protocol", "source_name", "value", "reason")


def metric_means(results: pd.DataFrame) -> pd.DataFrame:
    """Mean value over perturbations per candidate and protocol, by cell-eval's NaN rules.

    Parameters
    ----------
    results
        Tidy results table (columns ``protocol``, ``source_name``, ``value``,
        ``reason``; the other columns are ignored).

    Returns
    -------
    pandas.DataFrame
        One row per ``source_name``, one column per protocol. A returned NaN
        (``reason`` :data:`~scperteval.engine.dispatch.UNDEFINED_REASON`) makes the
        mean NaN; a NaN recorded with another reason is left out.

    Raises
    ------
    SpecError
        If a required column is missing.

    """
    missing = [c for c in _REQUIRED if c not in results.columns]
    if missing:
        raise SpecError(f"results table lacks column(s) {', '.join(missing)}")
    values = results["value"].astype(np.float64)
    kept = results[values.notna() | (results["reason"] == UNDEFINED_REASON)]
    means = kept.groupby(["source_name", "protocol"], sort=True)["value"].agg(
        lambda column: float(np.mean(column.to_numpy(dtype=np.float64)))
    )
    return means.unstack("protocol")


def vcc_scores(
    results: pd.DataFrame, baseline: str, models: Iterable[str] | None = None
) -> pd.DataFrame:
    """Baseline-scaled score of each model, as ``cell-eval score`` computes it.

    Parameters
    ----------
    results
        Tidy results table of a score run with the ``cell_eval`` or ``vcc2025``
        suite (protocols named as cell-eval's metrics), holding the rows of the
        models and of the baseline, told apart by ``source_name``.
    baseline
        ``source_name`` of the baseline model (for the challenge: cell-eval's
        mean baseline, scored as a model).
    models
        Models to score; every ``source_name`` but the baseline when omitted.

    Returns
    -------
    pandas.DataFrame
        One row per model (index ``model``): one column per scored metric with its
        scaled value, then ``avg_score``, their mean. For the challenge's three
        metrics (``vcc2025``), ``avg_score`` is the challenge's score.

    Raises
    ------
    SpecError
        If the baseline or a model is not in the table, or no protocol is a scored
        cell-eval metric.

    """
    means = metric_means(results)
    if baseline not in means.index:
        raise SpecError(
            f"baseline {baseline!r} not in the results; candidates: {', '.join(means.index)}"
        )
    names = [m for m in means.index if m != baseline] if models is None else list(models)
    unknown = [m for m in names if m not in means.index]
    if unknown:
        raise SpecError(f"model(s) {', '.join(unknown)} not in the results")
    zero = [p for p in means.columns if p in BEST_ZERO]
    one = [p for p in means.columns if p in BEST_ONE]
    if not zero and not one:
        raise SpecError("no protocol of the results is a scored cell-eval metric")
    base = means.loc[baseline]
    rows = {}
    for name in names:
        user = means.loc[name]
        with np.errstate(divide="ignore", invalid="ignore"):
            scaled = np.concatenate(
                [
                    1.0 - user[zero].to_numpy(float) / base[zero].to_numpy(float),
                    (user[one].to_numpy(float) - base[one].to_numpy(float))
                    / (1.0 - base[one].to_numpy(float)),
                ]
            )
        scaled[np.isnan(scaled)] = 0.0
        scaled = np.clip(scaled, 0.0, None)
        rows[name] = [*scaled, float(scaled.mean())]
    table = pd.DataFrame.from_dict(rows, orient="index", columns=[*zero, *one, "avg_score"])
    table.index.name = "model"
    return table
