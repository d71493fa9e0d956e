"""The distance interface, the per-group summaries shared between pairs, and the registry.

A :class:`Distance` is computed from two :class:`Group` objects. A group holds its
cells and caches what several comparisons share: the mean and variance per feature,
and within-group pair sums (the sum over ``i < j`` of a function of the distance
between cells ``i`` and ``j``). :meth:`Distance.prepare` fills the cache of every
group before pairs are compared (so that pairs can run in threads without racing to
fill it), and :meth:`Distance.between` uses it: ``G`` groups cost ``G`` within sums,
not ``G (G - 1)``.
"""

from __future__ import annotations

import threading
from abc import ABC, abstractmethod
from collections.abc import Callable, Hashable
from typing import Any

import numpy as np

from scperteval.errors import DatasetError, SpecError
from scperteval.kernels.threads import Threads
from scperteval.registry import Registry

__all__ = ["DISTANCES", "Distance", "Group", "check_size", "resolve_distance"]

#: Every distance, registered under pertpy's metric name where pertpy has one.
DISTANCES = Registry("distance")


class Group:
    """The cells of one group, with cached summaries.

    Parameters
    ----------
    cells
        Float64 cells x features array.
    shift
        A vector subtracted from every cell before pair sums are formed (the mean
        of all groups compared together): distances do not change under a common
        shift, and the expansion ``|a|^2 + |b|^2 - 2 a.b`` loses less precision
        near the origin.

    """

    def __init__(self, cells: np.ndarray, shift: np.ndarray | None = None) -> None:
        self.cells = np.ascontiguousarray(cells, dtype=np.float64)
        self.shift = np.zeros(self.cells.shape[1]) if shift is None else np.asarray(shift)
        self._cache: dict[Hashable, Any] = {}
        self._lock = threading.RLock()

    @property
    def n(self) -> int:
        """Number of cells."""
        return int(self.cells.shape[0])

    def cached(self, key: Hashable, build: Callable[[], Any]) -> Any:
        """The value stored under ``key``, built once."""
        with self._lock:
            if key not in self._cache:
                self._cache[key] = build()
            return self._cache[key]

    @property
    def centred(self) -> np.ndarray:
        """The cells minus :attr:`shift`."""
        return self.cached("centred", lambda: self.cells - self.shift)  # type: ignore[no-any-return]

    @property
    def mean(self) -> np.ndarray:
        """Mean of every feature."""
        return self.cached("mean", lambda: self.cells.mean(axis=0))  # type: ignore[no-any-return]

    def variance(self, ddof: int = 0) -> np.ndarray:
        """Variance of every feature with ``ddof`` degrees of freedom removed."""
        return self.cached(  # type: ignore[no-any-return]
            ("variance", ddof), lambda: self.cells.var(axis=0, ddof=ddof)
        )


class Distance(ABC):
    """A distance between two groups of cells.

    Subclasses set :attr:`name` and :attr:`symmetric`, implement :meth:`between`,
    and may override :meth:`prepare` and :attr:`min_cells`.
    """

    #: Registered name.
    name: str = ""
    #: Whether ``between(x, y) == between(y, x)``; a pairwise table of an asymmetric
    #: distance holds both orders.
    symmetric: bool = True
    #: Fewest cells a group needs.
    min_cells: int = 1

    @property
    def threads(self) -> Threads:
        """The kernel threads and BLAS limit of this distance's sums (its own, made once)."""
        threads = self.__dict__.get("_threads")
        if threads is None:
            threads = self.__dict__["_threads"] = Threads()
        return threads

    def prepare(self, group: Group) -> None:  # noqa: B027 - a distance may have nothing to cache
        """Compute and cache the summaries of ``group`` that comparisons reuse."""

    @abstractmethod
    def between(self, x: Group, y: Group) -> float:
        """The distance from ``x`` to ``y`` (``y`` is the reference in one-sided use)."""

    def __call__(self, x: np.ndarray, y: np.ndarray) -> float:
        """The distance between two cells x features arrays (a common shift applied)."""
        a = np.asarray(x, dtype=np.float64)
        b = np.asarray(y, dtype=np.float64)
        if a.ndim != 2 or b.ndim != 2 or a.shape[1] != b.shape[1]:
            raise ValueError("x and y must be cells x features arrays with the same features")
        shift = np.vstack([a, b]).mean(axis=0) if a.size + b.size else None
        gx, gy = Group(a, shift), Group(b, shift)
        self.prepare(gx)
        self.prepare(gy)
        return self.between(gx, gy)


def check_size(distance: Distance, *groups: Group) -> None:
    """Raise :class:`~scperteval.errors.DatasetError` for a group below ``distance.min_cells``."""
    for group in groups:
        if group.n < distance.min_cells:
            raise DatasetError(
                f"{distance.name} needs at least {distance.min_cells} cell(s) per group; "
                f"a group has {group.n}"
            )


def resolve_distance(metric: Any) -> Distance:
    """The :class:`Distance` of a metric spec (``"mmd(kernel='linear')"``, a name, ...).

    Parameters
    ----------
    metric
        A registered name, ``"name(option=value)"``, ``(name, options)``,
        ``{"name": name, **options}``, or a :class:`Distance`.

    Returns
    -------
    Distance
        The distance, options bound.

    Raises
    ------
    SpecError
        For an unknown name (listing the known ones) or option, or a bad value.

    """
    if isinstance(metric, Distance):
        return metric
    bound = DISTANCES.resolve(metric)
    try:
        distance = bound()
    except (TypeError, ValueError) as exc:
        raise SpecError(f"distance {metric!r}: {exc}") from None
    if not isinstance(distance, Distance):
        raise SpecError(f"distance {metric!r} did not build a Distance")
    return distance
