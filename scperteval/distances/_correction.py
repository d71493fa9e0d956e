"""Multiple-testing corrections of one family of p-values."""

from __future__ import annotations

import numpy as np
from scipy.stats import false_discovery_control

from scperteval.errors import SpecError

__all__ = ["CORRECTIONS", "adjust"]

#: The accepted corrections.
CORRECTIONS = ("holm", "bh", "bonferroni", "none")


def adjust(pvalues: np.ndarray, method: str) -> np.ndarray:
    """Adjusted p-values of one family of tests.

    Parameters
    ----------
    pvalues
        P-values in ``[0, 1]``, NaN for tests that were not run (left out of the
        family and kept NaN).
    method
        ``"holm"`` (Holm's step-down, family-wise error), ``"bh"``
        (Benjamini-Hochberg, false discovery rate), ``"bonferroni"`` or ``"none"``.

    Returns
    -------
    numpy.ndarray
        The adjusted p-values, each at most 1.

    Raises
    ------
    SpecError
        For an unknown method.

    """
    if method not in CORRECTIONS:
        raise SpecError(f"unknown correction {method!r}; known: {', '.join(CORRECTIONS)}")
    values = np.asarray(pvalues, dtype=np.float64)
    out = np.full(values.shape, np.nan)
    present = np.flatnonzero(~np.isnan(values))
    if present.size == 0:
        return out
    family = values[present]
    m = family.size
    if method == "none":
        adjusted = family.copy()
    elif method == "bonferroni":
        adjusted = np.minimum(family * m, 1.0)
    elif method == "bh":
        adjusted = false_discovery_control(family, method="bh")
    else:
        order = np.argsort(family, kind="stable")
        steps = family[order] * (m - np.arange(m))
        ordered = np.minimum(np.maximum.accumulate(steps), 1.0)
        adjusted = np.empty(m)
        adjusted[order] = ordered
    out[present] = adjusted
    return out
