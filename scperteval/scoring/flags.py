"""Sanity flags on a model's predictions, raised before anyone reads its score.

- **mode collapse**: the prediction is (nearly) the same profile for every
  perturbation. Within each covariate group, the spread of the predicted
  centroids across perturbations (the sum over genes of their variance) is
  compared with the spread of the truth's centroids (all cells); the flag is
  raised when the ratio, pooled over groups, is below
  ``COLLAPSE_RATIO`` (0.02: the predicted profiles differ from one another by
  less than about 14% of the truth's standard deviation). Metrics on deltas
  against the perturbed mean, DE ranks and some rank metrics can reward such a
  prediction; the flag says so wherever its score is shown.
- **leakage**: the prediction holds the truth's own cells. For up to
  ``LEAK_CONDITIONS`` perturbations (seeded choice), up to ``LEAK_CELLS`` of the
  predicted cells are compared, exactly after rounding to float32, with every
  truth cell of the same perturbation; the flag is raised when at least
  ``LEAK_SHARE`` (10%) of them are truth cells. A pseudobulk prediction is
  flagged when its profile equals the truth's centroid (all cells or the truth
  half, to 1e-6 relative) for at least that share of the perturbations. Such a
  prediction scores above the positive control (it *is* the truth half, or
  contains it).

Each flag is a short sentence naming the evidence; :func:`prediction_flags`
returns them per model.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import scipy.sparse as sp

from scperteval.reporting.formatting import percent

if TYPE_CHECKING:
    from scperteval.engine.engine import Engine
    from scperteval.scoring.predictions import Prediction

__all__ = [
    "COLLAPSE_RATIO",
    "LEAK_SHARE",
    "collapse_ratio",
    "leaked_share",
    "prediction_flags",
]

COLLAPSE_RATIO = 0.02
LEAK_SHARE = 0.1
LEAK_CONDITIONS = 50
LEAK_CELLS = 50
CENTROID_RTOL = 1e-6


def _dense(block: Any) -> np.ndarray:
    return np.asarray(block.toarray() if sp.issparse(block) else block, dtype=np.float64)


def collapse_ratio(predicted: np.ndarray, truth: np.ndarray, groups: np.ndarray) -> float:
    """Spread of predicted centroids across perturbations relative to the truth's.

    Parameters
    ----------
    predicted, truth
        Conditions x genes centroids (the same conditions in the same order).
    groups
        Covariate group of each condition; spreads are taken within groups and
        summed.

    Returns
    -------
    float
        ``sum_groups sum_genes var(predicted) / sum_groups sum_genes var(truth)``;
        NaN when no group has two conditions or the truth does not vary.

    Examples
    --------
    >>> truth = np.array([[0.0, 1.0], [2.0, 3.0]])
    >>> collapse_ratio(np.ones((2, 2)), truth, np.zeros(2, dtype=int))
    0.0

    """
    predicted_spread = truth_spread = 0.0
    for group in np.unique(groups):
        rows = groups == group
        if rows.sum() < 2:
            continue
        predicted_spread += float(predicted[rows].var(axis=0).sum())
        truth_spread += float(truth[rows].var(axis=0).sum())
    if truth_spread <= 0.0:
        return float("nan")
    return predicted_spread / truth_spread


def leaked_share(
    model: Prediction, engine: Engine, conditions: Sequence[int], seed: int = 0
) -> float:
    """Share of the checked predicted cells (or profiles) that are the truth's.

    Parameters
    ----------
    model
        The aligned prediction.
    engine
        The run's engine (its dataset and layout give the truth's cells).
    conditions
        Conditions the model predicts.
    seed
        Seed of the choice of conditions and cells checked.

    Returns
    -------
    float
        Fraction in [0, 1]; NaN when nothing could be checked.

    """
    context = engine.context
    rng = np.random.default_rng([seed, 17])
    chosen = list(conditions)
    if len(chosen) > LEAK_CONDITIONS:
        chosen = sorted(rng.choice(chosen, LEAK_CONDITIONS, replace=False).tolist())
    if model.pseudobulk:
        if not chosen:
            return float("nan")
        profiles = np.vstack([model.source(engine, k).centroid for k in chosen])
        shares = []
        for half in ("all", "truth"):
            reference = context.centroids(half)[chosen]
            scale = np.maximum(np.abs(reference).max(axis=1), 1e-12)
            same = np.abs(profiles - reference).max(axis=1) <= CENTROID_RTOL * scale
            shares.append(float(same.mean()))
        return max(shares)
    hits = checked = 0
    for k in chosen:
        rows = model.rows[k]
        if rows.size > LEAK_CELLS:
            rows = np.sort(rng.choice(rows, LEAK_CELLS, replace=False))
        predicted = np.ascontiguousarray(_dense(model.matrix[rows]), dtype=np.float32)
        cells = _dense(context.dataset.rows(context.layout.positions(k, "all")))
        truth = {row.tobytes() for row in np.ascontiguousarray(cells, dtype=np.float32)}
        hits += sum(row.tobytes() in truth for row in predicted)
        checked += int(rows.size)
    return hits / checked if checked else float("nan")


def prediction_flags(
    models: Sequence[Prediction], engine: Engine, seed: int = 0
) -> dict[str, dict[str, Any]]:
    """Flags and their evidence for each model.

    Parameters
    ----------
    models
        The aligned predictions.
    engine
        The run's engine.
    seed
        Seed of the leakage check's sampling.

    Returns
    -------
    dict
        Per model name: ``flags`` (list of sentences, empty when none),
        ``collapse_ratio`` and ``leaked_share``.

    """
    context = engine.context
    truth = context.centroids("all")
    groups = np.asarray(context.layout.condition_covariate)
    record: dict[str, dict[str, Any]] = {}
    for model in models:
        conditions = sorted(model.rows)
        flags: list[str] = []
        ratio = leak = float("nan")
        if len(conditions) >= 2:
            predicted = np.vstack([model.source(engine, k).centroid for k in conditions])
            ratio = collapse_ratio(predicted, truth[conditions], groups[conditions])
            if np.isfinite(ratio) and ratio < COLLAPSE_RATIO:
                flags.append(
                    "mode collapse: the predicted profiles spread "
                    f"{percent(ratio)} as much across perturbations as the truth's "
                    "(nearly one profile for every perturbation)"
                )
        if conditions:
            leak = leaked_share(model, engine, conditions, seed)
            if np.isfinite(leak) and leak >= LEAK_SHARE:
                what = (
                    "profiles equal the truth's centroids"
                    if model.pseudobulk
                    else ("predicted cells checked are cells of the truth")
                )
                flags.append(f"leakage: {percent(leak)} of the {what}")
        record[model.name] = {
            "flags": flags,
            "collapse_ratio": float(ratio),
            "leaked_share": float(leak),
        }
    return record
