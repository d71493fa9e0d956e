"""Shared by the metric modules: the registry, input checks and the error for undefined inputs."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np
import numpy.typing as npt
from scipy import sparse

from scperteval.errors import ScpertevalError
from scperteval.registry import Registry

__all__ = ["METRICS", "DegenerateInput", "as_vector", "as_vector_pair", "as_matrix"]

#: Every metric of :mod:`scperteval.metrics`, registered by name with its metadata:
#: ``representation`` ("centroid", "population" or "de"), ``scope`` ("perturbation" or
#: "dataset"), ``better`` ("higher" or "lower"), ``perfect`` (the ideal value) and, where a
#: metric needs more than the two datapoints, ``needs`` (names of context fields it reads);
#: ``check``, where given, is called with a protocol's bound options before a run and
#: raises ``ValueError`` on an invalid value.
METRICS = Registry("metric")

Decorator = Callable[[Callable[..., Any]], Callable[..., Any]]


def register_metric(description: str, **meta: Any) -> Decorator:
    """Register a metric under its function's name: ``METRICS.register`` with a description."""
    return METRICS.register(description=description, **meta)


class DegenerateInput(ScpertevalError, ValueError):
    """A metric is undefined on inputs that are well-formed in type and shape.

    Examples: a point cloud with fewer cells than an unbiased estimator needs, a DE
    result with no positive gene, non-finite values. Whoever runs many metrics records
    such a case as NaN together with :attr:`reason`, so that it is counted instead of
    crashing the run or vanishing from it.
    """

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def _positive_number(value: Any) -> bool:
    """Whether ``value`` is a positive finite int or float (a bool is not)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return False
    return math.isfinite(value) and value > 0


def _checked(array: npt.NDArray[np.float64], ndim: int, what: str) -> npt.NDArray[np.float64]:
    """``array``, checked to have ``ndim`` (1 or 2) dimensions and finite values."""
    if array.ndim != ndim:
        dimensions = "one" if ndim == 1 else "two"
        raise ValueError(f"{what} must be {dimensions}-dimensional, got shape {array.shape}")
    if not np.isfinite(array).all():
        bad = int(array.size - np.count_nonzero(np.isfinite(array)))
        raise DegenerateInput(f"{what} contains {bad} non-finite value(s)")
    return array


def as_vector(values: npt.ArrayLike, what: str) -> npt.NDArray[np.float64]:
    """Return ``values`` as a finite 1-D float64 array.

    Raises
    ------
    ValueError
        If ``values`` is not one-dimensional.
    DegenerateInput
        If it contains NaN or infinity.

    """
    return _checked(np.asarray(values, dtype=np.float64), 1, what)


def as_vector_pair(
    gt: npt.ArrayLike, pred: npt.ArrayLike
) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.float64]]:
    """Return truth and prediction as finite 1-D float64 arrays of one length.

    Raises
    ------
    ValueError
        If either is not one-dimensional or the lengths differ.
    DegenerateInput
        If either is empty or contains NaN or infinity.

    """
    x = as_vector(gt, "truth")
    y = as_vector(pred, "prediction")
    if x.shape != y.shape:
        raise ValueError(f"truth has {x.size} features but prediction has {y.size}")
    if x.size == 0:
        raise DegenerateInput("truth and prediction have no features")
    return x, y


def as_matrix(values: npt.ArrayLike, what: str) -> npt.NDArray[np.float64]:
    """Return ``values`` (dense or scipy sparse) as a finite 2-D C-contiguous float64 array.

    Raises
    ------
    ValueError
        If ``values`` is not two-dimensional.
    DegenerateInput
        If it contains NaN or infinity.

    """
    if sparse.issparse(values):
        values = values.toarray()  # type: ignore[union-attr]
    return _checked(np.ascontiguousarray(values, dtype=np.float64), 2, what)
