"""Debiased Sinkhorn divergence between two uniform point clouds, on NumPy or torch arrays.

The algorithm is the one of geomloss's ``SamplesLoss("sinkhorn", p=2, debias=True,
backend="tensorized")`` (Feydy et al. 2019, "Interpolating between optimal transport
and MMD using Sinkhorn divergences"), so that the values agree with it to rounding:

- ground cost ``C(x, y) = ||x - y||^2 / 2`` from the expansion
  ``(|x|^2 - 2 x.y + |y|^2) / 2``;
- temperatures annealed from ``diameter^2`` down to ``blur^2`` by factors of
  ``scaling^2`` (:func:`temperature_schedule`), where the diameter is that of the
  pooled bounding box;
- symmetric updates (:func:`anneal`): at each temperature every dual potential is
  averaged with its soft-C-transform (``softmin``), for the cross problem and for
  both self-problems (the debiasing terms) alike, then one last, non-averaged
  update at the final temperature;
- ``S = <a, f_ba - f_aa> + <b, g_ab - g_bb>`` with uniform weights ``a``, ``b``.

The annealing alone stops before the potentials have converged at the final
temperature: on perturbation-vs-control pairs of real screens in PCA space
(``blur = 0.05``) it leaves ``S`` up to 1% low. With a tolerance ``tol`` the
solver therefore keeps iterating at ``eps = blur^2`` (:func:`converge`) before the
last update: over-relaxed alternating updates of the cross potentials, averaged
updates of the two self potentials, until ``S`` moves by less than ``tol * eps``
per iteration (five in a row). ``tol=None`` is geomloss's rule (annealing only).

The iterations are written once, on arrays of any library, given a
soft-C-transform: :func:`debiased_sinkhorn` runs them on NumPy arrays with a
compiled one (one pass over its cost matrix that fuses the scaling, the vectorised
exponential of :mod:`scperteval.kernels.rbf` and the sum, with no temporary matrix),
the annealing compiled as a whole from the same :func:`anneal` (for clouds of a few
hundred cells the interpreter's share of each step was as large as the soft-minima's),
or on torch tensors with a ``logsumexp`` given by the caller.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numba
import numpy as np

from scperteval.kernels.rbf import _exponentials, _largest, _products_sum

__all__ = [
    "OVERRELAXATION",
    "Softmin",
    "anneal",
    "converge",
    "debiased_sinkhorn",
    "half_squared_distances",
    "solve",
    "softmin",
    "temperature_schedule",
]

#: Over-relaxation factor of the cross updates in :func:`converge`.
OVERRELAXATION = 1.9
#: Consecutive iterations that must each change ``S`` by less than the tolerance: a
#: single small change can be an over-relaxed oscillation turning round.
_CALM_ITERATIONS = 5
#: A cross update larger than this many times ``max(eps, first update)`` means the
#: over-relaxed iteration diverges: it restarts with the over-relaxation halved.
_DIVERGED = 10.0


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


#: A soft-C-transform ``(cost, potential, eps) -> -eps log sum_j exp(potential_j - cost_ij / eps)``
#: on arrays of one library (NumPy here, torch for a device).
Softmin = Callable[[Any, Any, float], Any]


def _largest_change(new: Any, old: Any) -> float:
    return float(abs(new - old).max())


def _divergence(f_ba: Any, g_ab: Any, f_aa: Any, g_bb: Any) -> float:
    return float((f_ba - f_aa).mean() + (g_ab - g_bb).mean())


def converge(
    softmin: Softmin,
    costs: tuple[Any, Any, Any, Any],
    log_weights: tuple[Any, Any],
    potentials: tuple[Any, Any, Any, Any],
    eps: float,
    tol: float,
    max_iter: int,
) -> tuple[tuple[Any, Any, Any, Any], int]:
    """Iterate the four dual potentials at a fixed temperature until ``S`` settles.

    The cross potentials take over-relaxed alternating updates
    ``f <- (1 - w) f + w softmin(C_xy, log b + g / eps)``, then the same for ``g``
    from the new ``f``, with ``w =`` :data:`OVERRELAXATION`: plain Sinkhorn updates
    (``w = 1``) converge sublinearly at the small temperatures of real screens
    (thousands of iterations to 1e-6), over-relaxed ones in tens to hundreds. The
    iteration restarts from the given potentials with ``w - 1`` halved (``w = 1``
    once below 1.1, where plain updates cannot diverge) if an update grows past ten
    times ``max(eps, first update)``. The self potentials take the
    averaged (symmetric) updates of the annealing until one of them moves by less
    than ``tol * eps``.

    The stopping rule is on the estimate ``S = <a, f_ba - f_aa> + <b, g_ab - g_bb>``
    rather than on the potentials: at small temperatures the cross potentials keep
    drifting along directions that leave ``S`` unchanged (pairs of matched points
    shifting against each other), so their largest change stays near
    ``1e-2 * eps`` long after ``S`` has settled to 1e-7.

    Parameters
    ----------
    softmin
        The soft-C-transform on the arrays given.
    costs
        ``C_xy``, ``C_yx``, ``C_xx``, ``C_yy``, the half squared distances.
    log_weights
        ``log a``, ``log b``.
    potentials
        ``f_ba``, ``g_ab``, ``f_aa``, ``g_bb`` at the end of the annealing.
    eps
        The temperature (``blur^2``).
    tol
        Stop once the self potentials have settled and five consecutive iterations
        have each changed ``S`` by less than ``tol * eps``.
    max_iter
        Cap on the iterations.

    Returns
    -------
    tuple
        The four potentials and the number of iterations run.

    """
    cost_xy, cost_yx, cost_xx, cost_yy = costs
    log_a, log_b = log_weights
    f_ba, g_ab, f_aa, g_bb = potentials
    start = (f_ba, g_ab)
    relaxation = OVERRELAXATION
    first_step: float | None = None
    self_settled = False
    value = _divergence(f_ba, g_ab, f_aa, g_bb)
    iteration = 0
    calm = 0
    while iteration < max_iter:
        iteration += 1
        f_next = (1.0 - relaxation) * f_ba + relaxation * softmin(cost_xy, log_b + g_ab / eps, eps)
        g_next = (1.0 - relaxation) * g_ab + relaxation * softmin(
            cost_yx, log_a + f_next / eps, eps
        )
        step = max(_largest_change(f_next, f_ba), _largest_change(g_next, g_ab))
        if first_step is None:
            first_step = step
        if relaxation != 1.0 and not step <= _DIVERGED * max(eps, first_step):
            f_ba, g_ab = start
            relaxation = 1.0 + (relaxation - 1.0) / 2.0 if relaxation > 1.1 else 1.0
            first_step = None
            continue
        f_ba, g_ab = f_next, g_next
        if not self_settled:
            f_aa_next = 0.5 * (f_aa + softmin(cost_xx, log_a + f_aa / eps, eps))
            g_bb_next = 0.5 * (g_bb + softmin(cost_yy, log_b + g_bb / eps, eps))
            self_step = max(_largest_change(f_aa_next, f_aa), _largest_change(g_bb_next, g_bb))
            f_aa, g_bb = f_aa_next, g_bb_next
            self_settled = self_step < tol * eps
        updated = _divergence(f_ba, g_ab, f_aa, g_bb)
        calm = calm + 1 if abs(updated - value) < tol * eps else 0
        if self_settled and calm >= _CALM_ITERATIONS:
            break
        value = updated
    return (f_ba, g_ab, f_aa, g_bb), iteration


def anneal(
    softmin: Softmin,
    costs: tuple[Any, Any, Any, Any],
    log_weights: tuple[Any, Any],
    temperatures: list[float],
) -> tuple[Any, Any, Any, Any]:
    """The annealing of geomloss: symmetric updates of the four potentials per temperature.

    Parameters
    ----------
    softmin, costs, log_weights
        As for :func:`converge`.
    temperatures
        The annealing (:func:`temperature_schedule`).

    Returns
    -------
    tuple
        ``f_ba``, ``g_ab``, ``f_aa``, ``g_bb`` after the last temperature.

    """
    cost_xy, cost_yx, cost_xx, cost_yy = costs
    log_a, log_b = log_weights
    eps = temperatures[0]
    g_ab = softmin(cost_yx, log_a, eps)
    f_ba = softmin(cost_xy, log_b, eps)
    f_aa = softmin(cost_xx, log_a, eps)
    g_bb = softmin(cost_yy, log_b, eps)
    for eps in temperatures:
        f_ba_next = softmin(cost_xy, log_b + g_ab / eps, eps)
        g_ab_next = softmin(cost_yx, log_a + f_ba / eps, eps)
        f_aa_next = softmin(cost_xx, log_a + f_aa / eps, eps)
        g_bb_next = softmin(cost_yy, log_b + g_bb / eps, eps)
        f_ba = 0.5 * (f_ba + f_ba_next)
        g_ab = 0.5 * (g_ab + g_ab_next)
        f_aa = 0.5 * (f_aa + f_aa_next)
        g_bb = 0.5 * (g_bb + g_bb_next)
    return f_ba, g_ab, f_aa, g_bb


#: The annealing on given costs, log weights and temperatures, a soft-C-transform bound in.
Annealing = Callable[[tuple[Any, Any, Any, Any], tuple[Any, Any], list[float]], tuple[Any, ...]]


def solve(
    softmin: Softmin,
    costs: tuple[Any, Any, Any, Any],
    log_weights: tuple[Any, Any],
    temperatures: list[float],
    tol: float | None,
    max_iter: int,
    annealing: Annealing | None = None,
) -> float:
    """The annealing, the iterations at the final temperature, and ``S``.

    Parameters
    ----------
    softmin, costs, log_weights, temperatures
        As for :func:`anneal`.
    tol, max_iter
        As for :func:`converge`; ``tol=None`` stops at the end of the annealing.
    annealing
        Runs the annealing instead of :func:`anneal` with ``softmin``: :func:`anneal`
        compiled with a soft-C-transform bound in.

    Returns
    -------
    float
        ``<a, f_ba - f_aa> + <b, g_ab - g_bb>`` after one last, non-averaged update.

    """
    cost_xy, cost_yx, cost_xx, cost_yy = costs
    log_a, log_b = log_weights
    if annealing is None:
        f_ba, g_ab, f_aa, g_bb = anneal(softmin, costs, log_weights, temperatures)
    else:
        f_ba, g_ab, f_aa, g_bb = annealing(costs, log_weights, temperatures)
    eps = temperatures[-1]
    if tol is not None:
        (f_ba, g_ab, f_aa, g_bb), _ = converge(
            softmin, costs, log_weights, (f_ba, g_ab, f_aa, g_bb), eps, tol, max_iter
        )
    # The last update is not averaged: it extrapolates the potentials to the final
    # temperature, the two cross potentials from each other's previous values.
    f_ba, g_ab = (
        softmin(cost_xy, log_b + g_ab / eps, eps),
        softmin(cost_yx, log_a + f_ba / eps, eps),
    )
    f_aa = softmin(cost_xx, log_a + f_aa / eps, eps)
    g_bb = softmin(cost_yy, log_b + g_bb / eps, eps)
    return _divergence(f_ba, g_ab, f_aa, g_bb)


@numba.njit(cache=True, nogil=True)
def _scaled_differences(
    potential: np.ndarray, row: np.ndarray, eps: float, out: np.ndarray
) -> None:
    """``out[j] = potential[j] - row[j] / eps``."""
    for j in range(row.shape[0]):
        out[j] = potential[j] - row[j] / eps


@numba.njit(cache=True, nogil=True)
def _softmin_rows(cost: np.ndarray, potential: np.ndarray, eps: float, out: np.ndarray) -> None:
    """``out[i] = -eps * log(sum_j exp(potential[j] - cost[i, j] / eps))``."""
    n_rows, n_columns = cost.shape
    exponents = np.empty(n_columns)
    mantissas = np.empty(n_columns)
    powers = np.empty(n_columns)
    for i in range(n_rows):
        # Separate passes: the divisions vectorise only in a loop of their own, and
        # the maximum is fastest over several running maxima (see ``_largest``).
        _scaled_differences(potential, cost[i], eps, exponents)
        largest = _largest(exponents)
        # Every argument is <= 0 and the largest is 0, so the sum is >= 1: arguments
        # clamped at the smallest normal exponent change it by less than one ulp.
        _exponentials(exponents, 1.0, largest, mantissas, powers)
        out[i] = -eps * (math.log(_products_sum(mantissas, powers)) + largest)


@numba.njit(cache=True, nogil=True)
def softmin(cost: np.ndarray, potential: np.ndarray, eps: float) -> np.ndarray:
    """The soft-C-transform ``-eps log sum_j exp(potential_j - cost_ij / eps)`` of each row.

    Parameters
    ----------
    cost
        C-contiguous float64 cost matrix (rows x columns).
    potential
        float64 dual potential, one value per column.
    eps
        The temperature (positive).

    Returns
    -------
    numpy.ndarray
        One value per row.

    """
    out = np.empty(cost.shape[0])
    _softmin_rows(cost, potential, eps, out)
    return out


# Inlined into the cached function below: a soft-C-transform passed as a value to a
# separately compiled function would keep that function out of numba's cache.
_anneal_inlined = numba.njit(inline="always")(anneal)


@numba.njit(cache=True, nogil=True)
def _anneal_compiled(
    costs: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray],
    log_weights: tuple[np.ndarray, np.ndarray],
    temperatures: np.ndarray,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    return _anneal_inlined(softmin, costs, log_weights, temperatures)  # type: ignore[arg-type, no-any-return]


def _compiled_annealing(
    costs: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray],
    log_weights: tuple[np.ndarray, np.ndarray],
    temperatures: list[float],
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    return _anneal_compiled(costs, log_weights, np.asarray(temperatures, dtype=np.float64))  # type: ignore[no-any-return]


def half_squared_distances(x: Any, y: Any) -> Any:
    """The cost matrix ``||x_i - y_j||^2 / 2`` of two clouds (NumPy arrays or torch tensors).

    Parameters
    ----------
    x, y
        Cells x features float64 arrays of one library, with the same features.

    Returns
    -------
    array
        ``(|x|^2 - 2 x.y + |y|^2) / 2``, in that order of operations (geomloss's).

    """
    cost = (x * x).sum(axis=1)[:, None] - 2.0 * (x @ y.T)
    cost += (y * y).sum(axis=1)[None, :]
    cost /= 2.0
    return cost


def debiased_sinkhorn(
    x: Any,
    y: Any,
    blur: float,
    scaling: float,
    diameter: float | None = None,
    *,
    tol: float | None = None,
    max_iter: int,
    soft_c_transform: Softmin | None = None,
) -> float:
    """Debiased Sinkhorn divergence ``S_eps`` between uniform measures on two clouds.

    Parameters
    ----------
    x, y
        Cells x features float64 arrays with the same features and at least one row
        each, finite, not all points coinciding: NumPy arrays, or torch tensors on
        one device with ``soft_c_transform`` given.
    blur
        Final blur (``eps = blur^2``).
    scaling
        Ratio of successive blurs in the annealing, in (0, 1).
    diameter
        Length of the diagonal of the pooled clouds' bounding box, where the caller
        has it already; computed when omitted.
    tol
        Iterate at ``eps = blur^2`` after the annealing until ``S`` changes by less
        than ``tol * eps`` per iteration (see :func:`converge`); ``None`` stops at
        the end of the annealing, as geomloss does.
    max_iter
        Cap on the iterations at ``eps = blur^2``.
    soft_c_transform
        The soft-C-transform on the arrays given (torch tensors); ``None``: NumPy
        arrays, :func:`softmin` and the compiled annealing.

    Returns
    -------
    float
        ``OT_eps(a, b) - (OT_eps(a, a) + OT_eps(b, b)) / 2`` for the cost
        ``||x - y||^2 / 2``; may be slightly negative by rounding.

    """
    annealing: Annealing | None = None
    if soft_c_transform is None:
        soft_c_transform, annealing = softmin, _compiled_annealing
        x = np.ascontiguousarray(x, dtype=np.float64)
        y = np.ascontiguousarray(y, dtype=np.float64)
    if diameter is None:
        low = np.minimum(x.min(axis=0), y.min(axis=0))
        high = np.maximum(x.max(axis=0), y.max(axis=0))
        diameter = float(np.linalg.norm(high - low))
    temperatures = temperature_schedule(diameter, blur, scaling)
    # C_yx is expanded on its own, not transposed, as geomloss does: rounding then agrees.
    costs = (
        half_squared_distances(x, y),
        half_squared_distances(y, x),
        half_squared_distances(x, x),
        half_squared_distances(y, y),
    )
    log_weights = (_uniform_log_weights(x), _uniform_log_weights(y))
    return solve(soft_c_transform, costs, log_weights, temperatures, tol, max_iter, annealing)


def _uniform_log_weights(cloud: Any) -> Any:
    """``log(1 / n)`` for each of the ``n`` rows, in the cloud's library and device."""
    value = math.log(1.0 / cloud.shape[0])
    if isinstance(cloud, np.ndarray):
        return np.full(cloud.shape[0], value)
    return cloud.new_full((cloud.shape[0],), value)
