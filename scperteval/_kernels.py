"""Compiled inner loops (numba), imported only when first needed."""

from __future__ import annotations

import numba
import numpy as np


@numba.njit(parallel=True, cache=True, nogil=True)
def csr_group_shifted_sums(
    indptr: np.ndarray,
    indices: np.ndarray,
    data: np.ndarray,
    codes: np.ndarray,
    shift: np.ndarray,
    n_blocks: int,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Sums of shifted stored entries of a CSR matrix per group, per row block.

    Rows are split into ``n_blocks`` contiguous blocks processed in parallel.
    For each stored entry ``x`` of a row in group ``g`` and column ``f`` the
    kernel adds ``x - shift[g, f]`` and its square, and counts the entry.
    Rows with a negative group code are skipped.

    Returns
    -------
    tuple
        Shifted sums, shifted sums of squares (float64) and stored-entry counts
        (int64), each of shape ``(n_blocks, n_groups, n_features)``.

    """
    n_rows = codes.shape[0]
    n_groups, n_features = shift.shape
    shifted_sum = np.zeros((n_blocks, n_groups, n_features))
    shifted_sumsq = np.zeros((n_blocks, n_groups, n_features))
    stored = np.zeros((n_blocks, n_groups, n_features), dtype=np.int64)
    for block in numba.prange(n_blocks):
        start = block * n_rows // n_blocks
        stop = (block + 1) * n_rows // n_blocks
        for row in range(start, stop):
            group = codes[row]
            if group < 0:
                continue
            sum_row = shifted_sum[block, group]
            sumsq_row = shifted_sumsq[block, group]
            count_row = stored[block, group]
            shift_row = shift[group]
            for k in range(indptr[row], indptr[row + 1]):
                feature = indices[k]
                deviation = np.float64(data[k]) - shift_row[feature]
                sum_row[feature] += deviation
                sumsq_row[feature] += deviation * deviation
                count_row[feature] += 1
    return shifted_sum, shifted_sumsq, stored
