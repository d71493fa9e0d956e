"""LAPACK's band routines of the PCA fit, called without holding the GIL.

scipy's wrappers of LAPACK hold the interpreter lock for the whole call. For the
eigenvalues of the PCA fit's band matrix (seconds for 5,000 genes) that stops
every other worker of the pool at its next line of Python, and so do the hundreds
of band LU solves of the inverse iteration that follows, and the QR
factorisations of the panels that reduce the matrix to band form. This calls the same
routines (``dsbevx``, ``dgeqrt``, ``dgbtrf``, ``dgbtrs``) with the arguments scipy's wrappers
give them, through scipy's Cython interface (:mod:`scperteval.kernels._foreign`),
which releases the lock: the results are LAPACK's, bit for bit.
"""

from __future__ import annotations

import ctypes

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

__all__ = [
    "band_eigenvalues",
    "band_lu",
    "band_lu_solve",
    "blocked_qr",
]

# jobz, range, uplo, n, kd, ab, ldab, q, ldq, vl, vu, il, iu, abstol, m, w, z, ldz, work,
# iwork, ifail, info
_SIGNATURE = (CHAR, CHAR, CHAR, INT, INT, DOUBLE, INT, DOUBLE, INT, DOUBLE, DOUBLE, INT, INT,
              DOUBLE, INT, DOUBLE, DOUBLE, INT, DOUBLE, INT, INT, INT)  # fmt: skip
# m, n, nb, a, lda, t, ldt, work, info
_QR_SIGNATURE = (INT, INT, INT, DOUBLE, INT, DOUBLE, INT, DOUBLE, INT)
# m, n, kl, ku, ab, ldab, ipiv, info
_LU_SIGNATURE = (INT, INT, INT, INT, DOUBLE, INT, INT, INT)
# trans, n, kl, ku, nrhs, ab, ldab, ipiv, b, ldb, info
_SOLVE_SIGNATURE = (CHAR, INT, INT, INT, INT, DOUBLE, INT, INT, DOUBLE, INT, INT)


def _absolute_tolerance() -> float:
    from scipy.linalg import lapack

    # scipy's choice for eig_banded: twice the safe minimum, LAPACK's most accurate.
    return 2.0 * float(lapack.dlamch("s"))


def band_eigenvalues(band: np.ndarray, first: int, last: int) -> np.ndarray:
    """Eigenvalues ``first`` to ``last`` (0-based, ascending) of a symmetric band matrix.

    The same as ``scipy.linalg.eig_banded(band, lower=True, eigvals_only=True,
    select="i", select_range=(first, last))``, bit for bit: ``dsbevx`` reduces the
    band to tridiagonal form by plane rotations, then bisection finds the
    eigenvalues.

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
        double_pointer(np.zeros(7 * order)),
        int_pointer(np.zeros(5 * order, dtype=np.intc)),
        int_pointer(np.zeros(max(order, 1), dtype=np.intc)), ctypes.byref(info),
    )  # fmt: skip
    if info.value != 0:
        raise np.linalg.LinAlgError(f"LAPACK's dsbevx failed (info={info.value})")
    return values[: found.value].copy()


def band_lu(general: np.ndarray, lower: int, upper: int) -> tuple[np.ndarray, np.ndarray, int]:
    """LU factorisation with partial pivoting of a square band matrix, in place (``dgbtrf``).

    Parameters
    ----------
    general
        Float64 Fortran-ordered ``(2 * lower + upper + 1, n)`` array in LAPACK's
        storage for a band LU (the matrix in rows ``lower`` onwards); overwritten
        by the factors.
    lower, upper
        Numbers of sub- and super-diagonals.

    Returns
    -------
    tuple
        ``general`` (now the factors), the pivots (LAPACK's, 1-based, for
        :func:`band_lu_solve`) and LAPACK's ``info`` (``> 0``: an exact zero pivot).

    """
    _check_band_storage(general, 2 * lower + upper + 1)
    order = general.shape[1]
    pivots = np.zeros(max(order, 1), dtype=np.intc)
    info = ctypes.c_int(0)
    routine("lapack", "dgbtrf", *_LU_SIGNATURE)(
        int_reference(order), int_reference(order), int_reference(lower), int_reference(upper),
        double_pointer(general), int_reference(general.shape[0]), int_pointer(pivots),
        ctypes.byref(info),
    )  # fmt: skip
    return general, pivots, info.value


def band_lu_solve(
    factors: np.ndarray, lower: int, upper: int, pivots: np.ndarray, rhs: np.ndarray
) -> tuple[np.ndarray, int]:
    """Solve ``A x = rhs`` from :func:`band_lu`'s factors of ``A`` (``dgbtrs``).

    Parameters
    ----------
    factors, pivots
        What :func:`band_lu` returned.
    lower, upper
        Numbers of sub- and super-diagonals of ``A``.
    rhs
        Float64 vector of length ``n``; not modified.

    Returns
    -------
    tuple
        The solution and LAPACK's ``info``.

    """
    _check_band_storage(factors, 2 * lower + upper + 1)
    order = factors.shape[1]
    if rhs.shape != (order,) or pivots.shape != (max(order, 1),) or pivots.dtype != np.intc:
        raise ValueError("the right-hand side or the pivots do not match the factors")
    solution = np.array(rhs, dtype=np.float64)
    info = ctypes.c_int(0)
    routine("lapack", "dgbtrs", *_SOLVE_SIGNATURE)(
        b"N", int_reference(order), int_reference(lower), int_reference(upper),
        int_reference(1), double_pointer(factors), int_reference(factors.shape[0]),
        int_pointer(pivots), double_pointer(solution), int_reference(max(order, 1)),
        ctypes.byref(info),
    )  # fmt: skip
    return solution, info.value


def _check_band_storage(array: np.ndarray, rows: int) -> None:
    if (
        array.ndim != 2
        or array.dtype != np.float64
        or not array.flags.f_contiguous
        or array.shape[0] != rows
    ):
        raise ValueError(f"expected a Fortran-ordered float64 array with {rows} rows")


def blocked_qr(matrix: np.ndarray, block: int) -> tuple[np.ndarray, np.ndarray, int]:
    """QR factorisation in compact WY form, in blocks of ``block`` columns (``dgeqrt``).

    The same as ``scipy.linalg.lapack.dgeqrt(block, matrix)``, bit for bit.

    Parameters
    ----------
    matrix
        Float64 ``(m, n)`` array; not modified.
    block
        Block size, ``1 <= block <= min(m, n)`` (when ``min(m, n) > 0``).

    Returns
    -------
    tuple
        The factored matrix (``R`` above the diagonal, the reflectors below), the
        ``(block, min(m, n))`` triangular factors and LAPACK's ``info``.

    """
    if matrix.ndim != 2 or matrix.dtype != np.float64:
        raise ValueError("matrix must be a two-dimensional float64 array")
    rows, columns = matrix.shape
    if min(rows, columns) > 0 and not 1 <= block <= min(rows, columns):
        raise ValueError(f"block must be between 1 and {min(rows, columns)}, got {block}")
    factored = np.array(matrix, order="F")
    triangular = np.zeros((max(block, 1), min(rows, columns)), order="F")
    work = np.zeros(max(block * columns, 1))
    info = ctypes.c_int(0)
    routine("lapack", "dgeqrt", *_QR_SIGNATURE)(
        int_reference(rows), int_reference(columns), int_reference(block),
        double_pointer(factored), int_reference(max(rows, 1)),
        double_pointer(triangular), int_reference(max(block, 1)),
        double_pointer(work), ctypes.byref(info),
    )  # fmt: skip
    return factored, triangular, info.value
