"""Rank-sum counts of a target group against a sorted reference, by one merge per gene.

A Mann-Whitney U statistic of a target group against a fixed reference needs, for each
target value, the number of reference values below it and equal to it. With the
reference's nonzero values sorted per gene and the target's sorted likewise, one walk
along both gives every count; a binary search per target value would revisit the
reference ``log n`` times. The counts are integers (halves for ties), exact in float64,
so the result does not depend on the order of the additions.
"""

from __future__ import annotations

import numba
import numpy as np


@numba.njit(cache=True, nogil=True)
def rank_counts_by_gene(
    reference_values: np.ndarray,
    reference_bounds: np.ndarray,
    target_values: np.ndarray,
    target_bounds: np.ndarray,
    u_statistic: np.ndarray,
    tie_change: np.ndarray,
) -> None:
    """Add each gene's nonzero target values' share of U and of the pooled tie term.

    Parameters
    ----------
    reference_values
        The reference's nonzero values, gene after gene, sorted within each gene
        (float64).
    reference_bounds
        Gene ``g``'s reference values are ``reference_values[reference_bounds[g]:
        reference_bounds[g + 1]]`` (int64, genes + 1).
    target_values
        The target's nonzero values, gene after gene, in any order within a gene
        (float64); sorted in place.
    target_bounds
        As ``reference_bounds``, for ``target_values``.
    u_statistic
        Per gene, incremented by the sum over its nonzero target values ``v`` of the
        nonzero reference values below ``v`` plus half of those equal to ``v``; the
        reference's zeros are the caller's to count.
    tie_change
        Per gene, incremented by ``(a + b)^3 - (a + b) - (a^3 - a)`` for every distinct
        nonzero target value shared by ``b`` target and ``a`` reference values.

    """
    n_genes = target_bounds.size - 1
    for gene in range(n_genes):
        start, stop = target_bounds[gene], target_bounds[gene + 1]
        if stop == start:
            continue
        target = target_values[start:stop]
        target.sort()
        position = reference_bounds[gene]
        end = reference_bounds[gene + 1]
        total = 0.0
        ties = 0.0
        index = 0
        count = stop - start
        while index < count:
            value = target[index]
            run = 1
            while index + run < count and target[index + run] == value:
                run += 1
            while position < end and reference_values[position] < value:
                position += 1
            equal = 0
            while position + equal < end and reference_values[position + equal] == value:
                equal += 1
            below = position - reference_bounds[gene]
            total += run * (below + 0.5 * equal)
            pooled = equal + run
            ties += float(pooled) ** 3 - pooled - (float(equal) ** 3 - equal)
            index += run
        u_statistic[gene] += total
        tie_change[gene] += ties
