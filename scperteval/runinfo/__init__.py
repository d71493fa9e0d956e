"""Run records: options and timings in ``run.json``, atomic output files.

The input's checksum is computed by :mod:`scperteval.runinfo.checksums`.
"""

from __future__ import annotations

import functools
import json
import os
import platform
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from scperteval._version import __version__

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["Timer", "write_atomic", "write_run_json", "write_tables"]


class Timer:
    """Named wall-clock timings of the steps of a run, and its total since the timer was made."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}
        self.started = time.time()

    @contextmanager
    def step(self, name: str) -> Iterator[None]:
        """Time the enclosed block under ``name`` (accumulating repeats)."""
        start = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[name] = self.seconds.get(name, 0.0) + time.perf_counter() - start

    def timings(self) -> dict[str, float]:
        """Every step's seconds, and the ``total`` seconds since the timer was made."""
        return {**self.seconds, "total": time.time() - self.started}


def write_atomic(path: Path, write: Callable[[Path], object]) -> None:
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


def write_tables(folder: Path, tables: Mapping[str, pd.DataFrame]) -> None:
    """Write tables atomically into a folder, without their index.

    Parameters
    ----------
    folder
        The output folder.
    tables
        File name to table; a ``.parquet`` name is written as Parquet, any other as CSV.

    """
    for file, table in tables.items():
        write = table.to_parquet if file.endswith(".parquet") else table.to_csv
        write_atomic(folder / file, functools.partial(write, index=False))


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
    write_atomic(path, lambda p: p.write_text(text + "\n", encoding="utf-8"))
