"""Maximum mean discrepancy between two groups: RBF, linear and polynomial kernels.

The kernel sums are the block sums of :mod:`scperteval.distances._kernel`; the RBF
ones are formed in tiles by :func:`scperteval.kernels.pairs.pair_sums`, the
linear ones from the groups' sums exactly, the polynomial ones in tiles here.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Sequence

import numpy as np

from scperteval.distances._base import DISTANCES, Distance, Group, check_size
from scperteval.distances._kernel import BlockSums, PairKernelDistance, squared_distances
from scperteval.kernels.median import median_distance
from scperteval.kernels.pairs import rbf_transform
from scperteval.metrics.population import mmd_from_sums

__all__ = ["MEDIAN_CELLS", "MMD"]

#: Cells of the pooled sample the ``"median"`` bandwidth rule looks at, at most.
MEDIAN_CELLS = 5000
_MEDIAN_SEED = 20240
# Values of one tile of polynomial-kernel values.
_TILE_VALUES = 1 << 20


class MMD(PairKernelDistance):
    """Squared maximum mean discrepancy ``E k(X, X') + E k(Y, Y') - 2 E k(X, Y)``.

    Parameters
    ----------
    kernel
        ``"rbf"``, ``"linear"`` (``a.b``) or ``"poly"`` (``(gamma a.b + coef0)^degree``).
    bandwidth
        RBF width ``sigma`` (``k = exp(-|a - b|^2 / (2 sigma^2))``): a number,
        ``"median"`` (the median distance between distinct cells of all groups
        compared together, over a seeded sample of at most :data:`MEDIAN_CELLS`
        cells, so that one kernel serves the whole table) or ``"pair_median"`` (the
        median over the two groups of each comparison, as the ``mmd`` metric does).
    gamma
        Kernel coefficient: for ``"rbf"`` ``k = exp(-gamma |a - b|^2)`` (replaces
        ``bandwidth``); for ``"poly"`` the factor of ``a.b`` (default 1).
    degree, coef0
        Of the polynomial kernel.
    unbiased
        U-statistic (diagonal left out) rather than the V-statistic.

    """

    def __init__(
        self,
        kernel: str,
        bandwidth: float | str,
        gamma: float | None,
        degree: int,
        coef0: float,
        unbiased: bool,
    ) -> None:
        if kernel not in ("rbf", "linear", "poly"):
            raise ValueError(f"kernel must be 'rbf', 'linear' or 'poly', got {kernel!r}")
        if isinstance(bandwidth, str) and bandwidth not in ("median", "pair_median"):
            raise ValueError(
                f"bandwidth must be a number, 'median' or 'pair_median', got {bandwidth!r}"
            )
        if not isinstance(bandwidth, str) and not (
            math.isfinite(float(bandwidth)) and float(bandwidth) > 0
        ):
            raise ValueError(f"bandwidth must be positive, got {bandwidth!r}")
        if gamma is not None and not (math.isfinite(float(gamma)) and float(gamma) > 0):
            raise ValueError(f"gamma must be positive, got {gamma!r}")
        self.name = "mmd"
        self.kernel = kernel
        self.unbiased = bool(unbiased)
        self.min_cells = 2 if self.unbiased else 1
        self.degree = int(degree)
        self.coef0 = float(coef0)
        self.gamma = None if gamma is None else float(gamma)
        self.shift_invariant = kernel != "poly"
        self.bandwidth: float | str = bandwidth
        if kernel == "rbf" and self.gamma is not None:
            self.bandwidth = 1.0 / math.sqrt(2.0 * self.gamma)

    def fit(self, groups: Sequence[Group]) -> MMD:
        """The kernel with a ``"median"`` bandwidth resolved on the pooled groups."""
        if self.kernel != "rbf" or self.bandwidth != "median":
            return self
        pooled = np.vstack([g.centred for g in groups]) if groups else np.zeros((0, 1))
        if pooled.shape[0] > MEDIAN_CELLS:
            rng = np.random.default_rng(_MEDIAN_SEED)
            pooled = pooled[np.sort(rng.choice(pooled.shape[0], MEDIAN_CELLS, replace=False))]
        fitted = copy.copy(self)
        fitted.bandwidth = median_distance(pooled, threads=self.threads) or 1.0
        return fitted

    def batched(self) -> bool:
        """RBF sums with one bandwidth are batched; linear ones have a closed form."""
        return self.kernel != "linear" and self.bandwidth != "pair_median"

    def key(self) -> tuple[object, ...]:
        """The kernel and its parameters."""
        return ("kernel", self.kernel, self.bandwidth, self.gamma, self.degree, self.coef0)

    def _sigma(self) -> float:
        if isinstance(self.bandwidth, str):
            raise RuntimeError("the bandwidth rule is resolved by fit() before use")
        return float(self.bandwidth)

    def pair_matrix(self, a: np.ndarray, b: np.ndarray | None = None) -> np.ndarray:
        """Kernel values between every pair of rows (raw cells for ``"poly"``)."""
        other = a if b is None else b
        if self.kernel == "linear":
            return a @ other.T
        if self.kernel == "poly":
            return (self._poly_gamma() * (a @ other.T) + self.coef0) ** self.degree
        sigma = self._sigma()
        return np.exp(-squared_distances(a, b) / (2.0 * sigma * sigma))

    def diagonal(self, cells: np.ndarray) -> np.ndarray:
        """``k(c, c)``: 1 for the RBF kernel, a function of ``|c|^2`` otherwise."""
        norms = np.einsum("ij,ij->i", cells, cells)
        if self.kernel == "linear":
            return norms
        if self.kernel == "poly":
            return (self._poly_gamma() * norms + self.coef0) ** self.degree
        return np.ones(cells.shape[0])

    def _poly_gamma(self) -> float:
        return 1.0 if self.gamma is None else self.gamma

    def _poly_sums(self, a: np.ndarray, b: np.ndarray) -> float:
        rows = max(1, _TILE_VALUES // max(b.shape[0], 1))
        total = 0.0
        gamma = self._poly_gamma()
        for start in range(0, a.shape[0], rows):
            tile = gamma * (a[start : start + rows] @ b.T) + self.coef0
            total += float((tile**self.degree).sum())
        return total

    def block_sums(self, x: Group, y: Group | None) -> tuple[float, float]:
        """Kernel sums; the linear kernel's from the group sums exactly."""
        if self.kernel == "linear":
            if y is None:
                total = x.centred.sum(axis=0)
                return float(total @ total), float(np.einsum("ij,ij->", x.centred, x.centred))
            return float(x.centred.sum(axis=0) @ y.centred.sum(axis=0)), 0.0
        if self.kernel == "poly":
            if y is None:
                raw = x.cells
                diag = self._poly_gamma() * np.einsum("ij,ij->i", raw, raw) + self.coef0
                return self._poly_sums(raw, raw), float((diag**self.degree).sum())
            return self._poly_sums(x.cells, y.cells), 0.0
        total = self.centred_sum(x, y, rbf_transform(self.pair_sigma(x, y)))
        return (2.0 * total + x.n, float(x.n)) if y is None else (total, 0.0)

    def pair_sigma(self, x: Group, y: Group | None) -> float:
        """The RBF width of the pair ``(x, y)``: per pair (pooled median) for ``"pair_median"``."""
        if self.bandwidth != "pair_median":
            return self._sigma()
        pooled = x.centred if y is None else np.vstack([x.centred, y.centred])
        return median_distance(pooled, threads=self.threads) or 1.0

    def prepare(self, group: Group) -> None:
        """Cache the within sums (not for ``"pair_median"``, whose kernel is per pair)."""
        if self.bandwidth != "pair_median":
            super().prepare(group)

    def between(self, x: Group, y: Group) -> float:
        """MMD^2 from the block sums."""
        if self.bandwidth != "pair_median":
            return super().between(x, y)
        check_size(self, x, y)
        fixed = copy.copy(self)
        fixed.bandwidth = self.pair_sigma(x, y)
        return fixed.between(Group(x.cells, x.shift), Group(y.cells, y.shift))

    def combine(self, sums: BlockSums) -> float:
        """``S_xx / n_x + S_yy / n_y - 2 S_xy / (n m)`` with U or V forms."""
        cross, within_x, within_y, diag_x, diag_y, n, m = sums
        if self.unbiased:
            return mmd_from_sums(cross, within_x - diag_x, within_y - diag_y, n, m)
        return within_x / (n * n) + within_y / (m * m) - 2.0 * cross / (n * m)


@DISTANCES.register(
    "mmd", description="squared MMD: RBF (median bandwidth), linear or polynomial kernel"
)
def mmd(
    *,
    kernel: str | None = None,
    bandwidth: float | str = "median",
    gamma: float | None = None,
    degree: int = 2,
    coef0: float = 0.0,
    unbiased: bool | None = None,
    pertpy: bool = False,
) -> Distance:
    """Squared MMD; ``pertpy=True``: pertpy's defaults (linear kernel, V-statistic, gamma 1)."""
    if pertpy:
        kernel = kernel or "linear"
        unbiased = bool(unbiased) if unbiased is not None else False
        gamma = 1.0 if gamma is None else gamma
    return MMD(
        kernel=kernel or "rbf",
        bandwidth=bandwidth,
        gamma=gamma,
        degree=degree,
        coef0=coef0,
        unbiased=True if unbiased is None else unbiased,
    )
