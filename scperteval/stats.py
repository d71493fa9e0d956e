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
statistics as one pass, to floating-point rounding.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import scipy.sparse as sp

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
    def from_chunk(cls, matrix: Any, codes: np.ndarray, n_groups: int) -> GroupStats:
        """Summarise one chunk of rows.

        Parameters
        ----------
        matrix
            Cells x features: a scipy sparse matrix (any format) or a dense array.
        codes
            Group index of each row; rows with a negative code are ignored.
        n_groups
            Total number of groups (codes lie in ``[0, n_groups)``).

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
        if sp.issparse(matrix):
            # The kernel reads only the rows of the groups: ignored rows need no copy.
            csr = matrix if matrix.format == "csr" else matrix.tocsr()
            mean, m2 = _sparse_moments(csr, codes, counts, n_groups)
        else:
            if not all_kept:
                rows = np.flatnonzero(keep)
                matrix = np.asarray(matrix)[rows]
                codes = codes[rows]
            mean, m2 = _dense_moments(np.asarray(matrix), codes, counts, n_groups)
        return cls(n=counts, mean=mean, m2=m2)

    def combine(self, other: GroupStats) -> GroupStats:
        """Merge the statistics of two disjoint sets of cells, group by group."""
        if self.mean.shape != other.mean.shape:
            raise ValueError(f"cannot combine shapes {self.mean.shape} and {other.mean.shape}")
        n = self.n + other.n
        safe_n = np.where(n > 0, n, 1.0)[:, None]
        delta = other.mean - self.mean
        weight_other = (other.n[:, None]) / safe_n
        mean = self.mean + delta * weight_other
        m2 = self.m2 + other.m2 + delta**2 * (self.n[:, None] * weight_other)
        return GroupStats(n=n, mean=mean, m2=m2)

    def __add__(self, other: GroupStats) -> GroupStats:
        return self.combine(other)

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

    def allclose(self, other: GroupStats, rtol: float = 1e-12, atol: float = 1e-12) -> bool:
        """Whether two summaries agree to the given tolerances."""
        return bool(
            np.allclose(self.n, other.n, rtol=0, atol=0)
            and np.allclose(self.mean, other.mean, rtol=rtol, atol=atol)
            and np.allclose(self.m2, other.m2, rtol=rtol, atol=atol)
        )


def _sparse_moments(
    matrix: Any, codes: np.ndarray, counts: np.ndarray, n_groups: int
) -> tuple[np.ndarray, np.ndarray]:
    from scperteval._kernels import balanced_group_ranges, csr_group_moments
    from scperteval._threads import run_ranges

    # Visiting rows group by group keeps each group's accumulators in cache and
    # lets one thread own a group. Rows with negative codes sort first and belong
    # to no group.
    order = np.argsort(codes, kind="stable")
    group_starts = np.empty(n_groups + 1, dtype=np.int64)
    group_starts[0] = codes.shape[0] - int(counts.sum())
    np.cumsum(counts.astype(np.int64), out=group_starts[1:])
    group_starts[1:] += group_starts[0]
    n_features = int(matrix.shape[1])
    bounds = balanced_group_ranges(matrix.indptr, order, group_starts, n_features).tolist()
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

    if not all(run_ranges(moments_of, bounds)):
        # Unsorted or duplicate column indices: the kernel checks this for free as
        # it reads, which spares a full pass over the indices in the usual case.
        matrix = matrix.copy()
        matrix.sum_duplicates()
        run_ranges(moments_of, bounds)
    return mean, m2


def _dense_moments(
    matrix: np.ndarray, codes: np.ndarray, counts: np.ndarray, n_groups: int
) -> tuple[np.ndarray, np.ndarray]:
    values = matrix.astype(np.float64, copy=False)
    indicator = sp.csr_matrix(
        (np.ones(codes.shape[0]), (codes, np.arange(codes.shape[0]))),
        shape=(n_groups, codes.shape[0]),
    )
    safe_counts = np.where(counts > 0, counts, 1.0)[:, None]
    mean = np.asarray(indicator @ values) / safe_counts
    deviation = values - mean[codes]
    m2 = np.asarray(indicator @ (deviation * deviation))
    return mean, m2


def merge_groups(stats: GroupStats, labels: np.ndarray, n_out: int) -> GroupStats:
    """Merge groups into ``n_out`` larger groups in one vectorised step.

    Parameters
    ----------
    stats
        Statistics of the input groups.
    labels
        Output group of each input group; negative labels are dropped.
    n_out
        Number of output groups.

    Returns
    -------
    GroupStats
        ``out[k]`` pools every input group ``g`` with ``labels[g] == k``, using
        the exact multi-way decomposition ``M2 = sum M2_g + sum n_g (mean_g - mean)^2``.

    """
    labels = np.asarray(labels, dtype=np.int64)
    keep = labels >= 0
    source = stats.select(keep)
    target = labels[keep]
    indicator = sp.csr_matrix(
        (np.ones(target.shape[0]), (target, np.arange(target.shape[0]))),
        shape=(n_out, target.shape[0]),
    )
    n = np.asarray(indicator @ source.n).ravel()
    safe_n = np.where(n > 0, n, 1.0)[:, None]
    mean = np.asarray(indicator @ (source.mean * source.n[:, None])) / safe_n
    spread = source.n[:, None] * (source.mean - mean[target]) ** 2
    m2 = np.asarray(indicator @ (source.m2 + spread))
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


def leave_one_out(stats: GroupStats, labels: np.ndarray) -> GroupStats:
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

    Returns
    -------
    GroupStats
        One row per input group (no cells where a group is alone in its label).

    """
    labels = np.asarray(labels)
    n = np.zeros_like(stats.n)
    mean = np.zeros_like(stats.mean)
    m2 = np.zeros_like(stats.m2)
    for label in np.unique(labels):
        members = np.flatnonzero(labels == label)
        suffix_n = np.zeros(members.shape[0])
        suffix_mean = np.zeros((members.shape[0], stats.n_features))
        suffix_m2 = np.zeros((members.shape[0], stats.n_features))
        running = GroupStats.empty(1, stats.n_features)
        for i in range(members.shape[0] - 1, -1, -1):
            suffix_n[i], suffix_mean[i], suffix_m2[i] = running.n[0], running.mean[0], running.m2[0]
            running = running.combine(stats.select([members[i]]))
        prefix = GroupStats.empty(1, stats.n_features)
        for i, group in enumerate(members):
            suffix = GroupStats(suffix_n[i : i + 1], suffix_mean[i : i + 1], suffix_m2[i : i + 1])
            rest = prefix.combine(suffix)
            n[group], mean[group], m2[group] = rest.n[0], rest.mean[0], rest.m2[0]
            prefix = prefix.combine(stats.select([group]))
    return GroupStats(n=n, mean=mean, m2=m2)
