"""Distances that compare the two groups feature by feature, then average.

``t_test`` and ``sym_kldiv`` need only the per-feature mean and variance of each
group (cached once per group); ``ks_test`` the sorted values of each feature;
``mean_var_distribution`` compares the two clouds of ``(log mean, log variance)``
points, one per feature.
"""

from __future__ import annotations

import math

import numpy as np

from scperteval.distances._base import DISTANCES, Distance, Group, check_size
from scperteval.errors import DatasetError

__all__ = ["KSTest", "MeanVarDistribution", "SymmetricKL", "TTest"]


def _check_epsilon(epsilon: float) -> float:
    value = float(epsilon)
    if not (math.isfinite(value) and value >= 0):
        raise ValueError(f"epsilon must be a non-negative number, got {epsilon!r}")
    return value


@DISTANCES.register("t_test", description="mean |Welch t| over features")
class TTest(Distance):
    """Mean over features of ``|t|``, Welch's statistic with ``epsilon`` added to variances."""

    def __init__(self, epsilon: float = 1e-8) -> None:
        self.name = "t_test"
        self.epsilon = _check_epsilon(epsilon)
        self.min_cells = 2

    def prepare(self, group: Group) -> None:
        """Cache the mean and unbiased variance."""
        if group.n >= 2:
            _ = group.mean, group.variance(1)

    def between(self, x: Group, y: Group) -> float:
        """``mean_g |mx - my| / sqrt((vx + eps) / n + (vy + eps) / m)``."""
        check_size(self, x, y)
        spread = (x.variance(1) + self.epsilon) / x.n + (y.variance(1) + self.epsilon) / y.n
        with np.errstate(divide="ignore", invalid="ignore"):
            statistic = np.abs(x.mean - y.mean) / np.sqrt(spread)
        return float(statistic.mean())


@DISTANCES.register("sym_kldiv", description="mean symmetrised Gaussian KL divergence per feature")
class SymmetricKL(Distance):
    """Mean over features of the symmetrised KL divergence of per-feature Gaussians."""

    def __init__(self, epsilon: float = 1e-8) -> None:
        self.name = "sym_kldiv"
        self.epsilon = _check_epsilon(epsilon)

    def prepare(self, group: Group) -> None:
        """Cache the mean and (biased) variance."""
        _ = group.mean, group.variance(0)

    def between(self, x: Group, y: Group) -> float:
        """``KL(N_x || N_y) + KL(N_y || N_x)`` per feature, averaged; ``s = std + eps``."""
        check_size(self, x, y)
        sx = np.sqrt(x.variance(0)) + self.epsilon
        sy = np.sqrt(y.variance(0)) + self.epsilon
        gap2 = (x.mean - y.mean) ** 2
        with np.errstate(divide="ignore", invalid="ignore"):
            forward = np.log(sy / sx) + (sx**2 + gap2) / (2 * sy**2) - 0.5
            backward = np.log(sx / sy) + (sy**2 + gap2) / (2 * sx**2) - 0.5
        return float((forward + backward).mean())


@DISTANCES.register("ks_test", description="mean two-sample Kolmogorov-Smirnov statistic")
class KSTest(Distance):
    """Mean over features of the two-sample Kolmogorov-Smirnov statistic."""

    def __init__(self) -> None:
        self.name = "ks_test"

    @staticmethod
    def _sorted(group: Group) -> np.ndarray:
        return group.cached("sorted", lambda: np.sort(group.cells, axis=0))  # type: ignore[no-any-return]

    def prepare(self, group: Group) -> None:
        """Cache every feature's sorted values."""
        self._sorted(group)

    def between(self, x: Group, y: Group) -> float:
        """``mean_g sup_t |F_x(t) - F_y(t)|`` with the empirical distribution functions."""
        check_size(self, x, y)
        sx, sy = self._sorted(x), self._sorted(y)
        total = 0.0
        for feature in range(sx.shape[1]):
            a, b = sx[:, feature], sy[:, feature]
            points = np.concatenate([a, b])
            fa = np.searchsorted(a, points, side="right") / a.shape[0]
            fb = np.searchsorted(b, points, side="right") / b.shape[0]
            total += float(np.abs(fa - fb).max())
        return total / sx.shape[1]


@DISTANCES.register(
    "mean_var_distribution",
    description="mean squared difference of (log mean, log var) densities of the features",
)
class MeanVarDistribution(Distance):
    """Mean squared difference of the two densities of ``(log mean, log variance)`` per feature.

    For each group, the features with positive mean and variance give points
    ``(log m_g, log v_g)`` (variance with ``ddof=0``). Each cloud's density is a
    kernel density estimate with the exponential kernel
    ``exp(-|u| / h) / (2 pi h^2)`` and Silverman's bandwidth
    ``h = (n (d + 2) / 4)^(-1 / (d + 4))`` with ``d = 2`` (scikit-learn's rule, which
    does not scale with the data); the two densities are evaluated on a grid of
    ``n_points x n_points`` points spanning the pooled points plus half a cell on
    each side, and the mean of their squared difference is returned.

    Parameters
    ----------
    n_points
        Grid points per axis.

    """

    def __init__(self, n_points: int = 100) -> None:
        if int(n_points) < 3:
            raise ValueError(f"n_points must be at least 3, got {n_points!r}")
        self.name = "mean_var_distribution"
        self.n_points = int(n_points)

    @staticmethod
    def _points(group: Group) -> np.ndarray:
        def build() -> np.ndarray:
            mean, variance = group.mean, group.variance(0)
            keep = (mean > 0) & (variance > 0)
            return np.column_stack([np.log(mean[keep]), np.log(variance[keep])])

        return group.cached("mean_var_points", build)  # type: ignore[no-any-return]

    def prepare(self, group: Group) -> None:
        """Cache the ``(log mean, log variance)`` points."""
        self._points(group)

    def _grid(self, values: np.ndarray) -> np.ndarray:
        low, high = float(values.min()), float(values.max())
        step = (high - low) / (self.n_points - 2)
        return low - step + step * (0.5 + np.arange(self.n_points))

    @staticmethod
    def _density(points: np.ndarray, grid: np.ndarray) -> np.ndarray:
        n = points.shape[0]
        h = (n * (2 + 2) / 4.0) ** (-1.0 / (2 + 4))
        density = np.zeros(grid.shape[0])
        rows = max(1, (1 << 20) // max(n, 1))
        for start in range(0, grid.shape[0], rows):
            block = grid[start : start + rows]
            gap = block[:, None, :] - points[None, :, :]
            radius = np.sqrt((gap**2).sum(axis=2))
            density[start : start + rows] = np.exp(-radius / h).sum(axis=1)
        return density / (n * 2.0 * math.pi * h * h)

    def between(self, x: Group, y: Group) -> float:
        """The mean squared difference of the two densities on the common grid."""
        px, py = self._points(x), self._points(y)
        if px.shape[0] == 0 or py.shape[0] == 0:
            raise DatasetError(
                "mean_var_distribution needs features with positive mean and variance"
            )
        pooled = np.vstack([px, py])
        mean_grid, var_grid = self._grid(pooled[:, 0]), self._grid(pooled[:, 1])
        grid = np.column_stack(
            [np.repeat(mean_grid, var_grid.shape[0]), np.tile(var_grid, mean_grid.shape[0])]
        )
        gap = self._density(px, grid) - self._density(py, grid)
        return float((gap**2).mean())
