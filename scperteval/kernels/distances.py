"""Pairwise distances completed from matrix products, and fused L1 distances."""

from __future__ import annotations

import math

import numba
import numpy as np


@numba.njit(cache=True, nogil=True)
def complete_distances(
    tile: np.ndarray, sq_a: np.ndarray, sq_b: np.ndarray, rtol: float, out: np.ndarray | None
) -> None:
    """Turn ``-2 a.b`` into snapped squared distances, in place, in one pass.

    ``tile[i, j]`` holds ``-2 a_i . b_j``; it becomes ``(tile + sq_a[i]) + sq_b[j]``
    (the same additions, in the same order, as NumPy's broadcast ``+=``), set to 0
    where it is at most ``rtol * (sq_a[i] + sq_b[j])``: rounding noise of the
    expansion, as for coinciding points. The distances (square roots) are also
    written to ``out`` unless it is ``None``; numba compiles a version for each
    case, so the test leaves the loop.
    """
    n_rows, n_columns = tile.shape
    for i in range(n_rows):
        norm_a = sq_a[i]
        row = tile[i]
        if out is not None:
            out_row = out[i]
        for j in range(n_columns):
            value = row[j] + norm_a + sq_b[j]
            if value <= rtol * (norm_a + sq_b[j]):
                value = 0.0
            row[j] = value
            if out is not None:
                out_row[j] = math.sqrt(value)


@numba.njit(cache=True, nogil=True)
def zero_through_diagonal(tile: np.ndarray, offset: int) -> None:
    """Set ``tile[i, j] = 0`` wherever ``j <= i + offset``, in place.

    The pairs a within-cloud tile crossing the diagonal must leave out: with the
    tile's first row at ``start`` and first column at ``first`` of the same cloud,
    ``offset = start - first`` marks the pairs ``(a, b)`` with ``b <= a``.
    """
    n_rows, n_columns = tile.shape
    for i in range(n_rows):
        stop = min(i + offset + 1, n_columns)
        row = tile[i]
        for j in range(stop):
            row[j] = 0.0


@numba.njit(cache=True, nogil=True, fastmath={"reassoc", "contract"})
def l1_distances(pred: np.ndarray, truth: np.ndarray, keep: np.ndarray, out: np.ndarray) -> None:
    """``out[i, j] = sum_k keep[i, k] |pred[i, k] - truth[j, k]|`` (all ``k`` if ``keep`` is empty).

    One fused pass per pair of rows, with no temporary array; the order of the
    sum is fixed, so identical rows give identical distances.

    Parameters
    ----------
    pred, truth
        C-contiguous float64 rows with the same number of columns.
    keep
        0/1 float64 mask shaped like ``pred``, or an array of size 0 for none.
    out
        ``(len(pred), len(truth))`` float64 array to fill.

    """
    n_pred, n_features = pred.shape
    n_truth = truth.shape[0]
    masked = keep.size > 0
    for i in range(n_pred):
        row = pred[i]
        for j in range(n_truth):
            other = truth[j]
            total = 0.0
            if masked:
                weights = keep[i]
                for k in range(n_features):
                    total += weights[k] * abs(row[k] - other[k])
            else:
                for k in range(n_features):
                    total += abs(row[k] - other[k])
            out[i, j] = total
