"""Ahlmann-Eltze, Huber & Anders's criterion: a model against the training-mean baseline.

For each held-out perturbation ``p`` the error ratio ``r_p = e_model(p) / e_mean(p)``
of a model's error to the error of the Mean baseline (the mean of the training
perturbations' centroids, the ``dataset_mean`` baseline under a split) on an error
protocol (lower is better, e.g. L2 on the 1,000 genes most expressed in controls).
The mean of ``r_p`` over perturbations gets a percentile bootstrap 95% interval
over perturbations (10,000 seeded resamples); the model *outperforms* the
baseline when the interval's upper end is below 1.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd

__all__ = [
    "BOOTSTRAP_RESAMPLES",
    "CRITERION_BASELINE",
    "CRITERION_COLUMNS",
    "error_ratio_interval",
    "mean_ratio_table",
]

BOOTSTRAP_RESAMPLES = 10_000
#: The baseline the errors are divided by (training-fold mean under a split).
CRITERION_BASELINE = "dataset_mean"
CRITERION_COLUMNS = (
    "model",
    "kind",
    "protocol",
    "n",
    "mean_ratio",
    "ci_low",
    "ci_high",
    "outperforms",
)
#: Resamples drawn at a time: bounds the index matrix to ``chunk x n`` integers.
_CHUNK = 1000


def error_ratio_interval(
    ratios: np.ndarray,
    seed: int,
    resamples: int = BOOTSTRAP_RESAMPLES,
    level: float = 0.95,
) -> tuple[float, float, float]:
    """Mean of per-perturbation error ratios and its percentile bootstrap interval.

    Parameters
    ----------
    ratios
        Finite per-perturbation ratios.
    seed
        Seed of the resampling (``numpy.random.default_rng``); resample ``b`` draws
        ``n`` perturbations with replacement, ``rng.integers(0, n, n)``, in order.
    resamples
        Number of bootstrap resamples.
    level
        Coverage of the interval.

    Returns
    -------
    tuple of float
        The mean ratio and the interval's ends (``numpy.percentile``, linear
        interpolation); NaN for all three without ratios.

    """
    ratios = np.asarray(ratios, dtype=np.float64)
    n = ratios.size
    if n == 0:
        return float("nan"), float("nan"), float("nan")
    rng = np.random.default_rng(seed)
    means = np.empty(resamples)
    for start in range(0, resamples, _CHUNK):
        stop = min(start + _CHUNK, resamples)
        # One draw of ``(rows, n)`` gives the same indices as ``rows`` draws of ``n``.
        index = rng.integers(0, n, size=(stop - start, n))
        means[start:stop] = ratios[index].mean(axis=1)
    tail = 100.0 * (1.0 - level) / 2.0
    low, high = np.percentile(means, [tail, 100.0 - tail])
    return float(ratios.mean()), float(low), float(high)


def mean_ratio_table(
    results: pd.DataFrame,
    protocols: Sequence[str],
    seed: int,
    resamples: int = BOOTSTRAP_RESAMPLES,
) -> pd.DataFrame:
    """The criterion for every model and baseline on each error protocol.

    Parameters
    ----------
    results
        Tidy per-perturbation results (``covariate, perturbation, protocol, source,
        source_name, value``) holding the ``dataset_mean`` baseline.
    protocols
        Error protocols (lower is better) to judge on.
    seed
        Seed of every bootstrap (the same resamples for every entry of a protocol
        that covers the same perturbations).
    resamples
        Bootstrap resamples.

    Returns
    -------
    pandas.DataFrame
        :data:`CRITERION_COLUMNS`: per entry and protocol, the perturbations with a
        finite ratio (``n``), the mean ratio, its interval and ``outperforms``
        (upper end below 1; NA without a finite ratio). Empty when the baseline
        was not scored.

    """
    rows = []
    entries = results[results["source"].isin(["model", "baseline"])]
    keys = ["covariate", "perturbation"]
    for protocol in protocols:
        scored = entries[entries["protocol"] == protocol]
        base = scored[
            (scored["source"] == "baseline") & (scored["source_name"] == CRITERION_BASELINE)
        ]
        if base.empty:
            continue
        baseline_error = base.set_index(keys)["value"]
        for (kind, name), own in scored.groupby(["source", "source_name"], sort=True):
            if kind == "baseline" and name == CRITERION_BASELINE:
                continue
            error = own.set_index(keys)["value"]
            below = baseline_error.reindex(error.index).to_numpy(dtype=np.float64)
            with np.errstate(divide="ignore", invalid="ignore"):
                ratio = error.to_numpy(dtype=np.float64) / below
            # A perturbation whose baseline error is 0 (or missing) has no ratio.
            ratio = ratio[np.isfinite(ratio)]
            mean, low, high = error_ratio_interval(ratio, seed, resamples)
            # Undecided (NA), not a loss, without a single finite ratio.
            outperforms = bool(high < 1.0) if np.isfinite(high) else pd.NA
            rows.append((name, kind, protocol, int(ratio.size), mean, low, high, outperforms))
    return pd.DataFrame(rows, columns=list(CRITERION_COLUMNS))
