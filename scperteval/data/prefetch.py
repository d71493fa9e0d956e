"""Reading a file's expression matrix while the program is still starting.

A command-line run spends its first half second importing pandas, numba and
scipy, on one core. Reading the expression matrix of a large ``.h5ad`` file
takes as long again, most of it the operating system handing the process new
memory page by page, which needs no interpreter lock. :func:`start_prefetch`
begins that read in a background thread before the imports: the destination
arrays are allocated and touched (page faults on the idle core), then filled
from the file. :func:`read_stored <scperteval.data.h5ad.read_stored>` later takes
the arrays (:func:`take_prefetched`) instead of reading them again: the same
bytes, read by h5py from the same datasets.

Only a file the run reads into memory is prefetched (the rule of
:func:`~scperteval.data.matrix_io.open_data`), only numeric arrays, and any
failure leaves the ordinary read to happen and to report the problem.
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from scperteval.data.memory import reads_into_memory

__all__ = ["discard_prefetch", "discard_prefetches", "start_prefetch", "take_prefetched"]

#: Elements copied from the file per read, so that a cancelled prefetch stops soon.
_SLICE_ELEMENTS = 1 << 23
#: Bytes written at a time when the destination's pages are first touched.
_TOUCH_BYTES = 1 << 25
#: The arrays of the stored encodings of ``X`` that are read.
_SPARSE_KEYS = ("data", "indices", "indptr")


@dataclass
class _Prefetch:
    identity: tuple[int, int]
    thread: threading.Thread
    stop: threading.Event = field(default_factory=threading.Event)
    arrays: dict[str, np.ndarray] | None = None


_PENDING: dict[str, _Prefetch] = {}
_LOCK = threading.Lock()


def _identity(path: str) -> tuple[int, int]:
    status = os.stat(path)
    return status.st_size, status.st_mtime_ns


def start_prefetch(path: str | os.PathLike[str], backed: bool | str = "auto") -> bool:
    """Begin reading the ``X`` matrix of an ``.h5ad`` file in a background thread.

    Parameters
    ----------
    path
        The file a run will open.
    backed
        The run's reading option: nothing is prefetched for a file left on disk
        (``True``, or ``"auto"`` and over a third of the available memory).

    Returns
    -------
    bool
        Whether a read was started.

    """
    try:
        key = os.path.realpath(path)
        identity = _identity(key)
    except (OSError, TypeError, ValueError):
        return False
    if backed not in (True, False, "auto") or not reads_into_memory(identity[0], backed):
        return False
    with _LOCK:
        if key in _PENDING:
            return False
        thread = threading.Thread(target=_run, args=(key,), name="scperteval-prefetch", daemon=True)
        _PENDING[key] = _Prefetch(identity, thread)
    thread.start()
    return True


def take_prefetched(path: str | os.PathLike[str]) -> dict[str, np.ndarray] | None:
    """The arrays of ``X`` read by :func:`start_prefetch`, once; ``None`` if there are none.

    Waits for the read to finish. The arrays are handed over (forgotten here);
    they are discarded if the file has changed since the read began.

    Parameters
    ----------
    path
        The file.

    Returns
    -------
    dict or None
        By name (``"data"``, ``"indices"``, ``"indptr"`` of a sparse matrix,
        ``""`` for a dense one), the arrays as stored.

    """
    key = os.path.realpath(path)
    with _LOCK:
        prefetch = _PENDING.pop(key, None)
    if prefetch is None:
        return None
    prefetch.thread.join()
    try:
        unchanged = _identity(key) == prefetch.identity
    except OSError:
        unchanged = False
    return prefetch.arrays if unchanged else None


def discard_prefetch(path: str | os.PathLike[str]) -> None:
    """Stop the prefetch of ``path`` if one is running and drop what it read.

    Parameters
    ----------
    path
        The file.

    """
    with _LOCK:
        prefetch = _PENDING.pop(os.path.realpath(path), None)
    if prefetch is not None:
        _stop([prefetch])


def discard_prefetches() -> None:
    """Stop every prefetch still running and drop what was read (a run that ended early)."""
    with _LOCK:
        pending = list(_PENDING.values())
        _PENDING.clear()
    _stop(pending)


def _stop(pending: list[_Prefetch]) -> None:
    for prefetch in pending:
        prefetch.stop.set()
    for prefetch in pending:
        prefetch.thread.join()
        prefetch.arrays = None


def _run(key: str) -> None:
    with _LOCK:
        prefetch = _PENDING.get(key)
    if prefetch is None:
        return
    try:
        arrays = _read_matrix_arrays(key, prefetch.stop)
    except Exception:  # noqa: BLE001 - the ordinary read reports any problem
        arrays = None
    prefetch.arrays = arrays


def _read_matrix_arrays(path: str, stop: threading.Event) -> dict[str, np.ndarray] | None:
    import h5py

    with h5py.File(path, "r") as handle:
        node = handle.get("X")
        if isinstance(node, h5py.Dataset):
            datasets = {"": node}
        elif isinstance(node, h5py.Group) and all(
            isinstance(node.get(name), h5py.Dataset) for name in _SPARSE_KEYS
        ):
            datasets = {name: node[name] for name in _SPARSE_KEYS}
        else:
            return None
        if any(dataset.dtype.kind not in "fiu" for dataset in datasets.values()):
            return None
        arrays = {name: np.empty(ds.shape, ds.dtype) for name, ds in datasets.items()}
        _touch(list(arrays.values()), stop)
        if stop.is_set():
            return None
        for name, dataset in datasets.items():
            if not _read_in_slices(dataset, arrays[name], stop):
                return None
    return arrays


def _touch(arrays: list[np.ndarray], stop: threading.Event) -> None:
    """Write every page of ``arrays`` once, on two threads, until ``stop`` is set.

    Done before the read, which holds the interpreter lock, and without it: the
    new pages come while the main thread imports. Where the operating system is
    slow to hand out memory (a virtual machine's first use of it), two threads
    take about half the time of one. The pieces are small enough that a stop is
    heeded within a few hundredths of a second.
    """
    pieces = []
    for array in arrays:
        flat = array.reshape(-1).view(np.uint8)
        pieces += [
            flat[start : start + _TOUCH_BYTES] for start in range(0, flat.size, _TOUCH_BYTES)
        ]

    def fill(parts: list[np.ndarray]) -> None:
        for part in parts:
            if stop.is_set():
                return
            part.fill(0)

    helper = threading.Thread(target=fill, args=(pieces[1::2],), name="scperteval-prefetch-touch")
    helper.start()
    fill(pieces[::2])
    helper.join()


def _read_in_slices(dataset: Any, out: np.ndarray, stop: threading.Event) -> bool:
    if out.ndim == 0 or out.size == 0:
        dataset.read_direct(out)
        return True
    rows = max(1, _SLICE_ELEMENTS // max(1, int(np.prod(out.shape[1:], dtype=np.int64))))
    for start in range(0, out.shape[0], rows):
        if stop.is_set():
            return False
        selection = np.s_[start : min(start + rows, out.shape[0])]
        dataset.read_direct(out, selection, selection)
    return True
