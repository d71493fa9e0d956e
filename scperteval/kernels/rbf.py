"""Sums of RBF kernel values ``exp(scale * d2)`` over a tile of squared distances.

MMD with a bandwidth per perturbation evaluates one exponential per pair of cells
of the shared sample and per perturbation, billions on a large screen. NumPy's
float64 ``exp`` is vectorised only on CPUs with AVX-512; elsewhere it calls the C
library once per element. These compiled loops vectorise on any x86-64 CPU and
fuse the scaling, the exponential and the sum into one pass over the tile:

- the argument is reduced as ``x = k ln 2 + r`` with ``|r| <= ln 2 / 2`` (``ln 2``
  in two parts, so that ``r`` is exact to rounding); adding ``1.5 * 2^52`` rounds
  ``x / ln 2`` to the integer ``k`` inside the floating-point unit, where it can be
  read from the low bits of the bit pattern, so no float-to-integer conversion is
  needed;
- ``exp(r)`` is the degree-13 Taylor polynomial (truncation error below 5e-18
  relative), ``2^k`` is assembled from its exponent bits.

Each value agrees with the C library's ``exp`` to about one unit in the last place
(tested), so sums agree to rounding. Tiles holding arguments below -708, whose
powers of two would be subnormal, are summed with NumPy's ``exp`` instead.
"""

from __future__ import annotations

import math

import numba
import numpy as np

__all__ = ["NO_DIAGONAL", "rbf_tile_sum"]

#: ``diagonal_offset`` that keeps every pair of a tile.
NO_DIAGONAL = -(2**62)

_LOG2E = 1.4426950408889634
_LN2_HI = 6.93147180369123816490e-01
_LN2_LO = 1.90821492927058770002e-10
_SMALLEST_NORMAL_ARGUMENT = -708.0
_ROUNDING_SHIFT = 6755399441055744.0  # 1.5 * 2^52
_ROUNDING_SHIFT_BITS = 0x4338000000000000  # its bit pattern
_EXPONENT_BIAS = 1023
_MANTISSA_BITS = 52
# 1 / n! for n = 13 down to 2: the Horner coefficients of exp(r).
_C13 = 1.0 / 6227020800.0
_C12 = 1.0 / 479001600.0
_C11 = 1.0 / 39916800.0
_C10 = 1.0 / 3628800.0
_C9 = 1.0 / 362880.0
_C8 = 1.0 / 40320.0
_C7 = 1.0 / 5040.0
_C6 = 1.0 / 720.0
_C5 = 1.0 / 120.0
_C4 = 1.0 / 24.0
_C3 = 1.0 / 6.0
_C2 = 0.5


@numba.njit(cache=True, nogil=True, fastmath={"contract"})
def _exponentials(
    values: np.ndarray, scale: float, shift: float, mantissas: np.ndarray, powers: np.ndarray
) -> None:
    """``exp(values[j] * scale - shift) = mantissas[j] * powers[j]``, ``powers[j] = 2^k_j``.

    With ``scale = 1`` the argument is the rounded difference ``values[j] - shift``,
    with ``shift = 0`` the rounded product ``values[j] * scale``: either way one
    rounding, whether or not the two operations are fused.
    """
    # Loops run from 0 over views: with a variable start, numba's negative-index
    # handling keeps LLVM from vectorising them.
    for j in range(values.shape[0]):
        x = values[j] * scale - shift
        x = x if x > _SMALLEST_NORMAL_ARGUMENT else _SMALLEST_NORMAL_ARGUMENT
        rounded = x * _LOG2E + _ROUNDING_SHIFT
        k = rounded - _ROUNDING_SHIFT
        r = (x - k * _LN2_HI) - k * _LN2_LO
        p = _C13
        p = p * r + _C12
        p = p * r + _C11
        p = p * r + _C10
        p = p * r + _C9
        p = p * r + _C8
        p = p * r + _C7
        p = p * r + _C6
        p = p * r + _C5
        p = p * r + _C4
        p = p * r + _C3
        p = p * r + _C2
        p = p * r + 1.0
        mantissas[j] = p * r + 1.0
        powers[j] = rounded
    # ``k + 1.5 * 2^52`` read as an integer, rebuilt as the bit pattern of ``2.0**k``.
    bits = powers.view(np.int64)
    for j in range(bits.shape[0]):
        bits[j] = (bits[j] - _ROUNDING_SHIFT_BITS + _EXPONENT_BIAS) << _MANTISSA_BITS


