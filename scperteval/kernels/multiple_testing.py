"""Benjamini-Hochberg adjusted p-values, row by row, compiled."""

from __future__ import annotations

import numba
import numpy as np


@numba.njit(cache=True, nogil=True)
def benjamini_hochberg_rows(pvalues: np.ndarray, order: np.ndarray, out: np.ndarray) -> bool:
    """Benjamini-Hochberg adjusted p-values of each row, written to ``out``.

    The same operations, in the same order, as
    :func:`scipy.stats.false_discovery_control` (``method="bh"``): the ``i``-th
    smallest of ``m`` p-values times ``m / i``, the running minimum from the
    largest down, clipped to ``[0, 1]``; so the values are identical. Ties get
    the same adjusted value whatever their order in ``order``.

    Parameters
    ----------
    pvalues
        P-values, one test family per row (2-D, float64).
    order
        ``numpy.argsort(pvalues, axis=-1)``.
    out
        Array of the same shape to fill.

    Returns
    -------
    bool
        Whether every p-value lies in ``[0, 1]`` (False for NaN); when not, ``out``
        is meaningless.

    """
    n_rows, n_tests = pvalues.shape
    in_range = True
    for row in range(n_rows):
        running = np.inf
        for rank in range(n_tests - 1, -1, -1):
            test = order[row, rank]
            value = pvalues[row, test]
            in_range &= (value >= 0.0) & (value <= 1.0)
            scaled = value * (n_tests / (rank + 1))
            if scaled < running:
                running = scaled
            out[row, test] = min(max(running, 0.0), 1.0)
    return in_range
