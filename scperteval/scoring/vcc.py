"""The Virtual Cell Challenge's baseline-scaled score, from a tidy results table.

``cell-eval score`` compares a model's mean metric values with those of a baseline
model scored on the same data (cell-eval's baseline predicts, for every perturbed
cell, the unweighted mean of the centroids of every label of the truth file, the
control's included: :func:`~scperteval.scoring.baselines.cell_eval_mean_baseline`).
Per metric, with ``u`` the model's and ``b`` the baseline's mean over perturbations:

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

The leaderboard's ``vcc_score`` column (:func:`add_vcc_column`) is this score on the
challenge's three terms (:data:`CHALLENGE_TERMS`, the ``vcc2025`` suite) against
``cell_eval_mean``, for every entry of a plain run (``truth="all"``, as cell-eval
scores) holding the three terms as the challenge defines them.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

import numpy as np
import pandas as pd

from scperteval.engine.dispatch import UNDEFINED_REASON
from scperteval.errors import SpecError
from scperteval.scoring.baselines import CELL_EVAL_MEAN
from scperteval.scoring.leaderboard import Leaderboard

__all__ = [
    "BEST_ZERO",
    "BEST_ONE",
    "CHALLENGE_TERMS",
    "VCC_COLUMN",
    "add_vcc_column",
    "has_challenge_terms",
    "metric_means",
    "vcc_column",
    "vcc_scores",
]

#: The Virtual Cell Challenge's terms: PDS, MAE and DES, under cell-eval's names.
CHALLENGE_TERMS = ("discrimination_score_l1", "mae", "overlap_at_N")
#: The leaderboard column holding the challenge's score.
VCC_COLUMN = "vcc_score"
#: The terms an entry's ``vcc_score`` counts as 0 because it has no value for them.
VCC_UNSCORED_COLUMN = "vcc_terms_as_zero"
#: What defines a protocol's values (its name and controls aside).
_DEFINING = ("metric", "representation", "scope", "space", "centering")

#: cell-eval metrics whose best value is 0.
BEST_ZERO = frozenset({"mae", "mse", "mae_delta", "mse_delta"})
#: cell-eval metrics whose best value is 1.
BEST_ONE = frozenset(
    {f"{m}_at_{n}" for m in ("overlap", "precision") for n in ("N", 50, 100, 200, 500)}
    | {"de_spearman_sig", "de_direction_match", "de_spearman_lfc_sig", "de_sig_genes_recall"}
    | {"discrimination_score_l1", "discrimination_score_l2", "discrimination_score_cosine"}
    | {"pr_auc", "roc_auc", "pearson_delta", "pearson_edistance", "clustering_agreement"}
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
        (``reason`` :data:`~scperteval.engine.result_rows.UNDEFINED_REASON`) makes the
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
    names = list(dict.fromkeys(names))
    unknown = [m for m in names if m not in means.index]
    if unknown:
        raise SpecError(f"model(s) {', '.join(unknown)} not in the results")
    zero = [p for p in means.columns if p in BEST_ZERO]
    one = [p for p in means.columns if p in BEST_ONE]
    if not zero and not one:
        raise SpecError("no protocol of the results is a scored cell-eval metric")
    columns = [*zero, *one]
    user = means.loc[names, columns].to_numpy(float)
    base = means.loc[baseline, columns].to_numpy(float)
    with np.errstate(divide="ignore", invalid="ignore"):
        scaled = np.where(
            np.arange(len(columns)) < len(zero), 1.0 - user / base, (user - base) / (1.0 - base)
        )
    scaled = np.clip(np.where(np.isnan(scaled), 0.0, scaled), 0.0, None)
    table = pd.DataFrame(scaled, index=pd.Index(names, name="model"), columns=columns)
    table["avg_score"] = [float(row.mean()) for row in scaled]
    return table


def _differing(described: Iterable[dict[str, Any]]) -> list[str]:
    """Challenge terms among ``described`` that are defined otherwise than in ``vcc2025``."""
    from scperteval.engine.suites import resolve_protocols

    challenge = resolve_protocols("vcc2025")
    expected = {p.name: tuple(str(p.describe()[k]) for k in _DEFINING) for p in challenge}
    return sorted(
        str(row["protocol"])
        for row in described
        if row["protocol"] in expected
        and tuple(str(row.get(k)) for k in _DEFINING) != expected[str(row["protocol"])]
    )


def has_challenge_terms(protocols: Iterable[Any]) -> bool:
    """Whether the protocols hold the challenge's three terms, defined as the challenge does.

    Parameters
    ----------
    protocols
        :class:`~scperteval.engine.protocol.Protocol` objects.

    Returns
    -------
    bool
        ``True`` when every name of :data:`CHALLENGE_TERMS` is among them with the
        ``vcc2025`` suite's metric, representation, scope, space and centering.

    """
    described = [p.describe() for p in protocols]
    names = {row["protocol"] for row in described}
    return set(CHALLENGE_TERMS) <= names and not _differing(described)


def vcc_column(
    results: pd.DataFrame, protocols: pd.DataFrame, calibrated: bool
) -> tuple[dict[str, float], str] | None:
    """The challenge's score of every entry of a run, or why it has none.

    Parameters
    ----------
    results
        The run's tidy results table.
    protocols
        One row per protocol of the run (``protocol`` and the defining columns
        ``metric, representation, scope, space, centering``).
    calibrated
        Whether the run is calibrated (truth half).

    Returns
    -------
    tuple or None
        ``None`` when the run lacks one of :data:`CHALLENGE_TERMS` (no column).
        Else ``(scores, reason)``: per entry (``model`` and ``baseline`` rows), its
        :func:`vcc_scores` ``avg_score`` on the three terms against
        ``cell_eval_mean`` (none for an entry whose every value failed) and
        ``reason`` empty; or no scores and the reason.

    """
    names = {str(p) for p in protocols["protocol"]}
    if not set(CHALLENGE_TERMS) <= names:
        return None
    differing = _differing(protocols.to_dict("records"))
    if differing:
        return {}, (
            f"protocol(s) {', '.join(differing)} are not defined as in the challenge "
            "(the vcc2025 suite)"
        )
    if calibrated:
        return {}, "the challenge's score is defined on plain runs (--truth all)"
    entries = _challenge_rows(results)
    if CELL_EVAL_MEAN not in set(entries["source_name"]):
        return {}, f"its baseline {CELL_EVAL_MEAN!r} was not scored (baselines turned off)"
    # An entry without a single value of the terms (every one failed) has no score.
    scored = sorted(metric_means(entries).index)
    if CELL_EVAL_MEAN not in scored:
        return {}, f"its baseline {CELL_EVAL_MEAN!r} has no value of the challenge's terms"
    scores = vcc_scores(entries, baseline=CELL_EVAL_MEAN, models=scored)
    return {str(name): float(value) for name, value in scores["avg_score"].items()}, ""


def _challenge_rows(results: pd.DataFrame) -> pd.DataFrame:
    """The rows of models and baselines on the challenge's terms."""
    entries = results["source"].isin(("model", "baseline"))
    return results[entries & results["protocol"].isin(CHALLENGE_TERMS)]