@numba.njit(cache=True, nogil=True)
def _largest(values: np.ndarray) -> float:
    """The largest of ``values`` (``-inf`` when empty), over eight running maxima.

    A single running maximum is one chain of dependent comparisons that LLVM does
    not vectorise; eight independent ones run side by side, about 2.5 times faster.
    The maximum of finite numbers does not depend on the order they are compared in.
    """
    n = values.shape[0]
    a0 = a1 = a2 = a3 = a4 = a5 = a6 = a7 = -np.inf
    whole = n - n % 8
    for j in range(0, whole, 8):
        a0 = max(a0, values[j])
        a1 = max(a1, values[j + 1])
        a2 = max(a2, values[j + 2])
        a3 = max(a3, values[j + 3])
        a4 = max(a4, values[j + 4])
        a5 = max(a5, values[j + 5])
        a6 = max(a6, values[j + 6])
        a7 = max(a7, values[j + 7])
    largest = max(max(max(a0, a1), max(a2, a3)), max(max(a4, a5), max(a6, a7)))
    for j in range(whole, n):
        largest = max(largest, values[j])
    return largest


@numba.njit(cache=True, nogil=True, fastmath={"reassoc", "contract"})
def _products_sum(mantissas: np.ndarray, powers: np.ndarray) -> float:
    total = 0.0
    for j in range(mantissas.shape[0]):
        total += mantissas[j] * powers[j]
    return total


@numba.njit(cache=True, nogil=True)
def _fused_tile_sum(tile: np.ndarray, scale: float, diagonal_offset: int) -> float:
    n_rows, n_columns = tile.shape
    mantissas = np.empty(n_columns)
    powers = np.empty(n_columns)
    total = 0.0
    for i in range(n_rows):
        first = max(0, i + diagonal_offset + 1)
        if first >= n_columns:
            continue
        kept = n_columns - first
        row_mantissas = mantissas[:kept]
        row_powers = powers[:kept]
        _exponentials(tile[i, first:], scale, 0.0, row_mantissas, row_powers)
        total += _products_sum(row_mantissas, row_powers)
    return total


def rbf_tile_sum(
    tile: np.ndarray,
    scale: float,
    diagonal_offset: int = NO_DIAGONAL,
    upper_bound: float = math.inf,
) -> float:
    """Sum of ``exp(scale * tile[i, j])`` over the pairs with ``j > i + diagonal_offset``.

    Parameters
    ----------
    tile
        Non-negative squared distances, C-contiguous float64 (rows x columns).
    scale
        The kernel's factor ``-1 / (2 sigma^2)`` (negative).
    diagonal_offset
        Pairs ``(i, j)`` with ``j <= i + diagonal_offset`` are left out: a tile that
        crosses the diagonal of a within-cloud pass. :data:`NO_DIAGONAL` keeps all.
    upper_bound
        A number no smaller than any value of the tile, when the caller knows one:
        if no exponential can leave the normal range below it, the tile's largest
        value is not looked for (a pass over the tile). The sum does not depend on it.

    Returns
    -------
    float
        The sum.

    """
    if tile.size == 0:
        return 0.0
    # A bound that keeps every exponential normal decides as the largest value would.
    bounded = float(upper_bound) * scale >= _SMALLEST_NORMAL_ARGUMENT
    if not bounded and float(tile.max()) * scale < _SMALLEST_NORMAL_ARGUMENT:
        values = np.exp(tile * scale)
        if diagonal_offset != NO_DIAGONAL:
            rows, columns = np.indices(tile.shape)
            values[columns <= rows + diagonal_offset] = 0.0
        return float(values.sum())
    return float(_fused_tile_sum(tile, float(scale), int(diagonal_offset)))
