"""Mann-Whitney U tests of many target groups against one fixed reference group.

Comparing every perturbation with the same control cells, the pooled ranking of
:func:`~scperteval.stats.rank_test.mann_whitney` sorts the control again for each
target. Here the reference is sorted once per gene; a target's U statistic and tie
term then come from counting, for each of its values, the reference values below and
equal to it, which costs a search per target value. The counts are exact integers,
so the statistics and p-values equal :func:`mann_whitney`'s.

The search is one :func:`numpy.searchsorted` call for all genes at once, on keys
that sort by gene and then by value, so that the reference's sorted columns laid end
to end form one sorted array: for values that float32 holds exactly (the usual
storage of expression), the gene in the high 32 bits of an integer and the value's
order-preserving bit pattern in the low ones; otherwise the complex number
``g + v i`` (complex numbers sort by real, then imaginary part; slower). Sparse
targets are searched only at their stored values; the zeros of each gene are counted
once.
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


def _float32_exact(values: np.ndarray) -> bool:
    return bool(np.array_equal(values.astype(np.float32).astype(np.float64), values))


def _ordered_bits(values: np.ndarray) -> np.ndarray:
    """Unsigned integers that order as the float32 values do (``-0.0`` as ``0.0``)."""
    bits = (np.asarray(values, dtype=np.float32) + np.float32(0.0)).view(np.uint32)
    flip = np.where(bits & np.uint32(0x80000000), np.uint32(0xFFFFFFFF), np.uint32(0x80000000))
    return (bits ^ flip).astype(np.uint64)


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
        self._ordered = np.sort(values, axis=0) + 0.0
        self._reference_ties = _run_lengths_cubed(self._ordered)
        self._float32 = _float32_exact(self._ordered)
        self._cache: dict[str, np.ndarray] = {}
        # Zeros (most of a sparse reference) are counted, not searched.
        zero = self._ordered == 0.0
        self._zero_count = zero.sum(axis=0).astype(np.float64)
        self._negative_count = (self._ordered < 0.0).sum(axis=0).astype(np.float64)
        self._nonzero_t = [column[column != 0.0] for column in self._ordered.T]
        sizes = np.array([c.size for c in self._nonzero_t], dtype=np.int64)
        self._offset = np.r_[0, np.cumsum(sizes)[:-1]]
        self._zero_below = self._negative_count
        self._zero_equal = self._zero_count

    def _encode(self, genes: np.ndarray, values: np.ndarray, kind: str) -> np.ndarray:
        # Keys that sort by gene, then value, in one array: exact either way.
        if kind == "bits":
            return (genes.astype(np.uint64) << np.uint64(32)) | _ordered_bits(values)
        return genes.astype(np.float64) + 1j * values

    def _reference_keys(self, kind: str) -> np.ndarray:
        keys = self._cache.get(kind)
        if keys is None:
            genes = np.repeat(np.arange(self.n_genes), [c.size for c in self._nonzero_t])
            values = np.concatenate(self._nonzero_t) if self._nonzero_t else np.zeros(0)
            # Gene-major: the sorted nonzero values of gene 0, then of gene 1, ...
            keys = self._encode(genes, values, kind)
            self._cache[kind] = keys
        return keys

    def _counts(
        self, keys: np.ndarray, genes: np.ndarray, values: np.ndarray, kind: str
    ) -> tuple[np.ndarray, np.ndarray]:
        """Reference values below and equal to each key (sorted keys search fastest)."""
        reference = self._reference_keys(kind)
        below = np.searchsorted(reference, keys, "left")
        equal = (np.searchsorted(reference, keys, "right") - below).astype(np.float64)
        below = (below - self._offset[genes]).astype(np.float64)
        zeros = self._zero_count[genes]
        below += np.where(values > 0.0, zeros, 0.0)
        equal += np.where(values == 0.0, zeros, 0.0)
        return below, equal

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
        genes, values, zeros = self._entries(target)
        kind = "bits" if self._float32 and _float32_exact(values) else "complex"
        # Sorted keys: equal (gene, value) entries form runs, searched once each.
        keys = self._encode(genes, values, kind)
        order = np.argsort(keys)
        keys = keys[order]
        starts = (
            np.flatnonzero(np.r_[True, keys[1:] != keys[:-1]])
            if keys.size
            else np.zeros(0, np.int64)
        )
        distinct = keys[starts]
        run = np.diff(np.r_[starts, keys.size]).astype(np.float64)
        first = order[starts]
        genes, values = genes[first], values[first]
        below, equal = self._counts(distinct, genes, values, kind)
        # U counts the reference values below each target value, ties by one half.
        u_statistic: np.ndarray = np.bincount(
            genes, weights=run * (below + 0.5 * equal), minlength=self.n_genes
        ).astype(np.float64)
        u_statistic += zeros * (self._zero_below + 0.5 * self._zero_equal)
        ties = self._reference_ties.copy()
        self._add_target_ties(ties, genes, run, equal, zeros)
        n_reference = self.n_reference
        total = n_target + n_reference
        variance = n_target * n_reference / 12.0 * ((total + 1) - ties / (total * (total - 1)))
        with np.errstate(divide="ignore", invalid="ignore"):
            z = (u_statistic - n_target * n_reference / 2.0) / np.sqrt(variance)
        z = np.where(np.isfinite(z), z, 0.0)
        return z, np.minimum(2.0 * special.ndtr(-np.abs(z)), 1.0)

    def _entries(self, target: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Gene and value of every searched entry, and each gene's count of zeros left."""
        if sp.issparse(target):
            csr = sp.csr_matrix(target)
            if not csr.has_canonical_format:
                csr = csr.copy()
                csr.sum_duplicates()
            kept = csr.data != 0
            genes = csr.indices[kept].astype(np.int64)
            values = np.asarray(csr.data[kept], dtype=np.float64)
            stored = np.bincount(genes, minlength=self.n_genes)
            return genes, values, (target.shape[0] - stored).astype(np.float64)
        dense = np.asarray(target, dtype=np.float64)
        genes = np.broadcast_to(np.arange(self.n_genes), dense.shape).ravel()
        return genes, dense.ravel(), np.zeros(self.n_genes)

    def _add_target_ties(
        self,
        ties: np.ndarray,
        genes: np.ndarray,
        run: np.ndarray,
        equal: np.ndarray,
        zeros: np.ndarray,
    ) -> None:
        """Turn the reference's tie term into the pooled one, in place.

        One entry per distinct target (gene, value) with ``run`` target cells: a value
        shared by ``a`` reference and ``b`` target cells forms one pooled tie run of
        ``a + b``, whose term replaces the reference's ``a^3 - a``.
        """
        a = equal.astype(np.float64)
        pooled = (a + run) ** 3 - (a + run) - (a**3 - a)
        ties += np.bincount(genes, weights=pooled, minlength=self.n_genes)
        a = self._zero_equal.astype(np.float64)
        ties += np.where(zeros > 0, (a + zeros) ** 3 - (a + zeros) - (a**3 - a), 0.0)
