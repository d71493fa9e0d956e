"""Rows of a CSR matrix written out densely in float64, or projected, compiled."""

from __future__ import annotations

import numba
import numpy as np


@numba.njit(cache=True, nogil=True)
def add_csr_rows(
    indptr: np.ndarray, indices: np.ndarray, data: np.ndarray, out: np.ndarray
) -> None:
    """Add every stored value of a CSR matrix to ``out`` at its row and column.

    Values are converted to float64 and added row by row in storage order, the
    order of scipy's ``toarray`` on the matrix converted to float64 first, so a
    zero ``out`` receives the same values bit for bit (repeated columns summed
    alike) without the converted copy of the matrix.

    Parameters
    ----------
    indptr, indices, data
        The CSR arrays.
    out
        Float64 array of shape ``(n_rows, n_columns)``, added to in place.

    """
    for row in range(indptr.size - 1):
        for position in range(indptr[row], indptr[row + 1]):
            out[row, indices[position]] += np.float64(data[position])


@numba.njit(cache=True, nogil=True)
def project_csr_rows(
    indptr: np.ndarray,
    indices: np.ndarray,
    data: np.ndarray,
    rows: np.ndarray,
    components: np.ndarray,
    out: np.ndarray,
) -> None:
    """``out[i] = float64(matrix[rows[i]]) @ components``, reading the rows in place.

    Each row's stored values are converted to float64 and their multiples of the
    components' rows added in storage order to a zero row: the operations of
    scipy's product of the selected rows (converted to float64) with a dense
    matrix, bit for bit, without copying the rows out first.

    Parameters
    ----------
    indptr, indices, data
        The CSR arrays of the whole matrix.
    rows
        The rows to project, in the order wanted.
    components
        C-contiguous float64 ``(n_columns, width)`` matrix.
    out
        Float64 ``(rows.size, width)`` array to fill.

    """
    width = components.shape[1]
    for i in range(rows.size):
        row = rows[i]
        target = out[i]
        for k in range(width):
            target[k] = 0.0
        for position in range(indptr[row], indptr[row + 1]):
            value = np.float64(data[position])
            source = components[indices[position]]
            for k in range(width):
                target[k] += value * source[k]


@numba.njit(cache=True, nogil=True)
def gather_csr_columns(
    indptr: np.ndarray,
    indices: np.ndarray,
    data: np.ndarray,
    rows: np.ndarray,
    positions: np.ndarray,
    out: np.ndarray,
) -> bool:
    """Selected rows and columns of a CSR matrix written densely in float64, in place.

    ``out[i, positions[column]] = data`` for each value stored in row ``rows[i]``
    whose column has a position (``>= 0``); other entries of ``out`` are left as
    they are (zero, usually).

    Parameters
    ----------
    indptr, indices, data
        The CSR arrays of the whole matrix.
    rows
        The rows wanted, in order.
    positions
        For the matrix's first columns, each one's column in ``out``, or -1 if not
        selected; columns beyond its end are not selected.
    out
        Float64 ``(rows.size, n_selected)`` array.

    Returns
    -------
    bool
        Whether every row's columns were strictly increasing. If not, a column may
        be stored twice and ``out`` holds one of its values, where scipy sums them.

    """
    n_mapped = positions.size
    increasing = True
    for i in range(rows.size):
        row = rows[i]
        previous = -1
        for position in range(indptr[row], indptr[row + 1]):
            column = indices[position]
            if column <= previous:
                increasing = False
            previous = column
            if column < n_mapped:
                target = positions[column]
                if target >= 0:
                    out[i, target] = np.float64(data[position])
    return increasing
