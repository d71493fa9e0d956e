"""Compiled merges of group statistics (see :mod:`scperteval.stats.groups`).

Each kernel performs the floating-point operations of the vectorised formulas
it replaces in the same order, so results are identical; what it saves is the
temporaries (several arrays of groups x genes per step) and the Python loop over
groups.
"""

from __future__ import annotations

import numba
import numpy as np

__all__ = ["merge_group_rows"]


@numba.njit(cache=True, nogil=True)
def _combine_into(
    n_a: float,
    mean_a: np.ndarray,
    m2_a: np.ndarray,
    n_b: float,
    mean_b: np.ndarray,
    m2_b: np.ndarray,
    out_mean: np.ndarray,
    out_m2: np.ndarray,
) -> float:
    """Chan's pairwise update (``GroupStats.combine``); ``out`` may alias ``a`` or ``b``."""
    total = n_a + n_b
    weight = n_b / (total if total > 0 else 1.0)
    spread = n_a * weight
    for feature in range(mean_a.shape[0]):
        delta = mean_b[feature] - mean_a[feature]
        out_m2[feature] = m2_a[feature] + m2_b[feature] + delta * delta * spread
        out_mean[feature] = mean_a[feature] + delta * weight
    return total


@numba.njit(cache=True, nogil=True)
def merge_group_rows(
    n: np.ndarray,
    mean: np.ndarray,
    m2: np.ndarray,
    members: np.ndarray,
    starts: np.ndarray,
    out_n: np.ndarray,
    out_mean: np.ndarray,
    out_m2: np.ndarray,
    first_feature: int,
    stop_feature: int,
    leave_one_out: bool,
) -> None:
    """Pool groups by label (``members[starts[k]:starts[k + 1]]``, ascending).

    Without ``leave_one_out``, output ``k`` gathers label ``k``'s groups:
    ``M2 = sum_g (M2_g + n_g (mean_g - mean)^2)``, the sums taken from 0 in the
    order of ``members`` (ascending group numbers, as a CSR indicator product).

    With ``leave_one_out``, output ``i`` holds, per input group, the pooled
    statistics of the other groups of its label: suffix pools are built from the
    last member down, then prefix pools from the first up; group ``i``'s result is
    ``prefix_i`` combined with ``suffix_i``. Only merges, never a subtraction, so no
    cancellation.

    Parameters
    ----------
    n, mean, m2
        Input counts ``(groups,)``, means and centred sums of squares
        ``(groups, features)``.
    members, starts
        Input groups sorted by label, and offsets (``labels + 1``).
    out_n, out_mean, out_m2
        Outputs, one row per label (per input group with ``leave_one_out``).
    first_feature, stop_feature
        The features computed by this call (threads take disjoint ranges).
    leave_one_out
        Which of the two pools to compute (tested once, outside the loops).

    """
    if not leave_one_out:
        for k in range(starts.shape[0] - 1):
            total = 0.0
            row_mean = out_mean[k, first_feature:stop_feature]
            row_m2 = out_m2[k, first_feature:stop_feature]
            row_mean[:] = 0.0
            row_m2[:] = 0.0
            for position in range(starts[k], starts[k + 1]):
                group = members[position]
                count = n[group]
                total += count
                group_mean = mean[group, first_feature:stop_feature]
                for feature in range(row_mean.shape[0]):
                    row_mean[feature] += group_mean[feature] * count
            out_n[k] = total
            safe = total if total > 0 else 1.0
            for feature in range(row_mean.shape[0]):
                row_mean[feature] /= safe
            for position in range(starts[k], starts[k + 1]):
                group = members[position]
                count = n[group]
                group_mean = mean[group, first_feature:stop_feature]
                group_m2 = m2[group, first_feature:stop_feature]
                for feature in range(row_mean.shape[0]):
                    delta = group_mean[feature] - row_mean[feature]
                    row_m2[feature] += group_m2[feature] + count * (delta * delta)
        return
    lo, hi = first_feature, stop_feature
    prefix_mean = np.empty(hi - lo)
    prefix_m2 = np.empty(hi - lo)
    for k in range(starts.shape[0] - 1):
        first, stop = starts[k], starts[k + 1]
        if stop == first:
            continue
        # Each member's output row first holds the pool of the members after it
        # (built from the last member down), then is combined with the pool of
        # the members before it.
        # Counts are kept apart: threads over other features read the same ones.
        counts = np.empty(stop - first)
        last = members[stop - 1]
        counts[stop - 1 - first] = 0.0
        out_mean[last, lo:hi] = 0.0
        out_m2[last, lo:hi] = 0.0
        for i in range(stop - 1, first, -1):
            after, group = members[i], members[i - 1]
            counts[i - 1 - first] = _combine_into(
                counts[i - first],
                out_mean[after, lo:hi],
                out_m2[after, lo:hi],
                n[after],
                mean[after, lo:hi],
                m2[after, lo:hi],
                out_mean[group, lo:hi],
                out_m2[group, lo:hi],
            )
        prefix_n = 0.0
        prefix_mean[:] = 0.0
        prefix_m2[:] = 0.0
        for i in range(first, stop):
            group = members[i]
            total = _combine_into(
                prefix_n,
                prefix_mean,
                prefix_m2,
                counts[i - first],
                out_mean[group, lo:hi],
                out_m2[group, lo:hi],
                out_mean[group, lo:hi],
                out_m2[group, lo:hi],
            )
            if lo == 0:
                out_n[group] = total
            prefix_n = _combine_into(
                prefix_n,
                prefix_mean,
                prefix_m2,
                n[group],
                mean[group, lo:hi],
                m2[group, lo:hi],
                prefix_mean,
                prefix_m2,
            )
