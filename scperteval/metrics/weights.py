"""DEG weights for the weighted centroid metrics (Mejia et al. 2025)."""

from __future__ import annotations

import math

import numpy as np
import numpy.typing as npt

__all__ = ["deg_weights_from_statistic"]


def deg_weights_from_statistic(
    statistic: npt.ArrayLike, exponent: float = 2.0
) -> npt.NDArray[np.float64]:
    """Turn a per-gene DE statistic into weights that sum to 1.

    ``s = |statistic|`` is min-max normalised across genes to [0, 1], raised to
    ``exponent`` and divided by its sum, so the most differential gene gets the largest
    weight and the least differential gene weight 0.

    Parameters
    ----------
    statistic
        One value per gene, typically the Welch t statistic of the truth vs the rest.
    exponent
        Power applied after min-max normalisation; must be positive. Larger values
        concentrate the weight on the strongest genes.

    Returns
    -------
    numpy.ndarray
        Non-negative float64 weights aligned with ``statistic``: summing to 1, or all
        zero in the degenerate cases below.

    Raises
    ------
    ValueError
        If ``statistic`` is not one-dimensional or ``exponent`` is not a positive
        finite number.

    Notes
    -----
    - Non-finite statistics (NaN for a gene without variance, infinity) get weight 0
      and take no part in the min-max normalisation.
    - When fewer than two finite values differ (all ``|t|`` equal, a single finite
      value, or none), min-max normalisation is 0/0 and no gene can be preferred: the
      weights are all zero, and the weighted metrics return NaN on them.

    Examples
    --------
    >>> deg_weights_from_statistic([-8, 4, 1, 0.5, 0]).round(6)
    array([0.787692, 0.196923, 0.012308, 0.003077, 0.      ])

    """
    if not (math.isfinite(exponent) and exponent > 0):
        raise ValueError(f"exponent must be a positive finite number, got {exponent!r}")
    magnitude = np.abs(np.asarray(statistic, dtype=np.float64))
    if magnitude.ndim != 1:
        raise ValueError(f"statistic must be one-dimensional, got shape {magnitude.shape}")
    weights = np.zeros_like(magnitude)
    finite = np.isfinite(magnitude)
    if not finite.any():
        return weights
    low = magnitude[finite].min()
    span = magnitude[finite].max() - low
    if span == 0:
        return weights
    weights[finite] = ((magnitude[finite] - low) / span) ** exponent
    return weights / weights.sum()
