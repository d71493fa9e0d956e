"""Multiple-testing corrections: Benjamini-Hochberg, Bonferroni and Holm.

:func:`benjamini_hochberg` adjusts many families at once (one per row: the genes
of every perturbation's DE), by one sort per row and a compiled pass
(:mod:`scperteval.kernels.multiple_testing`) on parallel threads, with the values
of :func:`scipy.stats.false_discovery_control` bit for bit. :func:`adjust`
corrects one family by any method of :data:`CORRECTIONS`, leaving out the tests
that were not run (NaN); the DE tables, the paired tests of leaderboards and the
permutation tests of distances all adjust through this module.
"""

from __future__ import annotations

import numpy as np

from scperteval.errors import SpecError
from scperteval.kernels.threads import Threads
from scperteval.stats.diffexp import _run_row_blocks

__all__ = ["CORRECTIONS", "adjust", "benjamini_hochberg"]

#: The accepted corrections of :func:`adjust`.
CORRECTIONS = ("holm", "bh", "bonferroni", "none")


def benjamini_hochberg(
    pvalues: np.ndarray, *, overwrite: bool = False, threads: Threads | None = None
) -> np.ndarray:
    """Benjamini-Hochberg adjusted p-values, one family of tests along the last axis.

    Identical values to ``scipy.stats.false_discovery_control(pvalues, axis=-1,
    method="bh")``; large arrays are cut into row blocks computed by parallel
    threads (sorting and the compiled pass release the GIL).

    Parameters
    ----------
    pvalues
        P-values in ``[0, 1]``.
    overwrite
        Write the adjusted values over ``pvalues`` when it is a C-contiguous float64
        array with more than one test per family (the result is then that array),
        sparing a second array of its size; its raw values are lost.
    threads
        The run's kernel threads (its own for the call when omitted).

    Returns
    -------
    numpy.ndarray
        Adjusted p-values, same shape.

    Raises
    ------
    ValueError
        If a p-value lies outside ``[0, 1]`` or is NaN (as scipy).

    """
    pvalues = np.asarray(pvalues)
    if pvalues.size == 0:
        return pvalues.copy()
    if pvalues.dtype != np.float64 or pvalues.ndim == 0 or pvalues.shape[-1] <= 1:
        # Other dtypes change scipy's arithmetic; single tests are returned as given.
        from scipy import stats

        return np.asarray(stats.false_discovery_control(pvalues, axis=-1, method="bh"))
    from scperteval.kernels.multiple_testing import benjamini_hochberg_rows

    rows = np.ascontiguousarray(pvalues).reshape(-1, pvalues.shape[-1])
    # In place is safe: the pass reads each p-value once, before writing its result.
    out = rows if overwrite else np.empty(rows.shape)

    def block(start: int, stop: int) -> bool:
        order = np.argsort(rows[start:stop], axis=-1)
        return bool(benjamini_hochberg_rows(rows[start:stop], order, out[start:stop]))

    if not all(_run_row_blocks(block, rows.size, rows.shape[0], threads)):
        raise ValueError("`ps` must include only numbers between 0 and 1.")
    return out.reshape(pvalues.shape)


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
        adjusted = benjamini_hochberg(family)
    else:
        order = np.argsort(family, kind="stable")
        steps = family[order] * (m - np.arange(m))
        ordered = np.minimum(np.maximum.accumulate(steps), 1.0)
        adjusted = np.empty(m)
        adjusted[order] = ordered
    out[present] = adjusted
    return out