def unscored_terms(results: pd.DataFrame) -> dict[str, list[str]]:
    """Per entry, the challenge's terms on which it has no value (counted as 0).

    Parameters
    ----------
    results
        The run's tidy results table.

    Returns
    -------
    dict
        Entry (``model`` and ``baseline`` rows) to the terms of :data:`CHALLENGE_TERMS`
        whose mean over perturbations (by :func:`metric_means`) is NaN or absent.

    """
    means = metric_means(_challenge_rows(results)).reindex(columns=list(CHALLENGE_TERMS))
    return {
        str(name): [t for t in CHALLENGE_TERMS if not np.isfinite(float(row[t]))]
        for name, row in means.iterrows()
    }


def add_vcc_column(
    board: Leaderboard, results: pd.DataFrame, protocols: pd.DataFrame, calibrated: bool
) -> None:
    """Add the ``vcc_score`` column and its note to a leaderboard, in place.

    Parameters
    ----------
    board
        The run's leaderboard.
    results, protocols, calibrated
        As for :func:`vcc_column`. Without the three terms the board is left as it
        is; where the score cannot be computed the column holds NaN and the note
        says why.

    """
    column = vcc_column(results, protocols, calibrated)
    if column is None:
        return
    scores, reason = column
    board.table[VCC_COLUMN] = [scores.get(str(n), math.nan) for n in board.table["model"]]
    if reason:
        board.notes.append(f"{VCC_COLUMN}: none, {reason}.")
    else:
        board.notes.append(
            f"{VCC_COLUMN}: the Virtual Cell Challenge's score (cell-eval score): the mean over "
            f"{', '.join(CHALLENGE_TERMS)} of each term scaled against the baseline "
            f"{CELL_EVAL_MEAN} (1 - u/b for mae, (u - b)/(1 - b) for the others, NaN and "
            "negative values as 0)."
        )
        unscored = unscored_terms(results)
        board.table[VCC_UNSCORED_COLUMN] = [
            "; ".join(unscored.get(str(n), [])) or "none" if str(n) in scores else "-"
            for n in board.table["model"]
        ]
        named = {n: unscored[n] for n in map(str, board.table["model"]) if unscored.get(n)}
        if named:
            board.notes.append(
                f"{VCC_COLUMN} counts as 0 the terms an entry has no value for ("
                + "; ".join(f"{n}: {', '.join(terms)}" for n, terms in named.items())
                + f"; the reasons are in failures.csv): its {VCC_COLUMN} is not comparable "
                "with an entry scored on all three."
            )
