"""Rank-sum counts of target groups against a reference sorted once per gene.

A Mann-Whitney U statistic needs, for each target value, the number of reference
values below it and equal to it. The reference's nonzero values are gathered by gene
(:func:`gather_by_gene`) and sorted once per gene (:func:`sort_genes`); then, gene
after gene, every target group's nonzero values are sorted and found in the
reference's by binary search (:func:`rank_counts`), the gene's reference values
staying in cache for all the groups. The counts are integers (halves for ties),
exact in float64, so the result does not depend on the order of the additions. The
kernels on a range of genes release the GIL, for
:func:`~scperteval.kernels.threads.run_ranges`.
"""

from __future__ import annotations

import numba
import numpy as np


@numba.njit(cache=True, nogil=True)
def _tie_size(count: float) -> float:
    """``t^3 - t`` of a tie of ``count`` values."""
    return count * count * count - count


@numba.njit(cache=True, nogil=True)
def _first_index(values: np.ndarray, start: int, stop: int, value: float, above: bool) -> int:
    """First index of sorted ``values[start:stop]`` past the values below ``value``.

    With ``above``, past the values equal to ``value`` too; ``stop`` when none is left.

    The halving is written as arithmetic, not a branch: the comparisons of a search
    are unpredictable, and a mispredicted branch costs more than the whole step.
    """
    if stop <= start:
        return start
    base = start
    length = stop - start
    while length > 1:
        half = length >> 1
        probe = values[base + half]
        base += half * ((probe < value) | (above & (probe == value)))
        length -= half
    probe = values[base]
    return base + ((probe < value) | (above & (probe == value)))


@numba.njit(cache=True, nogil=True)
def gather_by_gene(
    data: np.ndarray, indices: np.ndarray, indptr: np.ndarray, rows: np.ndarray, n_genes: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The nonzero values of some rows of a CSR matrix, gene after gene.

    Parameters
    ----------
    data, indices, indptr
        A CSR matrix without duplicate entries (stored zeros allowed).
    rows
        The rows to gather.
    n_genes
        Its number of columns.

    Returns
    -------
    tuple of numpy.ndarray
        ``(values, bounds, negative)``: gene ``g``'s nonzero values are
        ``values[bounds[g]:bounds[g + 1]]`` (float64, in row order), and
        ``negative[g]`` counts those below zero.

    """
    bounds = np.zeros(n_genes + 1, dtype=np.int64)
    for row in rows:
        for entry in range(indptr[row], indptr[row + 1]):
            if data[entry] != 0.0:
                bounds[indices[entry] + 1] += 1
    for gene in range(n_genes):
        bounds[gene + 1] += bounds[gene]
    filled = bounds[:-1].copy()
    values = np.empty(bounds[-1], dtype=np.float64)
    negative = np.zeros(n_genes)
    for row in rows:
        for entry in range(indptr[row], indptr[row + 1]):
            value = data[entry]
            if value != 0.0:
                gene = indices[entry]
                values[filled[gene]] = value
                filled[gene] += 1
                negative[gene] += value < 0.0
    return values, bounds, negative


@numba.njit(cache=True, nogil=True)
def sort_genes(
    values: np.ndarray, bounds: np.ndarray, tie_term: np.ndarray, start: int, stop: int
) -> None:
    """Sort each gene's values in place and sum ``t^3 - t`` over their runs of ties.

    Parameters
    ----------
    values
        Nonzero values, gene after gene (float64); gene ``g``'s are
        ``values[bounds[g]:bounds[g + 1]]``.
    bounds
        Gene boundaries (int64, genes + 1).
    tie_term
        Per gene, set to the sum over runs of equal values of ``t^3 - t``.
    start, stop
        The range of genes.

    """
    for gene in range(start, stop):
        segment = values[bounds[gene] : bounds[gene + 1]]
        segment.sort()
        total = 0.0
        index = 0
        while index < segment.size:
            run = 1
            while index + run < segment.size and segment[index + run] == segment[index]:
                run += 1
            total += _tie_size(float(run))
            index += run
        tie_term[gene] = total


@numba.njit(cache=True, nogil=True)
def rank_counts(
    reference_values: np.ndarray,
    reference_bounds: np.ndarray,
    data: np.ndarray,
    indices: np.ndarray,
    indptr: np.ndarray,
    row_bounds: np.ndarray,
    within_reference: bool,
    below: np.ndarray,
    tie_change: np.ndarray,
    nonzero: np.ndarray,
    positive: np.ndarray,
    start: int,
    stop: int,
) -> None:
    """Each target group's share of U and of the pooled tie term, from its nonzero values.

    The genes are the outer loop, so that a gene's reference values stay in cache
    while every target group is counted against them.

    Parameters
    ----------
    reference_values
        The reference's nonzero values, gene after gene, sorted within each gene
        (float64, see :func:`sort_genes`).
    reference_bounds
        Gene ``g``'s reference values are ``reference_values[reference_bounds[g]:
        reference_bounds[g + 1]]`` (int64, genes + 1).
    data, indices, indptr
        The target groups' cells as a CSC matrix with sorted row indices (stored
        zeros allowed).
    row_bounds
        Target group ``t`` is rows ``row_bounds[t]`` to ``row_bounds[t + 1]``.
    within_reference
        ``False``: the target's cells are added to the reference's in the pooled tie
        term; ``True``: they are among the reference's cells, and taken out of it.
    below
        Target groups x genes, set to the sum over the nonzero target values ``v`` of
        the nonzero reference values below ``v`` plus half of those equal to ``v``;
        the reference's zeros are the caller's to count.
    tie_change
        Target groups x genes, set to the sum of ``(a ± b)^3 - (a ± b) - (a^3 - a)``
        over the distinct nonzero target values, each shared by ``b`` target and
        ``a`` reference values (``+`` added, ``-`` taken out).
    nonzero, positive
        Target groups x genes, set to the counts of nonzero and of positive values.
    start, stop
        The range of genes.

    """
    sign = -1.0 if within_reference else 1.0
    longest = 0
    for gene in range(start, stop):
        longest = max(longest, indptr[gene + 1] - indptr[gene])
    scratch = np.empty(longest, dtype=np.float64)
    for gene in range(start, stop):
        first = reference_bounds[gene]
        end = reference_bounds[gene + 1]
        entry = indptr[gene]
        last_entry = indptr[gene + 1]
        for group in range(row_bounds.size - 1):
            count = 0
            n_positive = 0
            while entry < last_entry and indices[entry] < row_bounds[group + 1]:
                value = data[entry]
                if value != 0.0:
                    scratch[count] = value
                    count += 1
                    n_positive += value > 0.0
                entry += 1
            target = scratch[:count]
            target.sort()
            position = first
            total = 0.0
            ties = 0.0
            index = 0
            while index < count:
                value = target[index]
                run = 1
                while index + run < count and target[index + run] == value:
                    run += 1
                position = _first_index(reference_values, position, end, value, False)
                after = position
                if position < end and reference_values[position] == value:
                    after = _first_index(reference_values, position, end, value, True)
                equal = float(after - position)
                total += run * (position - first + 0.5 * equal)
                ties += _tie_size(equal + sign * run) - _tie_size(equal)
                position = after
                index += run
            below[group, gene] = total
            tie_change[group, gene] = ties
            nonzero[group, gene] = count
            positive[group, gene] = n_positive
