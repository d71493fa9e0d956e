"""Bandwidths and membership weights of a fuzzy neighbourhood graph (UMAP's construction).

Rows hold one point's neighbour distances in float32, sorted, the point itself first.
The arithmetic is the reference implementation's, type for type: the bandwidth search
runs in float64 on float32 distance gaps, the weights in float32 (``expf``). Compiled,
so that the float32 exponential is the C library's, as in the reference.
"""

from __future__ import annotations

import numba
import numpy as np

#: Bisection steps of the bandwidth search.
BISECTION_STEPS = 64
#: The search stops when the fuzzy cardinality is this close to ``log2(k)``.
BISECTION_TOLERANCE = 1e-5
#: A bandwidth is at least this fraction of the mean neighbour distance.
MIN_BANDWIDTH_SCALE = 1e-3
_UNBOUNDED = float(np.finfo(np.float32).max)


@numba.njit(cache=True, nogil=True)
def fuzzy_bandwidths(distances: np.ndarray, k: float) -> tuple[np.ndarray, np.ndarray]:
    """``sigma`` and ``rho`` of every row of neighbour distances.

    ``rho`` is the first positive distance of the row (0 if none); ``sigma`` solves
    ``sum_{j >= 1} exp(-max(d_j - rho, 0) / sigma) = log2(k)`` by bisection from 1
    (doubling while unbounded above), and is raised to ``MIN_BANDWIDTH_SCALE`` times the
    row's mean distance (the whole matrix's mean for a row without positive distance).

    Parameters
    ----------
    distances
        ``n x m`` float32, each row sorted, column 0 the point itself.
    k
        Target neighbour count (``m``).

    Returns
    -------
    tuple of numpy.ndarray
        ``sigma`` and ``rho``, float32 of length ``n``.

    """
    n_rows, n_columns = distances.shape
    target = np.log2(k)
    rho = np.zeros(n_rows, dtype=np.float32)
    sigma = np.zeros(n_rows, dtype=np.float32)
    overall = np.mean(distances)
    for i in range(n_rows):
        for j in range(n_columns):
            if distances[i, j] > 0.0:
                rho[i] = distances[i, j]
                break
        lo = 0.0
        hi = _UNBOUNDED
        mid = 1.0
        for _ in range(BISECTION_STEPS):
            psum = 0.0
            for j in range(1, n_columns):
                gap = distances[i, j] - rho[i]
                if gap > 0.0:
                    psum += np.exp(-(gap / mid))
                else:
                    psum += 1.0
            if np.fabs(psum - target) < BISECTION_TOLERANCE:
                break
            if psum > target:
                hi = mid
                mid = (lo + hi) / 2.0
            else:
                lo = mid
                if hi >= _UNBOUNDED:
                    mid *= 2
                else:
                    mid = (lo + hi) / 2.0
        sigma[i] = mid
        scale = np.mean(distances[i]) if rho[i] > 0.0 else overall
        if sigma[i] < MIN_BANDWIDTH_SCALE * scale:
            sigma[i] = MIN_BANDWIDTH_SCALE * scale
    return sigma, rho


@numba.njit(cache=True, nogil=True)
def fuzzy_memberships(
    indices: np.ndarray, distances: np.ndarray, sigma: np.ndarray, rho: np.ndarray
) -> np.ndarray:
    """Directed weights ``exp(-(d_ij - rho_i) / sigma_i)``: 1 at or below ``rho_i``, 0 to itself.

    Parameters
    ----------
    indices
        ``n x m`` neighbour indices.
    distances
        ``n x m`` float32 neighbour distances.
    sigma, rho
        float32 per row, from :func:`fuzzy_bandwidths`.

    Returns
    -------
    numpy.ndarray
        ``n x m`` float32 weights.

    """
    n_rows, n_columns = indices.shape
    weights = np.zeros((n_rows, n_columns), dtype=np.float32)
    for i in range(n_rows):
        for j in range(n_columns):
            if indices[i, j] == i:
                continue
            gap = distances[i, j] - rho[i]
            if gap <= 0.0 or sigma[i] == 0.0:
                weights[i, j] = 1.0
            else:
                weights[i, j] = np.exp(-(gap / sigma[i]))
    return weights
