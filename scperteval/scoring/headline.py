"""The headline score of a leaderboard entry and its bootstrap confidence interval.

The headline score is the **median over trusted protocols** of each protocol's
aggregate (median, or mean, over perturbations) calibrated score. A median over
protocols moves by at most one rank position among the protocol columns when a
single column is corrupted, whatever the corrupted value: one outlier column
(an unbounded calibrated score, a metric that breaks on one model) cannot carry
an entry past another unless the two were already within one column's order
statistic of each other. A mean over protocols has no such bound: one column at
-50 moves it by ``50 / K``.

The 95% confidence interval resamples perturbations (the rows of the
entry's perturbations x trusted protocols matrix, all protocols together, so the
dependence between protocols scored on the same perturbation is kept), recomputes
each protocol's aggregate and their median, and reports the percentile interval.
The resampling is seeded and the same resampled perturbations are used for
every entry, so intervals of entries are comparable and reproducible.
"""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np
import pandas as pd

__all__ = [
    "HEADLINE_RULE",
    "score_definition",
    "headline_matrix",
    "headline_score",
    "headline_ci",
    "finite_aggregate",
]

HEADLINE_RULE = "median"
N_RESAMPLES = 1000
LEVEL = 0.95


def score_definition(aggregate: str, n_trusted: int | str, calibrated: bool = True) -> str:
    """The one sentence defining the headline ``score``, used by every output.

    Parameters
    ----------
    aggregate
        ``median`` or ``mean``: the per-protocol aggregate over perturbations.
    n_trusted
        Number of protocols the score uses (``"N"`` for the documentation's
        general form).
    calibrated
        Calibrated scores (truth half) or plain scores.

    Returns
    -------
    str
        The definition, identical in the terminal, Markdown, LaTeX, HTML and
        notebook outputs.

    Examples
    --------
    >>> score_definition("median", 3)[:60]
    'score = median over the 3 trusted protocols of each protocol'

    """
    if not calibrated:
        return (
            f"score = mean over the {n_trusted} protocols of the share of the other ranked "
            f"entries whose {aggregate} raw value over perturbations the entry beats (ties "
            "count one half; plain scores on all truth cells, no calibration; 1 = best on "
            "every protocol; higher is better)"
        )
    return (
        f"score = median over the {n_trusted} trusted protocols of each protocol's "
        f"{aggregate} calibrated score over perturbations (0 = negative control, "
        "1 = positive control; higher is better); 95% CI: percentile bootstrap "
        f"over perturbations ({N_RESAMPLES} resamples, all protocols resampled together)"
    )


def headline_matrix(
    results: pd.DataFrame, entry: str, protocols: list[str], column: str = "calibrated"
) -> pd.DataFrame:
    """An entry's (covariate, perturbation) x protocol matrix of per-perturbation scores.

    Parameters
    ----------
    results
        Tidy results with ``source_name``, ``protocol``, ``covariate``,
        ``perturbation`` and ``column``.
    entry
        The model or baseline.
    protocols
        Columns, in order (absent ones are all NaN).
    column
        The value column.

    Returns
    -------
    pandas.DataFrame
        Rows indexed by ``(covariate, perturbation)``.

    """
    part = results[(results["source_name"] == entry) & results["protocol"].isin(protocols)]
    wide = part.pivot_table(
        index=["covariate", "perturbation"],
        columns="protocol",
        values=column,
        aggfunc="first",
        dropna=False,
        observed=True,
    )
    return wide.reindex(columns=protocols)


def finite_aggregate(values: Any, how: str = "median") -> float:
    """The median or the mean of the finite values.

    Parameters
    ----------
    values
        Numbers, NaN and infinite ones among them.
    how
        ``median`` or ``mean``.

    Returns
    -------
    float
        NaN when no value is finite.

    """
    finite = np.asarray(values, dtype=np.float64)
    finite = finite[np.isfinite(finite)]
    if finite.size == 0:
        return float("nan")
    return float(np.median(finite) if how == "median" else finite.mean())


def headline_score(columns: np.ndarray) -> float:
    """Median of the finite protocol aggregates (NaN when there is none)."""
    return finite_aggregate(columns, "median")


def headline_ci(
    matrix: np.ndarray,
    aggregate: str = "median",
    seed: int = 0,
    n_resamples: int = N_RESAMPLES,
    level: float = LEVEL,
) -> tuple[float, float]:
    """Percentile bootstrap interval of the headline score over perturbations.

    Parameters
    ----------
    matrix
        Perturbations x trusted protocols of per-perturbation calibrated scores
        (NaN where undefined).
    aggregate
        Per-protocol aggregate over perturbations (``median`` or ``mean``).
    seed
        Seed of the resampling; the resampled row numbers depend only on the
        seed and the number of rows.
    n_resamples, level
        Resamples and confidence level.

    Returns
    -------
    tuple of float
        Lower and upper bounds; NaN with fewer than 2 perturbations or no value.

    """
    matrix = np.asarray(matrix, dtype=np.float64)
    if matrix.ndim != 2 or matrix.shape[0] < 2 or not np.isfinite(matrix).any():
        return float("nan"), float("nan")
    rng = np.random.default_rng(seed)
    rows = rng.integers(0, matrix.shape[0], size=(n_resamples, matrix.shape[0]))
    with warnings.catch_warnings():
        # An all-NaN protocol column has no aggregate; it is NaN and skipped.
        warnings.simplefilter("ignore", RuntimeWarning)
        per_protocol = (np.nanmedian if aggregate == "median" else np.nanmean)(matrix[rows], axis=1)
        stats = np.nanmedian(per_protocol, axis=1)
    stats = stats[np.isfinite(stats)]
    if not stats.size:
        return float("nan"), float("nan")
    alpha = (1.0 - level) / 2.0
    low, high = np.quantile(stats, [alpha, 1.0 - alpha])
    return float(low), float(high)
