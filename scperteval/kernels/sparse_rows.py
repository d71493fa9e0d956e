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
) -> bool:
    """``out[i] = float64(matrix[rows[i]]) @ components``, reading the rows in place.

    Each row's nonzero values are converted to float64 and their multiples of the
    components' rows added in column order to a zero row: the operations of
    :func:`project_dense_rows` on the row written densely, bit for bit, and of
    scipy's product of the rows (converted to float64) with a dense matrix.

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

    Returns
    -------
    bool
        Whether every row's columns were strictly increasing; if not, ``out`` is
        meaningless and the rows must be projected densely.

    """
    width = components.shape[1]
    for i in range(rows.size):
        row = rows[i]
        target = out[i]
        for k in range(width):
            target[k] = 0.0
        previous = np.int64(-1)
        for position in range(indptr[row], indptr[row + 1]):
            column = np.int64(indices[position])
            if column <= previous:
                return False
            previous = column
            value = np.float64(data[position])
            if value == 0.0:
                continue
            source = components[column]
            for k in range(width):
                target[k] += value * source[k]
    return True


@numba.njit(cache=True, nogil=True)
def project_dense_rows(values: np.ndarray, components: np.ndarray, out: np.ndarray) -> None:
    """``out[i] = values[i] @ components``, row by row, the same bits for every storage.

    Each row's nonzero values are taken in column order and their multiples of
    the components' rows added to a zero row, as :func:`project_csr_rows` does:
    a row's projection depends on that row alone (a BLAS product may round a row
    differently with other rows around it) and not on how its zeros are stored.

    Parameters
    ----------
    values
        ``(n_rows, n_columns)`` array, any float dtype.
    components
        C-contiguous float64 ``(n_columns, width)`` matrix.
    out
        Float64 ``(n_rows, width)`` array to fill.

    """
    width = components.shape[1]
    for i in range(values.shape[0]):
        target = out[i]
        for k in range(width):
            target[k] = 0.0
        for column in range(values.shape[1]):
            value = np.float64(values[i, column])
            if value == 0.0:
                continue
            source = components[column]
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
