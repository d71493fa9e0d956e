"""Per-group moments of CSR rows in one compensated pass, and one-pass value scans."""

from __future__ import annotations

import numba
import numpy as np

#: A group's one-pass moments are kept when ``m2 >= sumsq * ONE_PASS_MIN_SPREAD`` for every
#: feature. The compensated sums below err by at most about ``2u`` (``u = 2**-53``)
#: relative to the sum of magnitudes whatever the number of rows, so
#: ``sumsq - sum**2 / n`` errs by at most about ``9u * sumsq`` (Cauchy-Schwarz bounds
#: the cross terms by ``sumsq``); relative to ``m2`` that is ``9u * sumsq / m2``, at
#: most ``9 * 128 * 2**-53 = 1.3e-13`` above this spread. Features nearly constant
#: within a group (``sumsq / m2`` beyond 128, i.e. a standard deviation below ~9%
#: of the root mean square) would lose more, so they take an exact second pass.
ONE_PASS_MIN_SPREAD = 2.0**-7
#: Up to this many such features, the second pass reads only them (by binary search
#: in each row); beyond, it reads every stored entry of the group again.
FEW_EXACT_FEATURES = 64


@numba.njit(cache=True, nogil=True, inline="always")
def _find_column(indices: np.ndarray, first: int, stop: int, column: int) -> int:
    """Position of ``column`` in the sorted ``indices[first:stop]``, or -1."""
    lo, hi = first, stop
    while lo < hi:
        middle = (lo + hi) // 2
        if np.int64(indices[middle]) < column:
            lo = middle + 1
        else:
            hi = middle
    if lo < stop and np.int64(indices[lo]) == column:
        return lo
    return -1


@numba.njit(cache=True, nogil=True)
def csr_group_moments(
    indptr: np.ndarray,
    indices: np.ndarray,
    data: np.ndarray,
    order: np.ndarray,
    group_starts: np.ndarray,
    first_group: int,
    stop_group: int,
    mean: np.ndarray,
    m2: np.ndarray,
) -> bool:
    """Mean and centred sum of squares of groups of CSR rows, mostly in one pass.

    Each group's rows are read once, accumulating per feature the sum and the sum
    of squares with compensated (Kahan) additions; ``m2 = sumsq - sum**2 / n``.
    Where that formula could lose accuracy (see :data:`ONE_PASS_MIN_SPREAD`), those
    features' sums of squared deviations from the mean are computed exactly in a
    second pass (reading only them while they are few, see
    :data:`FEW_EXACT_FEATURES`); non-finite sums send the whole group through it.
    Results agree with the two-pass method to about ``1e-13`` relative.

    Parameters
    ----------
    indptr, indices, data
        The CSR matrix (any index and value dtypes). A visited row must not hold
        the same column twice; the returned value says whether one did. Rows need
        not be sorted and may store zeros: the results are those of the matrix
        with its stored zeros removed and its rows sorted, bit for bit (every
        feature's values are added in row order and zeros are skipped).
    order
        Row numbers sorted by group: group ``g`` owns
        ``order[group_starts[g]:group_starts[g + 1]]``. Rows not owned by any group
        are not read.
    group_starts
        Offsets into ``order``, length ``n_groups + 1``.
    first_group, stop_group
        The range of groups computed by this call (threads take disjoint ranges,
        see :func:`balanced_group_ranges`).
    mean, m2
        ``(n_groups, n_features)`` float64 outputs; rows of the range are written
        (zeros for groups without rows).

    Returns
    -------
    bool
        Whether every visited row was free of duplicate column indices; when not,
        the moments are meaningless and the caller must sum the duplicates and
        call again.

    """
    n_features = mean.shape[1]
    no_duplicates = True
    # Last row in which each column was seen, read only for unsorted rows.
    seen = np.full(n_features, -1, dtype=np.int64)
    # Interleaved per feature (sum, its compensation, sum of squares, its
    # compensation) so that one stored entry touches one cache line.
    # Zero between groups: the finishing loop below clears what it reads.
    sums = np.zeros((n_features, 4))
    stored = np.empty(n_features, dtype=np.int64)
    selected = np.zeros(n_features, dtype=np.bool_)
    flagged = np.empty(FEW_EXACT_FEATURES, dtype=np.int64)
    for group in range(first_group, stop_group):
        start = group_starts[group]
        stop = group_starts[group + 1]
        n_rows = stop - start
        mean_row = mean[group]
        m2_row = m2[group]
        if n_rows == 0:
            mean_row[:] = 0.0
            m2_row[:] = 0.0
            continue
        group_sorted = True
        for position in range(start, stop):
            row = order[position]
            previous = np.int64(-1)
            increasing = True
            for k in range(indptr[row], indptr[row + 1]):
                # Unsigned, so that numba skips its negative-index wraparound.
                column = np.uintp(indices[k])
                if np.int64(indices[k]) <= previous:
                    increasing = False
                previous = np.int64(indices[k])
                value = np.float64(data[k])
                if value == 0.0:
                    # A stored zero adds nothing: the sums are those of its absence.
                    continue
                addend = value - sums[column, 1]
                total = sums[column, 0] + addend
                sums[column, 1] = (total - sums[column, 0]) - addend
                sums[column, 0] = total
                addend = value * value - sums[column, 3]
                total = sums[column, 2] + addend
                sums[column, 3] = (total - sums[column, 2]) - addend
                sums[column, 2] = total
            if not increasing:
                group_sorted = False
                for k in range(indptr[row], indptr[row + 1]):
                    column = np.uintp(indices[k])
                    if seen[column] == row:
                        no_duplicates = False
                    seen[column] = row
        n_flagged = 0
        means_finite = True
        for feature in range(n_features):
            total = sums[feature, 0] - sums[feature, 1]
            sumsq = sums[feature, 2] - sums[feature, 3]
            sums[feature, :] = 0.0
            feature_mean = total / n_rows
            spread = sumsq - total * feature_mean
            mean_row[feature] = feature_mean
            m2_row[feature] = spread
            # Written to be true for NaN as well.
            if not spread >= sumsq * ONE_PASS_MIN_SPREAD:
                if n_flagged < flagged.shape[0]:
                    flagged[n_flagged] = feature
                n_flagged += 1
            if not np.isfinite(feature_mean):
                means_finite = False
        if n_flagged == 0:
            continue
        if means_finite and group_sorted and n_flagged <= flagged.shape[0]:
            # Usually one or two genes: find each in every (sorted) row by binary
            # search instead of reading all the rows again.
            for j in range(n_flagged):
                feature = flagged[j]
                feature_mean = mean_row[feature]
                spread = 0.0
                n_stored = 0
                for position in range(start, stop):
                    row = order[position]
                    k = _find_column(indices, indptr[row], indptr[row + 1], feature)
                    if k >= 0 and np.float64(data[k]) != 0.0:
                        deviation = np.float64(data[k]) - feature_mean
                        spread += deviation * deviation
                        n_stored += 1
                m2_row[feature] = spread + (n_rows - n_stored) * feature_mean**2
            continue
        if means_finite and n_flagged <= flagged.shape[0]:
            # Unsorted rows: the same sums as the binary search above (each flagged
            # feature's values in row order), read in one pass over the group, so
            # that the order of columns within a row never changes a value.
            for j in range(n_flagged):
                feature = flagged[j]
                selected[feature] = True
                m2_row[feature] = 0.0
                stored[feature] = 0
            for position in range(start, stop):
                row = order[position]
                for k in range(indptr[row], indptr[row + 1]):
                    column = np.uintp(indices[k])
                    value = np.float64(data[k])
                    if selected[column] and value != 0.0:
                        deviation = value - mean_row[column]
                        m2_row[column] += deviation * deviation
                        stored[column] += 1
            for j in range(n_flagged):
                feature = flagged[j]
                selected[feature] = False
                m2_row[feature] += (n_rows - stored[feature]) * mean_row[feature] ** 2
            continue
        if not means_finite:
            # Non-finite data: plain sums, as the two-pass method takes them.
            mean_row[:] = 0.0
            for position in range(start, stop):
                row = order[position]
                for k in range(indptr[row], indptr[row + 1]):
                    if np.float64(data[k]) != 0.0:
                        mean_row[np.uintp(indices[k])] += np.float64(data[k])
            for feature in range(n_features):
                mean_row[feature] /= n_rows
        m2_row[:] = 0.0
        stored[:] = 0
        for position in range(start, stop):
            row = order[position]
            for k in range(indptr[row], indptr[row + 1]):
                column = np.uintp(indices[k])
                value = np.float64(data[k])
                if value == 0.0:
                    continue
                deviation = value - mean_row[column]
                m2_row[column] += deviation * deviation
                stored[column] += 1
        for feature in range(n_features):
            m2_row[feature] += (n_rows - stored[feature]) * mean_row[feature] ** 2
    return no_duplicates


