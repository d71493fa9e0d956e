"""Checksums of a run's input, computed beside the run.

``run.json`` records the MD5 of the input file (``"md5:..."``), or of the values
of data given in memory (``"md5-memory:..."``), so that runs on the same data can
be told apart from runs on different data. A file is hashed in a background
thread at the lowest priority: hashing releases the interpreter lock, and the
program begins it before its own imports (:func:`begin_input_checksum`), so that
it runs on the core that importing and reading leave idle.
"""

from __future__ import annotations

import concurrent.futures as cf
import hashlib
import os
import stat
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

__all__ = [
    "ChecksumCancelled",
    "PendingChecksum",
    "begin_input_checksum",
    "cancel_unclaimed_checksums",
    "dataset_checksum",
    "file_checksum",
    "start_dataset_checksum",
    "start_file_checksum",
    "start_input_checksum",
]

#: The largest nice value: the lowest priority a Linux thread can have.
_LOWEST_PRIORITY = 19


def file_checksum(
    path: str | os.PathLike[str],
    chunk_bytes: int = 1 << 22,
    stop: threading.Event | None = None,
) -> str:
    """MD5 of a file's bytes, read in chunks.

    Parameters
    ----------
    path
        The file.
    chunk_bytes
        Bytes read and hashed at a time.
    stop
        When set, hashing ends at the next chunk with :class:`ChecksumCancelled`.

    Returns
    -------
    str
        The hexadecimal digest.

    """
    digest = hashlib.md5(usedforsecurity=False)
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(chunk_bytes), b""):
            if stop is not None and stop.is_set():
                raise ChecksumCancelled(f"checksum of {path} cancelled")
            digest.update(chunk)
    return digest.hexdigest()


class ChecksumCancelled(RuntimeError):
    """A background checksum was cancelled before it finished."""


def dataset_checksum(dataset: Any) -> str:
    """Checksum of the evaluated data: the file's MD5, or a hash of the in-memory values."""
    if dataset.path is not None:
        return "md5:" + file_checksum(dataset.path)
    digest = hashlib.md5(usedforsecurity=False)
    digest.update("\x1f".join(dataset.var_names).encode())
    digest.update("\x1f".join(dataset.perturbation_labels.tolist()).encode())
    for _, block in dataset.iter_chunks():
        values = block.data if hasattr(block, "data") and hasattr(block, "indices") else block
        digest.update(np.ascontiguousarray(values).tobytes())
        if hasattr(block, "indices"):
            digest.update(np.ascontiguousarray(block.indices).tobytes())
            digest.update(np.ascontiguousarray(block.indptr).tobytes())
    return "md5-memory:" + digest.hexdigest()


class PendingChecksum:
    """The checksum of a run's input, computed in the background or on demand.

    Call it for the value (waiting if need be; an error of the hash is raised
    then). :meth:`cancel` stops a file's hash at its next chunk, for a run that
    ends before it needs the value.
    """

    def __init__(
        self,
        value: Callable[[], str],
        stop: threading.Event | None = None,
        path: Path | None = None,
    ) -> None:
        self._value = value
        self._stop = stop
        #: The file hashed in the background, if any.
        self.path = path

    def __call__(self) -> str:
        """The checksum, once computed."""
        return self._value()

    def cancel(self) -> None:
        """Stop a background hash; its value can no longer be asked for."""
        if self._stop is not None:
            self._stop.set()


def start_file_checksum(path: str | os.PathLike[str]) -> PendingChecksum:
    """Begin the MD5 of a file in a background thread of the lowest priority.

    Hashing releases the GIL: started before the file is read, the hash runs on
    the core that reading and importing leave idle (a 900 MB file takes a core
    for one to two seconds) instead of competing with the evaluation later. On
    Linux the thread has the lowest priority, so that whatever it still has to do
    when the evaluation starts runs only on idle cycles.

    Parameters
    ----------
    path
        The input file.

    Returns
    -------
    PendingChecksum
        Its value is ``"md5:" + file_checksum(path)``; :attr:`PendingChecksum.path`
        is the path hashed.

    """
    stop = threading.Event()
    pool = cf.ThreadPoolExecutor(1, thread_name_prefix="scperteval-checksum")
    future = pool.submit(_background_file_checksum, path, stop)
    pool.shutdown(wait=False)
    return PendingChecksum(future.result, stop, Path(path))


