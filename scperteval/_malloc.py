"""Fewer malloc arenas for the command-line process.

glibc gives each thread that allocates concurrently an arena of its own (up to
eight per core) and keeps memory freed in one arena for that arena's later use.
A run's worker threads allocate and free blocks of tens of megabytes (rows of
cells, dense views, DE tables); spread over many arenas, the freed blocks are
not reused by the other threads, and the process's peak resident memory grows by
their sum. Two arenas keep the threads' allocations contending only briefly (the
large blocks are mapped directly anyway) while freed memory is reused.

Only the command line calls this: a library must not change how the process that
imports it allocates memory.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import sys

__all__ = ["MALLOC_ARENAS", "limit_malloc_arenas"]

#: Arenas the command-line process keeps.
MALLOC_ARENAS = 2
# mallopt's parameter number for the arena limit, from glibc's <malloc.h>.
_M_ARENA_MAX = -8


def limit_malloc_arenas(arenas: int = MALLOC_ARENAS) -> bool:
    """Ask glibc to use at most ``arenas`` malloc arenas in this process.

    Must be called before worker threads start allocating to take full effect.

    Parameters
    ----------
    arenas
        The limit (at least 1).

    Returns
    -------
    bool
        Whether the limit was set: ``False`` off Linux, with another C library, or
        when ``MALLOC_ARENA_MAX`` is already set in the environment (the user's
        choice is kept).

    """
    if not sys.platform.startswith("linux") or "MALLOC_ARENA_MAX" in os.environ:
        return False
    name = ctypes.util.find_library("c")
    if name is None:
        return False
    try:
        libc = ctypes.CDLL(name)
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    return bool(mallopt(_M_ARENA_MAX, max(1, int(arenas))))