def balanced_group_ranges(
    indptr: np.ndarray,
    order: np.ndarray,
    group_starts: np.ndarray,
    n_features: int,
    n_workers: int,
) -> np.ndarray:
    """Split the groups into contiguous ranges of about equal work, one per thread.

    Parameters
    ----------
    indptr
        Row offsets of the CSR matrix.
    order, group_starts, n_features
        As for :func:`csr_group_moments`.
    n_workers
        Number of ranges (the threads a kernel may use).

    Returns
    -------
    numpy.ndarray
        ``n_workers + 1`` non-decreasing group boundaries (int64), from 0 to ``n_groups``.

    """
    n_groups = group_starts.shape[0] - 1
    n_workers = max(1, int(n_workers))
    # A static split by group count would leave one thread with the large control
    # groups; work is a group's stored entries plus its sweeps over the features.
    owned = order[group_starts[0] : group_starts[-1]]
    entries_before = np.zeros(owned.shape[0] + 1, dtype=np.int64)
    np.cumsum(indptr[owned + 1] - indptr[owned], out=entries_before[1:])
    group_entries = np.diff(entries_before[group_starts - group_starts[0]])
    work = np.zeros(n_groups + 1)
    np.cumsum(group_entries + n_features * (np.diff(group_starts) > 0), out=work[1:])
    bounds = np.searchsorted(work, np.linspace(0.0, work[-1], n_workers + 1))
    bounds[0], bounds[-1] = 0, n_groups
    return np.maximum.accumulate(bounds.astype(np.int64))


@numba.njit(cache=True, nogil=True)
def scan_values(values: np.ndarray) -> tuple[int, float, float, bool]:
    """One pass over a flat array: non-finite count, finite min and max, all-integer flag."""
    nonfinite = 0
    minimum = np.inf
    maximum = -np.inf
    integral = True
    for i in range(values.shape[0]):
        value = np.float64(values[i])
        if not np.isfinite(value):
            nonfinite += 1
            continue
        if value < minimum:
            minimum = value
        if value > maximum:
            maximum = value
        if integral and value != np.floor(value):
            integral = False
    return nonfinite, minimum, maximum, integral