def start_dataset_checksum(dataset: Any, started: PendingChecksum | None = None) -> PendingChecksum:
    """Begin :func:`dataset_checksum`; the returned object gives its value when called.

    A file is hashed in a background thread (:func:`start_file_checksum`). Data in
    memory is hashed when the value is asked for.

    Parameters
    ----------
    dataset
        A :class:`~scperteval.data.dataset.Dataset`.
    started
        A hash begun before the dataset was opened: used when it is of the
        dataset's file, cancelled otherwise.

    Returns
    -------
    PendingChecksum
        Called without arguments, returns the checksum.

    """
    if started is not None:
        if dataset.path is not None and started.path == dataset.path:
            return started
        started.cancel()
    if dataset.path is None:
        return PendingChecksum(lambda: dataset_checksum(dataset))
    return start_file_checksum(dataset.path)


def start_input_checksum(data: Any) -> PendingChecksum | None:
    """The background hash of ``data`` when it is a file path; else ``None``.

    A hash of the same unchanged file begun earlier in the process (the program
    begins it before its imports) and not yet claimed is handed over instead of
    starting another.

    Parameters
    ----------
    data
        What a run was given as its dataset: a path or an object in memory.

    Returns
    -------
    PendingChecksum or None
        Hand it to :func:`start_dataset_checksum` once the dataset is open, or
        cancel it if opening fails.

    """
    identity = _file_identity(data)
    if identity is None:
        return None
    with _UNCLAIMED_LOCK:
        pending = _UNCLAIMED.pop(identity, None)
    return pending or start_file_checksum(data)


def begin_input_checksum(data: Any) -> None:
    """Begin :func:`start_input_checksum` of ``data`` now, for a run that claims it later.

    Parameters
    ----------
    data
        The dataset a run will be given.

    """
    identity = _file_identity(data)
    if identity is None:
        return
    # An unclaimed hash of the same file is taken over rather than started again.
    pending = start_input_checksum(data)
    if pending is not None:
        with _UNCLAIMED_LOCK:
            _UNCLAIMED[identity] = pending


def _file_identity(data: Any) -> tuple[str, int, int] | None:
    """A regular file's resolved path, size and modification time; ``None`` otherwise."""
    if not isinstance(data, (str, os.PathLike)):
        return None
    try:
        key = os.path.realpath(data)
        status = os.stat(key)
    except (OSError, ValueError):
        return None
    if not stat.S_ISREG(status.st_mode):
        return None
    return key, status.st_size, status.st_mtime_ns


def cancel_unclaimed_checksums() -> None:
    """Cancel the hashes begun by :func:`begin_input_checksum` that no run claimed."""
    with _UNCLAIMED_LOCK:
        pending = list(_UNCLAIMED.values())
        _UNCLAIMED.clear()
    for checksum in pending:
        checksum.cancel()


def _background_file_checksum(path: str | os.PathLike[str], stop: threading.Event) -> str:
    _lower_thread_priority()  # the pool's only thread, made for this checksum
    return "md5:" + file_checksum(path, stop=stop)


def _lower_thread_priority() -> bool:
    """Give the calling thread the lowest scheduling priority (Linux only).

    For background work with time to spare (a checksum of the input): it then
    runs on cores the evaluation leaves idle instead of taking turns with it.
    Only the calling thread is affected, and only on Linux, where a thread has a
    priority of its own; elsewhere nothing changes. A thread cannot raise its
    priority again without privileges: use it for threads of their own.

    Returns
    -------
    bool
        Whether the priority was lowered.

    """
    if not sys.platform.startswith("linux"):
        return False
    try:
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), _LOWEST_PRIORITY)
    except (AttributeError, OSError):
        return False
    return True


#: Hashes begun ahead of a run, by file (resolved path, size, modification time).
_UNCLAIMED: dict[tuple[str, int, int], PendingChecksum] = {}
_UNCLAIMED_LOCK = threading.Lock()
