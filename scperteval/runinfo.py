"""Run records: input checksums, options, timings, atomic output files."""

from __future__ import annotations

import concurrent.futures as cf
import hashlib
import json
import os
import platform
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np

from scperteval._version import __version__

#: The largest nice value: the lowest priority a Linux thread can have.
_LOWEST_PRIORITY = 19

__all__ = ["Timer", "file_checksum", "write_atomic", "write_run_json", "dataset_checksum"]


class Timer:
    """Named wall-clock timings of the steps of a run."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}

    @contextmanager
    def step(self, name: str) -> Iterator[None]:
        """Time the enclosed block under ``name`` (accumulating repeats)."""
        start = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[name] = self.seconds.get(name, 0.0) + time.perf_counter() - start


def file_checksum(path: str | os.PathLike[str], chunk_bytes: int = 1 << 22) -> str:
    """MD5 of a file's bytes, read in chunks."""
    digest = hashlib.md5(usedforsecurity=False)
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(chunk_bytes), b""):
            digest.update(chunk)
    return digest.hexdigest()


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


def start_dataset_checksum(dataset: Any) -> Callable[[], str]:
    """Begin :func:`dataset_checksum`; the returned function waits for its value.

    A file is hashed in a background thread (hashing releases the GIL), so that
    reading a large file a second time overlaps with the computation instead of
    adding to it. On Linux the thread has the lowest priority: it runs when a core
    would otherwise idle (a 900 MB file takes a core for one to two seconds) and does
    not slow the evaluation. Data in memory is hashed when the value is asked for.

    Parameters
    ----------
    dataset
        A :class:`~scperteval.data.dataset.Dataset`.

    Returns
    -------
    callable
        Without arguments, returns the checksum (re-raising any error of the hash).

    """
    if dataset.path is None:
        return lambda: dataset_checksum(dataset)
    pool = cf.ThreadPoolExecutor(1, thread_name_prefix="scperteval-checksum")
    future = pool.submit(_background_checksum, dataset)
    pool.shutdown(wait=False)
    return future.result


def _background_checksum(dataset: Any) -> str:
    _lower_thread_priority()  # the pool's only thread, made for this checksum
    return dataset_checksum(dataset)


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


def write_atomic(path: Path, write: Callable[[Path], None]) -> None:
    """Write a file through a temporary sibling then rename, so readers never see a partial file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(handle)
    try:
        write(Path(temporary))
        # mkstemp creates private files; outputs get the usual permissions.
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(temporary, 0o666 & ~umask)
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


def write_run_json(path: Path, command: str, options: Mapping[str, Any], **extra: Any) -> None:
    """Write ``run.json``: version, command, options, environment and extra fields."""
    record = {
        "scperteval_version": __version__,
        "command": command,
        "options": dict(options),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        **extra,
    }
    text = json.dumps(record, indent=2, default=str, sort_keys=False)
    write_atomic(path, lambda p: _write_text(p, text + "\n"))


def _write_text(path: Path, text: str) -> None:
    path.write_text(text, encoding="utf-8")
