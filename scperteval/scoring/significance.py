"""Paired one-sided tests of each model against each negative baseline.

For one protocol, a model and a baseline are compared on the perturbations
where both have a value: a paired t-test and a Wilcoxon signed-rank test of
"the model is better" (greater values for higher-is-better metrics, smaller
otherwise). p-values are corrected for multiple testing within each protocol
and test (Bonferroni by default, as Miller et al. 2025; Benjamini-Hochberg
optional). A pair with no perturbation scored by both gets no row.
Every entry against every other, two-sided, is in :mod:`scperteval.scoring.pairwise`.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping, Sequence

import numpy as np
import pandas as pd
from scipy import stats

from scperteval.scoring.pairwise import wilcoxon_method
from scperteval.stats.multiple_testing import adjust

__all__ = ["paired_tests", "NEGATIVE_BASELINES"]

NEGATIVE_BASELINES = ("dataset_mean", "control_mean")


def paired_tests(
    results: pd.DataFrame,
    better: Mapping[str, str],
    models: Sequence[str],
    baselines: Sequence[str] = NEGATIVE_BASELINES,
    correction: str = "bonferroni",
) -> pd.DataFrame:
    """Paired tests of every model against every baseline, per protocol.

    Parameters
    ----------
    results
        Tidy results with ``source_name`` naming models and baselines.
    better
        Direction of each protocol.
    models
        Names of the models to test.
    baselines
        Names of the baselines to test against.
    correction
        ``bonferroni`` or ``bh`` (Benjamini-Hochberg), within protocol and test.

    Returns
    -------
    pandas.DataFrame
        ``protocol, model, baseline, n, mean_difference, t_statistic, t_pvalue,
        t_pvalue_adj, wilcoxon_statistic, wilcoxon_pvalue, wilcoxon_pvalue_adj``.

    """
    if correction not in ("bonferroni", "bh"):
        raise ValueError(f"correction must be 'bonferroni' or 'bh', got {correction!r}")
    wide = results.pivot_table(
        index=["protocol", "covariate", "perturbation"],
        columns="source_name",
        values="value",
        aggfunc="first",
        dropna=False,
        observed=True,
    )
    rows = []
    for protocol, frame in wide.groupby(level="protocol", sort=True, observed=True):
        alternative = "greater" if better.get(str(protocol), "higher") == "higher" else "less"
        for model in models:
            for baseline in baselines:
                if model not in frame or baseline not in frame or model == baseline:
                    continue
                pair = frame[[model, baseline]].dropna()
                if pair.empty:
                    # Nothing paired (a baseline undefined on this protocol): no row at all.
                    continue
                rows.append(_test(str(protocol), model, baseline, pair, alternative))
    table = pd.DataFrame(rows)
    if table.empty:
        return table
    for test in ("t", "wilcoxon"):
        table[f"{test}_pvalue_adj"] = np.nan
        for _, index in table.groupby("protocol").groups.items():
            pvalues = table.loc[index, f"{test}_pvalue"].to_numpy()
            table.loc[index, f"{test}_pvalue_adj"] = adjust(pvalues, correction)
    order = [
        "protocol",
        "model",
        "baseline",
        "n",
        "mean_difference",
        "t_statistic",
        "t_pvalue",
        "t_pvalue_adj",
        "wilcoxon_statistic",
        "wilcoxon_pvalue",
        "wilcoxon_pvalue_adj",
    ]
    return table[order]


def _test(protocol: str, model: str, baseline: str, pair: pd.DataFrame, alternative: str) -> dict:
    a = pair[model].to_numpy(dtype=np.float64)
    b = pair[baseline].to_numpy(dtype=np.float64)
    row = {
        "protocol": protocol,
        "model": model,
        "baseline": baseline,
        "n": int(a.size),
        "mean_difference": float(np.mean(a - b)) if a.size else np.nan,
        "t_statistic": np.nan,
        "t_pvalue": np.nan,
        "wilcoxon_statistic": np.nan,
        "wilcoxon_pvalue": np.nan,
    }
    if a.size >= 2 and np.any(a != b):
        with np.errstate(all="ignore"), warnings.catch_warnings():
            # Nearly identical pairs make scipy warn about precision; the p-values stand.
            warnings.simplefilter("ignore", RuntimeWarning)
            t = stats.ttest_rel(a, b, alternative=alternative)
            w = stats.wilcoxon(a, b, alternative=alternative, method=wilcoxon_method(a - b))
        row["t_statistic"], row["t_pvalue"] = float(t.statistic), float(t.pvalue)
        row["wilcoxon_statistic"], row["wilcoxon_pvalue"] = float(w.statistic), float(w.pvalue)
    return row
