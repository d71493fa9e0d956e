"""LAPACK's banded symmetric eigenvalues, called without holding the GIL.

scipy's wrappers of LAPACK hold the interpreter lock for the whole call. For the
eigenvalues of the PCA fit's band matrix (seconds for 5,000 genes) that stops
every other worker of the pool at its next line of Python. This calls the same
routine, ``dsbevx``, with the arguments :func:`scipy.linalg.eig_banded` gives it,
through scipy's Cython interface (:mod:`scperteval.kernels._foreign`), which
releases the lock: the values are LAPACK's, bit for bit.
"""

from __future__ import annotations

import ctypes
from functools import cache

import numpy as np

from scperteval.kernels._foreign import (
    CHAR,
    DOUBLE,
    INT,
    double_pointer,
    double_reference,
    int_pointer,
    int_reference,
    routine,
)

__all__ = ["band_eigenvalues"]

# jobz, range, uplo, n, kd, ab, ldab, q, ldq, vl, vu, il, iu, abstol, m, w, z, ldz, work,
# iwork, ifail, info
_SIGNATURE = (CHAR, CHAR, CHAR, INT, INT, DOUBLE, INT, DOUBLE, INT, DOUBLE, DOUBLE, INT, INT,
              DOUBLE, INT, DOUBLE, DOUBLE, INT, DOUBLE, INT, INT, INT)  # fmt: skip


@cache
def _absolute_tolerance() -> float:
    from scipy.linalg import lapack

    # scipy's choice for eig_banded: twice the safe minimum, LAPACK's most accurate.
    return 2.0 * float(lapack.dlamch("s"))


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
    routine("lapack", "dsbevx", *_SIGNATURE)(
        b"N", b"I", b"L", int_reference(order), int_reference(rows - 1),
        double_pointer(matrix), int_reference(rows),
        double_pointer(unused), int_reference(1),
        double_reference(0.0), double_reference(1.0),
        int_reference(first + 1), int_reference(last + 1),
        double_reference(_absolute_tolerance()),
        ctypes.byref(found), double_pointer(values),
        double_pointer(unused), int_reference(1),
        double_pointer(work), int_pointer(integer_work), int_pointer(failed),
        ctypes.byref(info),
    )  # fmt: skip
    if info.value != 0:
        raise np.linalg.LinAlgError(f"LAPACK's dsbevx failed (info={info.value})")
    return values[: found.value].copy()
