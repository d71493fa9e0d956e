"""Calling BLAS and LAPACK routines through scipy's Cython interface with ``ctypes``.

scipy exports the Fortran routines it links against in ``scipy.linalg.cython_blas``
and ``scipy.linalg.cython_lapack``; numba's documented helper locates them. A call
through ``ctypes`` releases the GIL, unlike scipy's Python wrappers, and passes
pointers and leading dimensions as they are, without copying strided blocks.
"""

from __future__ import annotations

import ctypes
from typing import Any

import numpy as np

__all__ = [
    "CHAR",
    "DOUBLE",
    "INT",
    "double_pointer",
    "double_reference",
    "int_pointer",
    "int_reference",
    "routine",
]

INT = ctypes.POINTER(ctypes.c_int)
DOUBLE = ctypes.POINTER(ctypes.c_double)
CHAR = ctypes.c_char_p


def routine(library: str, name: str, *arguments: Any) -> Any:
    """The routine ``name`` of ``scipy.linalg.cython_<library>``, callable with ``arguments``.

    Parameters
    ----------
    library
        ``"blas"`` or ``"lapack"``.
    name
        The routine, e.g. ``"dsymm"``.
    *arguments
        Its ``ctypes`` argument types, in order.

    Returns
    -------
    ctypes function
        Returns nothing; releases the GIL while it runs.

    """
    from numba.extending import get_cython_function_address

    address = get_cython_function_address(f"scipy.linalg.cython_{library}", name)
    return ctypes.CFUNCTYPE(None, *arguments)(address)


def int_reference(value: int) -> Any:
    """An integer argument passed by reference, as Fortran takes it."""
    return ctypes.byref(ctypes.c_int(int(value)))


def double_reference(value: float) -> Any:
    """A float64 argument passed by reference, as Fortran takes it."""
    return ctypes.byref(ctypes.c_double(float(value)))


def double_pointer(array: np.ndarray) -> Any:
    """Pointer to a float64 array's first element."""
    return array.ctypes.data_as(DOUBLE)


def int_pointer(array: np.ndarray) -> Any:
    """Pointer to a C ``int`` array's first element."""
    return array.ctypes.data_as(INT)
