"""Scores ranked so that values equal in exact arithmetic tie, whatever their rounding."""

from __future__ import annotations

import numpy as np

__all__ = ["RANKING_BITS", "ranking_keys"]

#: Scores are ranked on this many significant bits (about 12 decimal digits): values
#: that are equal in exact arithmetic but differ in their last bits by rounding
#: (a Welch ``|t|`` of exactly 1 computed as ``1 - 2**-53`` or ``1 + 2**-52``) tie.
RANKING_BITS = 40


def ranking_keys(scores: np.ndarray) -> np.ndarray:
    """Scores rounded to :data:`RANKING_BITS` significant bits, for ranking.

    Parameters
    ----------
    scores
        Any float scores; infinities and NaN are kept as they are.

    Returns
    -------
    numpy.ndarray
        Float64 keys, each the nearest number with at most ``RANKING_BITS``
        significant bits (ties to even), ``-0.0`` as ``0.0``.

    Examples
    --------
    >>> ranking_keys(np.array([0.9999999999999999, 1.0, 1.0000000000000002, 0.5]))
    array([1. , 1. , 1. , 0.5])

    """
    values = np.asarray(scores, dtype=np.float64)
    mantissa, exponent = np.frexp(values)
    finite = np.isfinite(values)
    rounded = np.ldexp(np.round(np.ldexp(mantissa, RANKING_BITS)), exponent - RANKING_BITS)
    return np.where(finite, rounded, values) + 0.0
