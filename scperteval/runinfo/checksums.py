"""Checksums of a run's input, computed beside the run.

``run.json`` records the MD5 of the input file (``"md5:..."``), or of the values
of data given in memory (``"md5-memory:..."``), so that runs on the same data can
be told apart from runs on different data. The run that loads the input starts
its checksum (:func:`start_input_checksum`) and holds the :class:`PendingChecksum`
it gets: a file is hashed in a background thread at the lowest priority while
the run reads and evaluates it.
"""

from __future__ import annotations

import hashlib
import os
import sys
import threading
from collections.abc import Callable
from typing import Any

import numpy as np

__all__ = [
    "ChecksumCancelled",
    "PendingChecksum",
    "dataset_checksum",
    "file_checksum",
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
    """The checksum of a run's input, computed in a background thread or on demand.

    The run that starts it owns it: calling it gives the value (waiting if need
    be; an error of the hash is raised then), and :meth:`cancel` stops a file's
    hash at its next chunk, for a run that ends before it needs the value.

    Parameters
    ----------
    compute
        Computes the checksum; it is given the stop event to check between chunks.
    background
        Compute it now in a daemon thread of the lowest priority (a file's hash),
        rather than when the value is asked for (data in memory, whose hash reads
        the matrix the run is using).

    """

    def __init__(self, compute: Callable[[threading.Event], str], background: bool) -> None:
        self._compute = compute
        self._stop = threading.Event()
        self._outcome: list[str | BaseException] = []
        self._thread: threading.Thread | None = None
        if background:
            # A daemon: a run that fails or is interrupted does not wait for the hash.
            self._thread = threading.Thread(
                target=self._run, name="scperteval-checksum", daemon=True
            )
            self._thread.start()

    def _run(self) -> None:
        _lower_thread_priority()  # a thread of its own, made for this checksum
        try:
            self._outcome.append(self._compute(self._stop))
        except BaseException as exc:  # noqa: BLE001 - raised to whoever asks for the value
            self._outcome.append(exc)

    def __call__(self) -> str:
        """The checksum, once computed."""
        if self._thread is None:
            return self._compute(self._stop)
        self._thread.join()
        outcome = self._outcome[0]
        if isinstance(outcome, BaseException):
            raise outcome
        return outcome

    def cancel(self) -> None:
        """Stop a background hash; its value can no longer be asked for."""
        self._stop.set()

    @property
    def cancelled(self) -> bool:
        """Whether :meth:`cancel` was called."""
        return self._stop.is_set()


def start_input_checksum(data: Any) -> PendingChecksum:
    """Begin the checksum of a run's input; the returned object gives its value when called.

    A file (a path, or a :class:`~scperteval.data.dataset.Dataset` read from one)
    is hashed in a background thread at the lowest priority: hashing releases the
    interpreter lock, so started before the file is read, it runs on the core
    that reading leaves idle (a 900 MB file takes a core for one to two seconds),
    and whatever remains when the evaluation starts runs on idle cycles only.
    Data in memory is hashed (:func:`dataset_checksum`) when the value is asked for.

    Parameters
    ----------
    data
        A path to the input file, or an open Dataset.

    Returns
    -------
    PendingChecksum
        ``"md5:" + file_checksum(path)`` for a file, else ``dataset_checksum(data)``.

    """
    path = data if isinstance(data, (str, os.PathLike)) else data.path
    if path is None:
        return PendingChecksum(lambda stop: dataset_checksum(data), background=False)
    return PendingChecksum(lambda stop: "md5:" + file_checksum(path, stop=stop), background=True)


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
