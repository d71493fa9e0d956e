"""Distances built from sums of a function of every pair of cells.

Every one of them is a combination of three block sums of a pair function ``k``:
``S_xy = sum_ij k(x_i, y_j)``, and ``S_xx``, ``S_yy`` over all ordered pairs of one
group (diagonal included), with the diagonal sums ``D_x = sum_i k(x_i, x_i)`` kept
apart for the unbiased estimators. Energy distances and the mean pairwise distance
use ``k = ||a - b||``, MMD a kernel. The within sums are computed once per group
and reused by every pair that group is in; the sums over pairs are formed in
cache-sized tiles (:func:`scperteval.kernels.pairs.pair_sums`), so no cells x
cells matrix is ever held. :class:`PairKernelDistance` also gives the pooled matrix
of ``k`` for the permutation test, which reuses it across permutations.
"""

from __future__ import annotations

from abc import abstractmethod
from typing import Any, NamedTuple

import numpy as np

from scperteval.distances._base import DISTANCES, Distance, Group, check_size
from scperteval.kernels.pairs import SQRT, PairTransform, pair_sums
from scperteval.kernels.threads import Threads
from scperteval.metrics.population import (
    DEFAULT_MAX_ITER,
    check_sinkhorn_options,
    energy_distance_from_sums,
    sinkhorn,
)

__all__ = [
    "BlockSums",
    "EnergyDistance",
    "MeanPairwise",
    "PairKernelDistance",
    "Wasserstein",
    "squared_distances",
]


class BlockSums(NamedTuple):
    """The block sums of one comparison (floats, or arrays with one entry per replicate)."""

    cross: Any
    within_x: Any
    within_y: Any
    diag_x: Any
    diag_y: Any
    n: int
    m: int


