"""Mann-Whitney U (Wilcoxon rank-sum) tests of many target groups against sorted references.

Every rank test of the package is a target group against a reference group sorted
once per gene (:class:`ReferenceRankTest`): cell-eval's tables of each prediction
against the control cells, and the ``wilcoxon`` DE method (:func:`wilcoxon_all`).
Against the control, each perturbation is tested against the control cells sorted
once. Against the rest, the reference of perturbation ``k`` is every other perturbed
cell of its covariate group; all of them (``k``'s included) form one pool sorted
once, and ``k``'s counts against the pool lose its own cells' share, which follows
from its cell count alone (a group's values, counted against themselves, sum to
``n^2 / 2``). Testing one half of ``k``, the other half is taken out of the pool by
counting it against the pool and against the tested half. Only nonzero values are
sorted and searched: zeros are counted. The counts are exact, so the statistics are
those of the pooled ranking, and the p-values :func:`scipy.stats.mannwhitneyu`'s
(``method="asymptotic", use_continuity=False``).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import scipy.sparse as sp
from scipy import special

from scperteval.data.dataset import Dataset
from scperteval.data.layout import GroupLayout
from scperteval.kernels.threads import Threads

__all__ = ["ReferenceRankTest", "wilcoxon_against", "wilcoxon_all"]

#: Genes per thread at least: smaller ranges cost more to hand over than they save.
MIN_GENES_PER_THREAD = 64


def _run_on_genes(kernel: Any, n_genes: int, threads: Threads) -> None:
    threads.run_ranges(
        kernel, threads.even_bounds(n_genes, max(1, n_genes // MIN_GENES_PER_THREAD))
    )


def _tie_size(count: np.ndarray) -> np.ndarray:
    return count**3 - count


def _nonzero_by_gene(
    cells: Any, rows: np.ndarray | None
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Some rows' nonzero values gene after gene, with per gene their zeros and negatives.

    Returns ``(values, bounds, zeros, negative)``: gene ``g``'s values are
    ``values[bounds[g]:bounds[g + 1]]`` (a fresh float64 array); stored zeros and
    ``-0.0`` count as zeros.
    """
    n_genes = cells.shape[1]
    if not sp.issparse(cells):
        dense = np.asarray(cells if rows is None else cells[rows], dtype=np.float64).T
        kept = dense != 0.0
        values = dense[kept]
        counts = kept.sum(axis=1)
        negative = (dense < 0.0).sum(axis=1).astype(np.float64)
        zeros = (dense.shape[1] - counts).astype(np.float64)
        return values, np.r_[0, np.cumsum(counts)].astype(np.int64), zeros, negative
    from scperteval.kernels.rank_counts import gather_by_gene

    csr = sp.csr_matrix(cells)
    if not csr.has_canonical_format:
        csr = csr.copy()
        csr.sum_duplicates()
    rows = np.arange(csr.shape[0]) if rows is None else np.asarray(rows, dtype=np.int64)
    values, bounds, negative = gather_by_gene(csr.data, csr.indices, csr.indptr, rows, n_genes)
    return values, bounds, rows.size - np.diff(bounds).astype(np.float64), negative


