"""Per-group sufficient statistics as an additive accumulator (a monoid).

For every group of cells (a covariate x perturbation x half combination) the
accumulator keeps the cell count ``n`` and, per feature, the mean and the sum of
squared deviations from the mean (``m2``) in float64. Sum and sum of squares
follow from them (``sum = n * mean``, ``sumsq = m2 + n * mean**2``), but storing
centred moments avoids the cancellation of ``E[x^2] - E[x]^2`` for features whose
variance is small next to their mean.

The monoid:

- :meth:`GroupStats.empty` is the identity;
- :meth:`GroupStats.from_chunk` summarises one chunk of rows;
- :meth:`GroupStats.combine` merges two summaries (pairwise update of Chan,
  Golub and LeVeque), associative and commutative up to rounding;
- :meth:`GroupStats.variance` and :attr:`GroupStats.mean` finalise.

Any chunking of the rows and any split into shards therefore gives the same
statistics as one pass, to floating-point rounding. For one chunking, the
statistics are the same bits for every storage of the same numbers (dense, any
sparse format, stored zeros, unsorted columns, float32 or float64): every chunk
is summarised from its nonzero values, each feature's in row order.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import scipy.sparse as sp

from scperteval.kernels.threads import Threads

__all__ = ["GroupStats", "leave_one_out", "merge_groups", "subtract_group"]


@dataclass(frozen=True)
class GroupStats:
    """Count, mean and centred sum of squares per group and feature.

    Attributes
    ----------
    n
        Cell count per group, shape ``(n_groups,)``, float64.
    mean
        Per-group feature means, shape ``(n_groups, n_features)``, float64.
    m2
        Per-group sums of squared deviations from the mean, same shape.

    """

    n: np.ndarray
    mean: np.ndarray
    m2: np.ndarray

    @property
    def n_groups(self) -> int:
        """Number of groups."""
        return int(self.n.shape[0])

    @property
    def n_features(self) -> int:
        """Number of features (genes)."""
        return int(self.mean.shape[1])

    @property
    def sum(self) -> np.ndarray:
        """Per-group feature sums."""
        return self.mean * self.n[:, None]

    @property
    def sumsq(self) -> np.ndarray:
        """Per-group feature sums of squares."""
        return self.m2 + self.n[:, None] * self.mean**2

    @classmethod
    def empty(cls, n_groups: int, n_features: int) -> GroupStats:
        """Identity of the monoid: no cells in any group."""
        return cls(
            n=np.zeros(n_groups),
            mean=np.zeros((n_groups, n_features)),
            m2=np.zeros((n_groups, n_features)),
        )

    @classmethod
    def from_chunk(
        cls, matrix: Any, codes: np.ndarray, n_groups: int, threads: Threads | None = None
    ) -> GroupStats:
        """Summarise one chunk of rows.

        Parameters
        ----------
        matrix
            Cells x features: a scipy sparse matrix (any format) or a dense array.
        codes
            Group index of each row; rows with a negative code are ignored.
        n_groups
            Total number of groups (codes lie in ``[0, n_groups)``).
        threads
            The run's kernel threads (a :class:`~scperteval.kernels.threads.Threads`
            of its own when omitted).

        Returns
        -------
        GroupStats
            Statistics of this chunk alone.

        """
        codes = np.asarray(codes, dtype=np.int64)
        if codes.shape[0] != matrix.shape[0]:
            raise ValueError(f"{codes.shape[0]} group codes for {matrix.shape[0]} rows")
        keep = codes >= 0
        all_kept = bool(keep.all())
        counts = np.bincount(codes if all_kept else codes[keep], minlength=n_groups).astype(
            np.float64
        )
        # One computation for every storage: the chunk's nonzero values, each
        # feature's added in row order (see csr_group_moments). Dense rows become
        # CSR and other sparse formats are converted, so that the statistics are a
        # function of the numbers, not of how they are stored.
        if sp.issparse(matrix):
            # The kernel reads only the rows of the groups: ignored rows need no copy.
            csr = matrix if matrix.format == "csr" else matrix.tocsr()
        else:
            if not all_kept:
                rows = np.flatnonzero(keep)
                matrix = np.asarray(matrix)[rows]
                codes = codes[rows]
            csr = sp.csr_matrix(np.atleast_2d(np.asarray(matrix)))
        mean, m2 = _sparse_moments(csr, codes, counts, n_groups, threads or Threads())
        return cls(n=counts, mean=mean, m2=m2)

    def combine(self, other: GroupStats) -> GroupStats:
        """Merge the statistics of two disjoint sets of cells, group by group."""
        # absorb's operations on copies: the same values, the inputs left as they are.
        merged = GroupStats(*(a.astype(np.float64) for a in (self.n, self.mean, self.m2)))
        merged.absorb(
            GroupStats(other.n, other.mean.astype(np.float64), other.m2.astype(np.float64))
        )
        return merged

    def absorb(self, other: GroupStats) -> None:
        """Merge ``other`` into these statistics in place; ``other`` is consumed.

        The values are those of :meth:`combine`, bit for bit (the same operations
        in the same order), without its full-size temporaries: folding many chunks
        into a running total then needs no memory beyond the total and one chunk.

        Parameters
        ----------
        other
            Statistics of a disjoint set of cells. Its ``mean`` and ``m2`` arrays
            are overwritten (used as scratch space); do not use it afterwards.

        """
        if self.mean.shape != other.mean.shape:
            raise ValueError(f"cannot combine shapes {self.mean.shape} and {other.mean.shape}")
        n = self.n + other.n
        safe_n = np.where(n > 0, n, 1.0)[:, None]
        weight_other = (other.n[:, None]) / safe_n
        mean, m2 = self.mean, self.m2
        delta = other.mean
        delta -= mean
        m2 += other.m2
        squared = other.m2
        np.multiply(delta, delta, out=squared)
        squared *= self.n[:, None] * weight_other
        m2 += squared
        delta *= weight_other
        mean += delta
        self.n[:] = n

    def __add__(self, other: GroupStats) -> GroupStats:
        return self.combine(other)

    def contiguous_arrays(
        self, strided_rows: bool = False
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``n``, ``mean`` and ``m2`` as C-contiguous float64 arrays (copies only if needed).

        Parameters
        ----------
        strided_rows
            Pass a selection of whole rows (every other group, as a half of each
            perturbation is) as it is rather than copy it: for compiled kernels that
            read row by row. Only rows must then be contiguous.

        Returns
        -------
        tuple of numpy.ndarray
            The arrays compiled kernels read.

        """
        table = _with_contiguous_rows if strided_rows else _c_float64
        return _c_float64(self.n), table(self.mean), table(self.m2)

    def variance(self, ddof: int = 1) -> np.ndarray:
        """Per-group feature variances; NaN where a group has ``n <= ddof`` cells."""
        denominator = (self.n - ddof)[:, None]
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where(
                denominator > 0, self.m2 / np.where(denominator > 0, denominator, 1), np.nan
            )

    def select(self, index: Any) -> GroupStats:
        """Statistics of a subset of groups (any numpy index)."""
        return GroupStats(n=self.n[index], mean=self.mean[index], m2=self.m2[index])

    def group(self, index: int) -> GroupStats:
        """Statistics of group ``index`` alone, as views of these arrays (no copy).

        Parameters
        ----------
        index
            Position of the group (negative counts from the end).

        Returns
        -------
        GroupStats
            One row; read it, do not write to it.

        """
        position = range(len(self.n))[index]
        return self.select(slice(position, position + 1))

    def allclose(self, other: GroupStats, rtol: float = 1e-12, atol: float = 1e-12) -> bool:
        """Whether two summaries agree to the given tolerances."""
        return bool(
            np.allclose(self.n, other.n, rtol=0, atol=0)
            and np.allclose(self.mean, other.mean, rtol=rtol, atol=atol)
            and np.allclose(self.m2, other.m2, rtol=rtol, atol=atol)
        )


