"""Threads for the compiled kernels: one run's pool, core claims and thread limits.

The kernels release the GIL, so plain threads run them in parallel; numba's own
parallel regions would do the same but cost seconds of compilation per signature
on a fresh installation. Each range is computed by one thread and written to its
own part of the output, so values do not depend on the number of threads.

Everything a run holds lives in one :class:`Threads` object that the run creates
and passes down (the :class:`~scperteval.context.Context` and the engine carry
it): the kernel pool, the core claims, the scheduling locks. Two runs in one
process therefore share none of it. A function given no object makes its own for
the call.
"""

from __future__ import annotations

import concurrent.futures as cf
import os
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import Any, TypeVar

__all__ = ["Threads", "available_cores", "dealt_back_and_forth"]

T = TypeVar("T")


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


class _RunShare:
    """What every :class:`Threads` of one run shares: pool, claims, locks, BLAS controls."""

    def __init__(self, cores: int) -> None:
        self.cores = cores
        self.lock = threading.Lock()
        self.pool: cf.ThreadPoolExecutor | None = None
        #: Claims held, in all and by thread (see :meth:`Threads.claim_cores`).
        self.claims = 0
        self.claims_by_thread: dict[int, int] = {}
        self.claims_released = threading.Condition(self.lock)
        self.large_fit_lock = threading.Lock()
        self.dataset_task_lock = threading.Lock()
        self.blas: Any = None

    def kernel_pool(self) -> cf.ThreadPoolExecutor:
        with self.lock:
            if self.pool is None:
                # Its threads end when the run's objects are dropped with it.
                self.pool = cf.ThreadPoolExecutor(self.cores, thread_name_prefix="scperteval")
            return self.pool

    def blas_libraries(self) -> list[Any]:
        with self.lock:
            if self.blas is None:
                try:
                    from threadpoolctl import ThreadpoolController
                except ImportError:  # pragma: no cover - shipped with scikit-learn
                    self.blas = []
                else:
                    self.blas = ThreadpoolController().select(user_api="blas").lib_controllers
            return list(self.blas)


class Threads:
    """The kernel threads of one run, and the limits that the run's work needs.

    Parameters
    ----------
    cores
        Threads of the kernel pool and the default :attr:`count`; the CPU cores
        available to the process (:func:`available_cores`) when omitted.

    Notes
    -----
    :meth:`limited` and :meth:`serial` give views of the same run with another
    :attr:`count` (a task among many keeps its kernels on its own thread); the
    views share the pool, the claims and the locks.

    BLAS's and torch's thread counts are process-wide: a run that set them and
    restored them after could restore under another run still inside its products.
    So a run only ever lowers them to the one thread its products need and never
    restores them (:meth:`single_threaded_blas`): every run of the process then
    finds the setting it needs, whoever set it, and no run's values depend on
    another run's timing. The process keeps that setting after the run.

    """

    def __init__(self, cores: int | None = None) -> None:
        self._share = _RunShare(max(1, int(cores)) if cores else available_cores())
        #: Threads a kernel may use (see :meth:`limited`).
        self.count = self._share.cores

    def __reduce__(self) -> tuple[Any, ...]:
        # Pools and locks stay behind: a copy in another process is a run of its own
        # there, on that machine's cores unless limited here.
        return (Threads, (None if self.count == self.cores else self.count,))

    @property
    def cores(self) -> int:
        """Threads of the run's kernel pool."""
        return self._share.cores

    def limited(self, threads: int) -> Threads:
        """The same run's threads with kernels limited to ``threads`` threads (at least 1).

        Parameters
        ----------
        threads
            The limit.

        Returns
        -------
        Threads
            A view sharing this run's pool, claims and locks.

        """
        # Not copy.copy: that pickles, which makes a new run (see __reduce__).
        view = object.__new__(Threads)
        view._share, view.count = self._share, max(1, int(threads))
        return view

    def serial(self) -> Threads:
        """The same run's threads with every kernel kept on the calling thread.

        For the small pieces of work of a task among many running in parallel,
        handing ranges to other threads costs more than it saves.

        Returns
        -------
        Threads
            :meth:`limited` to 1.

        """
        return self.limited(1)

    def even_bounds(self, n_items: int, max_blocks: int) -> list[int]:
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
            ``n_blocks = max(1, min(count, max_blocks))``.

        """
        n_blocks = max(1, min(self.count, int(max_blocks)))
        return [block * n_items // n_blocks for block in range(n_blocks + 1)]

    def run_ranges(self, function: Callable[[int, int], T], bounds: Sequence[int]) -> list[T]:
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
        pool = self._share.kernel_pool()
        futures = [pool.submit(function, a, b) for a, b in ranges[1:]]
        first = function(*ranges[0])
        return [first, *(future.result() for future in futures)]

    @contextmanager
    def claim_cores(self) -> Iterator[None]:
        """Hold back the run's tasks that call :meth:`wait_for_cores` while the work runs.

        For parallel work on a run's critical path (a PCA fit's Gram matrix, which
        every task of the fitted space waits for): it runs on every core instead of
        sharing them with tasks that have time to spare. A task already running goes
        on; one that starts meanwhile waits at its first :meth:`wait_for_cores`.
        Claims nest and may be held by several threads.
        """
        share, thread = self._share, threading.get_ident()
        with share.lock:
            share.claims += 1
            share.claims_by_thread[thread] = share.claims_by_thread.get(thread, 0) + 1
        try:
            yield
        finally:
            with share.lock:
                share.claims -= 1
                share.claims_by_thread[thread] -= 1
                if not share.claims_by_thread[thread]:
                    del share.claims_by_thread[thread]
                if share.claims == 0:
                    share.claims_released.notify_all()

    def claim_cores_when_parallel(self) -> AbstractContextManager[None]:
        """:meth:`claim_cores` when the kernels may use several threads.

        For a step of a run's critical path whose own threads keep every core busy (a
        PCA's Gram matrix, its reduction to band form): other tasks sharing the cores
        meanwhile would only delay it. With one kernel thread, nothing is claimed.

        Returns
        -------
        contextlib.AbstractContextManager
            The claim, or a context that does nothing.

        """
        return self.claim_cores() if self.count > 1 else nullcontext()

    def wait_for_cores(self) -> None:
        """Wait until the run holds no :meth:`claim_cores`, unless this thread holds one."""
        share, thread = self._share, threading.get_ident()
        with share.lock:
            while share.claims and thread not in share.claims_by_thread:
                share.claims_released.wait()

    @property
    def large_fit_lock(self) -> threading.Lock:
        """Held by a large shared fit (a PCA) of the run while it runs."""
        return self._share.large_fit_lock

    @property
    def dataset_task_lock(self) -> threading.Lock:
        """Held by a dataset-scope task of the run while it runs."""
        return self._share.dataset_task_lock

    @contextmanager
    def single_threaded_blas(self) -> Iterator[None]:
        """Run the enclosed matrix products on one BLAS thread.

        For thin products (tens of features) waking BLAS threads costs more than it
        saves; one thread also makes a product with many features independent of the
        machine's thread count (BLAS may split the sum over features between
        threads). The limit is left in place after (see the class notes).
        """
        for library in self._share.blas_libraries():
            if library.num_threads != 1:
                library.set_num_threads(1)
        yield

    @staticmethod
    @contextmanager
    def single_threaded_torch(torch: Any) -> Iterator[None]:
        """Run the enclosed torch operations on one intra-op thread, left so after.

        Parameters
        ----------
        torch
            The imported torch module.

        """
        if torch.get_num_threads() != 1:
            torch.set_num_threads(1)
        yield


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