class PairKernelDistance(Distance):
    """A distance from block sums of a pair function (see the module notes)."""

    #: Whether the pair function is shift invariant (a distance, an RBF kernel), so
    #: that it may be evaluated on the shifted cells.
    shift_invariant: bool = True

    @abstractmethod
    def pair_matrix(self, a: np.ndarray, b: np.ndarray | None = None) -> np.ndarray:
        """``k(a_i, b_j)`` for every pair of rows (``b = a`` by default, diagonal included)."""

    def diagonal(self, cells: np.ndarray) -> np.ndarray:
        """``k(c_i, c_i)`` for every row."""
        return np.zeros(cells.shape[0])

    def batched(self) -> bool:
        """Whether :meth:`cross_sums` evaluates the pair matrix (else the cross sums one by one)."""
        return False

    def cells_of(self, group: Group) -> np.ndarray:
        """The cells the pair function is evaluated on: shifted when it is shift invariant."""
        return group.centred if self.shift_invariant else group.cells

    def cross_sums(
        self, x: Group, stacked: np.ndarray, starts: np.ndarray, threads: Threads | None = None
    ) -> np.ndarray:
        """Cross sums of ``x`` with several groups at once.

        Parameters
        ----------
        x
            One group.
        stacked
            The other groups' cells (:meth:`cells_of`), one after the other.
        starts
            Row where each of them starts in ``stacked``.
        threads
            Kernel threads to split the tiles between (for a caller that runs
            nothing else at the same time); one thread when omitted.

        Returns
        -------
        numpy.ndarray
            ``S_xy`` for each group: the pair matrix is formed in tiles of at most
            about 16 MiB and summed per group, so that many small groups cost a few
            large matrix products rather than one small one each.

        """
        cells = self.cells_of(x)
        column_sums = np.empty(stacked.shape[0])
        columns = max(1, _TILE_BYTES // (8 * max(cells.shape[0], 1)))

        def fill(start: int, stop: int) -> None:
            for first in range(start, stop, columns):
                last = min(first + columns, stop)
                column_sums[first:last] = self.pair_matrix(cells, stacked[first:last]).sum(axis=0)

        n_rows = stacked.shape[0]
        if threads is None:
            fill(0, n_rows)
        else:
            threads.run_ranges(fill, threads.even_bounds(n_rows, -(-n_rows // columns)))
        if not starts.size:
            return np.zeros(0)
        return np.add.reduceat(column_sums, starts)

    def centred_sum(self, x: Group, y: Group | None, transform: PairTransform) -> float:
        """``pair_sums`` of the shifted cells: cross pairs, or pairs ``i < j`` of ``x`` alone."""
        other = None if y is None else y.centred
        return pair_sums(x.centred, other, [transform], threads=self.threads)[0]

    @abstractmethod
    def block_sums(self, x: Group, y: Group | None) -> tuple[float, float]:
        """``(sum over pairs, sum of the diagonal)``: cross pairs, or ordered pairs of ``x``."""

    @abstractmethod
    def combine(self, sums: BlockSums) -> float:
        """The distance from block sums (``within_*`` over ordered pairs, diagonal included)."""

    def within(self, group: Group) -> tuple[float, float]:
        """The within-group ``(S_xx, D_x)`` of ``group``, computed once and cached."""
        return group.cached(("within", self.key()), lambda: self.block_sums(group, None))  # type: ignore[no-any-return]

    @abstractmethod
    def key(self) -> tuple[object, ...]:
        """What the within sums depend on (several distances may share them)."""

    def prepare(self, group: Group) -> None:
        """Cache the within-group sums of ``group``."""
        if group.n >= self.min_cells:
            self.within(group)

    def between(self, x: Group, y: Group) -> float:
        """The distance from the block sums, the within ones from the cache."""
        check_size(self, x, y)
        return self.from_cross(self.block_sums(x, y)[0], x, y)

    def from_cross(self, cross: float, x: Group, y: Group) -> float:
        """The distance from the cross sum ``S_xy``, the within sums from the cache."""
        within_x, diag_x = self.within(x)
        within_y, diag_y = self.within(y)
        return self.combine(BlockSums(cross, within_x, within_y, diag_x, diag_y, x.n, y.n))


# Bytes of one tile of the batched cross sums.
_TILE_BYTES = 16 * 2**20


def squared_distances(a: np.ndarray, b: np.ndarray | None = None) -> np.ndarray:
    """Squared distances between the rows of ``a`` and of ``b`` (``a`` itself by default)."""
    other = a if b is None else b
    norms_a = np.einsum("ij,ij->i", a, a)
    norms_b = norms_a if b is None else np.einsum("ij,ij->i", other, other)
    d2 = -2.0 * (a @ other.T)
    d2 += norms_a[:, None]
    d2 += norms_b[None, :]
    # Values within rounding of zero are coinciding cells.
    d2[d2 <= 1e-12 * (norms_a[:, None] + norms_b[None, :])] = 0.0
    if b is None:
        np.fill_diagonal(d2, 0.0)
    return d2


class EnergyDistance(PairKernelDistance):
    """Energy distance ``2 E|X - Y| - E|X - X'| - E|Y - Y'|``.

    Parameters
    ----------
    name
        Registered name.
    unbiased
        Within-group means over ordered pairs ``i != j`` (U-statistics) rather than
        over all ``n^2`` pairs, zero self-distances included (V-statistics).
    cell_wise_metric
        ``"euclidean"`` (the energy distance) or ``"sqeuclidean"`` (its squared
        variant, which equals ``2 ||mean_x - mean_y||^2`` in the V form).

    """

    def __init__(self, name: str, unbiased: bool, cell_wise_metric: str) -> None:
        if cell_wise_metric not in ("euclidean", "sqeuclidean"):
            raise ValueError(
                f"cell_wise_metric must be 'euclidean' or 'sqeuclidean', got {cell_wise_metric!r}"
            )
        self.name = name
        self.unbiased = bool(unbiased)
        self.cell_wise_metric = cell_wise_metric
        self.min_cells = 2 if self.unbiased else 1

    def batched(self) -> bool:
        """Euclidean sums are batched; squared ones have a closed form."""
        return self.cell_wise_metric == "euclidean"

    def key(self) -> tuple[object, ...]:
        """Within sums of distances (or squared distances)."""
        return ("distance", self.cell_wise_metric)

    def pair_matrix(self, a: np.ndarray, b: np.ndarray | None = None) -> np.ndarray:
        """Distances (or squared distances) between every pair of rows."""
        d2 = squared_distances(a, b)
        return d2 if self.cell_wise_metric == "sqeuclidean" else np.sqrt(d2)

    def block_sums(self, x: Group, y: Group | None) -> tuple[float, float]:
        """Sums of the cell-wise metric; squared ones from means and variances exactly."""
        if self.cell_wise_metric == "sqeuclidean":
            if y is None:
                return 2.0 * x.n * x.n * float(x.variance().sum()), 0.0
            gap = x.mean - y.mean
            spread = float(x.variance().sum() + y.variance().sum())
            return x.n * y.n * (float(gap @ gap) + spread), 0.0
        total = self.centred_sum(x, y, SQRT)
        return (2.0 * total if y is None else total), 0.0

    def combine(self, sums: BlockSums) -> float:
        """``2 S_xy / (n m) - S_xx / n_x - S_yy / n_y`` with U or V denominators."""
        return energy_distance_from_sums(*sums[:3], sums.n, sums.m, unbiased=self.unbiased)


@DISTANCES.register(
    "mean_pairwise", description="mean Euclidean distance between the groups' cells"
)
class MeanPairwise(EnergyDistance):
    """Mean Euclidean distance over all pairs of cells of the two groups."""

    def __init__(self) -> None:
        super().__init__("mean_pairwise", unbiased=False, cell_wise_metric="euclidean")

    def prepare(self, group: Group) -> None:
        """Nothing: only cross sums are needed."""

    def between(self, x: Group, y: Group) -> float:
        """``S_xy / (n m)``."""
        check_size(self, x, y)
        return self.block_sums(x, y)[0] / (x.n * y.n)

    def combine(self, sums: BlockSums) -> float:
        """``S_xy / (n m)``."""
        return sums.cross / (sums.n * sums.m)


@DISTANCES.register("wasserstein", description="debiased Sinkhorn estimate of W2 (sqrt(2 S_eps))")
class Wasserstein(Distance):
    """Debiased Sinkhorn estimate of the 2-Wasserstein distance (see :func:`sinkhorn`).

    Parameters
    ----------
    blur, scaling
        Entropic blur and the annealing factor of :func:`sinkhorn`.
    tol, max_iter
        The stopping rule of :func:`sinkhorn`.

    """

    def __init__(
        self,
        blur: float = 0.05,
        scaling: float = 0.9,
        tol: float | None = None,
        max_iter: int = DEFAULT_MAX_ITER,
    ) -> None:
        check_sinkhorn_options(blur, scaling, "tensorized", tol, max_iter)
        self.name = "wasserstein"
        self.blur = float(blur)
        self.scaling = float(scaling)
        self.tol = tol
        self.max_iter = int(max_iter)

    def between(self, x: Group, y: Group) -> float:
        """``sqrt(2 S_eps)`` between the uniform measures on the two groups."""
        check_size(self, x, y)
        return sinkhorn(
            x.centred,
            y.centred,
            blur=self.blur,
            scaling=self.scaling,
            tol=self.tol,
            max_iter=self.max_iter,
        )


@DISTANCES.register(
    "edistance", description="energy distance, within terms over all n^2 pairs (pertpy's)"
)
def edistance(*, cell_wise_metric: str = "euclidean", unbiased: bool = False) -> Distance:
    """Energy distance with V-statistic within terms (pertpy's ``edistance``)."""
    return EnergyDistance("edistance", unbiased=unbiased, cell_wise_metric=cell_wise_metric)


@DISTANCES.register(
    "energy_distance", description="energy distance, unbiased within terms (U-statistics)"
)
def energy_distance(*, cell_wise_metric: str = "euclidean", unbiased: bool = True) -> Distance:
    """Energy distance with U-statistic within terms."""
    return EnergyDistance("energy_distance", unbiased=unbiased, cell_wise_metric=cell_wise_metric)
