"""Rows of a CSR matrix written out densely in float64, compiled."""

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