def _c_float64(values: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(values, dtype=np.float64)


def _with_contiguous_rows(values: np.ndarray) -> np.ndarray:
    values = np.asarray(values)
    if (
        values.dtype == np.float64
        and values.ndim == 2
        and values.strides[1] == values.itemsize
        and values.strides[0] >= 0
    ):
        return values
    return _c_float64(values)


def _sparse_moments(
    matrix: Any, codes: np.ndarray, counts: np.ndarray, n_groups: int, threads: Threads
) -> tuple[np.ndarray, np.ndarray]:
    from scperteval.kernels.moments import balanced_group_ranges, csr_group_moments

    # Visiting rows group by group keeps each group's accumulators in cache and
    # lets one thread own a group. Rows with negative codes sort first and belong
    # to no group.
    # numpy sorts 16-bit keys by radix, several times faster than 64-bit ones.
    keys = codes.astype(np.int16) if n_groups < np.iinfo(np.int16).max else codes
    order = np.argsort(keys, kind="stable")
    group_starts = np.empty(n_groups + 1, dtype=np.int64)
    group_starts[0] = codes.shape[0] - int(counts.sum())
    np.cumsum(counts.astype(np.int64), out=group_starts[1:])
    group_starts[1:] += group_starts[0]
    n_features = int(matrix.shape[1])
    bounds = balanced_group_ranges(
        matrix.indptr, order, group_starts, n_features, threads.count
    ).tolist()
    mean = np.empty((n_groups, n_features))
    m2 = np.empty((n_groups, n_features))

    def moments_of(first: int, stop: int) -> bool:
        return bool(
            csr_group_moments(
                matrix.indptr,
                matrix.indices,
                matrix.data,
                order,
                group_starts,
                first,
                stop,
                mean,
                m2,
            )
        )

    if not all(threads.run_ranges(moments_of, bounds)):
        # Duplicate column indices in a row (the kernel checks as it reads, and only
        # in unsorted rows): their values must be summed before squaring.
        matrix = matrix.copy()
        matrix.sum_duplicates()
        threads.run_ranges(moments_of, bounds)
    return mean, m2


def merge_groups(
    stats: GroupStats, labels: np.ndarray, n_out: int, threads: Threads | None = None
) -> GroupStats:
    """Merge groups into ``n_out`` larger groups in one compiled pass.

    Parameters
    ----------
    stats
        Statistics of the input groups.
    labels
        Output group of each input group; negative labels are dropped.
    n_out
        Number of output groups.
    threads
        The run's kernel threads (its own for the call when omitted).

    Returns
    -------
    GroupStats
        ``out[k]`` pools every input group ``g`` with ``labels[g] == k``, using
        the exact multi-way decomposition ``M2 = sum M2_g + sum n_g (mean_g - mean)^2``.

    """
    return _pool(stats, labels, n_out, n_out, threads, leave_one_out=False)


#: Below this many output values, merges run on one thread.
PARALLEL_MERGE = 1 << 15


def _pool(
    stats: GroupStats,
    labels: np.ndarray,
    n_labels: int,
    n_out: int,
    threads: Threads | None,
    leave_one_out: bool,
) -> GroupStats:
    """Run :func:`~scperteval.kernels.group_merges.merge_group_rows` into ``n_out`` rows.

    Its input groups are those with a label in ``[0, n_labels)``, sorted by label
    (stable), with the offsets of each label. The kernel runs over feature
    ranges, in parallel when large: features are independent in every merge, so
    each thread's values are those of one call over all features.
    """
    from scperteval.kernels.group_merges import merge_group_rows

    labels = np.asarray(labels, dtype=np.int64)
    keep = np.flatnonzero(labels >= 0)
    members = keep[np.argsort(labels[keep], kind="stable")]
    starts = np.zeros(n_labels + 1, dtype=np.int64)
    np.cumsum(np.bincount(labels[keep], minlength=n_labels), out=starts[1:])
    n = np.zeros(n_out)
    mean = np.zeros((n_out, stats.n_features))
    m2 = np.zeros((n_out, stats.n_features))
    arrays = stats.contiguous_arrays()

    def pool_features(first: int, stop: int) -> None:
        merge_group_rows(*arrays, members, starts, n, mean, m2, first, stop, leave_one_out)

    if stats.n_features == 0:
        pool_features(0, 0)  # the counts are still merged
    else:
        blocks = 1 if mean.size < PARALLEL_MERGE else stats.n_features
        threads = threads or Threads()
        threads.run_ranges(pool_features, threads.even_bounds(stats.n_features, blocks))
    return GroupStats(n=n, mean=mean, m2=m2)


def subtract_group(total: GroupStats, part: GroupStats) -> GroupStats:
    """Statistics of ``total`` with the cells of ``part`` removed (leave-one-out).

    ``part`` must describe a subset of the cells summarised by ``total``, group by
    group (shapes broadcast). The inverse of :meth:`GroupStats.combine`.

    Subtracting centred sums of squares cancels when the remainder's variance is
    tiny next to the spread between ``part`` and the remainder (e.g. a gene at
    1000 +- 0.001 in the remainder and 0 in ``part``); :func:`leave_one_out`
    avoids the subtraction.
    """
    n = total.n - part.n
    safe_n = np.where(n > 0, n, 1.0)[:, None]
    mean = (total.mean * total.n[:, None] - part.mean * part.n[:, None]) / safe_n
    delta = part.mean - mean
    m2 = (
        total.m2
        - part.m2
        - delta**2 * (part.n[:, None] * n[:, None] / np.where(total.n > 0, total.n, 1.0)[:, None])
    )
    m2 = np.maximum(m2, 0.0)
    mean = np.where(n[:, None] > 0, mean, 0.0)
    return GroupStats(n=n, mean=mean, m2=np.where(n[:, None] > 0, m2, 0.0))


def leave_one_out(
    stats: GroupStats, labels: np.ndarray, threads: Threads | None = None
) -> GroupStats:
    """Per group, the pooled statistics of every *other* group with the same label.

    Computed by merging prefixes and suffixes (:meth:`GroupStats.combine`), never
    by subtraction, so a remainder with a variance tiny next to its distance from
    the left-out group keeps full precision.

    Parameters
    ----------
    stats
        Statistics of the input groups.
    labels
        Label of each input group; each group is pooled with the others of its label.
    threads
        The run's kernel threads (its own for the call when omitted).

    Returns
    -------
    GroupStats
        One row per input group (no cells where a group is alone in its label).

    """
    _, codes = np.unique(np.asarray(labels), return_inverse=True)
    n_labels = int(codes.max()) + 1 if codes.size else 0
    return _pool(stats, codes.reshape(-1), n_labels, stats.n_groups, threads, leave_one_out=True)
