"""Checksums of a run's input, computed beside the run.

``run.json`` records the MD5 of the input file (``"md5:..."``), or of the values
of data given in memory (``"md5-memory:..."``), so that runs on the same data can
be told apart from runs on different data. The run that loads the input starts
its checksum (:func:`start_input_checksum`) and holds the :class:`PendingChecksum`
it gets: a file is hashed in a background thread at the lowest priority while
the run reads and evaluates it, and whatever is left when the run asks for the
value is hashed by the run's own thread, at its priority.
"""

from __future__ import annotations

import hashlib
import os
import sys
import threading
from typing import IO, Any

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
    digest = _FileHash(path, chunk_bytes).advance(stop)
    assert digest is not None
    return digest


class _FileHash:
    """A file's MD5, hashed in order a chunk at a time, that a thread can take over.

    One thread advances it at a time: a thread pauses it between chunks, and
    the next one continues from the same digest and file position.
    """

    def __init__(self, path: str | os.PathLike[str], chunk_bytes: int = 1 << 22) -> None:
        self._path = path
        self._chunk_bytes = chunk_bytes
        self._digest = hashlib.md5(usedforsecurity=False)
        self._handle: IO[bytes] | None = None
        self._hexdigest: str | None = None

    def advance(
        self, stop: threading.Event | None = None, pause: threading.Event | None = None
    ) -> str | None:
        """Hash chunks until the end (the hexadecimal digest) or ``pause`` is set (``None``)."""
        if self._handle is None:
            self._handle = open(self._path, "rb")  # noqa: SIM115 - kept open across calls
        while self._hexdigest is None and (pause is None or not pause.is_set()):
            chunk = self._handle.read(self._chunk_bytes)
            if stop is not None and stop.is_set():
                self._handle.close()
                raise ChecksumCancelled(f"checksum of {self._path} cancelled")
            if chunk:
                self._digest.update(chunk)
            else:
                self._handle.close()
                self._hexdigest = self._digest.hexdigest()
        return self._hexdigest


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
        sparse = hasattr(block, "data") and hasattr(block, "indices")
        for part in (block.data, block.indices, block.indptr) if sparse else (block,):
            digest.update(np.ascontiguousarray(part).tobytes())
    return "md5-memory:" + digest.hexdigest()


class PendingChecksum:
    """The checksum of a run's input, computed in a background thread or on demand.

    The run that starts it owns it: calling it gives the value (an error of the
    hash is raised then), and :meth:`cancel` stops a file's hash at its next
    chunk, for a run that ends before it needs the value. A file's hash not done
    when the value is asked for is taken over between chunks by the caller's
    thread: on a busy machine a thread of the lowest priority may get almost no
    time, and the run would otherwise wait for it rather than hash at its own
    priority.

    Parameters
    ----------
    path
        The input file, hashed now in a daemon thread of the lowest priority.
    dataset
        Without ``path``: data in memory, hashed (:func:`dataset_checksum`) when
        the value is asked for, as its hash reads the matrix the run is using.

    """

    def __init__(self, path: str | os.PathLike[str] | None, dataset: Any = None) -> None:
        self._dataset = dataset
        self._stop = threading.Event()
        self._claimed = threading.Event()
        self._error: list[BaseException] = []
        self._file = None if path is None else _FileHash(path)
        if self._file is not None:
            # A daemon: a run that fails or is interrupted does not wait for the hash.
            self._thread = threading.Thread(
                target=self._run, name="scperteval-checksum", daemon=True
            )
            self._thread.start()

    def _run(self) -> None:
        _lower_thread_priority()  # a thread of its own, made for this checksum
        assert self._file is not None
        try:
            self._file.advance(self._stop, pause=self._claimed)
        except BaseException as exc:  # noqa: BLE001 - raised to whoever asks for the value
            self._error.append(exc)

    def __call__(self) -> str:
        """The checksum, its hash finished in the calling thread if need be."""
        if self._file is None:
            return dataset_checksum(self._dataset)
        self._claimed.set()
        self._thread.join()  # at most the chunk it is hashing
        if self._error:
            raise self._error[0]
        digest = self._file.advance(self._stop)
        assert digest is not None
        return "md5:" + digest

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
    and whatever remains when the evaluation starts runs on idle cycles only,
    until the run asks for the value and hashes the rest itself.
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
    return PendingChecksum(path, dataset=data)


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
