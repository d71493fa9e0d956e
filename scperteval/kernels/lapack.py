"""LAPACK's banded symmetric eigenvalues, called without holding the GIL.

scipy's wrappers of LAPACK hold the interpreter lock for the whole call. For the
eigenvalues of the PCA fit's band matrix (seconds for 5,000 genes) that stops
every other worker of the pool at its next line of Python. This calls the same
routine, ``dsbevx``, with the arguments :func:`scipy.linalg.eig_banded` gives it,
through scipy's Cython interface (located with numba's documented helper) by
``ctypes``, which releases the lock: the values are LAPACK's, bit for bit.
"""

from __future__ import annotations

import ctypes
from functools import cache
from typing import Any

import numpy as np

__all__ = ["band_eigenvalues"]

_INT = ctypes.POINTER(ctypes.c_int)
_DOUBLE = ctypes.POINTER(ctypes.c_double)
_CHAR = ctypes.c_char_p
# jobz, range, uplo, n, kd, ab, ldab, q, ldq, vl, vu, il, iu, abstol, m, w, z, ldz, work,
# iwork, ifail, info
_SIGNATURE = (_CHAR, _CHAR, _CHAR, _INT, _INT, _DOUBLE, _INT, _DOUBLE, _INT, _DOUBLE,
              _DOUBLE, _INT, _INT, _DOUBLE, _INT, _DOUBLE, _DOUBLE, _INT, _DOUBLE, _INT, _INT,
              _INT)  # fmt: skip


@cache
def _dsbevx() -> Any:
    from numba.extending import get_cython_function_address

    address = get_cython_function_address("scipy.linalg.cython_lapack", "dsbevx")
    return ctypes.CFUNCTYPE(None, *_SIGNATURE)(address)


@cache
def _absolute_tolerance() -> float:
    from scipy.linalg import lapack

    # scipy's choice for eig_banded: twice the safe minimum, LAPACK's most accurate.
    return 2.0 * float(lapack.dlamch("s"))


def _pointer(array: np.ndarray, kind: Any) -> Any:
    return array.ctypes.data_as(kind)


def band_eigenvalues(band: np.ndarray, first: int, last: int) -> np.ndarray:
    """Eigenvalues ``first`` to ``last`` (0-based, ascending) of a symmetric band matrix.

    The same as ``scipy.linalg.eig_banded(band, lower=True, eigvals_only=True,
    select="i", select_range=(first, last))``, bit for bit.

    Parameters
    ----------
    band
        Float64 ``(bandwidth + 1, n)`` array in LAPACK's lower band storage
        (``band[d, j] = A[j + d, j]``); not modified.
    first, last
        Positions of the smallest and the largest eigenvalue wanted among all ``n``
        in ascending order, ``0 <= first <= last < n``.

    Returns
    -------
    numpy.ndarray
        The ``last - first + 1`` eigenvalues, ascending.

    Raises
    ------
    numpy.linalg.LinAlgError
        If LAPACK reports a failure.

    """
    if band.ndim != 2 or band.dtype != np.float64:
        raise ValueError("band must be a two-dimensional float64 array")
    rows, order = band.shape
    if not 0 <= first <= last < order:
        raise ValueError(f"need 0 <= first <= last < {order}, got {first} and {last}")
    matrix = np.array(band, order="F")
    unused = np.zeros(1)
    values = np.zeros(order)
    work = np.zeros(7 * order)
    integer_work = np.zeros(5 * order, dtype=np.intc)
    failed = np.zeros(max(order, 1), dtype=np.intc)
    found = ctypes.c_int(0)
    info = ctypes.c_int(0)

    def integer(value: int) -> Any:
        return ctypes.byref(ctypes.c_int(int(value)))

    def real(value: float) -> Any:
        return ctypes.byref(ctypes.c_double(float(value)))

    _dsbevx()(
        b"N",
        b"I",
        b"L",
        integer(order),
        integer(rows - 1),
        _pointer(matrix, _DOUBLE),
        integer(rows),
        _pointer(unused, _DOUBLE),
        integer(1),
        real(0.0),
        real(1.0),
        integer(first + 1),
        integer(last + 1),
        real(_absolute_tolerance()),
        ctypes.byref(found),
        _pointer(values, _DOUBLE),
        _pointer(unused, _DOUBLE),
        integer(1),
        _pointer(work, _DOUBLE),
        _pointer(integer_work, _INT),
        _pointer(failed, _INT),
        ctypes.byref(info),
    )
    if info.value != 0:
        raise np.linalg.LinAlgError(f"LAPACK's dsbevx failed (info={info.value})")
    return values[: found.value].copy()
