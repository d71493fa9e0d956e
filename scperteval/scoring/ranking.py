"""What a leaderboard ranks on, and the scores and ranks on a given coverage.

The **ranking coverage** is the set of protocols and perturbations the ranked
entries are compared on. With at least one user model it is the trusted
protocols that every user model covers, over the perturbations every user model
covers there: a model predicting one profile per perturbation has no population
protocol (those need cells), and ranking it on the protocols it has keeps it,
and every baseline that covers the same, in the ranking. Without a user model it
is every trusted protocol. When the user models share no protocol (or no
perturbation), the coverage of the model that covers the most is used, so a
leaderboard with a user model always ranks at least one of them.

Cell-level models (user models with values on a population protocol) get a
second ranking on the trusted population protocols they all cover, when the
first ranking leaves those out.

Ranks are competition ranks (``scipy.stats.rankdata(-score, method="min")``):
tied entries share the best rank of their group and the next rank skips
(1, 1, 3).

In calibrated mode an entry's score on a coverage is the median over its
protocols of each protocol's aggregate over its perturbations. In plain mode
(truth = all cells, no controls) it is the mean over the protocols of the share
of the other compared entries that the entry beats on that protocol's
aggregate raw value (ties count one half): 1 beats every other entry
everywhere, 0 loses everywhere, higher is better in both modes.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

from scperteval.scoring.headline import finite_aggregate

__all__ = [
    "Coverage",
    "TIE_RULE",
    "competition_ranks",
    "entry_coverage",
    "ranking_coverage",
    "restricted",
    "covers",
    "scores_on",
]

TIE_RULE = "ties share the best rank of their group (competition ranking: 1, 1, 3)"


@dataclass(frozen=True)
class Coverage:
    """Protocols and perturbation rows an entry, or a ranking, is scored on."""

    protocols: list[str]
    rows: pd.Index
    #: False when the user models share no protocol or perturbation and the
    #: coverage is the best-covering model's own.
    shared: bool = True


def entry_coverage(matrix: pd.DataFrame, protocols: Sequence[str]) -> Coverage:
    """The protocols (among ``protocols``) and rows where an entry has a finite value.

    Parameters
    ----------
    matrix
        The entry's perturbations x protocols matrix.
    protocols
        The protocols considered, in order.

    Returns
    -------
    Coverage
        Protocols with a finite value somewhere, rows with a finite value on one of them.

    """
    part = matrix.reindex(columns=list(protocols))
    finite = np.isfinite(part.to_numpy(dtype=np.float64))
    columns = [
        p for p, any_finite in zip(part.columns, finite.any(axis=0), strict=True) if any_finite
    ]
    rows = part.index[finite.any(axis=1)] if finite.size else part.index[:0]
    return Coverage([str(c) for c in columns], rows)


def restricted(matrix: pd.DataFrame, coverage: Coverage) -> np.ndarray:
    """An entry's values on a coverage (NaN where it has none)."""
    return matrix.reindex(index=coverage.rows, columns=coverage.protocols).to_numpy(
        dtype=np.float64
    )


def covers(matrix: pd.DataFrame, coverage: Coverage) -> bool:
    """Whether an entry has a value on every protocol and every perturbation of a coverage."""
    if not coverage.protocols or len(coverage.rows) == 0:
        return False
    finite = np.isfinite(restricted(matrix, coverage))
    return bool(finite.any(axis=0).all() and finite.any(axis=1).all())


def ranking_coverage(
    matrices: Mapping[str, pd.DataFrame],
    models: Sequence[str],
    protocols: Sequence[str],
) -> Coverage:
    """The protocols and perturbations the ranked entries are compared on.

    Parameters
    ----------
    matrices
        Per entry (models and baselines), its perturbations x protocols matrix.
    models
        The user models among the entries (may be empty).
    protocols
        The protocols that may be used (the trusted ones), in order.

    Returns
    -------
    Coverage
        With user models: the protocols every one covers and the rows every one
        covers on them (or, when they share none, the coverage of the model that
        covers the most). Without: every protocol and every row any entry covers.

    """
    own = {name: entry_coverage(matrices[name], protocols) for name in matrices}
    if not models:
        indexes = [own[n].rows for n in own] or [pd.Index([])]
        rows = functools.reduce(lambda a, b: a.union(b, sort=False), indexes)
        return Coverage(list(protocols), rows)
    shared = [p for p in protocols if all(p in own[m].protocols for m in models)]
    if shared:
        rows = entry_coverage(matrices[models[0]], shared).rows
        for m in models[1:]:
            rows = rows.intersection(entry_coverage(matrices[m], shared).rows, sort=False)
        common = Coverage(shared, rows)
        if any(covers(matrices[m], common) for m in models):
            return common
    best = max(models, key=lambda m: (len(own[m].protocols), len(own[m].rows), m))
    return Coverage(own[best].protocols, own[best].rows, shared=False)


def scores_on(
    values: Mapping[str, np.ndarray],
    directions: Sequence[str],
    aggregate: str,
    calibrated: bool,
) -> dict[str, float]:
    """Each entry's score on one coverage.

    Parameters
    ----------
    values
        Per entry, its perturbations x protocols values on the coverage.
    directions
        Per protocol, ``higher`` or ``lower`` (used in plain mode).
    aggregate
        ``median`` or ``mean`` over perturbations.
    calibrated
        Calibrated scores (median over protocols of the aggregates) or plain
        (mean share of the other entries beaten, see the module docstring).

    Returns
    -------
    dict
        Entry to score (NaN without a finite aggregate).

    """
    names = list(values)
    columns = {
        n: np.array(
            [finite_aggregate(values[n][:, j], aggregate) for j in range(values[n].shape[1])]
        )
        if values[n].ndim == 2
        else np.asarray(values[n], dtype=np.float64)
        for n in names
    }
    if calibrated:
        return {n: finite_aggregate(columns[n], "median") for n in names}
    beaten: dict[str, list[float]] = {n: [] for n in names}
    for j, direction in enumerate(directions):
        column = {n: float(columns[n][j]) for n in names if np.isfinite(columns[n][j])}
        others = len(column) - 1
        if others < 1:
            continue
        sign = 1.0 if direction == "higher" else -1.0
        for n, mine in column.items():
            wins = sum(
                1.0 if sign * (mine - theirs) > 0 else 0.5 if mine == theirs else 0.0
                for other, theirs in column.items()
                if other != n
            )
            beaten[n].append(wins / others)
    return {n: float(np.mean(beaten[n])) if beaten[n] else float("nan") for n in names}


def competition_ranks(scores: Sequence[float]) -> np.ndarray:
    """Ranks of the finite scores, best (highest) first; ties share the best rank.

    Parameters
    ----------
    scores
        Scores, NaN for an entry without one.

    Returns
    -------
    numpy.ndarray
        Float ranks (1, 1, 3 for two tied leaders), NaN where the score is NaN.

    """
    values = np.asarray(scores, dtype=np.float64)
    ranks = np.full(values.shape, np.nan)
    finite = np.isfinite(values)
    chosen = values[finite]
    ranks[finite] = [1 + int(np.sum(chosen > v)) for v in chosen]
    return ranks
