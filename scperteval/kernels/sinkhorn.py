"""Debiased Sinkhorn divergence between two uniform point clouds, in NumPy + numba.

The algorithm is the one of geomloss's ``SamplesLoss("sinkhorn", p=2, debias=True,
backend="tensorized")`` (Feydy et al. 2019, "Interpolating between optimal transport
and MMD using Sinkhorn divergences"), so that the values agree with it to rounding:

- ground cost ``C(x, y) = ||x - y||^2 / 2`` from the expansion
  ``(|x|^2 - 2 x.y + |y|^2) / 2``;
- temperatures annealed from ``diameter^2`` down to ``blur^2`` by factors of
  ``scaling^2``, where the diameter is that of the pooled bounding box;
- symmetric updates: at each temperature every dual potential is averaged with its
  soft-C-transform (``softmin``), for the cross problem and for both
  self-problems (the debiasing terms) alike, then one last, non-averaged update at
  the final temperature;
- ``S = <a, f_ba - f_aa> + <b, g_ab - g_bb>`` with uniform weights ``a``, ``b``.

Running it here rather than through torch keeps the default CPU path free of a
heavy import and of per-operation dispatch overhead: each soft-C-transform is one
compiled pass over its cost matrix that fuses the scaling, the exponential (the
vectorised one of :mod:`scperteval.kernels.rbf`) and the sum, with no temporary matrix.
"""

from __future__ import annotations

import math

import numba
import numpy as np

from scperteval.kernels.rbf import _powers_of_two, _products_sum, _reduced_exponentials

__all__ = ["debiased_sinkhorn", "temperature_schedule"]


@numba.njit(cache=True, nogil=True)
def _softmin_rows(cost: np.ndarray, potential: np.ndarray, eps: float, out: np.ndarray) -> None:
    """``out[i] = -eps * log(sum_j exp(potential[j] - cost[i, j] / eps))``."""
    n_rows, n_columns = cost.shape
    exponents = np.empty(n_columns)
    mantissas = np.empty(n_columns)
    powers = np.empty(n_columns)
    for i in range(n_rows):
        row = cost[i]
        largest = -np.inf
        for j in range(n_columns):
            value = potential[j] - row[j] / eps
            exponents[j] = value
            largest = max(largest, value)
        for j in range(n_columns):
            exponents[j] -= largest
        # Every argument is <= 0 and the largest is 0, so the sum is >= 1: arguments
        # clamped at the smallest normal exponent change it by less than one ulp.
        _reduced_exponentials(exponents, 1.0, mantissas, powers)
        _powers_of_two(powers.view(np.int64))
        out[i] = -eps * (math.log(_products_sum(mantissas, powers)) + largest)


def _softmin(cost: np.ndarray, potential: np.ndarray, eps: float) -> np.ndarray:
    out = np.empty(cost.shape[0])
    _softmin_rows(cost, potential, float(eps), out)
    return out


def _half_squared_distances(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    cost = (x * x).sum(axis=1)[:, None] - 2.0 * (x @ y.T)
    cost += (y * y).sum(axis=1)[None, :]
    cost /= 2.0
    return cost


def temperature_schedule(diameter: float, blur: float, scaling: float) -> list[float]:
    """Temperatures ``eps`` of the annealing, from ``diameter^2`` down to ``blur^2``.

    Parameters
    ----------
    diameter
        Upper bound of the distances between the points (positive).
    blur
        Final blur; the last temperature is ``blur^2``.
    scaling
        Ratio of successive blurs, in (0, 1).

    Returns
    -------
    list of float
        ``diameter^2``, then ``exp(e)`` for ``e`` from ``2 log(diameter)`` down to
        (excluded) ``2 log(blur)`` in steps of ``2 log(scaling)``, then ``blur^2``.

    """
    steps = np.arange(2.0 * np.log(diameter), 2.0 * np.log(blur), 2.0 * np.log(scaling))
    return [diameter**2] + [float(np.exp(e)) for e in steps] + [blur**2]


def debiased_sinkhorn(
    x: np.ndarray, y: np.ndarray, blur: float, scaling: float, diameter: float | None = None
) -> float:
    """Debiased Sinkhorn divergence ``S_eps`` between uniform measures on two clouds.

    Parameters
    ----------
    x, y
        Cells x features float64 arrays with the same features and at least one row
        each, finite, not all points coinciding.
    blur
        Final blur (``eps = blur^2``).
    scaling
        Ratio of successive blurs in the annealing, in (0, 1).
    diameter
        Length of the diagonal of the pooled clouds' bounding box, where the caller
        has it already; computed when omitted.

    Returns
    -------
    float
        ``OT_eps(a, b) - (OT_eps(a, a) + OT_eps(b, b)) / 2`` for the cost
        ``||x - y||^2 / 2``; may be slightly negative by rounding.

    """
    x = np.ascontiguousarray(x, dtype=np.float64)
    y = np.ascontiguousarray(y, dtype=np.float64)
    if diameter is None:
        low = np.minimum(x.min(axis=0), y.min(axis=0))
        high = np.maximum(x.max(axis=0), y.max(axis=0))
        diameter = float(np.linalg.norm(high - low))
    temperatures = temperature_schedule(diameter, blur, scaling)

    cost_xy = _half_squared_distances(x, y)
    # Expanded on its own, not transposed, as geomloss does: rounding then agrees.
    cost_yx = _half_squared_distances(y, x)
    cost_xx = _half_squared_distances(x, x)
    cost_yy = _half_squared_distances(y, y)
    log_a = np.full(x.shape[0], math.log(1.0 / x.shape[0]))
    log_b = np.full(y.shape[0], math.log(1.0 / y.shape[0]))

    eps = temperatures[0]
    g_ab = _softmin(cost_yx, log_a, eps)
    f_ba = _softmin(cost_xy, log_b, eps)
    f_aa = _softmin(cost_xx, log_a, eps)
    g_bb = _softmin(cost_yy, log_b, eps)
    for eps in temperatures:
        f_ba_next = _softmin(cost_xy, log_b + g_ab / eps, eps)
        g_ab_next = _softmin(cost_yx, log_a + f_ba / eps, eps)
        f_aa_next = _softmin(cost_xx, log_a + f_aa / eps, eps)
        g_bb_next = _softmin(cost_yy, log_b + g_bb / eps, eps)
        f_ba = 0.5 * (f_ba + f_ba_next)
        g_ab = 0.5 * (g_ab + g_ab_next)
        f_aa = 0.5 * (f_aa + f_aa_next)
        g_bb = 0.5 * (g_bb + g_bb_next)
    # The last update is not averaged: it extrapolates the potentials to the final
    # temperature, the two cross potentials from each other's previous values.
    f_ba, g_ab = (
        _softmin(cost_xy, log_b + g_ab / eps, eps),
        _softmin(cost_yx, log_a + f_ba / eps, eps),
    )
    f_aa = _softmin(cost_xx, log_a + f_aa / eps, eps)
    g_bb = _softmin(cost_yy, log_b + g_bb / eps, eps)
    return float(np.mean(f_ba - f_aa) + np.mean(g_ab - g_bb))
