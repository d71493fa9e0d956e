"""Permutation tests of whether each group differs from a reference group.

For a group ``g`` (``n`` cells) and the reference ``r`` (``m`` cells), the
``N = n + m`` cells are pooled and relabelled at random ``B`` times: permutation
``b`` is ``rng.permutation(N)``, whose first ``n`` entries index the relabelled
group and the rest the relabelled reference, with ``rng`` the
:func:`numpy.random.default_rng` of ``derive_seed(seed, covariate, group)``
(:func:`scperteval.data.halves.derive_seed`), so that every group's permutations
depend on nothing else (not on the order of groups, nor on the threads). With
``k`` permutations whose distance is at least the observed one, the p-value is
``(k + 1) / (B + 1)``, which is never 0 and is valid at every ``B``.

One precomputation serves every permutation. For distances that are block sums of
a pair function (:class:`~scperteval.distances._kernel.PairKernelDistance`: energy
distances, MMD, mean pairwise), the pooled matrix ``K`` of the pair function is
formed once (in memory up to ``max_matrix_bytes``), with its row sums ``r``, total
and diagonal; a permutation then only needs the sum of ``K`` over the pairs of its
smaller side ``S``: ``S_SS``, from which ``S_cross = r_S - S_SS`` and
``S_TT = total - 2 r_S + S_SS`` follow. When ``K`` would not fit, only ``r`` is
kept (computed in tiles) and ``S_SS`` is recomputed from the cells of ``S``, which
costs ``min(n, m)^2`` pairs per permutation rather than ``N^2``. Other distances are
recomputed on each relabelled split.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import numba
import numpy as np
import pandas as pd

from scperteval.data.halves import derive_seed
from scperteval.distances._api import _pairwise_only, _run, against_reference, check_n_jobs
from scperteval.distances._base import Distance, Group
from scperteval.distances._kernel import BlockSums, PairKernelDistance
from scperteval.distances._mmd import MMD
from scperteval.errors import SpecError
from scperteval.stats.multiple_testing import CORRECTIONS, adjust

__all__ = ["permutation_test", "permutations"]

#: Largest pair matrix held in memory by default (pooled here, per group in the bootstrap).
MAX_MATRIX_BYTES = 256 * 2**20
_TILE_BYTES = 32 * 2**20


def permutations(seed: int, covariate: str, group: str, n_cells: int, count: int) -> np.ndarray:
    """The ``count`` permutations of ``n_cells`` pooled cells used for one group.

    Parameters
    ----------
    seed
        The test's seed.
    covariate, group
        Names the permutations are derived from (:data:`ALL` without covariates).
    n_cells
        Pooled cells (group first, then reference).
    count
        Number of permutations.

    Returns
    -------
    numpy.ndarray
        ``count x n_cells`` int64 array; row ``b`` is ``rng.permutation(n_cells)``.

    """
    rng = np.random.default_rng(derive_seed(int(seed), str(covariate), str(group)))
    out = np.empty((int(count), int(n_cells)), dtype=np.int64)
    for b in range(int(count)):
        out[b] = rng.permutation(n_cells)
    return out


@numba.njit(cache=True, nogil=True)
def _block_sums(matrix: np.ndarray, sides: np.ndarray, out: np.ndarray) -> None:
    """``out[b] = sum_{i, j in sides[b]} matrix[i, j]`` for every row ``b`` (symmetric matrix).

    Each row of ``sides`` is sorted, so that the reads of one row of ``matrix`` run
    forwards through memory; the pairs ``j > i`` are summed once and doubled.
    """
    n_rows, size = sides.shape
    for b in range(n_rows):
        side = sides[b]
        upper = 0.0
        diagonal = 0.0
        for i in range(size):
            row = matrix[side[i]]
            diagonal += row[side[i]]
            for j in range(i + 1, size):
                upper += row[side[j]]
        out[b] = 2.0 * upper + diagonal


class _PooledSums:
    """Row sums, total and diagonal of the pooled pair matrix, and block sums of sides."""

    def __init__(
        self,
        measure: PairKernelDistance,
        cells: np.ndarray,
        max_bytes: int,
        reference_block: np.ndarray | None = None,
    ) -> None:
        self.measure = measure
        self.cells = cells
        n = cells.shape[0]
        self.diagonal = measure.diagonal(cells)
        self.matrix: np.ndarray | None = None
        if 8 * n * n <= max_bytes:
            self.matrix = self._matrix(reference_block)
            self.row_sums = self.matrix.sum(axis=1)
        else:
            rows = max(1, _TILE_BYTES // (8 * n))
            self.row_sums = np.empty(n)
            for start in range(0, n, rows):
                stop = min(start + rows, n)
                tile = measure.pair_matrix(cells[start:stop], cells)
                # The same k(c, c) as the stored matrix holds on its diagonal.
                tile[np.arange(stop - start), np.arange(start, stop)] = self.diagonal[start:stop]
                self.row_sums[start:stop] = tile.sum(axis=1)
        self.total = float(self.row_sums.sum())
        self.diagonal_total = float(self.diagonal.sum())

    def _matrix(self, reference_block: np.ndarray | None) -> np.ndarray:
        """The pooled matrix; the reference's block (the last rows) reused when given."""
        if reference_block is None:
            return np.ascontiguousarray(self.measure.pair_matrix(self.cells))
        n = self.cells.shape[0]
        first = n - reference_block.shape[0]
        matrix = np.empty((n, n))
        matrix[:first] = self.measure.pair_matrix(self.cells[:first], self.cells)
        matrix[first:, first:] = reference_block
        matrix[first:, :first] = matrix[:first, first:].T
        # The diagonal as the stored matrix of one cloud holds it (no rounding noise).
        matrix[np.arange(first), np.arange(first)] = self.diagonal[:first]
        return matrix

    def side_sums(self, sides: np.ndarray, n_jobs: int | None) -> np.ndarray:
        """Sum of the pair function over all ordered pairs of each row of ``sides``."""
        out = np.empty(sides.shape[0])
        if self.matrix is not None:
            matrix = self.matrix

            def fill(bounds: tuple[int, int]) -> None:
                _block_sums(matrix, sides[bounds[0] : bounds[1]], out[bounds[0] : bounds[1]])

        else:

            def fill(bounds: tuple[int, int]) -> None:
                for b in range(bounds[0], bounds[1]):
                    out[b] = self.measure.block_sums(Group(self.cells[sides[b]]), None)[0]

        chunks = max(1, min(sides.shape[0], 64))
        edges = [i * sides.shape[0] // chunks for i in range(chunks + 1)]
        _run(list(zip(edges[:-1], edges[1:], strict=True)), fill, n_jobs)
        return out


def _kernel_null(
    measure: PairKernelDistance,
    x: Group,
    y: Group,
    orders: np.ndarray,
    max_bytes: int,
    n_jobs: int | None,
    reference_block: np.ndarray | None = None,
) -> tuple[float, np.ndarray]:
    n, m = x.n, y.n
    used = np.vstack([measure.cells_of(x), measure.cells_of(y)])
    if isinstance(measure, MMD) and measure.bandwidth == "pair_median":
        # The pooled sample, hence its median, is the same for every relabelling.
        measure = copy.copy(measure)
        measure.bandwidth = measure.pair_sigma(x, y)
    sums = _PooledSums(measure, used, max_bytes, reference_block)
    small_is_x = n <= m
    observed_side = np.arange(n) if small_is_x else np.arange(n, n + m)
    sides = orders[:, :n] if small_is_x else orders[:, n:]
    # Sorted, so the block sums read memory forwards; sums do not depend on order.
    all_sides = np.sort(np.vstack([observed_side[None, :], sides]), axis=1)
    block = sums.side_sums(np.ascontiguousarray(all_sides), n_jobs)
    row_part = sums.row_sums[all_sides].sum(axis=1)
    diag_part = sums.diagonal[all_sides].sum(axis=1)
    cross = row_part - block
    other = sums.total - 2.0 * row_part + block
    other_diag = sums.diagonal_total - diag_part
    # combine() is plain arithmetic, so it evaluates every permutation at once.
    small, large = (block, diag_part), (other, other_diag)
    (within_x, diag_x), (within_y, diag_y) = (small, large) if small_is_x else (large, small)
    combined = measure.combine(BlockSums(cross, within_x, within_y, diag_x, diag_y, n, m))
    values = np.asarray(combined, dtype=np.float64)
    return float(values[0]), values[1:]


def fixed_kernel(measure: Distance, ref: Group, max_bytes: int) -> PairKernelDistance | None:
    """``measure`` when it is one pair function whose matrix over ``ref`` fits in ``max_bytes``.

    Parameters
    ----------
    measure
        The fitted distance.
    ref
        The reference group.
    max_bytes
        Largest matrix of the pair function over the reference's cells.

    Returns
    -------
    PairKernelDistance or None
        ``None`` for another distance, a kernel chosen per pair of groups
        (``bandwidth="pair_median"``), or a reference too large.

    """
    per_pair = isinstance(measure, MMD) and measure.bandwidth == "pair_median"
    if isinstance(measure, PairKernelDistance) and not per_pair and 8 * ref.n**2 <= max_bytes:
        return measure
    return None


def _generic_null(
    measure: Distance, x: Group, y: Group, orders: np.ndarray, n_jobs: int | None
) -> tuple[float, np.ndarray]:
    pooled = np.vstack([x.cells, y.cells])
    n = x.n

    def one(order: np.ndarray) -> float:
        gx, gy = Group(pooled[order[:n]], x.shift), Group(pooled[order[n:]], x.shift)
        return measure.between(gx, gy)

    observed = measure.between(Group(x.cells, x.shift), Group(y.cells, y.shift))
    return observed, np.asarray(_run(list(orders), one, n_jobs), dtype=np.float64)


def _check(n_permutations: int, correction: str, alpha: float) -> None:
    if isinstance(n_permutations, bool) or int(n_permutations) < 1:
        raise SpecError(f"n_permutations must be a positive integer, got {n_permutations!r}")
    if correction not in CORRECTIONS:
        raise SpecError(f"unknown correction {correction!r}; known: {', '.join(CORRECTIONS)}")
    if not 0 < float(alpha) < 1:
        raise SpecError(f"alpha must lie in (0, 1), got {alpha!r}")


def permutation_test(
    adata: Any,
    groupby: str,
    reference: str,
    metric: Any = "edistance",
    *,
    n_permutations: int = 1000,
    seed: int = 0,
    correction: str = "holm",
    alpha: float = 0.05,
    groups: Sequence[str] | None = None,
    obsm_key: str | None = None,
    layer: str | None = None,
    space: str | None = None,
    covariate_key: str | None = None,
    subset: Mapping[str, Any] | None = None,
    n_jobs: int | None = None,
    max_matrix_bytes: int = MAX_MATRIX_BYTES,
    normalize: bool = False,
    backed: bool | str = "auto",
) -> pd.DataFrame:
    """Seeded permutation test of every group against the reference (see the module notes).

    Parameters
    ----------
    adata, groupby, reference, metric, groups, obsm_key, layer, space, covariate_key, subset
        As for :func:`~scperteval.distances.onesided`.
    normalize, backed
        As for :func:`~scperteval.distances.pairwise`.
    n_permutations
        Relabellings per group.
    seed
        Seed the permutations of each group are derived from.
    correction
        ``"holm"``, ``"bh"``, ``"bonferroni"`` or ``"none"``, over every group tested
        (all covariate values together); the reference is not a test and is not in
        the family.
    alpha
        Level of the ``significant`` column (on the adjusted p-value).
    n_jobs
        Threads (default: the cores available to scperteval's kernels).
    max_matrix_bytes
        Largest pooled pair matrix held in memory; above it the row sums are
        computed in tiles and each permutation's block sum from the cells.

    Returns
    -------
    pandas.DataFrame
        One row per tested group (the reference left out), indexed like
        :func:`~scperteval.distances.onesided`, with columns ``distance``,
        ``pvalue``, ``pvalue_adj``, ``significant``, ``n_cells`` and
        ``n_reference``.

    Raises
    ------
    SpecError
        For a bad option, distance or space.
    DatasetError
        For a missing reference or group, or too few cells.

    """
    _check(n_permutations, correction, alpha)
    check_n_jobs(n_jobs)
    distance = _pairwise_only(metric, "permutation_test")
    reference = str(reference)
    reading = (obsm_key, layer, space, covariate_key, subset, normalize, backed)

    def rows_of(
        covariate: str, by_label: dict[str, Group], measure: Distance, labels: list[str]
    ) -> Iterator[dict[str, Any]]:
        ref = by_label[reference]
        # The reference's own block of the pooled matrix is the same for every group.
        kernel = fixed_kernel(measure, ref, max_matrix_bytes)
        reference_block = None if kernel is None else kernel.pair_matrix(kernel.cells_of(ref))
        for label in labels:
            x = by_label[label]
            orders = permutations(seed, covariate, label, x.n + ref.n, n_permutations)
            if isinstance(measure, PairKernelDistance):
                observed, null = _kernel_null(
                    measure, x, ref, orders, max_matrix_bytes, n_jobs, reference_block
                )
            else:
                observed, null = _generic_null(measure, x, ref, orders, n_jobs)
            exceed = int(np.count_nonzero(null >= observed))
            yield {
                # The value onesided() reports; the null is compared with the
                # observed value computed the way the null is.
                "distance": measure.between(x, ref),
                "pvalue": (exceed + 1) / (n_permutations + 1),
                "n_cells": x.n,
                "n_reference": ref.n,
            }

    columns = ["distance", "pvalue", "n_cells", "n_reference"]
    table = against_reference(
        distance, adata, groupby, reference, groups, reading, 1, rows_of, columns
    )
    table.insert(2, "pvalue_adj", adjust(table["pvalue"].to_numpy(), correction))
    table.insert(3, "significant", table["pvalue_adj"] < alpha)
    table.attrs["n_permutations"] = int(n_permutations)
    return table
