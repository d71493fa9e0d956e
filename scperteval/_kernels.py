"""Compiled inner loops (numba), imported only when first needed."""

from __future__ import annotations

import math

import numba
import numpy as np


@numba.njit(parallel=True, cache=True, nogil=True)
def csr_group_moments(
    indptr: np.ndarray,
    indices: np.ndarray,
    data: np.ndarray,
    order: np.ndarray,
    group_starts: np.ndarray,
    n_features: int,
) -> tuple[np.ndarray, np.ndarray]:
    """Exact two-pass mean and centred sum of squares of each group of CSR rows.

    Parameters
    ----------
    indptr, indices, data
        The CSR matrix (any index and value dtypes).
    order
        Row numbers sorted by group: group ``g`` owns
        ``order[group_starts[g]:group_starts[g + 1]]``.
    group_starts
        Offsets into ``order``, length ``n_groups + 1``.
    n_features
        Number of columns.

    Returns
    -------
    tuple of numpy.ndarray
        Means and sums of squared deviations, each ``(n_groups, n_features)``
        float64. Groups are processed in parallel, each by one thread, so no
        per-thread copy of the result is needed. Entries not stored are zeros.

    """
    n_groups = group_starts.shape[0] - 1
    mean = np.zeros((n_groups, n_features))
    m2 = np.zeros((n_groups, n_features))
    for group in numba.prange(n_groups):
        start = group_starts[group]
        stop = group_starts[group + 1]
        n_rows = stop - start
        if n_rows == 0:
            continue
        mean_row = mean[group]
        m2_row = m2[group]
        stored = np.zeros(n_features, dtype=np.int64)
        for position in range(start, stop):
            row = order[position]
            for k in range(indptr[row], indptr[row + 1]):
                mean_row[indices[k]] += np.float64(data[k])
        for feature in range(n_features):
            mean_row[feature] /= n_rows
        for position in range(start, stop):
            row = order[position]
            for k in range(indptr[row], indptr[row + 1]):
                feature = indices[k]
                deviation = np.float64(data[k]) - mean_row[feature]
                m2_row[feature] += deviation * deviation
                stored[feature] += 1
        for feature in range(n_features):
            m2_row[feature] += (n_rows - stored[feature]) * mean_row[feature] ** 2
    return mean, m2


@numba.njit(parallel=True, cache=True, nogil=True)
def scan_values(values: np.ndarray, n_blocks: int) -> tuple[int, float, float, bool]:
    """One pass over a flat array: non-finite count, finite min and max, all-integer flag."""
    n = values.shape[0]
    nonfinite = np.zeros(n_blocks, dtype=np.int64)
    minima = np.full(n_blocks, np.inf)
    maxima = np.full(n_blocks, -np.inf)
    integral = np.ones(n_blocks, dtype=np.bool_)
    for block in numba.prange(n_blocks):
        start = block * n // n_blocks
        stop = (block + 1) * n // n_blocks
        for i in range(start, stop):
            value = np.float64(values[i])
            if not np.isfinite(value):
                nonfinite[block] += 1
                continue
            if value < minima[block]:
                minima[block] = value
            if value > maxima[block]:
                maxima[block] = value
            if integral[block] and value != np.floor(value):
                integral[block] = False
    return int(nonfinite.sum()), float(minima.min()), float(maxima.max()), bool(integral.all())


@numba.njit(cache=True, nogil=True)
def complete_squared_distances(
    tile: np.ndarray, sq_a: np.ndarray, sq_b: np.ndarray, rtol: float
) -> None:
    """Turn ``-2 a.b`` into snapped squared distances, in place, in one pass.

    ``tile[i, j]`` holds ``-2 a_i . b_j``; it becomes ``(tile + sq_a[i]) + sq_b[j]``
    (the same additions, in the same order, as NumPy's broadcast ``+=``), set to 0
    where it is at most ``rtol * (sq_a[i] + sq_b[j])``: rounding noise of the
    expansion, as for coinciding points.
    """
    n_rows, n_columns = tile.shape
    for i in range(n_rows):
        norm_a = sq_a[i]
        row = tile[i]
        for j in range(n_columns):
            value = row[j] + norm_a + sq_b[j]
            if value <= rtol * (norm_a + sq_b[j]):
                value = 0.0
            row[j] = value


@numba.njit(cache=True, nogil=True)
def complete_distances(
    tile: np.ndarray, sq_a: np.ndarray, sq_b: np.ndarray, rtol: float, out: np.ndarray
) -> None:
    """:func:`complete_squared_distances`, also writing the distances (square roots) to ``out``."""
    n_rows, n_columns = tile.shape
    for i in range(n_rows):
        norm_a = sq_a[i]
        row = tile[i]
        out_row = out[i]
        for j in range(n_columns):
            value = row[j] + norm_a + sq_b[j]
            if value <= rtol * (norm_a + sq_b[j]):
                value = 0.0
            row[j] = value
            out_row[j] = math.sqrt(value)
