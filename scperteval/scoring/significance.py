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

from collections.abc import Mapping, Sequence

import numpy as np
import pandas as pd

from scperteval.scoring.pairwise import (
    TEST_COLUMNS,
    adjust_per_protocol,
    paired_test,
    values_by_source,
)

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
    wide = values_by_source(results, correction)
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
                a = pair[model].to_numpy(dtype=np.float64)
                b = pair[baseline].to_numpy(dtype=np.float64)
                names = {"protocol": str(protocol), "model": model, "baseline": baseline}
                rows.append({**names, **paired_test(a, b, alternative)})
    table = pd.DataFrame(rows)
    if table.empty:
        return table
    adjust_per_protocol(table, correction)
    return table[["protocol", "model", "baseline", *TEST_COLUMNS]]
