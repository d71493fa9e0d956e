"""Distances between the two groups' mean profiles (pseudobulks).

Each compares ``mx`` and ``my``, the per-feature means of the cells of the two
groups, over the ``d`` features; only the means are computed per group, once.
"""

from __future__ import annotations

import math
from types import MappingProxyType

import numpy as np
from scipy.stats import kendalltau, rankdata

from scperteval.distances._base import DISTANCES, Distance, Group, check_size
from scperteval.errors import DatasetError

__all__ = ["MeanDistance", "Mahalanobis"]


def _pearson(a: np.ndarray, b: np.ndarray) -> float:
    da, db = a - a.mean(), b - b.mean()
    denominator = math.sqrt(float(da @ da) * float(db @ db))
    return float(da @ db) / denominator if denominator > 0 else math.nan


def _euclidean(mx: np.ndarray, my: np.ndarray) -> float:
    gap = mx - my
    return math.sqrt(float(gap @ gap))


def _rmse(mx: np.ndarray, my: np.ndarray) -> float:
    return _euclidean(mx, my) / math.sqrt(mx.shape[0])


def _mse(mx: np.ndarray, my: np.ndarray) -> float:
    gap = mx - my
    return float(gap @ gap) / mx.shape[0]


def _mae(mx: np.ndarray, my: np.ndarray) -> float:
    return float(np.abs(mx - my).sum()) / mx.shape[0]


def _pearson_distance(mx: np.ndarray, my: np.ndarray) -> float:
    return 1.0 - _pearson(mx, my)


def _spearman_distance(mx: np.ndarray, my: np.ndarray) -> float:
    return 1.0 - _pearson(rankdata(mx), rankdata(my))


def _kendalltau_distance(mx: np.ndarray, my: np.ndarray) -> float:
    d = mx.shape[0]
    tau = float(kendalltau(mx, my).statistic)
    return (1.0 - tau) * d * (d - 1) / 4.0


def _cosine_distance(mx: np.ndarray, my: np.ndarray) -> float:
    denominator = math.sqrt(float(mx @ mx) * float(my @ my))
    return 1.0 - float(mx @ my) / denominator if denominator > 0 else math.nan


def _r2_distance(mx: np.ndarray, my: np.ndarray) -> float:
    # R^2 of ``my`` as a prediction of ``mx``: 1 - R^2 = SS_res / SS_tot.
    residual = mx - my
    spread = mx - mx.mean()
    total = float(spread @ spread)
    return float(residual @ residual) / total if total > 0 else math.nan


class MeanDistance(Distance):
    """A distance that only looks at the two groups' mean profiles.

    Parameters
    ----------
    name
        Registered name.
    function
        ``f(mx, my) -> float``.
    symmetric
        Whether ``f(mx, my) == f(my, mx)``.

    """

    def __init__(self, name: str, function: object, symmetric: bool = True) -> None:
        self.name = name
        self.function = function
        self.symmetric = symmetric

    def prepare(self, group: Group) -> None:
        """Cache the mean."""
        _ = group.mean

    def between(self, x: Group, y: Group) -> float:
        """``f(mean(x), mean(y))``."""
        check_size(self, x, y)
        return float(self.function(x.mean, y.mean))  # type: ignore[operator]


class Mahalanobis(Distance):
    """Mahalanobis distance ``sqrt((mx - my)^T S^-1 (mx - my))`` between the mean profiles.

    Parameters
    ----------
    covariance
        ``S``: ``"pooled"`` (the pooled within-group covariance
        ``((n - 1) S_x + (m - 1) S_y) / (n + m - 2)``; symmetric), ``"first"`` (``S_x``,
        the covariance of the first group, pertpy's choice; in one-sided use the
        group, not the reference) or ``"second"`` (``S_y``).

    """

    def __init__(self, covariance: str) -> None:
        if covariance not in ("pooled", "first", "second"):
            raise ValueError(
                f"covariance must be 'pooled', 'first' or 'second', got {covariance!r}"
            )
        self.name = "mahalanobis"
        self.covariance = covariance
        self.symmetric = covariance == "pooled"
        self.min_cells = 2

    @staticmethod
    def _scatter(group: Group) -> np.ndarray:
        def build() -> np.ndarray:
            centred = group.cells - group.mean
            return centred.T @ centred

        return group.cached("scatter", build)  # type: ignore[no-any-return]

    def prepare(self, group: Group) -> None:
        """Cache the mean and the scatter matrix."""
        if group.n >= 2:
            self._scatter(group)

    def between(self, x: Group, y: Group) -> float:
        """The distance; the covariance must be invertible."""
        check_size(self, x, y)
        if self.covariance == "pooled":
            matrix = (self._scatter(x) + self._scatter(y)) / (x.n + y.n - 2)
        elif self.covariance == "first":
            matrix = self._scatter(x) / (x.n - 1)
        else:
            matrix = self._scatter(y) / (y.n - 1)
        gap = x.mean - y.mean
        try:
            solved = np.linalg.solve(matrix, gap)
        except np.linalg.LinAlgError:
            raise DatasetError(
                "mahalanobis: the covariance matrix is singular (more features than cells, "
                "or a constant feature); use a reduced space such as pca(k=...)"
            ) from None
        return math.sqrt(max(float(gap @ solved), 0.0))


_MEAN_DISTANCES = MappingProxyType(
    {
        "euclidean": (_euclidean, "Euclidean distance between the mean profiles", True),
        "mse": (_mse, "mean squared difference of the mean profiles", True),
        "mean_absolute_error": (_mae, "mean absolute difference of the mean profiles", True),
        "pearson_distance": (_pearson_distance, "1 - Pearson r of the mean profiles", True),
        "spearman_distance": (_spearman_distance, "1 - Spearman rho of the mean profiles", True),
        "kendalltau_distance": (
            _kendalltau_distance,
            "(1 - Kendall tau-b) d (d - 1) / 4 of the mean profiles",
            True,
        ),
        "cosine_distance": (_cosine_distance, "1 - cosine similarity of the mean profiles", True),
        "r2_distance": (
            _r2_distance,
            "1 - R^2 of the reference mean predicting the group's",
            False,
        ),
    }
)


def _register_mean(name: str) -> None:
    function, description, symmetric = _MEAN_DISTANCES[name]

    def build() -> Distance:
        return MeanDistance(name, function, symmetric)

    build.__doc__ = f"{description[0].upper()}{description[1:]}."
    build.__name__ = name
    DISTANCES.add(name, build, description=description)


for _name in _MEAN_DISTANCES:
    _register_mean(_name)


@DISTANCES.register(
    "root_mean_squared_error", description="root mean squared difference of the mean profiles"
)
def root_mean_squared_error(*, pertpy: bool = False) -> Distance:
    """``||mx - my|| / sqrt(d)``; ``pertpy=True`` gives pertpy's ``||mx - my||`` instead."""
    return MeanDistance("root_mean_squared_error", _euclidean if pertpy else _rmse)


@DISTANCES.register("mahalanobis", description="Mahalanobis distance between the mean profiles")
def mahalanobis(*, covariance: str = "pooled", pertpy: bool = False) -> Distance:
    """Mahalanobis distance; ``pertpy=True`` uses the first group's covariance."""
    return Mahalanobis("first" if pertpy else covariance)
