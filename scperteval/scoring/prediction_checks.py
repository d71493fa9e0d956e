"""Checks that a prediction is on the truth's scale: value ranges and total expression.

Values must be log-normalised expression (or, for a model declared to predict
changes from the control, changes of it): non-finite values and count or
``expm1`` scales are refused, and each row's total expression is compared with
the control cells' total of its covariate group.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import scipy.sparse as sp

from scperteval.data.dataset import RAW_COUNT_MAX, Dataset
from scperteval.errors import DatasetError
from scperteval.reporting.formatting import percent

__all__ = [
    "TOTAL_RATIO_WARNING",
    "check_scale",
    "check_totals",
    "control_totals",
]

#: A prediction whose mean total expression per row is this many times the control
#: cells' (or less than its inverse) is probably on another scale: it is scored with a
#: warning, or refused as undeclared changes from the control when it has negative values.
TOTAL_RATIO_WARNING = 3.0


def check_scale(where: str, matrix: Any) -> None:
    """Refuse values that cannot be log-normalised expression or changes of it.

    Parameters
    ----------
    where
        The prediction, for messages (``prediction 'name'``).
    matrix
        Its rows x the truth's genes (dense or sparse).

    Raises
    ------
    DatasetError
        For a non-finite value, or values beyond any log-normalised scale (raw
        counts, an ``expm1`` or count scale).

    """
    values = np.asarray(matrix.data if sp.issparse(matrix) else matrix)
    if values.size == 0:
        return
    finite = np.isfinite(values)
    if not finite.all():
        raise DatasetError(
            f"{where}: {int((~finite).sum())} non-finite predicted value(s); "
            "predict a number for every gene"
        )
    low, high = float(values.min()), float(values.max())
    largest = max(abs(low), abs(high))
    if largest > RAW_COUNT_MAX:
        integral = bool(np.all(values == np.round(values)))
        scale = "raw counts" if integral else "an expm1 or count scale"
        raise DatasetError(
            f"{where}: values up to {largest:g} look like {scale}; predictions must be on "
            "the truth's scale (normalize_total to 1e4, then log1p)"
        )


def control_totals(dataset: Dataset, layout: Any) -> dict[str, tuple[np.ndarray, float]]:
    """Per covariate group: the control cells' mean expression and its total over genes.

    Parameters
    ----------
    dataset
        The truth.
    layout
        Its group layout (the control cells of each covariate group).

    Returns
    -------
    dict
        Covariate name to ``(mean over the control cells, its sum over genes)``.

    """
    totals = {}
    for index, covariate in enumerate(layout.covariates):
        rows = dataset.rows(layout.control_positions(index))
        mean = np.asarray(rows.mean(axis=0, dtype=np.float64)).ravel()
        totals[covariate] = (mean, float(mean.sum()))
    return totals


def check_totals(
    model: Any,
    covariates: np.ndarray,
    controls: dict[str, tuple[np.ndarray, float]],
    notes: list[str],
) -> None:
    """Compare the prediction's total expression per row with the control cells' total.

    An undeclared delta (negative values with a total far below the controls', or
    a profile per perturbation whose values sum to less than 0) is refused;
    negative values otherwise, and totals far from the controls', are scored with
    a note.

    Parameters
    ----------
    model
        The aligned :class:`~scperteval.scoring.predictions.Prediction`.
    covariates
        The covariate of each of its rows.
    controls
        :func:`control_totals` of the truth.
    notes
        Where the notes are appended.

    Raises
    ------
    DatasetError
        For negative values with a total expression far below the controls', or a
        profile per perturbation summing to less than 0, in a model not declared to
        predict changes.

    """
    where = f"prediction {model.name!r}"
    used = np.concatenate(list(model.rows.values())) if model.rows else np.zeros(0, np.int64)
    if used.size == 0:
        return
    row_totals, n_negative, low = _scan_rows(model.matrix, used)
    n_values = used.size * model.matrix.shape[1]
    expected = np.array([controls[c][1] for c in covariates[used]])
    given_ratio = float(row_totals.mean() / expected.mean()) if expected.mean() > 0 else 1.0
    if model.delta:
        row_totals = row_totals + expected
    ratio = float(row_totals.mean() / expected.mean()) if expected.mean() > 0 else 1.0
    declare = f"(CLI: --delta {model.name}; Python: deltas=[{model.name!r}])"
    if n_negative and not model.delta:
        # A profile of expression (one per perturbation) sums to a positive total,
        # whatever a regression model's small undershoots; changes from the control
        # sum to about 0. Single predicted cells with noise added may sum below 0.
        below_zero = int((row_totals < 0).sum()) if model.pseudobulk else 0
        if ratio < 1 / TOTAL_RATIO_WARNING or below_zero:
            rows = f", {below_zero} row(s) summing to less than 0," if below_zero else ""
            raise DatasetError(
                f"{where}: {n_negative} negative value(s) (minimum {low:g}, "
                f"{percent(n_negative / n_values if n_values else 0.0)} of the values){rows} and a "
                f"total expression {ratio:.3g} times the control cells' look like changes from the "
                f"control; if the model predicts changes, declare it {declare}"
            )
        notes.append(
            f"{where}: {n_negative} negative value(s) (minimum {low:g}), impossible for "
            f"log-normalised expression, are scored as given; a model predicting changes "
            f"from the control is declared {declare}"
        )
    if model.delta and not n_negative and 1 / TOTAL_RATIO_WARNING <= given_ratio:
        notes.append(
            f"{where} is declared as changes from the control but has no negative value "
            f"and a total {given_ratio:.3g} times the control cells': it looks like "
            f"expression; if it is, leave out --delta {model.name} (Python: deltas)"
        )
        return
    if ratio > TOTAL_RATIO_WARNING or ratio < 1 / TOTAL_RATIO_WARNING:
        notes.append(
            f"{where}: mean total expression {row_totals.mean():.4g} is {ratio:.3g} times "
            f"the control cells' {expected.mean():.4g}; check that it is on the truth's "
            "scale (and its genes are the truth's)"
        )


#: Rows of a prediction read at a time by :func:`check_totals`.
CHECK_ROWS = 4096


def _scan_rows(matrix: Any, used: np.ndarray) -> tuple[np.ndarray, int, float]:
    """Totals of the rows ``used``, and the count and minimum of their negative values.

    A block of rows at a time rather than a copy of all of them (as large as the
    prediction itself). Each row's total is summed within its row as from the
    whole copy, so the totals are the same.
    """
    totals = []
    n_negative = 0
    low = math.inf
    for start in range(0, used.size, CHECK_ROWS):
        block = matrix[used[start : start + CHECK_ROWS]]
        totals.append(np.asarray(block.sum(axis=1)).ravel())
        values = block.data if sp.issparse(block) else np.asarray(block)
        n_negative += int((values < 0).sum())
        if values.size:
            low = min(low, float(values.min()))
    return np.concatenate(totals), n_negative, low
