"""Every leaderboard entry against every other: paired two-sided tests and win/tie/loss.

For a pair of entries ``(a, b)`` and one trusted protocol, the two are compared
on the perturbations where both have a raw value: a paired t-test
(:func:`scipy.stats.ttest_rel`) and a Wilcoxon signed-rank test
(:func:`scipy.stats.wilcoxon`, see :func:`wilcoxon_method`), two-sided. On the
headline ``score`` row the paired values are each perturbation's median
calibrated score over the trusted protocols (the per-perturbation counterpart
of the headline score). p-values
are corrected for multiple testing over all pairs, within each protocol and
test (Bonferroni by default, Benjamini-Hochberg optional).

A pair's outcome on a protocol is a **win** for ``a`` when the corrected
Wilcoxon p-value is below 0.05 and ``a`` is better on the signed ranks (the sum
of the ranks of the perturbations where ``a`` is better exceeds the other sum),
a **loss** in the mirror case, and a **tie** otherwise. Pairs with no
perturbation scored by both get no row.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping, Sequence
from itertools import combinations
from typing import Any

import numpy as np
import pandas as pd
from scipy import stats

from scperteval.stats.multiple_testing import adjust

__all__ = [
    "HEADLINE_PROTOCOL",
    "WIN_LEVEL",
    "TEST_COLUMNS",
    "pairwise_tests",
    "win_tie_loss",
    "wilcoxon_method",
    "paired_test",
    "values_by_source",
    "adjust_per_protocol",
]

HEADLINE_PROTOCOL = "score"
WIN_LEVEL = 0.05
#: The test columns of :func:`pairwise_tests` and of
#: :func:`~scperteval.scoring.significance.paired_tests`, after the names of the pair.
TEST_COLUMNS = (
    "n",
    "mean_difference",
    "t_statistic",
    "t_pvalue",
    "t_pvalue_adj",
    "wilcoxon_statistic",
    "wilcoxon_pvalue",
    "wilcoxon_pvalue_adj",
)
COLUMNS = ("protocol", "entry", "other", *TEST_COLUMNS, "outcome")


def wilcoxon_method(differences: np.ndarray) -> str:
    """The Wilcoxon method: scipy's default, the normal approximation where it would permute.

    With zeros or ties among few differences scipy's ``method="auto"`` runs a
    permutation test (seconds per pair); over all pairs of a leaderboard that
    is minutes. There the normal approximation (with scipy's tie and zero
    corrections) is used; otherwise the test is scipy's default (exact for up
    to 50 pairs).
    """
    magnitudes = np.abs(differences)
    if np.any(magnitudes == 0) or np.unique(magnitudes).size < magnitudes.size:
        return "approx"
    return "auto"


def _signed_rank_balance(oriented: np.ndarray) -> float:
    """Sum of ranks where the first entry is better minus the sum where it is worse."""
    nonzero = oriented[oriented != 0]
    if not nonzero.size:
        return 0.0
    ranks = stats.rankdata(np.abs(nonzero))
    return float(ranks[nonzero > 0].sum() - ranks[nonzero < 0].sum())


def paired_test(x: np.ndarray, y: np.ndarray, alternative: str = "two-sided") -> dict[str, Any]:
    """Paired t-test and Wilcoxon signed-rank test of two aligned value vectors.

    Parameters
    ----------
    x, y
        Paired values, at least one pair.
    alternative
        ``"two-sided"``, ``"greater"`` (``x`` larger) or ``"less"``.

    Returns
    -------
    dict
        ``n``, ``mean_difference`` (``x - y``), ``t_statistic``, ``t_pvalue``,
        ``wilcoxon_statistic`` and ``wilcoxon_pvalue``; the tests are NaN for fewer
        than two pairs or when every pair is equal.

    """
    row: dict[str, Any] = {
        "n": int(x.size),
        "mean_difference": float(np.mean(x - y)),
        "t_statistic": np.nan,
        "t_pvalue": np.nan,
        "wilcoxon_statistic": np.nan,
        "wilcoxon_pvalue": np.nan,
    }
    if x.size >= 2 and np.any(x != y):
        with np.errstate(all="ignore"), warnings.catch_warnings():
            # Nearly identical pairs make scipy warn about precision; the p-values stand.
            warnings.simplefilter("ignore", RuntimeWarning)
            t = stats.ttest_rel(x, y, alternative=alternative)
            w = stats.wilcoxon(x, y, alternative=alternative, method=wilcoxon_method(x - y))
        row["t_statistic"], row["t_pvalue"] = float(t.statistic), float(t.pvalue)
        row["wilcoxon_statistic"], row["wilcoxon_pvalue"] = float(w.statistic), float(w.pvalue)
    return row


def values_by_source(results: pd.DataFrame, correction: str) -> pd.DataFrame:
    """Raw values with one column per source, for paired tests corrected by ``correction``.

    Parameters
    ----------
    results
        Tidy results (``protocol``, ``covariate``, ``perturbation``, ``source_name``,
        ``value``).
    correction
        The multiple-testing correction the tests will use, checked here.

    Returns
    -------
    pandas.DataFrame
        Indexed by ``(protocol, covariate, perturbation)``, a column per source.

    Raises
    ------
    ValueError
        If ``correction`` is neither ``bonferroni`` nor ``bh``.

    """
    if correction not in ("bonferroni", "bh"):
        raise ValueError(f"correction must be 'bonferroni' or 'bh', got {correction!r}")
    return results.pivot_table(
        index=["protocol", "covariate", "perturbation"],
        columns="source_name",
        values="value",
        aggfunc="first",
        dropna=False,
        observed=True,
    )


def adjust_per_protocol(table: pd.DataFrame, correction: str) -> None:
    """Add ``t_pvalue_adj`` and ``wilcoxon_pvalue_adj``, corrected within each protocol.

    Parameters
    ----------
    table
        Rows of :func:`paired_test` with a ``protocol`` column; changed in place.
    correction
        ``bonferroni`` or ``bh``.

    """
    for test in ("t", "wilcoxon"):
        table[f"{test}_pvalue_adj"] = np.nan
        for _, index in table.groupby("protocol", sort=False).groups.items():
            pvalues = table.loc[index, f"{test}_pvalue"].to_numpy()
            table.loc[index, f"{test}_pvalue_adj"] = adjust(pvalues, correction)


def _headline_values(results: pd.DataFrame, trusted: Sequence[str]) -> pd.DataFrame:
    """Per perturbation and entry: the median calibrated score over the trusted protocols."""
    part = results[results["protocol"].isin(list(trusted))]
    if part.empty:
        return pd.DataFrame()
    grouped = part.groupby(["covariate", "perturbation", "source_name"], observed=True)
    return grouped["calibrated"].median().unstack("source_name")


def pairwise_tests(
    results: pd.DataFrame,
    better: Mapping[str, str],
    entries: Sequence[str],
    protocols: Sequence[str],
    correction: str = "bonferroni",
    headline: bool = True,
) -> pd.DataFrame:
    """Two-sided paired tests of every pair of entries, per protocol and on the headline.

    Parameters
    ----------
    results
        Tidy results of models and baselines (``source_name``, ``protocol``,
        ``covariate``, ``perturbation``, ``value``, ``calibrated``).
    better
        Direction of each protocol's raw metric.
    entries
        Names compared, in order (each pair once: ``entry`` before ``other``).
    protocols
        Protocols compared (the trusted ones); the headline uses all of them.
    correction
        ``bonferroni`` or ``bh``, over the pairs within each protocol and test.
    headline
        Add the ``score`` rows (per-perturbation median calibrated score over
        ``protocols``).

    Returns
    -------
    pandas.DataFrame
        ``protocol, entry, other, n, mean_difference (entry - other),
        t_statistic, t_pvalue, t_pvalue_adj, wilcoxon_statistic,
        wilcoxon_pvalue, wilcoxon_pvalue_adj, outcome`` with ``outcome`` the
        entry's ``win``, ``tie`` or ``loss``; no row where ``n`` is 0.

    """
    chosen = results[results["protocol"].isin(list(protocols))]
    wide = values_by_source(chosen, correction)
    frames: list[tuple[str, pd.DataFrame, str]] = [
        (str(p), frame.droplevel("protocol"), better.get(str(p), "higher"))
        for p, frame in wide.groupby(level="protocol", sort=False, observed=True)
    ]
    frames.sort(key=lambda item: list(protocols).index(item[0]))
    if headline and protocols:
        values = _headline_values(chosen, protocols)
        if not values.empty:
            frames.insert(0, (HEADLINE_PROTOCOL, values, "higher"))
    rows = []
    for protocol, frame, sense in frames:
        present = [e for e in entries if e in frame.columns]
        matrix = frame[present].to_numpy(dtype=np.float64)
        finite = np.isfinite(matrix)
        column = {name: j for j, name in enumerate(present)}
        for a, b in combinations(present, 2):
            both = finite[:, column[a]] & finite[:, column[b]]
            if not both.any():
                continue
            x, y = matrix[both, column[a]], matrix[both, column[b]]
            balance = _signed_rank_balance((x - y) if sense == "higher" else (y - x))
            pair = {"protocol": protocol, "entry": a, "other": b, "balance": balance}
            rows.append({**pair, **paired_test(x, y)})
    if not rows:
        return pd.DataFrame(columns=list(COLUMNS))
    table = pd.DataFrame(rows)
    adjust_per_protocol(table, correction)
    significant = table["wilcoxon_pvalue_adj"].to_numpy() < WIN_LEVEL
    balance = table["balance"].to_numpy()
    table["outcome"] = np.where(
        significant & (balance > 0), "win", np.where(significant & (balance < 0), "loss", "tie")
    )
    return table[list(COLUMNS)].reset_index(drop=True)


def win_tie_loss(pairs: pd.DataFrame, entries: Sequence[str]) -> pd.DataFrame:
    """Per ordered pair of entries: wins, ties and losses over the trusted protocols.

    Parameters
    ----------
    pairs
        Output of :func:`pairwise_tests`.
    entries
        Row and column order.

    Returns
    -------
    pandas.DataFrame
        ``entry, other, wins, ties, losses, n_protocols, score_outcome``: the
        entry's record against the other on the protocols (the headline
        ``score`` row is reported apart in ``score_outcome``). Pairs never
        compared are left out.

    """
    mirror = {"win": "loss", "loss": "win", "tie": "tie"}
    rows = []
    per_protocol = pairs[pairs["protocol"] != HEADLINE_PROTOCOL]
    headline = pairs[pairs["protocol"] == HEADLINE_PROTOCOL]
    for a in entries:
        for b in entries:
            if a == b:
                continue
            forward = per_protocol[(per_protocol["entry"] == a) & (per_protocol["other"] == b)]
            backward = per_protocol[(per_protocol["entry"] == b) & (per_protocol["other"] == a)]
            outcomes = list(forward["outcome"]) + [mirror[o] for o in backward["outcome"]]
            score_rows = headline[
                ((headline["entry"] == a) & (headline["other"] == b))
                | ((headline["entry"] == b) & (headline["other"] == a))
            ]
            if not outcomes and score_rows.empty:
                continue
            score_outcome = ""
            if len(score_rows):
                first = score_rows.iloc[0]
                score_outcome = (
                    str(first["outcome"]) if first["entry"] == a else mirror[str(first["outcome"])]
                )
            counts = [outcomes.count(outcome) for outcome in ("win", "tie", "loss")]
            rows.append((a, b, *counts, len(outcomes), score_outcome))
    columns = ["entry", "other", "wins", "ties", "losses", "n_protocols", "score_outcome"]
    return pd.DataFrame(rows, columns=columns)
