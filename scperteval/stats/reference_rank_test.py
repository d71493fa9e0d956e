"""Mann-Whitney U tests of many target groups against one fixed reference group.

Comparing every perturbation with the same control cells, the pooled ranking of
:func:`~scperteval.stats.rank_test.mann_whitney` sorts the control again for each
target. Here the reference's nonzero values are sorted once per gene; a target's U
statistic and tie term then come from counting, for each of its values, the reference
values below and equal to it, by one merge of the two sorted lists per gene
(:func:`~scperteval.kernels.rank_counts.rank_counts_by_gene`). The zeros (most of a
sparse matrix) are counted, not walked. The counts are exact integers, so the
statistics and p-values equal :func:`mann_whitney`'s.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import scipy.sparse as sp
from scipy import special

__all__ = ["ReferenceRankTest"]


def _run_lengths_cubed(sorted_columns: np.ndarray) -> np.ndarray:
    """Per column of column-sorted values, the sum over tie runs of ``t^3 - t``."""
    n_rows, n_cols = sorted_columns.shape
    if n_rows == 0:
        return np.zeros(n_cols)
    starts = np.ones(sorted_columns.shape, dtype=bool)
    starts[1:] = sorted_columns[1:] != sorted_columns[:-1]
    flat_starts = np.flatnonzero(starts.T.ravel())
    lengths = np.diff(np.r_[flat_starts, n_rows * n_cols]).astype(np.float64)
    column = flat_starts // n_rows
    return np.bincount(column, weights=lengths**3 - lengths, minlength=n_cols)


class ReferenceRankTest:
    """A reference group, sorted once, to test many target groups against.

    Parameters
    ----------
    reference
        Cells x genes of the reference group (dense), finite.

    """

    def __init__(self, reference: np.ndarray) -> None:
        values = np.asarray(reference, dtype=np.float64)
        if values.ndim != 2:
            raise ValueError(f"reference must be two-dimensional, got shape {values.shape}")
        self.n_reference, self.n_genes = values.shape
        # ``+ 0.0`` turns -0.0 into 0.0, so that both count as zeros.
        ordered = np.sort(values, axis=0) + 0.0
        self._reference_ties = _run_lengths_cubed(ordered)
        zero = ordered == 0.0
        self._zero_count = zero.sum(axis=0).astype(np.float64)
        self._negative_count = (ordered < 0.0).sum(axis=0).astype(np.float64)
        # Gene-major nonzero values, each gene's sorted: column order of ``ordered``.
        nonzero_t = ordered.T[~zero.T]
        self._nonzero = np.ascontiguousarray(nonzero_t, dtype=np.float64)
        self._bounds = np.r_[0, np.cumsum(self.n_reference - zero.sum(axis=0))].astype(np.int64)

    def test(self, target: Any) -> tuple[np.ndarray, np.ndarray]:
        """Two-sided test of one target group against the reference, every gene.

        Parameters
        ----------
        target
            Cells x genes (dense or scipy sparse) with the reference's genes.

        Returns
        -------
        tuple of numpy.ndarray
            The standardised statistic and the two-sided p-value per gene, as
            :func:`~scperteval.stats.rank_test.mann_whitney` (tie-corrected normal
            approximation without continuity correction; a gene constant across both
            groups has ``z = 0, p = 1``).

        Raises
        ------
        ValueError
            If the target's genes differ in number from the reference's.

        """
        n_target = target.shape[0]
        if target.shape[1] != self.n_genes:
            raise ValueError(f"target has {target.shape[1]} genes, reference {self.n_genes}")
        values, bounds, zeros, positive = self._entries(target)
        # The merge counts nonzero reference values; zeros are below every positive value.
        u_statistic = positive * self._zero_count
        ties = self._reference_ties.copy()
        from scperteval.kernels.rank_counts import rank_counts_by_gene

        rank_counts_by_gene(self._nonzero, self._bounds, values, bounds, u_statistic, ties)
        u_statistic += zeros * (self._negative_count + 0.5 * self._zero_count)
        a = self._zero_count
        ties += np.where(zeros > 0, (a + zeros) ** 3 - (a + zeros) - (a**3 - a), 0.0)
        n_reference = self.n_reference
        total = n_target + n_reference
        variance = n_target * n_reference / 12.0 * ((total + 1) - ties / (total * (total - 1)))
        with np.errstate(divide="ignore", invalid="ignore"):
            z = (u_statistic - n_target * n_reference / 2.0) / np.sqrt(variance)
        z = np.where(np.isfinite(z), z, 0.0)
        return z, np.minimum(2.0 * special.ndtr(-np.abs(z)), 1.0)

    def _entries(self, target: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """The target's nonzero values gene after gene, and per gene its zeros and positives.

        Returns ``(values, bounds, zeros, positive)``: gene ``g``'s nonzero values are
        ``values[bounds[g]:bounds[g + 1]]`` (a fresh float64 array, sorted in place by
        the kernel); ``zeros`` and ``positive`` count its zero and positive values.
        """
        if sp.issparse(target):
            csc = sp.csc_matrix(target)
            if not csc.has_canonical_format:
                csc = csc.copy()
                csc.sum_duplicates()
            data = np.asarray(csc.data, dtype=np.float64)
            kept = data != 0.0
            if kept.all():
                values, bounds = data.copy(), csc.indptr.astype(np.int64)
                genes = np.repeat(np.arange(self.n_genes), np.diff(bounds))
            else:
                genes = np.repeat(np.arange(self.n_genes), np.diff(csc.indptr))[kept]
                values = data[kept]
                bounds = np.r_[0, np.cumsum(np.bincount(genes, minlength=self.n_genes))]
        else:
            dense = np.asarray(target, dtype=np.float64).T
            kept = dense != 0.0
            values = dense[kept]
            genes = np.nonzero(kept)[0]
            bounds = np.r_[0, np.cumsum(kept.sum(axis=1))]
        stored = np.diff(bounds).astype(np.float64)
        positive = np.bincount(genes[values > 0.0], minlength=self.n_genes).astype(np.float64)
        return values, bounds.astype(np.int64), target.shape[0] - stored, positive
