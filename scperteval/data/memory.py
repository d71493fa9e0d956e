"""How much memory there is, and whether a file is read into it or left on disk."""

from __future__ import annotations

import os

__all__ = ["available_memory", "reads_into_memory"]


def available_memory() -> float:
    """Memory available to this process now, in bytes."""
    try:
        import psutil

        return float(psutil.virtual_memory().available)
    except ImportError:
        return float(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES"))


def reads_into_memory(file_bytes: int, backed: bool | str) -> bool:
    """Whether a file of ``file_bytes`` is read into memory under the option ``backed``.

    Parameters
    ----------
    file_bytes
        The file's size.
    backed
        ``True``: left on disk; ``False``: read; ``"auto"``: left on disk when it
        is over a third of the available memory.

    Returns
    -------
    bool
        Whether the file is read.

    """
    if backed == "auto":
        return file_bytes <= available_memory() / 3
    return not backed
