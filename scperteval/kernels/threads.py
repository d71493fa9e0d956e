"""Threads for the compiled kernels: ranges of work run on a shared pool.

The kernels release the GIL, so plain threads run them in parallel; numba's own
parallel regions would do the same but cost seconds of compilation per signature
on a fresh installation. Each range is computed by one thread and written to its
own part of the output, so values do not depend on the number of threads.
"""

from __future__ import annotations

import concurrent.futures as cf
import os
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import TypeVar

__all__ = [
    "available_cores",
    "claim_cores",
    "claim_cores_when_parallel",
    "dealt_back_and_forth",
    "even_bounds",
    "kernel_threads",
    "limit_kernel_threads",
    "run_ranges",
    "serial_kernels",
    "wait_for_cores",
]

T = TypeVar("T")

_local = threading.local()
_pool: list[cf.ThreadPoolExecutor] = []
_pool_lock = threading.Lock()
#: Number of claims on every core now held (see :func:`claim_cores`).
_claims = [0]
_claims_released = threading.Condition()


def available_cores() -> int:
    """The CPU cores this process may run on (its affinity set, else ``os.cpu_count()``).

    Returns
    -------
    int
        At least 1.

    """
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def kernel_threads() -> int:
    """Threads a kernel called from this thread may use (1 inside :func:`serial_kernels`).

    Returns
    -------
    int
        The CPU cores available to the process, or this thread's limit.

    """
    limit = getattr(_local, "limit", None)
    return int(limit) if limit is not None else available_cores()


@contextmanager
def limit_kernel_threads(threads: int) -> Iterator[None]:
    """Let the kernels called from this thread use at most ``threads`` threads.

    Parameters
    ----------
    threads
        The limit (at least 1).

    """
    saved = getattr(_local, "limit", None)
    _local.limit = max(1, int(threads))
    try:
        yield
    finally:
        _local.limit = saved


def serial_kernels() -> AbstractContextManager[None]:
    """Run the kernels called from this thread on this thread only.

    For the small pieces of work of a task among many running in parallel,
    handing ranges to other threads costs more than it saves.

    Returns
    -------
    contextlib.AbstractContextManager
        :func:`limit_kernel_threads` with a limit of 1.

    """
    return limit_kernel_threads(1)


def _shared_pool() -> cf.ThreadPoolExecutor:
    with _pool_lock:
        if not _pool:
            _pool.append(
                cf.ThreadPoolExecutor(available_cores(), thread_name_prefix="scperteval-kernel")
            )
        return _pool[0]


def even_bounds(n_items: int, max_blocks: int) -> list[int]:
    """Boundaries of near-equal ranges of ``n_items``, one per thread a kernel may use.

    Parameters
    ----------
    n_items
        Number of items (rows, features, values) to split.
    max_blocks
        At most this many ranges (1 keeps the work on the calling thread).

    Returns
    -------
    list of int
        ``n_blocks + 1`` non-decreasing boundaries from 0 to ``n_items``, with
        ``n_blocks = max(1, min(kernel_threads(), max_blocks))``.

    """
    n_blocks = max(1, min(kernel_threads(), int(max_blocks)))
    return [block * n_items // n_blocks for block in range(n_blocks + 1)]


def dealt_back_and_forth(n_items: int, n_ranges: int) -> list[list[int]]:
    """Items ``0 .. n_items - 1`` dealt to ``n_ranges`` ranges back and forth.

    For items whose work falls steadily with their index (column tiles of a lower
    triangle): dealt 0, 1, 1, 0, 0, 1, ... to two ranges, every range gets nearly
    the same work, where dealing in turn gives the first range the larger item of
    every round.

    Parameters
    ----------
    n_items
        Number of items.
    n_ranges
        Number of ranges (at least 1).

    Returns
    -------
    list of list of int
        The items of each range, in increasing order.

    Examples
    --------
    >>> dealt_back_and_forth(6, 2)
    [[0, 3, 4], [1, 2, 5]]

    """
    dealt: list[list[int]] = [[] for _ in range(max(1, n_ranges))]
    for item in range(n_items):
        round_index, position = divmod(item, len(dealt))
        owner = position if round_index % 2 == 0 else len(dealt) - 1 - position
        dealt[owner].append(item)
    return dealt


def run_ranges(function: Callable[[int, int], T], bounds: Sequence[int]) -> list[T]:
    """``function(bounds[i], bounds[i + 1])`` for every ``i``, the ranges in parallel.

    Parameters
    ----------
    function
        Called with the start and stop of one range; it must release the GIL to
        gain from the threads, and write only its own range of any shared output.
    bounds
        Non-decreasing range boundaries; empty ranges are skipped.

    Returns
    -------
    list
        The results of the non-empty ranges, in order.

    """
    ranges = [(a, b) for a, b in zip(bounds[:-1], bounds[1:], strict=True) if b > a]
    if len(ranges) <= 1:
        return [function(a, b) for a, b in ranges]
    futures = [_shared_pool().submit(function, a, b) for a, b in ranges[1:]]
    first = function(*ranges[0])
    return [first, *(future.result() for future in futures)]


def claim_cores_when_parallel() -> AbstractContextManager[None]:
    """:func:`claim_cores` when this thread's kernels may use several threads.

    For a step of a run's critical path whose own threads keep every core busy (a
    PCA's Gram matrix, its reduction to band form): other tasks sharing the cores
    meanwhile would only delay it. With one kernel thread, nothing is claimed.

    Returns
    -------
    contextlib.AbstractContextManager
        The claim, or a context that does nothing.

    """
    return claim_cores() if kernel_threads() > 1 else nullcontext()


@contextmanager
def claim_cores() -> Iterator[None]:
    """Hold back the tasks that call :func:`wait_for_cores` while the enclosed work runs.

    For parallel work on a run's critical path (a PCA fit's Gram matrix, which
    every task of the fitted space waits for): it runs on every core instead of
    sharing them with tasks that have time to spare. A task already running goes
    on; one that starts meanwhile waits at its first :func:`wait_for_cores`.
    Claims nest and may be held by several threads.
    """
    with _claims_released:
        _claims[0] += 1
    _local.claims = _claims_of_this_thread() + 1
    try:
        yield
    finally:
        _local.claims = _claims_of_this_thread() - 1
        with _claims_released:
            _claims[0] -= 1
            if _claims[0] == 0:
                _claims_released.notify_all()


def _claims_of_this_thread() -> int:
    return int(getattr(_local, "claims", 0))


def wait_for_cores() -> None:
    """Wait until no :func:`claim_cores` is held, unless this thread holds one."""
    if _claims[0] == 0 or _claims_of_this_thread() > 0:
        return
    with _claims_released:
        while _claims[0]:
            _claims_released.wait()
