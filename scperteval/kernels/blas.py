"""Symmetric BLAS products in place on strided blocks of a larger matrix.

scipy's Python wrappers of BLAS copy any output that is not a contiguous array,
so updating the trailing block of a matrix in place through them costs a copy of
the block in and out; numpy has no symmetric products at all. These call the
same BLAS routines through scipy's Cython interface (located with numba's
documented helper), passing the block's leading dimension, so the update happens
where the block lives. The calls release the GIL.

Every array passed is float64 with unit stride down its columns (Fortran order,
or a block of a Fortran-ordered array).
"""

from __future__ import annotations

import numpy as np

from scperteval.kernels._foreign import (
    CHAR,
    DOUBLE,
    INT,
    double_pointer,
    double_reference,
    int_reference,
    routine,
)

__all__ = ["symmetric_product", "symmetric_rank_2k_update"]

_TWO_FACTOR_SIGNATURE = (CHAR, CHAR, INT, INT, DOUBLE, DOUBLE, INT, DOUBLE, INT, DOUBLE, DOUBLE,
                         INT)  # fmt: skip


def _leading_dimension(array: np.ndarray, name: str) -> int:
    if array.dtype != np.float64:
        raise TypeError(f"{name} must be float64, got {array.dtype}")
    if array.ndim != 2:
        raise ValueError(f"{name} must be two-dimensional, got {array.ndim} dimensions")
    if array.shape[0] > 1 and array.strides[0] != array.itemsize:
        raise ValueError(f"{name} must have unit stride down its columns (Fortran order)")
    if array.shape[1] <= 1:
        return max(1, array.shape[0])
    leading, remainder = divmod(array.strides[1], array.itemsize)
    if remainder or leading < max(1, array.shape[0]):
        raise ValueError(f"{name} must have columns at least {array.shape[0]} values apart")
    return int(leading)


def _call_two_factor_routine(
    name: str,
    flags: tuple[bytes, bytes],
    alpha: float,
    beta: float,
    arrays: dict[str, np.ndarray],
    order: tuple[str, str, str],
) -> None:
    """Check the arrays, then call ``dsymm`` or ``dsyr2k``, whose argument lists have the same form.

    ``arrays`` holds the square matrix, the ``m x k`` array giving the sizes and the
    other ``m x k`` array, in that order (the order of the shape error); ``order``
    names the two operands and the result as the routine takes them. Two flags, two
    sizes, ``alpha``, the two operands with their leading dimensions, ``beta`` and
    the result with its leading dimension are passed; nothing when a size is 0.
    """
    (square, sized, other), result = arrays.values(), order[2]
    size, width = sized.shape
    if not arrays[result].flags.writeable:
        raise ValueError(f"{result} is read-only")
    if square.shape != (size, size) or other.shape != (size, width):
        raise ValueError(f"shapes {square.shape}, {sized.shape}, {other.shape} do not match")
    if size == 0 or width == 0:
        return
    call = routine("blas", name, *_TWO_FACTOR_SIGNATURE)
    (first, first_ld), (second, second_ld), (out, out_ld) = (
        (double_pointer(arrays[key]), int_reference(_leading_dimension(arrays[key], key)))
        for key in order
    )
    call(
        flags[0], flags[1], int_reference(size), int_reference(width),
        double_reference(alpha), first, first_ld, second, second_ld,
        double_reference(beta), out, out_ld,
    )  # fmt: skip


def symmetric_product(lower: np.ndarray, factor: np.ndarray, out: np.ndarray) -> np.ndarray:
    """``out = A @ factor`` for the symmetric ``A`` stored in the lower triangle of ``lower``.

    Parameters
    ----------
    lower
        ``m x m``; only its lower triangle is read.
    factor
        ``m x n``.
    out
        ``m x n``, written.

    Returns
    -------
    numpy.ndarray
        ``out``.

    Examples
    --------
    >>> import numpy as np
    >>> lower = np.asfortranarray([[2.0, np.nan], [1.0, 3.0]])
    >>> symmetric_product(lower, np.asfortranarray(np.eye(2)), np.empty((2, 2), order="F"))
    array([[2., 1.],
           [1., 3.]])

    """
    _call_two_factor_routine(
        "dsymm", (b"L", b"L"), 1.0, 0.0,
        {"lower": lower, "factor": factor, "out": out}, ("lower", "factor", "out"),
    )  # fmt: skip
    return out


def symmetric_rank_2k_update(
    lower: np.ndarray, first: np.ndarray, second: np.ndarray, alpha: float
) -> None:
    """``C += alpha * (first @ second.T + second @ first.T)`` on the lower triangle of ``C``.

    Parameters
    ----------
    lower
        ``m x m`` matrix ``C``, updated in place; only its lower triangle is read
        and written.
    first, second
        ``m x k`` factors.
    alpha
        Scale of the update.

    Examples
    --------
    >>> import numpy as np
    >>> lower = np.zeros((2, 2), order="F")
    >>> ones = np.ones((2, 1), order="F")
    >>> symmetric_rank_2k_update(lower, ones, ones, 0.5)
    >>> lower
    array([[1., 0.],
           [1., 1.]])

    """
    _call_two_factor_routine(
        "dsyr2k", (b"L", b"N"), alpha, 1.0,
        {"lower": lower, "first": first, "second": second}, ("first", "second", "lower"),
    )  # fmt: skip
