"""Calibrated scores: a model's value placed between its protocol's controls.

Per perturbation, ``c = (s_model - s_neg) / (s_pos - s_neg)``: 0 is as good as
the negative control, 1 as good as the positive control; values beyond are
possible. ``c`` is NaN where a control is NaN, where the positive control is
not strictly better than the negative one, or where the two differ by less than
``1e-12`` relative to their magnitude (no room to place the model in).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from scperteval.scoring.headline import finite_aggregate

__all__ = ["add_calibrated", "aggregate", "bootstrap_ci", "RELATIVE_GAP"]

RELATIVE_GAP = 1e-12


def calibrated_values(
    value: np.ndarray, positive: np.ndarray, negative: np.ndarray, better: str
) -> np.ndarray:
    """Vectorised calibrated score with the NaN rules of the module docstring."""
    value = np.asarray(value, dtype=np.float64)
    positive = np.asarray(positive, dtype=np.float64)
    negative = np.asarray(negative, dtype=np.float64)
    gap = positive - negative
    scale = np.maximum(np.maximum(np.abs(positive), np.abs(negative)), 1.0)
    positive_better = gap > 0 if better == "higher" else gap < 0
    usable = positive_better & (np.abs(gap) > RELATIVE_GAP * scale)
    with np.errstate(invalid="ignore", divide="ignore"):
        result = (value - negative) / gap
    return np.where(usable, result, np.nan)


def add_calibrated(results: pd.DataFrame, better: dict[str, str]) -> pd.DataFrame:
    """Add a ``calibrated`` column to a tidy results table.

    Every row of a model, baseline or control gets its calibrated score against
    the positive and negative controls of the same protocol and perturbation
    (controls score 1 and 0 by construction where defined).
    """
    keys = ["protocol", "covariate", "perturbation"]
    controls = results[results["source"].isin(["positive", "negative"])]
    wide = controls.pivot_table(
        index=keys, columns="source", values="value", aggfunc="first", dropna=False, observed=True
    )
    # A control missing everywhere is a column of NaN.
    bounds = wide.reindex(columns=["positive", "negative"]).reset_index()
    merged = results.merge(bounds, on=keys, how="left", validate="many_to_one")
    direction = merged["protocol"].map(better).fillna("higher").to_numpy()
    calibrated = np.full(len(merged), np.nan)
    for sense in ("higher", "lower"):
        mask = direction == sense
        calibrated[mask] = calibrated_values(
            merged.loc[mask, "value"].to_numpy(),
            merged.loc[mask, "positive"].to_numpy(),
            merged.loc[mask, "negative"].to_numpy(),
            sense,
        )
    out = results.copy()
    out["calibrated"] = calibrated
    return out


def bootstrap_ci(
    values: np.ndarray,
    statistic: str = "mean",
    n_resamples: int = 2000,
    seed: int = 0,
    level: float = 0.95,
) -> tuple[float, float]:
    """Percentile bootstrap confidence interval of the mean or median (NaN values dropped).

    Parameters
    ----------
    values
        Per-perturbation values.
    statistic
        ``mean`` or ``median``.
    n_resamples
        Bootstrap resamples.
    seed
        Seed of the resampling.
    level
        Confidence level.

    Returns
    -------
    tuple of float
        Lower and upper bounds; NaN with fewer than 2 finite values.

    """
    finite = np.asarray(values, dtype=np.float64)
    finite = finite[np.isfinite(finite)]
    if finite.size < 2:
        return float("nan"), float("nan")
    rng = np.random.default_rng(seed)
    samples = finite[rng.integers(0, finite.size, size=(n_resamples, finite.size))]
    stats = samples.mean(axis=1) if statistic == "mean" else np.median(samples, axis=1)
    alpha = (1.0 - level) / 2.0
    low, high = np.quantile(stats, [alpha, 1.0 - alpha])
    return float(low), float(high)


def aggregate(
    results: pd.DataFrame, column: str = "calibrated", seed: int = 0, n_resamples: int = 2000
) -> pd.DataFrame:
    """Per (protocol, source, source_name): n, mean, median and bootstrap 95% CIs."""
    rows = []
    for (protocol, source, name), part in results.groupby(
        ["protocol", "source", "source_name"], sort=True, observed=True
    ):
        values = part[column].to_numpy(dtype=np.float64)
        finite = values[np.isfinite(values)]
        row = {"protocol": protocol, "source": source, "source_name": name, "n": int(finite.size)}
        row["n_missing"] = int(values.size - finite.size)
        for how in ("mean", "median"):
            row[how] = finite_aggregate(finite, how)
            interval = bootstrap_ci(finite, how, n_resamples, seed)
            row[f"{how}_ci_low"], row[f"{how}_ci_high"] = interval
        rows.append(row)
    return pd.DataFrame(rows)