class ReferenceRankTest:
    """A reference group, sorted once per gene, to test many target groups against.

    Parameters
    ----------
    reference
        Cells x genes of the reference group (dense or scipy sparse), finite.
    rows
        The reference group's rows of ``reference`` (default: all of them).
    threads
        The run's kernel threads, over whose cores the genes are spread (its own
        when omitted).

    Attributes
    ----------
    n_reference, n_genes
        The reference's shape.
    tie_term
        Per gene, the sum over the reference's ties of ``t^3 - t``.

    """

    def __init__(
        self, reference: Any, rows: np.ndarray | None = None, threads: Threads | None = None
    ) -> None:
        if not sp.issparse(reference):
            reference = np.asarray(reference, dtype=np.float64)
        if reference.ndim != 2:
            raise ValueError(f"reference must be two-dimensional, got shape {reference.shape}")
        # numba is imported on first use: runs without rank tests never load it.
        from scperteval.kernels.rank_counts import sort_genes

        self.threads = threads or Threads()
        self.n_reference = int(reference.shape[0] if rows is None else len(rows))
        self.n_genes = int(reference.shape[1])
        values, bounds, self._zeros, self._negative = _nonzero_by_gene(reference, rows)
        nonzero_ties = np.zeros(self.n_genes)
        _run_on_genes(
            lambda a, b: sort_genes(values, bounds, nonzero_ties, a, b), self.n_genes, self.threads
        )
        self._values, self._bounds = values, bounds
        self.tie_term = nonzero_ties + _tie_size(self._zeros)

    def test(self, target: Any) -> tuple[np.ndarray, np.ndarray]:
        """Two-sided test of one target group against the reference, every gene.

        Parameters
        ----------
        target
            Cells x genes (dense or scipy sparse) with the reference's genes.

        Returns
        -------
        tuple of numpy.ndarray
            The standardised statistic ``z = (U - n1 n2 / 2) / sigma`` (positive when
            the target ranks higher, ties corrected) and the two-sided p-value per gene,
            as :func:`scipy.stats.mannwhitneyu` with ``method="asymptotic",
            use_continuity=False``. A gene constant across both groups has
            ``z = 0, p = 1``.

        Raises
        ------
        ValueError
            If the target's genes differ in number from the reference's.

        """
        z, p = self.test_groups(target, np.array([0, target.shape[0]]))
        return z[0], p[0]

    def test_groups(self, cells: Any, row_bounds: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """:meth:`test` of several target groups, stacked, in one pass over the genes.

        Parameters
        ----------
        cells
            Cells x genes (dense or scipy sparse) of the target groups, one after the
            other.
        row_bounds
            Group ``t`` is rows ``row_bounds[t]`` to ``row_bounds[t + 1]`` of ``cells``.

        Returns
        -------
        tuple of numpy.ndarray
            Statistics and p-values, shape ``(n_groups, n_genes)``.

        """
        u_statistic, tie_change = self.counts(cells, row_bounds, within_reference=False)
        sizes = np.diff(row_bounds)[:, None]
        return _normal_approximation(
            u_statistic, self.tie_term + tie_change, sizes, self.n_reference
        )

    def counts(
        self, cells: Any, row_bounds: np.ndarray, within_reference: bool
    ) -> tuple[np.ndarray, np.ndarray]:
        """Per target group and gene, its count of reference values below it, and the tie change.

        Parameters
        ----------
        cells
            Cells x genes (dense or scipy sparse) of the target groups, stacked.
        row_bounds
            Group ``t`` is rows ``row_bounds[t]`` to ``row_bounds[t + 1]`` of ``cells``.
        within_reference
            Whether the groups' cells are among the reference's (taken out of it in
            the tie term) rather than added to them.

        Returns
        -------
        tuple of numpy.ndarray
            Shape ``(n_groups, n_genes)``: the sum over each group's values of the
            reference values below plus half of those equal (the U statistic of a
            group disjoint from the reference), and the change that turns the
            reference's tie term into that of the reference with the group's cells
            added, or taken out ``within_reference``.

        Raises
        ------
        ValueError
            If the groups' genes differ in number from the reference's.

        """
        from scperteval.kernels.rank_counts import rank_counts

        if cells.shape[1] != self.n_genes:
            raise ValueError(f"target has {cells.shape[1]} genes, reference {self.n_genes}")
        csc = sp.csc_matrix(cells)
        if csc.dtype not in (np.float32, np.float64):
            csc = csc.astype(np.float64)
        if not csc.has_canonical_format:
            csc = csc.copy()
            csc.sum_duplicates()
        row_bounds = np.asarray(row_bounds, dtype=np.int64)
        shape = (row_bounds.size - 1, self.n_genes)
        below, tie_change = np.empty(shape), np.empty(shape)
        nonzero, positive = np.empty(shape), np.empty(shape)

        def kernel(start: int, stop: int) -> None:
            rank_counts(
                self._values,
                self._bounds,
                csc.data,
                csc.indices,
                csc.indptr,
                row_bounds,
                within_reference,
                below,
                tie_change,
                nonzero,
                positive,
                start,
                stop,
            )

        _run_on_genes(kernel, self.n_genes, self.threads)
        zeros = np.diff(row_bounds)[:, None] - nonzero
        # The kernel counts nonzero reference values; zeros are below every positive value.
        below += positive * self._zeros
        below += zeros * (self._negative + 0.5 * self._zeros)
        pooled_zeros = self._zeros - zeros if within_reference else self._zeros + zeros
        tie_change += np.where(zeros > 0, _tie_size(pooled_zeros) - _tie_size(self._zeros), 0.0)
        return below, tie_change


def _normal_approximation(
    u_statistic: np.ndarray, tie_term: np.ndarray, n_target: Any, n_reference: Any
) -> tuple[np.ndarray, np.ndarray]:
    """The z and two-sided p of U, tie-corrected normal approximation, no continuity correction."""
    total = n_target + n_reference
    variance = n_target * n_reference / 12.0 * ((total + 1) - tie_term / (total * (total - 1)))
    with np.errstate(divide="ignore", invalid="ignore"):
        z = (u_statistic - n_target * n_reference / 2.0) / np.sqrt(variance)
    z = np.where(np.isfinite(z), z, 0.0)
    return z, np.minimum(2.0 * special.ndtr(-np.abs(z)), 1.0)


#: Target cells read and counted at a time (bounds the memory of their copy).
BATCH_CELLS = 10_000


def _batches(layout: GroupLayout, conditions: np.ndarray, half: str) -> list[np.ndarray]:
    """The conditions in consecutive batches of at most :data:`BATCH_CELLS` target cells."""
    sizes = np.array([layout.positions(int(k), half).size for k in conditions])
    batch_of = np.cumsum(sizes) // BATCH_CELLS
    return [conditions[batch_of == b] for b in np.unique(batch_of)]


def _stacked(
    dataset: Dataset, layout: GroupLayout, batch: np.ndarray, half: str
) -> tuple[Any, np.ndarray]:
    """The cells of a batch of conditions, one condition after the other, and their bounds."""
    positions = [layout.positions(int(k), half) for k in batch]
    bounds = np.r_[0, np.cumsum([p.size for p in positions])]
    return dataset.rows(np.concatenate(positions)), bounds


def wilcoxon_all(
    dataset: Dataset,
    layout: GroupLayout,
    reference: str,
    half: str,
    threads: Threads | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Mann-Whitney z statistics and p-values of every condition vs its reference.

    Parameters
    ----------
    dataset
        The dataset whose rows are read.
    layout
        The statistic group of each cell (conditions, halves, controls).
    reference
        ``control`` (the control cells of the condition's covariate group) or
        ``rest`` (the cells of every other condition of that group, both halves).
    half
        Target cells: ``all``, ``truth`` or ``duplicate``.
    threads
        The run's kernel threads (its own for the call when omitted).

    Returns
    -------
    tuple of numpy.ndarray
        Statistics and p-values, shape ``(n_conditions, n_genes)``, as
        :meth:`ReferenceRankTest.test` of the target cells against the reference cells.

    """
    threads = threads or Threads()
    statistic = np.zeros((layout.n_conditions, dataset.n_genes))
    pvalue = np.ones((layout.n_conditions, dataset.n_genes))
    other_half = {"truth": "duplicate", "duplicate": "truth"}.get(half)
    for covariate in range(len(layout.covariates)):
        conditions = np.flatnonzero(layout.condition_covariate == covariate)
        if conditions.size == 0:
            continue
        if reference == "control":
            control = layout.control_positions(covariate)
            _test_against(dataset, layout, control, conditions, half, threads, statistic, pvalue)
            continue
        pool_positions = np.sort(np.concatenate([layout.positions(int(k)) for k in conditions]))
        resident = dataset.resident_csr()
        if resident is None:
            pool = ReferenceRankTest(dataset.rows(pool_positions), threads=threads)
        else:  # Sorted from the matrix in memory, without a copy of its rows.
            pool = ReferenceRankTest(resident, pool_positions, threads)
        del pool_positions
        for batch in _batches(layout, conditions, half):
            cells, bounds = _stacked(dataset, layout, batch, half)
            # Counted against the pool, a target's own values add n^2 / 2.
            u_statistic = pool.counts(cells, bounds, within_reference=True)[0]
            n_target = np.diff(bounds)[:, None]
            u_statistic -= n_target**2 / 2.0
            tie_term = pool.tie_term
            n_own = n_target
            if other_half is not None:
                others, other_bounds = _stacked(dataset, layout, batch, other_half)
                tie_term = tie_term + pool.counts(others, other_bounds, within_reference=True)[1]
                for row, (a, b) in enumerate(zip(bounds[:-1], bounds[1:], strict=True)):
                    own_other = ReferenceRankTest(
                        others[other_bounds[row] : other_bounds[row + 1]], threads=threads
                    )
                    u_statistic[row] -= own_other.counts(
                        cells[a:b], np.array([0, b - a]), within_reference=False
                    )[0][0]
                n_own = n_own + np.diff(other_bounds)[:, None]
            statistic[batch], pvalue[batch] = _normal_approximation(
                u_statistic, tie_term, n_target, pool.n_reference - n_own
            )
    return statistic, pvalue


def wilcoxon_against(
    dataset: Dataset,
    layout: GroupLayout,
    pools: list[tuple[np.ndarray, np.ndarray]],
    half: str,
    threads: Threads | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Mann-Whitney tests of sets of conditions, each set against its own reference cells.

    Parameters
    ----------
    dataset, layout
        As for :func:`wilcoxon_all`.
    pools
        ``(conditions, reference_positions)`` pairs: the conditions tested against
        the cells at ``reference_positions`` (sorted once per pair). A condition
        is in one pair at most.
    half, threads
        As for :func:`wilcoxon_all`.

    Returns
    -------
    tuple of numpy.ndarray
        Statistics and p-values, shape ``(n_conditions, n_genes)``, as
        :meth:`ReferenceRankTest.test`; NaN in the rows of conditions no pair tests.

    """
    threads = threads or Threads()
    statistic = np.full((layout.n_conditions, dataset.n_genes), np.nan)
    pvalue = np.full((layout.n_conditions, dataset.n_genes), np.nan)
    for conditions, reference_positions in pools:
        if conditions.size and reference_positions.size:
            _test_against(
                dataset, layout, reference_positions, conditions, half, threads, statistic, pvalue
            )
    return statistic, pvalue


def _test_against(
    dataset: Dataset,
    layout: GroupLayout,
    reference_positions: np.ndarray,
    conditions: np.ndarray,
    half: str,
    threads: Threads,
    statistic: np.ndarray,
    pvalue: np.ndarray,
) -> None:
    """Test ``conditions`` against the cells at ``reference_positions``, into the two tables."""
    reference = ReferenceRankTest(dataset.rows(reference_positions), threads=threads)
    for batch in _batches(layout, conditions, half):
        statistic[batch], pvalue[batch] = reference.test_groups(
            *_stacked(dataset, layout, batch, half)
        )
